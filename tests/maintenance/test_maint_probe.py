"""Probes against a real database: recall agrees with numpy, sizes, counters, query samples."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

import memstore.search.exact_answers as exact_answers_module
from maintenance.config import MaintenanceConfig
from maintenance.probes import probe
from maintenance.recall import (
    exact_answers,
    exact_settings,
    index_search,
    index_settings,
    measure_recall,
    sample_queries,
)
from maintenance.sizing import estimate_index_bytes
from maintenance.targets import targets_for
from memstore.catalog.collections import Collection
from memstore.db.vector_copy import CopyFormatError, stream_vectors
from memstore.models import ItemIn
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.search.exact_answers import STREAM_FROM, bounded_in_server, uses_found
from memstore.search.statements import SearchSettings, apply
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker
from tests.api.api_helpers import FakeBackend
from tests.maintenance.conftest import settle_live_count
from tests.maintenance.maint_helpers import churn, clustered


def _all_vectors(
    conn: psycopg.Connection[Any], c: Collection, *, with_vector: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    where = " WHERE embedding IS NOT NULL" if with_vector else ""
    rows = conn.execute(f'SELECT id, embedding FROM "{c.table_name}"{where} ORDER BY id').fetchall()
    return np.array([r[0] for r in rows]), np.stack([r[1].to_numpy() for r in rows])


def test_recall_probe_agrees_with_numpy(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(3000, 24, seed=3)
    churn(conn, c, update=0.2, delete=0.1)
    [target] = targets_for(conn, c)
    queries = clustered(60, 24, seed=99)
    k = 10
    # A small ef_search so the index misses some neighbours: the comparison must be non-trivial.
    result = measure_recall(
        conn, target, k=k, sample=60, budget_s=60, ef_search=10, max_scan_tuples=20_000, queries=list(queries)
    )
    ids, vectors = _all_vectors(conn, c)
    distances = 1.0 - (queries @ vectors.T) / np.linalg.norm(vectors, axis=1)  # cosine distance
    truth = [set(ids[np.argsort(d, kind="stable")[:k]].tolist()) for d in distances]
    assert result.queries == 60 and result.source == "given"
    assert [set(e) for e in result.exact] == truth
    expected = sum(len(set(f) & t) for f, t in zip(result.found, truth, strict=True)) / (k * len(truth))
    assert result.recall is not None and abs(result.recall - expected) < 1e-9
    assert 0.3 < expected <= 1.0


def _numpy_distances(metric: str, queries: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    if metric == "l2":
        return np.linalg.norm(queries[:, None, :] - vectors[None, :, :], axis=2)
    if metric == "inner_product":
        return -(queries @ vectors.T)
    return 1.0 - (queries @ vectors.T) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(queries, axis=1)[:, None]


@pytest.mark.parametrize("metric", ["l2", "inner_product"])
def test_exact_answers_from_one_scan_match_numpy_even_when_bounds_mislead(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection], metric: str
) -> None:
    """The one-scan exact answers trust the index's k-th distance as a bound; a bound that holds fewer
    than k rows, or a query the index answered short, must still get the true k nearest."""
    c = make_collection(600, 12, metric=metric, seed=4)
    [target] = targets_for(conn, c)
    queries = clustered(6, 12, seed=8)
    ids, vectors = _all_vectors(conn, c)
    distances = _numpy_distances(metric, queries, vectors)
    k = 7
    order = [np.argsort(d, kind="stable") for d in distances]
    honest = [[(int(ids[j]), float(d[j])) for j in o[k : 2 * k]] for o, d in zip(order, distances, strict=True)]
    found = [
        honest[0],  # the index's k answers, not the best: a loose bound, still a valid one
        honest[1],
        [(int(ids[j]), float(distances[2][j])) for j in order[2][:k]],  # exactly right
        [(i, d - 10.0) for i, d in honest[3]],  # too tight: fewer than k rows within it
        honest[4][: k - 2],  # the index answered short: no bound at all
        [],
    ]
    with conn.transaction(), conn.cursor() as cur:
        apply(cur, exact_settings(ef_search=40, max_scan_tuples=20_000))
        answers = exact_answers(cur, target, list(queries), found, k)
    for o, d, answer in zip(order, distances, answers, strict=True):
        assert [i for i, _ in answer] == [int(ids[j]) for j in o[:k]]
        assert np.allclose([x for _, x in answer], d[o[:k]], atol=1e-5)


@pytest.mark.parametrize("chunk", [50, 200])
@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_exact_answers_ranked_in_the_client_match_numpy(
    conn: psycopg.Connection[Any],
    make_collection: Callable[..., Collection],
    metric: str,
    chunk: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tuning's hundreds of queries stream the rows once and rank them in the client: the same k
    nearest as numpy's brute force and as the server's own scan, duplicates and rows without a
    vector included (and, under cosine, a zero vector, whose distance is NaN: ranked last), the
    rows in chunks (each query's best carried from chunk to chunk, and its candidates in a chunk
    chosen by its bar: of 50 rows, all of them or a sort; of 200, the few within it)."""
    monkeypatch.setattr(exact_answers_module, "STREAM_CELLS", 1)
    monkeypatch.setattr(exact_answers_module, "MIN_CHUNK_ROWS", chunk)
    c = make_collection(400, 12, metric=metric, seed=6)
    first = conn.execute(f'SELECT embedding FROM "{c.table_name}" ORDER BY id LIMIT 1').fetchone()
    assert first is not None
    conn.execute(f"INSERT INTO \"{c.table_name}\" (external_id, embedding) VALUES ('dup', %s)", (first[0],))
    conn.execute(f"INSERT INTO \"{c.table_name}\" (external_id, embedding, status) VALUES ('none', NULL, 'pending')")
    if metric == "cosine":
        conn.execute(f"INSERT INTO \"{c.table_name}\" (external_id, embedding) VALUES ('zero', %s)", (np.zeros(12),))
    # Rows of many lengths, so that the three distances order them differently.
    rng = np.random.default_rng(11)
    for i, v in enumerate(clustered(200, 12, seed=10)):
        conn.execute(
            f'INSERT INTO "{c.table_name}" (external_id, embedding) VALUES (%s, %s)', (f"s{i}", v * rng.uniform(0.2, 5))
        )
    [target] = targets_for(conn, c)
    n = STREAM_FROM + 6
    queries = np.concatenate([clustered(n - 1, 12, seed=9), [first[0].to_numpy()]])  # the last: a duplicated row
    ids, vectors = _all_vectors(conn, c, with_vector=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        distances = np.nan_to_num(_numpy_distances(metric, queries, vectors), nan=np.inf)
    k = 8
    order = [np.lexsort((ids, d))[:k] for d in distances]
    assert not uses_found(len(queries))
    with conn.transaction(), conn.cursor() as cur:
        apply(cur, exact_settings(ef_search=40, max_scan_tuples=20_000))
        answers = exact_answers(cur, target, list(queries), [[] for _ in queries], k)
        in_server = bounded_in_server(
            cur,
            table=target.table,
            operator=c.spec.operator,
            dimensions=12,
            queries=list(queries[:5]),
            found=[[] for _ in range(5)],
            k=k,
        )
    for o, d, answer in zip(order, distances, answers, strict=True):
        assert [i for i, _ in answer] == [int(ids[j]) for j in o]
        assert np.allclose([x for _, x in answer], d[o], rtol=1e-6, atol=1e-6)
    assert [[i for i, _ in a] for a in in_server] == [[i for i, _ in a] for a in answers[:5]]
    # The duplicated row's query finds both copies at distance 0 (cosine, l2), nearest first.
    if metric != "inner_product":
        assert answers[-1][0][1] == pytest.approx(0.0, abs=1e-6)
        assert answers[-1][1][1] == pytest.approx(0.0, abs=1e-6)


def test_exact_answers_ranked_in_the_client_on_a_table_of_fewer_than_k_rows(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(5, 6, metric="l2", seed=4)
    [target] = targets_for(conn, c)
    queries = clustered(STREAM_FROM, 6, seed=5)
    ids, vectors = _all_vectors(conn, c)
    distances = _numpy_distances("l2", queries, vectors)
    with conn.transaction(), conn.cursor() as cur:
        answers = exact_answers(cur, target, list(queries), [[] for _ in queries], 8)
    assert [[i for i, _ in a] for a in answers] == [[int(ids[j]) for j in np.argsort(d)] for d in distances]


def test_stored_vectors_stream_in_chunks_and_a_wrong_layout_is_an_error(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(250, 6, seed=2)
    conn.execute(f"INSERT INTO \"{c.table_name}\" (external_id, embedding, status) VALUES ('none', NULL, 'pending')")
    ids, vectors = _all_vectors(conn, c, with_vector=True)
    with conn.transaction(), conn.cursor() as cur:
        chunks = list(stream_vectors(cur, c.table_name, 6, chunk_rows=40))
    assert len(chunks) >= 250 // 40 and all(len(i) <= 2 * 40 + 40 for i, _ in chunks)
    got_ids = np.concatenate([i for i, _ in chunks])
    got = np.concatenate([v for _, v in chunks])
    assert got.dtype == np.float32 and got.shape == (250, 6)
    by_id = dict(zip(got_ids.tolist(), got, strict=True))
    assert sorted(by_id) == sorted(ids.tolist())
    assert all(np.array_equal(by_id[int(i)], v.astype(np.float32)) for i, v in zip(ids, vectors, strict=True))
    with conn.transaction(), conn.cursor() as cur, pytest.raises(CopyFormatError):
        list(stream_vectors(cur, c.table_name, 5))


def test_recall_probe_prefers_sampled_real_queries(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(800, 8)
    [target] = targets_for(conn, c)
    stored = measure_recall(conn, target, k=5, sample=7, budget_s=10, ef_search=40, max_scan_tuples=20_000)
    assert stored.source == "stand_ins" and stored.queries == 7 and stored.recall is not None
    for v in clustered(3, 8, seed=5):
        conn.execute("INSERT INTO memstore_query_samples (collection_id, embedding) VALUES (%s, %s)", (c.id, v))
    sampled = measure_recall(conn, target, k=5, sample=7, budget_s=10, ef_search=40, max_scan_tuples=20_000)
    assert sampled.source == "query_samples" and sampled.queries == 3
    # A confirming second sample takes the samples the first did not use, then stored vectors.
    assert len(set(sampled.sample_ids)) == 3
    used = sampled.sample_ids[:2]
    rest = measure_recall(conn, target, k=5, sample=7, budget_s=10, ef_search=40, max_scan_tuples=20_000, exclude=used)
    assert rest.source == "query_samples" and rest.queries == 1 and set(rest.sample_ids) == set(sampled.sample_ids[2:])
    past = measure_recall(
        conn, target, k=5, sample=7, budget_s=10, ef_search=40, max_scan_tuples=20_000, exclude=sampled.sample_ids
    )
    assert past.source == "stand_ins" and past.queries == 7 and past.sample_ids == ()


def test_without_query_samples_the_probe_asks_stand_ins_not_stored_rows(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """A stored row is a node of the graph, its neighbour list its answer: as a query it reads recall
    near 1.0 whatever the graph. With no API samples the probe asks stand-ins, as the tuning does."""
    c = make_collection(800, 8)
    [target] = targets_for(conn, c)
    queries, source, ids = sample_queries(conn, target, 10, max_scan_tuples=20_000)
    _, vectors = _all_vectors(conn, c)
    assert source == "stand_ins" and ids == () and len(queries) == 10
    nearest = np.linalg.norm(np.stack(queries)[:, None, :] - vectors[None, :, :], axis=2).min(axis=1)
    assert (nearest > 1e-4).all(), nearest


def test_probe_counts_dead_entries_and_size(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    c = make_collection(2000, 16)
    churn(conn, c, update=0.1, delete=0.05)
    # A budget no loaded machine can exhaust: the probe's size must not depend on how busy the cores are.
    config = MaintenanceConfig(  # type: ignore[call-arg]
        _env_file=None, recall_sample=8, recall_budget_s=3600, recall_cost_fraction=1e6
    )
    [target] = targets_for(conn, c)
    p = probe(conn, target, config, max_scan_tuples=20_000)
    assert p.live_rows == 1900
    # Every update and delete left a dead entry (no vacuum has run: the statistics say so directly).
    assert p.dead_entries == 300
    assert abs(p.dead_fraction - 300 / 1900) < 1e-9
    assert p.index_bytes > p.fresh_bytes  # the dead elements are still in the graph
    assert p.recall is not None and p.recall.queries == 8


def test_fresh_size_estimate_matches_a_real_build(conn: psycopg.Connection[Any]) -> None:
    for dims, n in ((16, 3000), (128, 2000), (1024, 200)):
        conn.execute("DROP TABLE IF EXISTS sizing_check")
        conn.execute(f"CREATE TABLE sizing_check (id bigint, embedding vector({dims}))")
        conn.execute(
            f"INSERT INTO sizing_check SELECT i, (SELECT array_agg(random())::real[]::vector({dims}) "
            f"FROM generate_series(1, {dims}) WHERE i > 0) FROM generate_series(1, {n}) AS i"
        )
        conn.execute("CREATE INDEX sizing_check_hnsw ON sizing_check USING hnsw (embedding vector_l2_ops)")
        real = conn.execute("SELECT pg_relation_size('sizing_check_hnsw')").fetchone()[0]  # type: ignore[index]
        estimate = estimate_index_bytes(n, dims=dims, m=16)
        assert abs(estimate - real) / real < 0.1, (dims, estimate, real)
    conn.execute("DROP TABLE sizing_check")


def test_recall_probe_measures_the_index_even_where_the_planner_would_scan_the_table(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """On a small table the planner answers ORDER BY distance with an exact sequential scan; the
    probe must still read the graph, or it reports recall 1.0 whatever state the index is in."""
    c = make_collection(400, 64, seed=4)
    [target] = targets_for(conn, c)
    plan_of = psycopg.sql.SQL("EXPLAIN ") + index_search(target)
    params = {"q": clustered(1, 64, seed=8)[0], "k": 10}
    with conn.transaction():
        apply(conn.cursor(), SearchSettings(ef_search=40, exact=False, max_scan_tuples=20_000))
        store_plan = "\n".join(r[0] for r in conn.execute(plan_of, params))
    assert "Seq Scan" in store_plan  # the premise: left alone, the planner scans this table
    with conn.transaction():
        apply(conn.cursor(), index_settings(target, ef_search=40, k=10, max_scan_tuples=20_000))
        probe_plan = "\n".join(r[0] for r in conn.execute(plan_of, params))
    assert f"Index Scan using {target.index}" in probe_plan


def test_recall_probe_runs_inside_a_callers_transaction(dsn: str, make_collection: Callable[..., Collection]) -> None:
    """On its own the probe takes one repeatable-read snapshot; inside a caller's open transaction it
    uses that transaction's (setting the isolation level there would be an error)."""
    c = make_collection(300, 8)
    with psycopg.connect(dsn) as tx:
        register_vector(tx)
        tx.execute("SELECT 1")  # a transaction is now open
        [target] = targets_for(tx, c)
        r = measure_recall(tx, target, k=5, sample=6, budget_s=5, ef_search=40, max_scan_tuples=20_000)
        assert r.recall is not None and r.queries == 6
        assert tx.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still the caller's


def test_dead_entries_after_a_clean_are_counted_from_its_own_figure_not_stale_statistics(
    conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """Right after a compaction n_dead_tup may still hold the old count (the heap's dead tuples, which
    the new graph never held). The next probe must count from the action's recorded figure (0) plus
    what was killed since, or it calls for a needless VACUUM."""
    from maintenance import history

    c = make_collection(1000, 8)
    churn(conn, c, update=0.3)
    config = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]
    [target] = targets_for(conn, c)
    stale = probe(conn, target, config, max_scan_tuples=20_000, with_recall=False)
    assert stale.dead_entries == 300  # no clean recorded yet: the statistics' own figure
    # Recorded under the action's old name ('compact'), as history written before the rename is.
    action = history.start_action(conn, target, "compact", "test", stale.summary())
    history.finish_action(
        conn, action, outcome="ok", duration_s=0.1, after=stale.summary() | {"dead_entries": 0}, error=None
    )
    assert probe(conn, target, config, max_scan_tuples=20_000, with_recall=False).dead_entries == 0
    churn(conn, c, delete=0.05)
    assert probe(conn, target, config, max_scan_tuples=20_000, with_recall=False).dead_entries == 50


def _wait_for_counters(conn: psycopg.Connection[Any], c: Collection, updates: int, timeout_s: float = 30.0) -> None:
    """Until the closed backends' updates are in the statistics (each reports as it exits)."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT coalesce(sum(n_tup_upd), 0) FROM pg_stat_user_tables WHERE relid = ANY(%s::regclass[])",
            (c.partition_tables(),),
        ).fetchone()
        if row is not None and int(row[0]) >= updates:
            return
        assert time.monotonic() < deadline, f"{row} updates counted after {timeout_s} s, {updates} made"
        time.sleep(0.05)


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_first_vector_written_into_a_stored_item_kills_no_graph_element(
    dsn: str, conn: psycopg.Connection[Any], store: VectorStore, collection_name: str, partitions: int
) -> None:
    """Texts are stored without a vector and given one by the ingest worker's UPDATE; the graph never
    held the old version, so a collection that only grew has no dead entries and no churn beyond its
    rows (it was read as all dead, and rebuilt for nothing). A real update still counts."""
    c = store.create_collection(name=collection_name, dimensions=64, partitions=partitions)
    jobs.enqueue(store.db, c, [PendingItem(text=f"note {i}", external_id=f"n{i}") for i in range(40)])
    worker = IngestWorker(store.db, FakeBackend(), settings=IngestSettings(batch_size=50))
    assert worker.run(once=True) == 0
    settle_live_count(dsn, store, c, 40)
    _wait_for_counters(conn, c, 40)
    config = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]
    probes = [probe(conn, t, config, max_scan_tuples=20_000, with_recall=False) for t in targets_for(conn, c)]
    assert sum(p.counters["vector_fills"] for p in probes) == 40
    # The heap holds the old versions (at least one per fill; other writes of the run may add some),
    # which the graph never held.
    assert sum(p.dead_tuples for p in probes) >= 40
    assert [p.dead_entries for p in probes] == [0] * partitions
    rng = np.random.default_rng(5)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=rng.normal(size=64), external_id=f"n{i}") for i in range(10)]
    )
    store.db.engine.dispose()
    _wait_for_counters(conn, c, 50)
    probes = [probe(conn, t, config, max_scan_tuples=20_000, with_recall=False) for t in targets_for(conn, c)]
    assert sum(p.dead_entries for p in probes) == 10


def _fresh_index(
    conn: psycopg.Connection[Any], dsn: str, store: VectorStore, name: str, representation: str, dims: int, n: int
) -> Collection:
    """A collection of ``n`` rows on an index of ``representation``, rebuilt so it is packed as a fresh build."""
    store.create_collection(name=name, dimensions=dims, representation=representation)
    vectors = clustered(n, dims, seed=5)
    for s in range(0, n, 1000):
        store.upsert_items(
            collection=name,
            items=[ItemIn(vector=v, external_id=f"e{s + i}") for i, v in enumerate(vectors[s : s + 1000])],
        )
    c = store.get_collection(name=name, fresh=True)
    settle_live_count(dsn, store, c, n)
    conn.execute(f'REINDEX INDEX "{c.index_name}"')
    return c


@pytest.mark.parametrize(
    ("representation", "dims"), [("full", 128), ("halfvec", 128), ("binary", 128), ("binary", 768)]
)
def test_a_fresh_compact_index_reads_a_size_ratio_near_one(
    conn: psycopg.Connection[Any], dsn: str, store: VectorStore, collection_name: str, representation: str, dims: int
) -> None:
    """A compact index holds 2 bytes a dimension (halfvec) or 1 bit (binary), not 4. Sized as float32,
    fresh builds read 0.70 (halfvec), 0.39 and 0.10 (binary, 128 and 768 dimensions): the size rule
    fired only once bloat had outgrown the float32 size, or (binary) never. Fresh, each must read healthy."""
    n = 2000
    c = _fresh_index(conn, dsn, store, collection_name, representation, dims, n)
    [target] = targets_for(conn, c)
    assert target.index == c.index_name
    config = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]
    p = probe(conn, target, config, max_scan_tuples=20_000, with_recall=False)
    assert p.live_rows == n
    assert 0.9 < p.size_ratio < config.max_size_ratio, (p.index_bytes, p.fresh_bytes)
    assert p.summary()["representation"] == representation  # what a rebuild's correction is kept for
    if representation == "full":
        assert p.fresh_bytes == estimate_index_bytes(n, dims=dims, m=16)  # float32 sizing is what it was


def test_a_rebuild_of_another_representation_does_not_correct_the_size(
    conn: psycopg.Connection[Any], dsn: str, store: VectorStore, collection_name: str
) -> None:
    """The bytes per row of the last rebuild correct the estimate of the index it built; once the
    collection switched to halfvec, the float32 index's figures would scale the halfvec estimate by
    its 4-byte vectors (a correction inside the bounds kept), and bloat would go unseen again."""
    from maintenance import history

    n = 2000
    c = _fresh_index(conn, dsn, store, collection_name, "halfvec", 128, n)
    [target] = targets_for(conn, c)
    config = MaintenanceConfig(_env_file=None)  # type: ignore[call-arg]
    fresh = probe(conn, target, config, max_scan_tuples=20_000, with_recall=False)
    # The float32 index's rebuild, recorded before the switch: its real bytes, its representation.
    built = fresh.summary() | {
        "representation": "full",
        "index_bytes": estimate_index_bytes(n, dims=128, m=16),
        "dead_entries": 0,
    }
    action = history.start_action(conn, target, "rebuild", "test", fresh.summary())
    history.finish_action(conn, action, outcome="ok", duration_s=0.1, after=built, error=None)
    p = probe(conn, target, config, max_scan_tuples=20_000, with_recall=False)
    assert p.index_bytes == fresh.index_bytes
    assert 0.9 < p.size_ratio < config.max_size_ratio, (p.index_bytes, p.fresh_bytes)
