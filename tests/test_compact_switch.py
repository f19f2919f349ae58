"""Compact indexes online: switching while searches run, writes reaching the side table, refit on drift."""

from __future__ import annotations

import threading
import time

import numpy as np
import psycopg
import pytest
from psycopg import sql

from maintenance.compact_index import CompactUpkeep, _queries, default_executor, maintain_compact_index
from memstore.catalog import index_spec as specs
from memstore.compact import ddl
from memstore.compact.switch import reconcile
from memstore.db.core import libpq_url
from memstore.models import ItemIn
from memstore.store import VectorStore
from tests.maintenance.maint_helpers import Blocker, ccnew_exists, invalid_indexes, wait_for
from tests.test_compact import _fill, low_rank_data


def _side_consistent(store: VectorStore, name: str) -> tuple[int, int, int]:
    """(rows with a vector, side rows, side rows whose vector is not the projection of the row's)."""
    c = store.get_collection(name=name, fresh=True)
    spec = specs.index_spec(c)
    assert spec.version is not None
    side = sql.Identifier(specs.side_table(c.id, spec.version))
    # One statement, so one snapshot: the test's writer keeps adding rows while this counts.
    with store.db.write() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT (SELECT count(*) FROM {t} WHERE embedding IS NOT NULL), (SELECT count(*) FROM {s}), "
                "(SELECT count(*) FROM {s} s LEFT JOIN {t} m USING (id) "
                "CROSS JOIN (SELECT components, offsets, unit_norm FROM memstore_projections WHERE id = %s) p "
                "WHERE m.embedding IS NULL OR "
                "s.v <-> memstore_project(m.embedding, p.components, p.offsets, p.unit_norm) > 1e-3)"
            ).format(s=side, t=c.table),
            (spec.projection_id,),
        ).fetchone()
    assert row is not None
    live, held, stale = row
    return int(live), int(held), int(stale)


def test_switching_online_keeps_searches_answering(store: VectorStore, collection_name: str) -> None:
    rows = low_rank_data(1200, 48, 8, seed=11)
    store.create_collection(name=collection_name, dimensions=48)
    _fill(store, collection_name, rows)
    stop = threading.Event()
    answered: list[int] = []
    errors: list[BaseException] = []
    reader = VectorStore(store.db, settings=store.settings)  # its own collection cache, as another process

    def search_loop() -> None:
        rng = np.random.default_rng(12)
        while not stop.is_set():
            try:
                q = rows[rng.integers(0, len(rows))]
                answered.append(len(reader.search(collection=collection_name, vector=q, k=5)))
            except BaseException as exc:  # any error is a failure of the switch
                errors.append(exc)

    def write_loop() -> None:
        i = 0
        while not stop.is_set():
            vector = low_rank_data(1, 48, 8, seed=100 + i)[0]
            store.upsert_item(collection=collection_name, vector=vector, external_id=f"w{i % 50}")
            i += 1
            time.sleep(0.01)

    threads = [threading.Thread(target=search_loop), threading.Thread(target=write_loop)]
    for t in threads:
        t.start()
    seen = []
    try:
        for representation, rank in (("lowrank", 8), ("halfvec", None), ("binary", None), ("full", None)):
            before = len(answered)
            # A short grace: the reader's cache outlives it, so its stale searches hit the dropped
            # index or side table, and must still answer (retried on the new representation).
            spec = store.set_index_representation(
                collection=collection_name, representation=representation, rank=rank, grace_s=0.2
            )
            if representation == "lowrank":
                live, held, stale = _side_consistent(store, collection_name)
                assert (held, stale) == (live, 0)
            seen.append(spec.representation)
            time.sleep(0.3)
            assert len(answered) > before, f"no search answered during the switch to {representation}"
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert seen == ["lowrank", "halfvec", "binary", "full"]
    assert answered and set(answered) == {5}
    c = store.get_collection(name=collection_name, fresh=True)
    with store.db.write() as conn:
        names = {
            r[0]
            for r in conn.execute(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = to_regclass(%s)", (c.table_name,)
            )
        }
        sides = conn.execute("SELECT count(*) FROM pg_class WHERE starts_with(relname, %s)", (f"memstore_lr_c{c.id}_",))
        assert sides.fetchone() == (0,)
    assert c.index_name in names and not any(n.startswith("memstore_next") for n in names)


def test_every_write_path_reaches_the_side_table(store: VectorStore, collection_name: str) -> None:
    rows = low_rank_data(600, 32, 6, seed=13)
    store.create_collection(name=collection_name, dimensions=32, partitions=2)
    _fill(store, collection_name, rows)
    store.set_index_representation(collection=collection_name, representation="lowrank", rank=8, grace_s=0)
    c = store.get_collection(name=collection_name, fresh=True)
    new = low_rank_data(60, 32, 6, seed=14)
    _fill(store, collection_name, new[:40], start=1000)  # COPY path (over the COPY threshold)
    store.upsert_item(collection=collection_name, vector=new[40], external_id="one")  # direct path
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=new[41], external_id="3")])  # update
    store.update_item(collection=collection_name, external_id="4", vector=new[42])
    store.update_item(collection=collection_name, external_id="5", metadata={"only": "metadata"})
    store.delete_items(collection=collection_name, external_ids=["6", "7"])
    with store.db.write() as conn:
        # As the ingest queue writes vectors, and as it re-queues an item (vector cleared).
        conn.execute(sql.SQL("UPDATE {} SET embedding = %s WHERE external_id = '8'").format(c.table), (new[43],))
        conn.execute(sql.SQL("UPDATE {} SET embedding = NULL WHERE external_id = '9'").format(c.table))
    live, held, stale = _side_consistent(store, collection_name)
    assert live == 600 + 40 + 1 - 2 - 1
    assert (held, stale) == (live, 0)
    top = store.search(collection=collection_name, vector=new[42], k=1)
    assert top[0].external_id == "4"


def test_low_rank_at_creation_waits_for_rows_then_is_made(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=32, representation="lowrank", rank=8)
    spec = specs.index_spec(store.get_collection(name=collection_name))
    assert spec.representation == "full" and spec.pending == {
        "representation": "lowrank",
        "rank": 8,
        "pool_factor": None,
    }
    rows = low_rank_data(300, 32, 6, seed=15)
    _fill(store, collection_name, rows[:50])
    early = maintain_compact_index(store.db, collection=collection_name, grace_s=0)
    assert early.outcome == "skipped" and early.action is None
    _fill(store, collection_name, rows[50:], start=50)
    made = maintain_compact_index(store.db, collection=collection_name, grace_s=0)
    assert made.action == "make_pending" and made.outcome == "ok", made
    assert made.spec["representation"] == "lowrank" and made.spec["rank"] == 8
    assert made.recall_after >= 0.9


def test_recall_drop_after_drift_triggers_a_recorded_refit(store: VectorStore, collection_name: str) -> None:
    """Data moves to another subspace: the old projection loses it; the refit finds it again."""
    store.create_collection(name=collection_name, dimensions=64)
    _fill(store, collection_name, low_rank_data(2000, 64, 8, seed=16, noise=0.05, block=0))
    store.set_index_representation(collection=collection_name, representation="lowrank", rank=8, grace_s=0)
    healthy = maintain_compact_index(store.db, collection=collection_name, min_recall=0.9, grace_s=0)
    assert healthy.action is None and healthy.recall >= 0.9, healthy
    # Every item replaced by a point of an orthogonal 8-dimensional subspace.
    _fill(store, collection_name, low_rank_data(2000, 64, 8, seed=17, noise=0.05, block=1))
    result = maintain_compact_index(store.db, collection=collection_name, min_recall=0.9, grace_s=0)
    assert result.action == "refit_projection" and result.outcome == "ok", result
    assert result.recall < 0.9 <= result.recall_after
    assert result.spec["version"] == 2
    with store.db.write() as conn:
        action = conn.execute(
            "SELECT action, outcome, reason, index_name, before -> 'probe' ->> 'recall', after -> 'spec' ->> 'version' "
            "FROM memstore_maintenance_actions WHERE collection = %s ORDER BY id DESC LIMIT 1",
            (collection_name,),
        ).fetchone()
        statuses = conn.execute(
            "SELECT version, status FROM memstore_projections p JOIN memstore_collections c ON c.id = p.collection_id "
            "WHERE c.name = %s ORDER BY version",
            (collection_name,),
        ).fetchall()
    assert action is not None
    assert action[:2] == ("refit_projection", "ok") and "below 0.9" in action[2]
    assert action[3].endswith("_v1_hnsw") and float(action[4]) == pytest.approx(result.recall)
    assert action[5] == "2"
    assert statuses == [(1, "retired"), (2, "active")]


def test_an_action_that_left_recall_low_is_not_repeated_every_pass(store: VectorStore, collection_name: str) -> None:
    """Binary codes re-ranked from a pool of exactly k cannot reach recall 0.99 on noisy data: a rebuild
    is tried once, the next pass says why it does nothing, and past the back-off or after a change of
    the index (a larger pool) it acts again."""
    store.create_collection(name=collection_name, dimensions=64)
    _fill(store, collection_name, low_rank_data(1500, 64, 16, seed=21, noise=0.3))
    store.set_index_representation(collection=collection_name, representation="binary", pool_factor=1.0, grace_s=0)
    first = maintain_compact_index(store.db, collection=collection_name, min_recall=0.99, grace_s=0)
    assert first.action == "rebuild_compact_index" and first.outcome == "ok" and first.still_below, first
    again = maintain_compact_index(store.db, collection=collection_name, min_recall=0.99, grace_s=0)
    assert again.action is None and again.outcome == "skipped", again
    assert "would not help" in again.reason and again.recall < 0.99
    late = maintain_compact_index(store.db, collection=collection_name, min_recall=0.99, grace_s=0, retry_after_s=0)
    assert late.action == "rebuild_compact_index", late
    store.set_index_representation(collection=collection_name, representation="binary", pool_factor=2.0, grace_s=0)
    changed = maintain_compact_index(store.db, collection=collection_name, min_recall=0.99, grace_s=0)
    assert changed.outcome == "ok", changed  # measured, and acted on if still low: not skipped


def test_reconcile_drops_what_a_crashed_switch_left(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=16)
    _fill(store, collection_name, low_rank_data(300, 16, 4, seed=18))
    c = store.get_collection(name=collection_name)
    with ddl.connect(store.db) as conn:
        ddl.build_next_index(conn, c, "binary")  # built, never flipped
        conn.execute(f"CREATE TABLE memstore_lr_c{c.id}_v9 (id bigint PRIMARY KEY, v halfvec(4))")
        done = reconcile(conn, c)
        assert done == [f"dropped unfinished {specs.next_index(c.id)}", "dropped side table v9"]
        assert [ix["name"] for ix in ddl.main_indexes(conn, c)] == [c.index_name]
        assert ddl.side_versions(conn, c) == []
    assert len(store.search(collection=collection_name, vector=np.ones(16), k=3)) == 3


def test_drop_collection_drops_side_tables(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=16)
    _fill(store, collection_name, low_rank_data(300, 16, 4, seed=19))
    store.set_index_representation(collection=collection_name, representation="lowrank", rank=4, grace_s=0)
    cid = store.get_collection(name=collection_name).id
    store.drop_collection(name=collection_name)
    with store.db.write() as conn:
        left = conn.execute("SELECT count(*) FROM pg_class WHERE starts_with(relname, %s)", (f"memstore_lr_c{cid}_",))
        assert left.fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM memstore_projections WHERE collection_id = %s", (cid,)
        ).fetchone() == (0,)


def test_the_maintenance_worker_looks_after_compact_indexes(store: VectorStore, collection_name: str) -> None:
    """One pass of the maintenance worker measures a compact index and records what it saw."""
    from maintenance.worker import MaintenanceWorker

    rng = np.random.default_rng(7)
    store.create_collection(name=collection_name, dimensions=16, representation="binary")
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(rng.normal(size=(300, 16)))],
    )
    worker = MaintenanceWorker(store.db, settings=store.settings, collections=[collection_name])
    try:
        assert worker.run_once() == 0
        compact = [o for o in worker.last_outcomes if "compact_index" in o.decision or o.decision == "refit_projection"]
        assert compact, worker.last_outcomes
        assert compact[0].before["recall"] is not None, compact
    finally:
        worker.close()


def test_an_interrupted_compact_rebuild_leaves_no_invalid_index(
    store: VectorStore, collection_name: str, database_url: str
) -> None:
    """The upkeep's REINDEX runs through the maintenance worker's executor: it waits out an open
    transaction (no lock timeout), a stop request cancels it, and its ``*_ccnew`` copy, which every
    write would go on maintaining, is dropped."""
    store.create_collection(name=collection_name, dimensions=32)
    _fill(store, collection_name, low_rank_data(1500, 32, 8, seed=31))
    store.set_index_representation(collection=collection_name, representation="halfvec", grace_s=0)
    c = store.get_collection(name=collection_name, fresh=True)
    dsn = libpq_url(database_url)
    executor = default_executor(store.db)
    results: list[CompactUpkeep] = []

    def upkeep() -> None:  # a recall no index reaches: the graph is rebuilt
        results.append(
            maintain_compact_index(store.db, collection=collection_name, min_recall=1.01, grace_s=0, executor=executor)
        )

    with psycopg.connect(dsn, autocommit=True) as conn:
        blocker = Blocker(dsn, c.table_name)
        t = threading.Thread(target=upkeep)
        t.start()
        try:
            wait_for(lambda: ccnew_exists(conn, c.table_name), timeout=60)
            executor.stop.set()
            time.sleep(0.8)  # the watchdog cancels the statement
        finally:
            blocker.release()
        t.join(60)
        [seen] = results
        assert seen.action == "rebuild_compact_index" and seen.outcome == "interrupted", seen
        assert invalid_indexes(conn, c.table_name) == []
        row = conn.execute(
            "SELECT action, outcome FROM memstore_maintenance_actions WHERE collection = %s ORDER BY id DESC LIMIT 1",
            (collection_name,),
        ).fetchone()
    assert row == ("rebuild_compact_index", "interrupted")
    assert len(store.search(collection=collection_name, vector=low_rank_data(1, 32, 8, seed=31)[0], k=5)) == 5


def test_without_query_samples_the_compact_probe_asks_stand_ins(store: VectorStore, collection_name: str) -> None:
    """A stored row as a query finds itself through any graph: recall near 1.0 whatever the index."""
    rows = low_rank_data(600, 32, 8, seed=33)
    store.create_collection(name=collection_name, dimensions=32)
    _fill(store, collection_name, rows)
    c = store.get_collection(name=collection_name, fresh=True)
    with ddl.connect(store.db) as conn:
        queries, source = _queries(conn, store, c, 8)
        stored = np.stack([r[0].to_numpy() for r in conn.execute(sql.SQL("SELECT embedding FROM {}").format(c.table))])
    assert source == "stand_ins" and len(queries) == 8
    nearest = np.linalg.norm(np.stack(queries)[:, None, :] - stored[None, :, :], axis=2).min(axis=1)
    assert (nearest > 1e-4).all(), nearest
