"""Migrations: idempotent, safe when several processes upgrade at once, reversible."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from alembic.script import ScriptDirectory

from memstore import migrate
from memstore.db import libpq_url
from tests.databases import scratch_database


@pytest.fixture
def empty_database(server_url: str) -> Iterator[str]:
    with scratch_database(server_url, "memstore_mig", migrated=False) as url:
        yield url


def test_one_head() -> None:
    heads = ScriptDirectory.from_config(migrate.alembic_config()).get_heads()
    assert len(heads) == 1, f"migrations have several heads: {heads}"


def test_concurrent_upgrades_from_several_processes_all_succeed(empty_database: str) -> None:
    """API, workers and a migrate job may all upgrade at start; the advisory lock serialises them."""
    script = "import sys; from memstore import migrate; migrate.upgrade(sys.argv[1])"
    procs = [
        subprocess.Popen([sys.executable, "-c", script, empty_database], stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outcomes = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(code == 0 for code, _ in outcomes), outcomes
    head = ScriptDirectory.from_config(migrate.alembic_config()).get_current_head()
    assert migrate.current_revision(empty_database) == head


def test_downgrade_to_base_removes_registry_tables(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    from alembic import command

    command.downgrade(migrate.alembic_config(empty_database), "base")
    with psycopg.connect(libpq_url(empty_database)) as conn:
        left = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'memstore_%%' AND tablename <> %s",
            (migrate.VERSION_TABLE,),
        ).fetchall()
    assert left == []
    migrate.upgrade(empty_database)
    assert migrate.current_revision(empty_database) is not None


def test_keyword_search_reaches_collections_made_before_it(empty_database: str) -> None:
    """Revision 0006 builds the keyword index of every existing collection (concurrently) and takes
    the pending list off its GIN indexes; revision 0012 stores their keywords in side tables and drops
    those indexes; searches by keyword work on the old rows at once."""
    import numpy as np
    from alembic import command

    from memstore.db import create_engine
    from memstore.models import ItemIn
    from memstore.settings import Settings
    from memstore.store import VectorStore

    migrate.upgrade(empty_database)
    engine = create_engine(empty_database)
    try:
        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        rng = np.random.default_rng(0)
        for name, partitions in (("before_plain", 1), ("before_parts", 2)):
            store.create_collection(name=name, dimensions=4, partitions=partitions)
            store.upsert_items(
                collection=name,
                items=[ItemIn(vector=rng.normal(size=4), external_id=str(i), text=f"row code-{i}") for i in range(50)],
            )
        engine.dispose()
        command.downgrade(migrate.alembic_config(empty_database), "0005")
        with psycopg.connect(libpq_url(empty_database)) as conn:
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE '%%_keywords'").fetchone() == (0,)
        migrate.upgrade(empty_database)
        store = VectorStore(engine, settings=Settings(database_url=empty_database))
        for name in ("before_plain", "before_parts"):
            hits = store.search(collection=name, text="code-17", mode="keyword", k=3)
            assert [h.external_id for h in hits] == ["17"], name
        with psycopg.connect(libpq_url(empty_database)) as conn:
            rows = conn.execute(
                "SELECT c.relname, x.indisvalid, coalesce(c.reloptions, '{}') FROM pg_index x "
                "JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_am am ON am.oid = c.relam "
                "WHERE am.amname = 'gin' AND c.relkind = 'i'"
            ).fetchall()
        keyword_indexes = [r for r in rows if r[0].startswith("memstore_kw_c") and r[0].endswith("_words")]
        assert len(keyword_indexes) == 2  # each collection's side table's
        assert not [r for r in rows if r[0].endswith("_keywords")]  # the expression indexes are gone
        assert all(valid for _, valid, _ in rows)
        assert all("fastupdate=off" in options for _, _, options in rows), rows
    finally:
        engine.dispose()
