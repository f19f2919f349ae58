"""Bulk loads: a load large against its collection goes in without the HNSW index (and the metadata
and keyword GIN indexes) and builds them afterwards; searches answer throughout; nothing is lost,
also with several connections or after the loading process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from psycopg import sql

from maintenance.worker import MaintenanceWorker
from memstore.db.core import Database, raw_connection
from memstore.items import bulk_load
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bulk_store(engine: sa.Engine, settings: Settings) -> VectorStore:
    """Thresholds small enough for test-sized loads."""
    return VectorStore(engine, settings=settings.model_copy(update={"bulk_min_rows": 500, "bulk_fraction": 0.5}))


def _items(vectors: np.ndarray, start: int = 0) -> list[ItemIn]:
    return [ItemIn(vector=v, external_id=f"r{start + i}", metadata={"n": start + i}) for i, v in enumerate(vectors)]


def _indexes(engine: sa.Engine, table: str, method: str = "hnsw") -> list[tuple[int, bool]]:
    """(oid, valid) of every index of access ``method`` on ``table`` and its partitions: a rebuilt
    index has a new oid."""
    with raw_connection(engine) as conn:
        return [
            (int(r[0]), bool(r[1]))
            for r in conn.execute(
                "SELECT x.indexrelid, x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "JOIN pg_am am ON am.oid = i.relam WHERE am.amname = %(m)s "
                "AND x.indrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass(%(t)s) "
                "UNION SELECT to_regclass(%(t)s)) ORDER BY 1",
                {"t": table, "m": method},
            )
        ]


def _hnsw_indexes(engine: sa.Engine, table: str) -> list[tuple[int, bool]]:
    return _indexes(engine, table, "hnsw")


def _uses_index(engine: sa.Engine, store: VectorStore, name: str, q: np.ndarray) -> bool:
    c = store.get_collection(name=name, fresh=True)
    plan = store.plain_search(c, vector=q, k=5, filter=None, ef_search=None, exact=False)
    with raw_connection(engine) as conn:
        conn.execute("SET enable_seqscan = off")  # a tiny table would be scanned anyway
        lines = conn.execute(sql.SQL("EXPLAIN ") + plan.statement, plan.params).fetchall()
    return any("hnsw" in line[0] for line in lines)


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_large_load_builds_the_index_once_and_every_row_is_found(
    bulk_store: VectorStore, engine: sa.Engine, collection_name: str, partitions: int
) -> None:
    rng = np.random.default_rng(10)
    vectors = rng.normal(size=(1500, 16)).astype(np.float32)
    c = bulk_store.create_collection(name=collection_name, dimensions=16, partitions=partitions)
    gin_before = _indexes(engine, c.table_name, "gin")
    items = [
        ItemIn(vector=it.vector, external_id=it.external_id, metadata=it.metadata, text=f"zebra{i} grazing")
        for i, it in enumerate(_items(vectors))
    ]
    result = bulk_store.bulk_load(collection=collection_name, items=items, batch_rows=400)
    assert result.deferred_index and result.created == 1500 and result.rows == 1500
    assert result.build_s > 0
    indexes = _hnsw_indexes(engine, c.table_name)
    assert indexes and all(valid for _, valid in indexes)
    assert len(indexes) == (1 if partitions == 1 else partitions + 1)
    # The metadata GIN index was dropped with the graph and built again after the rows.
    gin = _indexes(engine, c.table_name, "gin")
    assert len(gin) == len(gin_before) == len(indexes) and all(valid for _, valid in gin)
    assert not {oid for oid, _ in gin} & {oid for oid, _ in gin_before}
    words = bulk_store.search(collection=collection_name, text="zebra1234", mode="keyword", k=3)
    assert [h.external_id for h in words] == ["r1234"]
    kept = bulk_store.search(collection=collection_name, vector=vectors[77], k=1, filter={"n": 77}, exact=True)
    assert [h.external_id for h in kept] == ["r77"]
    assert not bulk_load.in_progress(bulk_store.get_collection(name=collection_name, fresh=True))
    assert _uses_index(engine, bulk_store, collection_name, vectors[0])
    found = sum(
        bulk_store.search(collection=collection_name, vector=vectors[i], k=1)[0].external_id == f"r{i}"
        for i in range(0, 1500, 50)
    )
    assert found == 30


def test_a_small_load_goes_into_the_live_index_side_by_side_and_loses_nothing(
    bulk_store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(3000, 8)).astype(np.float32)
    bulk_store.create_collection(name=collection_name, dimensions=8)
    first = bulk_store.bulk_load(collection=collection_name, items=_items(vectors[:2400]))
    assert first.deferred_index
    # 600 rows into 2,400: under the fraction, so into the live graph, by three connections at once.
    second = bulk_store.bulk_load(
        collection=collection_name, items=iter(_items(vectors[2400:], 2400)), batch_rows=37, connections=3
    )
    assert not second.deferred_index and second.created == 600
    c = bulk_store.get_collection(name=collection_name)
    with raw_connection(engine) as conn:
        ids = {r[0] for r in conn.execute(sql.SQL("SELECT external_id FROM {}").format(c.table))}
    assert ids == {f"r{i}" for i in range(3000)}
    assert bulk_store.search(collection=collection_name, vector=vectors[2999], k=1)[0].external_id == "r2999"


def test_one_large_upsert_batch_rebuilds_and_a_small_one_does_not(
    bulk_store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    rng = np.random.default_rng(12)
    vectors = rng.normal(size=(1200, 8)).astype(np.float32)
    c = bulk_store.create_collection(name=collection_name, dimensions=8)
    before = _hnsw_indexes(engine, c.table_name)
    results = bulk_store.upsert_items(collection=collection_name, items=_items(vectors[:1000]))
    assert [r.status for r in results] == ["created"] * 1000
    rebuilt = _hnsw_indexes(engine, c.table_name)
    assert rebuilt and rebuilt != before  # dropped and built again
    bulk_store.upsert_items(collection=collection_name, items=_items(vectors[1000:], 1000))
    assert _hnsw_indexes(engine, c.table_name) == rebuilt  # 200 rows went into the live graph
    assert bulk_store.search(collection=collection_name, vector=vectors[1100], k=1)[0].external_id == "r1100"


def test_searches_answer_throughout_a_load_and_find_every_row_after(
    bulk_store: VectorStore, collection_name: str
) -> None:
    rng = np.random.default_rng(13)
    vectors = rng.normal(size=(4000, 16)).astype(np.float32)
    bulk_store.create_collection(name=collection_name, dimensions=16)
    bulk_store.upsert_items(collection=collection_name, items=_items(vectors[:200]))
    stop = threading.Event()
    answered: list[int] = []
    errors: list[BaseException] = []

    def stream() -> None:
        i = 0
        while not stop.is_set():
            try:
                hits = bulk_store.search(collection=collection_name, vector=vectors[i % 200], k=3)
                answered.append(int(hits[0].external_id == f"r{i % 200}"))
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)
            i += 1

    searcher = threading.Thread(target=stream)
    searcher.start()
    try:
        result = bulk_store.bulk_load(
            collection=collection_name, items=(it for it in _items(vectors[200:], 200)), batch_rows=500
        )
    finally:
        stop.set()
        searcher.join(30)
    assert result.deferred_index and result.created == 3800
    assert errors == []
    assert len(answered) > 0 and all(answered)  # exact scans while the index was gone: always right
    for i in range(0, 4000, 97):
        assert bulk_store.search(collection=collection_name, vector=vectors[i], k=1)[0].external_id == f"r{i}"


def test_a_load_killed_mid_way_leaves_nothing_unindexed_for_long(
    bulk_store: VectorStore, engine: sa.Engine, settings: Settings, collection_name: str, tmp_path: Path
) -> None:
    """SIGKILL the loading process after some batches: the rows it committed stay, the maintenance
    worker's next pass (or the next load) builds the index, nothing is lost."""
    c = bulk_store.create_collection(name=collection_name, dimensions=8)
    script = tmp_path / "load.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import time
            import numpy as np
            from memstore.models import ItemIn
            from memstore.settings import Settings
            from memstore.store import VectorStore
            from memstore.db.core import create_engine

            settings = Settings(database_url={settings.database_url!r}, bulk_min_rows=100)
            store = VectorStore(create_engine(settings.database_url), settings=settings)
            rng = np.random.default_rng(14)

            def items():
                for i in range(100_000):
                    if i and i % 200 == 0:
                        time.sleep(0.2)
                    yield ItemIn(vector=rng.normal(size=8).astype(np.float32), external_id=f"k{{i}}")

            store.bulk_load(collection={collection_name!r}, items=items(), total=100_000, batch_rows=200)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            loading = bulk_load.in_progress(bulk_store.get_collection(name=collection_name, fresh=True))
            if loading and bulk_store.collection_stats(name=collection_name).items >= 600:
                break
            assert proc.poll() is None, "the loading process ended early"
            time.sleep(0.1)
        else:
            pytest.fail("the load never got going")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    interrupted = bulk_store.get_collection(name=collection_name, fresh=True)
    assert bulk_load.in_progress(interrupted)
    assert _hnsw_indexes(engine, c.table_name) == []  # the index is gone and nobody is building it
    assert _indexes(engine, c.table_name, "gin") == []  # the metadata and keyword indexes too
    committed = bulk_store.collection_stats(name=collection_name).items
    worker = MaintenanceWorker(Database(engine), settings=bulk_store.settings, collections=[collection_name])
    try:
        worker.run_once()
    finally:
        worker.close()
    assert [(o.decision, o.outcome) for o in worker.last_outcomes][:1] == [("build", "ok")]
    assert [valid for _, valid in _hnsw_indexes(engine, c.table_name)] == [True]
    assert [valid for _, valid in _indexes(engine, c.table_name, "gin")] == [True]
    assert not bulk_load.in_progress(bulk_store.get_collection(name=collection_name, fresh=True))
    assert bulk_store.collection_stats(name=collection_name).items == committed
    assert not bulk_load.finish_interrupted(bulk_store.db, interrupted, bulk_store.settings)  # nothing left


def test_a_load_waits_for_nobody_when_the_collection_is_busy(
    bulk_store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    """While a maintenance rebuild holds the index, a large load goes into the live graph instead."""
    from memstore.db import locks

    rng = np.random.default_rng(15)
    vectors = rng.normal(size=(800, 8)).astype(np.float32)
    c = bulk_store.create_collection(name=collection_name, dimensions=8)
    with bulk_store.db.dedicated(application_name="test-maint") as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (locks.index_key(c.index_name),))
        before = _hnsw_indexes(engine, c.table_name)
        started = time.monotonic()
        result = bulk_store.bulk_load(collection=collection_name, items=_items(vectors))
        assert not result.deferred_index and result.created == 800
        assert time.monotonic() - started < 60
        assert _hnsw_indexes(engine, c.table_name) == before


def test_bad_arguments_are_refused_before_anything_is_written(bulk_store: VectorStore, collection_name: str) -> None:
    from memstore.errors import InvalidInputError

    bulk_store.create_collection(name=collection_name, dimensions=4)
    for bad in ({"batch_rows": 0}, {"batch_rows": True}, {"connections": 0}, {"connections": 65}):
        with pytest.raises(InvalidInputError):
            bulk_store.bulk_load(collection=collection_name, items=[], **bad)  # type: ignore[arg-type]
    assert bulk_store.collection_stats(name=collection_name).items == 0


def test_a_collection_dropped_during_its_load_ends_the_load_with_not_found(
    bulk_store: VectorStore, collection_name: str
) -> None:
    from memstore.errors import CollectionNotFoundError

    rng = np.random.default_rng(16)
    vectors = rng.normal(size=(1500, 8)).astype(np.float32)
    bulk_store.create_collection(name=collection_name, dimensions=8)

    def items() -> Iterator[ItemIn]:
        for i, item in enumerate(_items(vectors)):
            if i == 700:
                bulk_store.drop_collection(name=collection_name)
            yield item

    with pytest.raises(CollectionNotFoundError):
        bulk_store.bulk_load(collection=collection_name, items=items(), total=1500, batch_rows=500, connections=1)
    assert collection_name not in {c.name for c in bulk_store.list_collections()}


def test_the_last_occurrence_wins_whatever_the_connections(bulk_store: VectorStore, collection_name: str) -> None:
    """A stream that names one id again later: side by side, each id goes to one connection, which
    writes its batches in the stream's order."""
    bulk_store.create_collection(name=collection_name, dimensions=4, metric="l2")
    rng = np.random.default_rng(3)
    versions = [ItemIn(vector=rng.normal(size=4), external_id=f"doc{v % 3}", metadata={"v": v}) for v in range(60)]
    for connections in (1, 4):
        result = bulk_store.bulk_load(
            collection=collection_name, items=iter(versions), batch_rows=1, connections=connections
        )
        assert result.rows == 60 and not result.deferred_index
        for d in range(3):
            assert bulk_store.get_item(collection=collection_name, external_id=f"doc{d}").metadata == {"v": 57 + d}


def test_a_load_sent_again_keeps_the_indexes(bulk_store: VectorStore, engine: sa.Engine, collection_name: str) -> None:
    """The same 600 rows again (a nightly sync of one file): they change nothing, so the indexes stay
    and searches keep their graph; a load of new rows as large still builds afresh."""
    c = bulk_store.create_collection(name=collection_name, dimensions=8)
    vectors = np.random.default_rng(4).normal(size=(1200, 8)).astype(np.float32)
    first = bulk_store.bulk_load(collection=collection_name, items=_items(vectors[:600]))
    assert first.deferred_index and first.created == 600
    before = _hnsw_indexes(engine, c.table_name)
    again = bulk_store.bulk_load(collection=collection_name, items=iter(_items(vectors[:600])))
    assert (again.deferred_index, again.unchanged) == (False, 600)
    assert _hnsw_indexes(engine, c.table_name) == before
    assert bulk_store.upsert_items(collection=collection_name, items=_items(vectors[:600]))[0].status != "created"
    assert _hnsw_indexes(engine, c.table_name) == before
    more = bulk_store.bulk_load(collection=collection_name, items=_items(vectors[600:], start=600))
    assert more.deferred_index and more.created == 600


def test_a_load_into_segments_builds_through_its_seals(bulk_store: VectorStore, collection_name: str) -> None:
    bulk_store.create_collection(name=collection_name, dimensions=8, write_path="segments")
    vectors = np.random.default_rng(5).normal(size=(600, 8)).astype(np.float32)
    result = bulk_store.bulk_load(collection=collection_name, items=_items(vectors))
    assert result.created == 600 and not result.deferred_index
