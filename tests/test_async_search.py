"""AsyncSearcher: the event-loop search path answers as VectorStore.search does, and a search
connection never runs a search under the settings an earlier search left on it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from psycopg import sql

from memstore.errors import DimensionMismatchError
from memstore.models import ItemIn
from memstore.search.request import SearchQuery, check_query
from memstore.search.runner import AsyncSearcher
from memstore.store import VectorStore


async def _settings_of(searcher: AsyncSearcher) -> tuple[str, str]:
    async with searcher.connections.connection() as conn:
        cur = await conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')")
        row = await cur.fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def _settle_statistics(store: VectorStore, name: str) -> None:
    """Statistics now, and none changing later, so both sides of a comparison are planned alike.

    The tables have 1,000 rows: at a few hundred, PostgreSQL plans a search as a sequential scan and
    a sort (exact answers) while a connection's prepared statement still gets custom plans, and as
    the HNSW scan once it keeps the generic plan (after five runs on that connection); the two sides,
    on connections with different histories, would then differ for that reason alone."""
    table = store.get_collection(name=name).table
    with store.db.write() as conn:
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(table))
        conn.execute(sql.SQL("ANALYZE {}").format(table))


def _filled(store: VectorStore, name: str, base: np.ndarray) -> None:
    """A collection of ``base``'s rows (a sparse graph, quick to build), its statistics settled."""
    store.create_collection(name=name, dimensions=base.shape[1], hnsw_m=4, hnsw_ef_construction=8)
    store.upsert_items(collection=name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)])
    _settle_statistics(store, name)


def _query(vector: Any, k: int, **more: Any) -> SearchQuery:
    return check_query(mode=more.pop("mode", None), vector=vector, text=more.pop("text", None), k=k, **more)


def test_async_search_answers_keyword_and_hybrid_searches_as_the_store_does(
    store: VectorStore, collection_name: str
) -> None:
    rng = np.random.default_rng(6)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    words = ["red", "green", "blue", "copper", "invoice", "ledger"]
    store.create_collection(name=collection_name, dimensions=16, hnsw_m=4, hnsw_ef_construction=8)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=v, external_id=str(i), text=f"{words[i % 6]} {words[(i * 5) % 6]} item-{i}")
            for i, v in enumerate(base)
        ],
    )
    _settle_statistics(store, collection_name)
    asks: list[dict[str, Any]] = [
        {"mode": "keyword", "text": "copper"},
        {"mode": "keyword", "text": "item-17", "offset": 0},
        {"mode": "hybrid", "text": "invoice ledger", "vector": base[3]},
        {"mode": "hybrid", "text": "red", "vector": base[9], "offset": 5, "weights": {"vector": 0.5, "keyword": 2}},
        {"mode": "vector", "vector": base[4], "offset": 3},
    ]

    async def scenario() -> None:
        searcher = AsyncSearcher(store, max_connections=1)
        try:
            for ask in asks:
                ask = dict(ask)
                vector = ask.pop("vector", None)
                got = await searcher.search(collection=collection_name, query=_query(vector, 8, **ask))
                want = store.search(collection=collection_name, vector=vector, k=8, **ask)
                assert got is not None and want
                assert [(r.id, r.vector_rank, r.keyword_rank) for r in got] == [
                    (r.id, r.vector_rank, r.keyword_rank) for r in want
                ], ask
        finally:
            await searcher.close()

    asyncio.run(scenario())


def test_async_search_matches_the_store_whatever_the_previous_search_set(
    store: VectorStore, collection_name: str
) -> None:
    rng = np.random.default_rng(5)
    _filled(store, collection_name, rng.normal(size=(1000, 24)).astype(np.float32))
    queries = rng.normal(size=(4, 24)).astype(np.float32)
    default_ef = store.get_collection(name=collection_name).default_ef_search
    # Default settings, then others, then the defaults again: each must run under its own.
    cases: list[dict[str, Any]] = [{}, {"ef_search": 3}, {"exact": True}, {}, {"ef_search": 3}, {}]

    async def scenario() -> None:
        searcher = AsyncSearcher(store, max_connections=1)  # one connection: every search reuses it
        try:
            for case in cases:
                for q in queries:
                    got = await searcher.search(collection=collection_name, query=_query(q, 10), **case)
                    want = store.search(collection=collection_name, vector=q, k=10, **case)
                    assert got is not None
                    assert [r.id for r in got] == [r.id for r in want], case
                ef, indexscan = await _settings_of(searcher)
                assert ef == str(case.get("ef_search", default_ef))
                assert indexscan == ("off" if case.get("exact") else "on")
            # A failed search leaves nothing assumed about its connection.
            with pytest.raises(DimensionMismatchError):
                await searcher.search(collection=collection_name, query=_query(np.zeros(3, np.float32), 5))
            got = await searcher.search(collection=collection_name, query=_query(queries[0], 10), ef_search=5)
            assert got is not None and await _settings_of(searcher) == ("5", "on")
        finally:
            await searcher.close()

    asyncio.run(scenario())


def test_a_search_after_its_connection_was_reset_runs_under_its_settings_again(
    store: VectorStore, collection_name: str
) -> None:
    """DISCARD ALL on a search connection drops its prepared statements and its settings: the next
    search says neither is there and sends both again (memstore.db.direct_fetch, the runner)."""
    base = np.random.default_rng(8).normal(size=(1000, 8)).astype(np.float32)
    _filled(store, collection_name, base)

    async def scenario() -> None:
        searcher = AsyncSearcher(store, max_connections=1)
        try:
            first = [await searcher.search(collection=collection_name, query=_query(base[3], 5), ef_search=7)]
            first.append(await searcher.search(collection=collection_name, query=_query(base[3], 5), ef_search=7))
            async with searcher.connections.connection() as conn:
                await conn.execute("DISCARD ALL")
            assert await _settings_of(searcher) != ("7", "on")  # the reset took the settings too
            again = await searcher.search(collection=collection_name, query=_query(base[3], 5), ef_search=7)
            assert again is not None and first[0] is not None
            assert [r.id for r in again] == [r.id for r in first[0]] == [r.id for r in first[1] or []]
            assert await _settings_of(searcher) == ("7", "on")
        finally:
            await searcher.close()

    asyncio.run(scenario())
