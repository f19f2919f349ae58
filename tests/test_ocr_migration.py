"""Revision 0009 on collections made before it: their tables get the OCR columns and the pending
index (a partitioned one on every partition), and OCR then works on their stored images."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import psycopg
import pytest
from alembic import command

from bench import ocr_images
from memstore.db import migrate
from memstore.db.core import Database, create_engine, libpq_url
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.settings import Settings
from memstore.store import VectorStore
from memstore.workers.ocr_pass import OcrPass
from tests.databases import scratch_database


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    with scratch_database(server_url, "memstore_ocr", migrated=False) as url:
        yield url


def _columns(url: str) -> dict[str, set[str]]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE column_name LIKE 'ocr_%%'"
        ).fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table, set()).add(column)
    return out


def test_collections_made_before_0009_get_the_columns_and_can_turn_ocr_on(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    engine = create_engine(empty_database)
    rendered = ocr_images.render(7, font=ocr_images.fonts()[0], size=32, lines=1, per_line=3, noise=8.0)
    try:
        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        for name, partitions in (("old_plain", 1), ("old_parts", 3)):
            c = store.create_collection(name=name, dimensions=4, partitions=partitions)
            jobs.enqueue(
                Database(engine), c, [PendingItem(content=rendered.content, content_type="image/png", external_id="a")]
            )
        engine.dispose()
        command.downgrade(migrate.alembic_config(empty_database), "0008")
        assert _columns(empty_database) == {}
        migrate.upgrade(empty_database)
        tables = _columns(empty_database)
        assert len(tables) == 1 + 1 + 3  # the plain table, the partitioned parent and its partitions
        assert all(cols == {"ocr_status", "ocr_text", "ocr_error"} for cols in tables.values())
        with psycopg.connect(libpq_url(empty_database)) as conn:
            pending_indexes = conn.execute(
                "SELECT count(*) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
                "WHERE c.relname LIKE '%%_ocr_pending' AND x.indisvalid"
            ).fetchone()
        assert pending_indexes == (1 + 1 + 3,)

        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        store.set_keywords(collection="old_parts", ocr=True, grace_s=0)
        # The downgrade refuses while a collection's keyword index needs the OCR keywords function.
        with pytest.raises(RuntimeError, match="turn OCR off first"):
            command.downgrade(migrate.alembic_config(empty_database), "0008")
        migrate.upgrade(empty_database)  # the revisions above 0009 were undone before the refusal
        if shutil.which("tesseract") is None:
            return
        with engine.begin() as conn:  # as if embedded: reading waits for the vector
            for table in (store.get_collection(name=n).table_name for n in ("old_plain", "old_parts")):
                conn.exec_driver_sql(f"UPDATE {table} SET status = 'ready', embedding = '[1,0,0,0]'")
        reader = OcrPass(Database(engine))
        while reader.step():
            pass
        item = store.get_item(collection="old_parts", external_id="a")
        assert item.ocr_status == "done" and ocr_images.recall(rendered.words, item.ocr_text or "") == 1.0
        hits = store.search(collection="old_parts", text=rendered.words[0], mode="keyword", k=3)
        assert [h.external_id for h in hits] == ["a"]
        assert store.get_item(collection="old_plain", external_id="a").ocr_status is None  # OCR off there
        # New images reach every partition's trigger.
        parts = store.get_collection(name="old_parts")
        more = [PendingItem(content=rendered.content + bytes([i]), content_type="image/png") for i in range(6)]
        jobs.enqueue(Database(engine), parts, more)
        for m in more:
            assert store.get_item(collection="old_parts", external_id=m.key()).ocr_status == "pending"
        with engine.connect() as conn:
            spread = conn.exec_driver_sql(
                f"SELECT count(DISTINCT tableoid) FROM {parts.table_name} WHERE ocr_status = 'pending'"
            ).scalar()
        assert spread == 3
    finally:
        engine.dispose()
