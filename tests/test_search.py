"""Search: ordering, scores per metric, filters with iterative scans, exact answers, recall on real data."""

from __future__ import annotations

import numpy as np
import pytest
from psycopg import sql

from memstore.errors import CollectionNotFoundError, DimensionMismatchError, InvalidInputError
from memstore.models import ItemIn
from memstore.search import statements
from memstore.search.filter_language import compile_filter
from memstore.store import VectorStore


def _exact_neighbours(base: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Brute force cosine neighbours in numpy, independent of PostgreSQL."""
    b = base / np.linalg.norm(base, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    return np.argsort(-(q @ b.T), axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_exact_search_matches_numpy_and_scores_follow_the_metric(
    store: VectorStore, collection_name: str, metric: str
) -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(size=(300, 16)).astype(np.float32)
    store.create_collection(name=collection_name, dimensions=16, metric=metric)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)]
    )
    q = rng.normal(size=16).astype(np.float32)
    results = store.search(collection=collection_name, vector=q, k=10, exact=True)
    if metric == "cosine":
        sims = base @ q / (np.linalg.norm(base, axis=1) * np.linalg.norm(q))
        expected_scores = np.sort(sims)[::-1][:10]
    elif metric == "l2":
        expected_scores = -np.sort(np.linalg.norm(base - q, axis=1))[:10]
    else:
        expected_scores = np.sort(base @ q)[::-1][:10]
    assert [r.score for r in results] == pytest.approx(expected_scores.tolist(), rel=1e-4, abs=1e-4)
    assert [r.distance for r in results] == sorted(r.distance for r in results)


def test_index_search_finds_the_item_itself(store: VectorStore, collection_name: str) -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(size=(500, 32)).astype(np.float32)
    store.create_collection(name=collection_name, dimensions=32, partitions=2)
    ids = store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=f"x{i}") for i, v in enumerate(base)]
    )
    hits = 0
    for i in range(0, 500, 25):
        top = store.search(collection=collection_name, vector=base[i], k=1)
        hits += top[0].id == ids[i].id
    assert hits == 20


def test_filtered_search_returns_k_rows_when_k_exist(store: VectorStore, collection_name: str) -> None:
    """2% of rows match the filter: a plain HNSW scan at ef_search 40 would return only a few of them."""
    rng = np.random.default_rng(3)
    n = 3000
    base = rng.normal(size=(n, 16)).astype(np.float32)
    store.create_collection(name=collection_name, dimensions=16)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, external_id=str(i), metadata={"rare": i % 50 == 0}) for i, v in enumerate(base)],
    )
    q = rng.normal(size=16)
    results = store.search(collection=collection_name, vector=q, k=20, filter={"rare": True}, ef_search=40)
    assert len(results) == 20
    assert all(r.metadata["rare"] is True for r in results)
    exact = store.search(collection=collection_name, vector=q, k=20, filter={"rare": True}, exact=True)
    assert len({r.id for r in results} & {r.id for r in exact}) >= 18


def test_filter_with_nothing_matching_returns_nothing(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_item(collection=collection_name, vector=[1, 0, 0, 0], metadata={"a": 1})
    assert store.search(collection=collection_name, vector=[1, 0, 0, 0], filter={"a": 2}) == []


@pytest.mark.parametrize("k", [0, -1, 1001, 2.5, True])
def test_k_outside_1_to_1000_is_refused(store: VectorStore, collection_name: str, k: object) -> None:
    store.create_collection(name=collection_name, dimensions=4)
    with pytest.raises(InvalidInputError, match="k must be"):
        store.search(collection=collection_name, vector=[1, 0, 0, 0], k=k)  # type: ignore[arg-type]


def test_bad_queries_are_refused(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=4)
    with pytest.raises(DimensionMismatchError):
        store.search(collection=collection_name, vector=[1, 0, 0])
    with pytest.raises(InvalidInputError, match="NaN"):
        store.search(collection=collection_name, vector=[1, 0, 0, float("nan")])
    with pytest.raises(InvalidInputError, match="ef_search"):
        store.search(collection=collection_name, vector=[1, 0, 0, 0], ef_search=0)
    with pytest.raises(InvalidInputError, match="filter"):
        store.search(collection=collection_name, vector=[1, 0, 0, 0], filter=[1])  # type: ignore[arg-type]
    with pytest.raises(CollectionNotFoundError):
        store.search(collection="missing_collection", vector=[1, 0, 0, 0])


def test_search_skips_items_without_vectors(store: VectorStore, collection_name: str) -> None:
    c = store.create_collection(name=collection_name, dimensions=4)
    store.upsert_item(collection=collection_name, vector=[1, 0, 0, 0], external_id="ready")
    with store.db.write() as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (external_id, status, text) VALUES ('waiting', 'pending', 'hello')").format(c.table)
        )
    for exact in (False, True):
        results = store.search(collection=collection_name, vector=[1, 0, 0, 0], k=5, exact=exact)
        assert [r.external_id for r in results] == ["ready"]


def test_recall_at_10_on_real_bge_m3_embeddings(store: VectorStore, collection_name: str, bge_m3: np.ndarray) -> None:
    """recall@10 of the HNSW index against exact search, at the collection's default ef_search."""
    queries, base = bge_m3[:100], bge_m3[100:]
    store.create_collection(name=collection_name, dimensions=1024)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)]
    )
    truth = _exact_neighbours(base, queries, 10)
    recalls = []
    for q, expected in zip(queries, truth, strict=True):
        got = {int(r.external_id) for r in store.search(collection=collection_name, vector=q, k=10)}
        db_exact = {int(r.external_id) for r in store.search(collection=collection_name, vector=q, k=10, exact=True)}
        # The database's exact answer is the numpy answer (ties aside).
        assert len(db_exact & set(expected.tolist())) >= 9
        recalls.append(len(got & db_exact) / 10)
    recall = float(np.mean(recalls))
    print(f"recall@10 on bge-m3 at default ef_search: {recall:.4f}")
    assert recall >= 0.95


@pytest.mark.parametrize("partitions", [1, 2])
def test_plans_use_the_hnsw_index_unless_exact(store: VectorStore, collection_name: str, partitions: int) -> None:
    """Recall figures only mean something if the index answers: check the plan, not just the rows.

    (On a few thousand rows per partition the planner rightly prefers a sequential scan and sort,
    which is exact; the index takes over as tables grow.)
    """
    c = store.create_collection(name=collection_name, dimensions=8, partitions=partitions)
    rng = np.random.default_rng(4)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, metadata={"g": i % 3}) for i, v in enumerate(rng.normal(size=(12_000, 8)))],
    )
    with store.db.write() as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(c.table))
    for filtered in (False, True):
        for exact in (False, True):
            matching = compile_filter({"g": 1}) if filtered else None
            statement = statements.search_statement(
                c.table_name, c.spec.operator, exact=exact, where=matching.where if matching else None
            )
            params: dict[str, object] = {"q": rng.normal(size=8).astype(np.float32), "k": 10}
            if matching:
                params.update(matching.params)
            settings = statements.SearchSettings(ef_search=40, exact=exact, max_scan_tuples=20000)
            with store.db.write() as conn, conn.cursor() as cur:
                statements.apply(cur, settings)
                cur.execute(sql.SQL("EXPLAIN ") + statement, params)
                plan = "\n".join(r[0] for r in cur.fetchall())
            assert ("_hnsw" in plan) is not exact, plan


@pytest.mark.parametrize("filtered", [False, True])
def test_pages_of_equal_distances_neither_repeat_nor_skip(
    store: VectorStore, collection_name: str, filtered: bool
) -> None:
    """Items at one distance (the same picture stored many times) come in id order: an exact search's
    pages tile, and an index search's page lists the ties it found in that order too (which of them
    a graph walk meets first is the graph's)."""
    store.create_collection(name=collection_name, dimensions=4)
    same = [0.3, 0.1, 0.5, 0.2]
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=same, external_id=f"d{i:02d}", metadata={"kind": "dup"}) for i in range(30)],
    )
    flt = {"kind": "dup"} if filtered else None

    def page(offset: int, *, exact: bool) -> list[int]:
        hits = store.search(collection=collection_name, vector=same, k=10, offset=offset, filter=flt, exact=exact)
        return [h.id for h in hits]

    exact_order = page(0, exact=True) + page(10, exact=True) + page(20, exact=True)
    assert exact_order == sorted(exact_order) and len(set(exact_order)) == 30
    for offset in (0, 10):
        found = page(offset, exact=False)
        assert found == sorted(found) and len(found) == 10


def test_groups_of_equal_objects_are_one_group(store: VectorStore, collection_name: str) -> None:
    """``{"a": 1}`` and ``{"a": 1.0}`` are equal JSONB (a filter matches both): one group."""
    store.create_collection(name=collection_name, dimensions=2)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=[1, 0.1], external_id="int", metadata={"g": {"a": 1, "b": [2]}}),
            ItemIn(vector=[1, 0.2], external_id="float", metadata={"g": {"b": [2.0], "a": 1.0}}),
            ItemIn(vector=[1, 0.3], external_id="other", metadata={"g": {"a": 1.5}}),
        ],
    )
    groups = store.search_groups(collection=collection_name, group_by="g", group_size=5, vector=[1, 0], exact=True)
    assert [[h.external_id for h in g] for g in groups] == [["int", "float"], ["other"]]
