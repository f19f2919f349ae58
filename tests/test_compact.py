"""Compact indexes: specs, projections, exact re-ranking of candidates, recall and size on real bge-m3."""

from __future__ import annotations

import numpy as np
import pytest
from pgvector import HalfVector, Vector
from psycopg import sql

from memstore.catalog import index_spec as specs
from memstore.compact import projection as proj
from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.search import compact as compact_search
from memstore.search import statements
from memstore.store import VectorStore


def low_rank_data(
    n: int, dims: int, latent: int, *, seed: int, noise: float = 0.3, block: int | None = None
) -> np.ndarray:
    """Points on a random ``latent``-dimensional subspace (clustered), plus isotropic noise.

    With ``block`` the subspace is block ``block`` of one fixed orthonormal basis: blocks are orthogonal.
    """
    rng = np.random.default_rng(seed)
    if block is None:
        basis, _ = np.linalg.qr(rng.normal(size=(dims, latent)))
    else:
        full, _ = np.linalg.qr(np.random.default_rng(1234).normal(size=(dims, dims)))
        basis = full[:, block * latent : (block + 1) * latent]
    centres = rng.normal(size=(20, latent))
    z = centres[rng.integers(0, 20, size=n)] + 0.5 * rng.normal(size=(n, latent))
    x = z @ basis.T
    x += rng.normal(scale=noise * np.sqrt((x**2).sum(1).mean() / dims), size=x.shape)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _fill(store: VectorStore, name: str, rows: np.ndarray, start: int = 0) -> None:
    items = [ItemIn(vector=v, external_id=str(start + i)) for i, v in enumerate(rows)]
    for s in range(0, len(items), 1000):
        store.upsert_items(collection=name, items=items[s : s + 1000])


# ---------------------------------------------------------------------- no database


def test_pool_defaults_and_bounds() -> None:
    assert specs.IndexSpec("full").pool(10) == 10
    assert specs.IndexSpec("lowrank").pool(10) == 10 * specs.DEFAULT_POOL_FACTOR["lowrank"]
    assert specs.IndexSpec("binary", pool_factor=3).pool(7) == 21
    assert specs.IndexSpec("halfvec").pool(900) == specs.MAX_POOL
    assert specs.IndexSpec("lowrank").pool(10, override=5) == 10  # never fewer than k
    spec = specs.IndexSpec("lowrank", rank=32, projection_id=4, version=2, pool_factor=6.0)
    assert specs.IndexSpec.from_options({specs.OPTIONS_KEY: spec.to_json()}) == spec


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"representation": "pq"}, "representation must be one of"),
        ({"representation": "halfvec", "rank": 8}, "rank applies to the lowrank"),
        ({"representation": "lowrank", "rank": 64}, "rank must be an integer between 1 and 31"),
        ({"representation": "binary", "pool_factor": 0.5}, "pool_factor must be"),
    ],
)
def test_bad_choices_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        specs.validate_choice(dimensions=32, **kwargs)


def test_fit_finds_the_subspace_and_choose_rank_the_latent_dimension() -> None:
    data = low_rank_data(3000, 96, 12, seed=3, noise=0.05)
    p = proj.fit(data, metric="cosine", rank=12)
    assert p.components.shape == (12, 96)
    assert np.allclose(p.components @ p.components.T, np.eye(12), atol=1e-4)
    assert p.kept_variance is not None and p.kept_variance > 0.95
    # Distances between projections track distances between the unit vectors.
    a, b = p.apply(data[:200]), p.apply(data[200:400])
    assert np.corrcoef(np.linalg.norm(a - b, axis=1), np.linalg.norm(data[:200] - data[200:400], axis=1))[0, 1] > 0.99
    assert proj.choose_rank(data, metric="cosine", pool=40) in (8, 16)


# ---------------------------------------------------------------------- database


def test_sql_projection_matches_numpy(store: VectorStore) -> None:
    data = low_rank_data(500, 48, 6, seed=4)
    for metric in ("cosine", "l2", "inner_product"):
        p = proj.fit(data * 3.0, metric=metric, rank=6)
        with store.db.write() as conn:
            row = conn.execute(
                "SELECT memstore_project(%s, %s, %s::real[], %s)::real[]",
                (data[0] * 3.0, [Vector(v) for v in p.components], p.offsets.tolist(), p.normalize),
            ).fetchone()
        assert row is not None
        assert np.allclose(row[0], p.apply(data[0] * 3.0), atol=2e-3), metric


@pytest.mark.parametrize("representation", ["halfvec", "binary", "lowrank"])
def test_reranking_returns_exactly_the_exact_order_among_candidates(
    store: VectorStore, collection_name: str, representation: str
) -> None:
    rows = low_rank_data(1500, 64, 10, seed=5)
    first = "full" if representation == "lowrank" else representation
    store.create_collection(name=collection_name, dimensions=64, representation=first)
    _fill(store, collection_name, rows)
    if representation == "lowrank":
        store.set_index_representation(collection=collection_name, representation="lowrank", rank=8, grace_s=0)
    c = store.get_collection(name=collection_name, fresh=True)
    spec = specs.index_spec(c)
    assert spec.representation == representation
    rng = np.random.default_rng(6)
    for q in low_rank_data(10, 64, 10, seed=7) + 0.01 * rng.normal(size=(10, 64)).astype(np.float32):
        q = q.astype(np.float32)
        results = store.search(collection=collection_name, vector=q, k=10)
        with store.db.write() as conn:
            # The store's own settings for this search, so the HNSW scan visits the same candidates.
            efs = max(c.default_ef_search, spec.pool(10))
            statements.apply(conn.cursor(), compact_search.settings(ef_search=efs, max_scan_tuples=20_000))
            params = {"q": q, "c": compact_search.compact_query(conn, spec, q), "pool": spec.pool(10)}
            candidates = conn.execute(compact_search.candidates_statement(c, spec), params).fetchall()
        assert len(candidates) == spec.pool(10)
        ids = np.array([int(r[1]) for r in candidates])
        exact = 1 - rows[ids] @ (q / np.linalg.norm(q))  # cosine distance on the full vectors
        expected = ids[np.argsort(exact, kind="stable")[:10]]
        assert [int(r.external_id) for r in results] == expected.tolist()
        assert [r.distance for r in results] == pytest.approx(np.sort(exact)[:10].tolist(), abs=1e-5)


def test_compact_search_plans_use_the_compact_index(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=32, representation="binary")
    _fill(store, collection_name, low_rank_data(600, 32, 6, seed=8))
    c = store.get_collection(name=collection_name)
    spec = specs.index_spec(c)
    q = np.ones(32, dtype=np.float32)
    with store.db.write() as conn:
        conn.execute("SELECT set_config('enable_seqscan', 'off', true)")
        plan = conn.execute(
            sql.SQL("EXPLAIN ") + compact_search.statement(c, spec, where=None),
            {"q": q, "c": compact_search.compact_query(conn, spec, q), "pool": 20, "k": 5},
        ).fetchall()
    text = "\n".join(r[0] for r in plan)
    assert f"Index Scan using {c.index_name}" in text, text


def test_recall_and_size_on_real_bge_m3(store: VectorStore, collection_name: str, bge_m3: np.ndarray) -> None:
    """Each representation on the 1,000 real embeddings: held-out queries, recall against exact search."""
    rng = np.random.default_rng(0)
    order = rng.permutation(len(bge_m3))
    queries, base = bge_m3[order[:60]], bge_m3[order[60:]]
    store.create_collection(name=collection_name, dimensions=1024)
    _fill(store, collection_name, base)
    truth = np.argsort(-(queries @ base.T), axis=1)[:, :10]
    sizes: dict[str, int] = {}
    recalls: dict[str, float] = {}
    for representation, rank in (("full", None), ("halfvec", None), ("binary", None), ("lowrank", 128)):
        store.set_index_representation(collection=collection_name, representation=representation, rank=rank, grace_s=0)
        c = store.get_collection(name=collection_name, fresh=True)
        spec = specs.index_spec(c)
        index = specs.side_index(c.id, spec.version) if representation == "lowrank" else c.index_name  # type: ignore[arg-type]
        with store.db.write() as conn:
            row = conn.execute("SELECT pg_relation_size(to_regclass(%s))", (index,)).fetchone()
        sizes[representation] = int(row[0]) if row else 0
        found = [
            [int(r.external_id) for r in store.search(collection=collection_name, vector=q, k=10)] for q in queries
        ]
        recalls[representation] = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)]))
    assert recalls["full"] >= 0.95, recalls
    assert recalls["halfvec"] >= 0.95, recalls
    assert recalls["lowrank"] >= 0.95, recalls
    assert recalls["binary"] >= 0.9, recalls
    # A 1024-dimension float32 element fills a page of its own; the compact ones share pages.
    assert sizes["halfvec"] < 0.6 * sizes["full"], sizes
    assert sizes["binary"] < 0.125 * sizes["full"], sizes
    assert sizes["lowrank"] < 0.125 * sizes["full"], sizes


def test_query_projection_is_what_the_side_table_holds(store: VectorStore, collection_name: str) -> None:
    rows = low_rank_data(400, 32, 5, seed=9)
    store.create_collection(name=collection_name, dimensions=32)
    _fill(store, collection_name, rows)
    spec = store.set_index_representation(collection=collection_name, representation="lowrank", rank=8, grace_s=0)
    c = store.get_collection(name=collection_name, fresh=True)
    assert spec.version is not None and spec.projection_id is not None
    with store.db.write() as conn:
        stored = conn.execute(
            sql.SQL("SELECT s.v FROM {} s JOIN {} m USING (id) WHERE m.external_id = '7'").format(
                sql.Identifier(specs.side_table(c.id, spec.version)), c.table
            )
        ).fetchone()
        p = proj.load(conn, spec.projection_id)
    assert stored is not None and isinstance(stored[0], HalfVector)
    assert np.allclose(stored[0].to_numpy(), p.apply(rows[7]), atol=2e-3)


def test_compact_collections_keep_vectors_in_the_row(store: VectorStore, collection_name: str) -> None:
    """Re-ranking reads pool-many vectors: they are stored inline, not TOASTed (full ones keep the default)."""

    def storage(table: str) -> str:
        with store.db.write() as conn:
            row = conn.execute(
                "SELECT attstorage FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
                (table,),
            ).fetchone()
        assert row is not None
        return str(row[0])

    full = store.create_collection(name=collection_name, dimensions=768)
    assert storage(full.table_name) == "e"  # pgvector's default: out of line, uncompressed
    _fill(store, collection_name, low_rank_data(250, 768, 8, seed=20))
    store.set_index_representation(collection=collection_name, representation="halfvec", grace_s=0)
    assert storage(full.table_name) == "m"
    binary = store.create_collection(name=collection_name + "_b", dimensions=768, representation="binary", partitions=2)
    assert [storage(t) for t in binary.partition_tables()] == ["m", "m"]
    _fill(store, binary.name, low_rank_data(20, 768, 8, seed=21))
    with store.db.write() as conn:
        row = conn.execute(
            "SELECT sum(pg_relation_size(to_regclass(t))) FROM unnest(%s::text[]) AS t", (binary.partition_tables(),)
        ).fetchone()
    assert row is not None and row[0] >= 20 * 768 * 4  # the vectors are in the partitions' own pages


@pytest.mark.parametrize("representation", ["lowrank", "binary"])
def test_filtered_compact_search_fills_k_with_matching_rows(
    store: VectorStore, collection_name: str, representation: str
) -> None:
    rows = low_rank_data(2000, 32, 6, seed=22)
    store.create_collection(name=collection_name, dimensions=32)
    items = [
        ItemIn(vector=v, external_id=str(i), metadata={"tag": "rare" if i % 20 == 0 else "common"})
        for i, v in enumerate(rows)
    ]
    store.upsert_items(collection=collection_name, items=items)
    rank = 8 if representation == "lowrank" else None
    store.set_index_representation(collection=collection_name, representation=representation, rank=rank, grace_s=0)
    rare = np.arange(0, 2000, 20)
    hits = 0
    for q in low_rank_data(5, 32, 6, seed=23):
        results = store.search(collection=collection_name, vector=q, k=10, filter={"tag": "rare"})
        assert len(results) == 10 and all(r.metadata == {"tag": "rare"} for r in results)
        truth = rare[np.argsort(-(rows[rare] @ (q / np.linalg.norm(q))))[:10]]
        hits += len({int(r.external_id) for r in results} & set(truth.tolist()))
    assert hits / 50 >= 0.9


def test_the_compact_recall_probe_counts_what_numpy_counts(
    store: VectorStore, collection_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe takes the true answers from one scan bounded by the index's answers; its recall must
    equal the one counted against numpy's exact neighbours of the same queries."""
    from maintenance import compact_index
    from memstore.search.exact_answers import recall_hits

    rows = low_rank_data(1500, 32, 6, seed=21)
    store.create_collection(name=collection_name, dimensions=32, representation="binary")
    _fill(store, collection_name, rows)
    queries = [q.astype(np.float32) for q in low_rank_data(20, 32, 6, seed=22)]
    monkeypatch.setattr(compact_index, "_queries", lambda conn, store, c, n: (queries, "given"))
    probe = compact_index.probe_compact_recall(store, collection=collection_name, k=10, queries=20)
    hits = 0
    for q in queries:
        found = [(int(r.external_id), r.distance) for r in store.search(collection=collection_name, vector=q, k=10)]
        distances = 1 - rows @ (q / np.linalg.norm(q))
        order = np.argsort(distances, kind="stable")[:10]
        hits += recall_hits(found, [(int(i), float(distances[i])) for i in order])
    assert probe.queries == 20 and probe.recall is not None
    assert probe.recall == pytest.approx(hits / 200)
    assert 0.3 < probe.recall <= 1.0


@pytest.mark.parametrize("representation", ["halfvec", "binary"])
def test_rows_written_during_the_compact_recall_probe_do_not_lower_it(
    store: VectorStore, collection_name: str, monkeypatch: pytest.MonkeyPatch, representation: str
) -> None:
    """Near-duplicates of the queries, written (and committed) after the index has answered and before
    the exact answers are read, are the true nearest rows of a later snapshot: read there, they would
    count as misses the index never had a chance to find. One snapshot for both keeps the reading."""
    from maintenance import compact_index

    rows = low_rank_data(1500, 32, 6, seed=31)
    store.create_collection(name=collection_name, dimensions=32, representation=representation)
    _fill(store, collection_name, rows)
    queries = [q.astype(np.float32) for q in low_rank_data(10, 32, 6, seed=32)]
    monkeypatch.setattr(compact_index, "_queries", lambda conn, store, c, n: (queries, "given"))
    quiet = compact_index.probe_compact_recall(store, collection=collection_name, k=10, queries=10)
    assert quiet.recall is not None and quiet.recall > 0.5

    exact = compact_index.exact_answers
    written = []

    def after_the_index_answered(*args: object, **kwargs: object) -> object:
        rng = np.random.default_rng(33)
        near = [q + rng.normal(scale=1e-4, size=q.shape).astype(np.float32) for q in queries for _ in range(3)]
        _fill(store, collection_name, np.stack(near), start=len(rows))
        written.append(len(near))
        return exact(*args, **kwargs)

    monkeypatch.setattr(compact_index, "exact_answers", after_the_index_answered)
    busy = compact_index.probe_compact_recall(store, collection=collection_name, k=10, queries=10)
    assert written == [30]
    assert busy.queries == quiet.queries
    assert busy.recall == pytest.approx(quiet.recall)
