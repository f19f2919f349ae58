"""How PostgreSQL plans the store's searches: an unfiltered search runs a prepared statement on a
cached generic plan (no planning per search) that still scans the HNSW index and stops at k; a
filtered search is planned with its own values every time.

What the server did is read from its own records of the search connection's session:
``pg_prepared_statements`` counts the generic and the custom plans each prepared statement ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from psycopg import sql

from memstore.db.core import search_connections
from memstore.models import ItemIn
from memstore.search.request import check_query
from memstore.search.runner import AsyncSearcher
from memstore.settings import Settings
from memstore.store import VectorStore

ROWS = 12_000  # enough rows that the planner prefers the index to a scan and sort (see test_search)
DIMS = 8


@pytest.fixture
def filled(store: VectorStore, collection_name: str) -> Iterator[np.ndarray]:
    rng = np.random.default_rng(11)
    base = rng.normal(size=(ROWS, DIMS)).astype(np.float32)
    c = store.create_collection(name=collection_name, dimensions=DIMS)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, external_id=str(i), metadata={"g": i % 3}) for i, v in enumerate(base)],
    )
    with store.db.write() as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(c.table))
    yield base
    store.drop_collection(name=collection_name)


def _prepared(engine: sa.Engine, table: str) -> list[dict[str, Any]]:
    """The prepared statements of the one search connection's session that read ``table``, with their
    plan counts."""
    with search_connections(engine).connection() as conn:
        rows = conn.execute(
            "SELECT name, statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s ORDER BY name",
            (f"%{table}%",),
        ).fetchall()
    return [{"name": r[0], "statement": r[1], "generic": r[2], "custom": r[3]} for r in rows]


def test_an_unfiltered_search_runs_a_cached_generic_plan_on_the_index(
    one_connection: sa.Engine, settings: Settings, collection_name: str, filled: np.ndarray
) -> None:
    store = VectorStore(one_connection, settings=settings)
    table = store.get_collection(name=collection_name).table_name
    searches = 12
    for i in range(searches):
        hits = store.search(collection=collection_name, vector=filled[i], k=7)
        assert len(hits) == 7 and hits[0].external_id == str(i)  # the answers are the index's, as before
    [prepared] = _prepared(one_connection, table)
    # PostgreSQL plans a prepared statement's first five runs with their values, then keeps the
    # generic plan when it costs no more: every later search ran without planning.
    assert prepared["custom"] <= 5 and prepared["generic"] >= searches - 5, prepared
    assert "LIMIT 7" in prepared["statement"]  # k is in the text: the plan knows how far to scan
    # The cached generic plan itself: the HNSW index, ordered by distance, stopping at k.
    vector = "[" + ",".join(str(float(x)) for x in filled[0]) + "]"
    with search_connections(one_connection).connection() as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                sql.SQL("EXPLAIN EXECUTE {}({})").format(sql.Identifier(prepared["name"]), sql.Literal(vector))
            )
        )
    assert f"{table}_hnsw" in plan and "Limit" in plan and "rows=7 " in plan, plan
    assert _prepared(one_connection, table)[0]["custom"] == prepared["custom"]  # EXPLAIN re-used it too


def test_a_filtered_search_is_planned_with_its_own_values_every_time(
    one_connection: sa.Engine, settings: Settings, collection_name: str, filled: np.ndarray
) -> None:
    store = VectorStore(one_connection, settings=settings)
    table = store.get_collection(name=collection_name).table_name
    for i in range(10):
        hits = store.search(collection=collection_name, vector=filled[i], k=5, filter={"g": i % 3})
        assert hits[0].external_id == str(i) and all(h.metadata["g"] == i % 3 for h in hits)
    # Never prepared: each run was parsed and planned with the filter's value (its selectivity
    # decides between the index and a scan), so no generic plan can answer for another value.
    assert _prepared(one_connection, table) == []
    for i in range(8):  # the same connection still keeps the unfiltered search's generic plan
        store.search(collection=collection_name, vector=filled[i], k=5)
    [prepared] = _prepared(one_connection, table)
    assert "@>" not in prepared["statement"] and prepared["generic"] >= 3, prepared


def test_a_generic_plan_runs_under_each_search_s_own_settings(
    one_connection: sa.Engine, settings: Settings, collection_name: str, filled: np.ndarray
) -> None:
    """The HNSW knobs are read when a scan starts, so the cached plan runs under each search's
    ``ef_search``; an exact search is a statement of its own, with a plan of its own (a scan)."""
    store = VectorStore(one_connection, settings=settings)
    c = store.get_collection(name=collection_name)
    queries = np.random.default_rng(12).normal(size=(12, DIMS)).astype(np.float32)
    for q in queries[:8]:  # past the five custom plans: the generic plan is cached
        store.search(collection=collection_name, vector=q, k=10, ef_search=200)
    with search_connections(one_connection).connection() as conn:
        held = conn.execute("SELECT current_setting('hnsw.ef_search')").fetchone()
    assert held is not None and held[0] == "200"
    unit = filled / np.linalg.norm(filled, axis=1, keepdims=True)
    for q in queries:
        exact = store.search(collection=collection_name, vector=q, k=10, exact=True)
        truth = np.argsort(-(unit @ (q / np.linalg.norm(q))))[:10]
        assert [int(h.external_id) for h in exact] == truth.tolist()
    statements = {p["statement"]: p for p in _prepared(one_connection, c.table_name)}
    assert len(statements) == 2  # the index search and the exact one, each with its own cached plan
    assert all(p["generic"] > 0 for p in statements.values()), statements
    store.search(collection=collection_name, vector=queries[0], k=10)  # the collection's default again
    with search_connections(one_connection).connection() as conn:
        held = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')").fetchone()
    assert held == (str(c.default_ef_search), "on")


def test_the_rest_path_s_async_searches_run_the_same_cached_plans(
    store: VectorStore, collection_name: str, filled: np.ndarray
) -> None:
    """The event-loop path (``memstore.search.runner``, the REST API's) plans as the store does: its
    one connection ends with the unfiltered search prepared on a generic plan, and no filtered one."""
    table = store.get_collection(name=collection_name).table_name

    async def scenario() -> list[tuple[Any, ...]]:
        searcher = AsyncSearcher(store, max_connections=1)
        try:
            for i in range(10):
                for where in (None, {"g": i % 3}):
                    q = check_query(mode=None, vector=filled[i], text=None, k=6, filter=where)
                    hits = await searcher.search(collection=collection_name, query=q)
                    assert hits is not None and hits[0].external_id == str(i)
            async with searcher.connections.connection() as conn:
                cur = await conn.execute(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                    (f"%{table}%",),
                )
                return await cur.fetchall()
        finally:
            await searcher.close()

    [(statement, generic, custom)] = asyncio.run(scenario())
    assert "LIMIT 6" in statement and "@>" not in statement
    assert custom <= 5 and generic >= 5, (generic, custom)
