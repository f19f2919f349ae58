"""A search through the Python API is one round trip (two when deleted rows leave an unfiltered walk
of the graph short), and what one search sets never reaches the next.

The round trips are counted from libpq's own protocol trace of the search connection
(``memstore.db.core.search_connections``): every round trip ends with a Sync (extended protocol) or is a
simple Query, so a search that sends one Sync and no Query waited on the server once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import pq, sql

from memstore.db.core import search_connections
from memstore.errors import CollectionNotFoundError
from memstore.models import ItemIn, SearchResult
from memstore.search import statements
from memstore.search.request import check_query
from memstore.search.runner import AsyncSearcher
from memstore.settings import Settings
from memstore.store import VectorStore


@contextmanager
def traced(engine: sa.Engine) -> Iterator[list[str]]:
    """The protocol messages the search connection sends while the block runs (frontend lines only)."""
    sent: list[str] = []
    with search_connections(engine).connection() as conn:
        pgconn = conn.pgconn  # given back: the next search takes this same connection
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    pgconn.trace(write_end)
    pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
    try:
        yield sent
    finally:
        pgconn.untrace()
        os.close(write_end)
        chunks = []
        while True:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(read_end)
        lines = b"".join(chunks).decode(errors="replace").splitlines()
        sent.extend(line.split("\t")[2].strip() for line in lines if line.startswith("F\t"))


def _round_trips(sent: list[str]) -> int:
    return sum(1 for message in sent if message.startswith(("Sync", "Query")))


def _filled(store: VectorStore, name: str, rows: int = 300) -> np.ndarray:
    rng = np.random.default_rng(3)
    base = rng.normal(size=(rows, 16)).astype(np.float32)
    store.create_collection(name=name, dimensions=16)
    store.upsert_items(collection=name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)])
    return base


def _setting(engine: sa.Engine, name: str) -> Any:
    """The setting as the session of the (one) search connection holds it."""
    with search_connections(engine).connection() as conn:
        row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize("kind", ["vector", "filtered", "hybrid", "exact"])
def test_a_search_is_one_round_trip(
    one_connection: sa.Engine, settings: Settings, collection_name: str, kind: str
) -> None:
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    args: dict[str, Any] = {"collection": collection_name, "vector": base[7], "k": 5}
    if kind == "filtered":
        args["filter"] = {"missing": "no"}
    elif kind == "hybrid":
        args["text"] = "anything"
    elif kind == "exact":
        args["exact"] = True
    store.search(**args)  # the registry row is cached from here on
    with traced(one_connection) as sent:
        hits = store.search(**args)
    assert _round_trips(sent) == 1, sent
    assert "Parse" in sent or "Bind" in sent  # the trace saw the search itself
    if kind == "vector" or kind == "exact":
        assert hits[0].external_id == "7"


def test_a_search_runs_with_its_own_settings_whatever_ran_before_it(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """The planner's knobs never outlive a search; the HNSW knobs a connection keeps for its session
    are always those of the search that runs, never a previous request's."""
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    planner = ("enable_indexscan", "enable_seqscan", "enable_hashjoin", "enable_mergejoin")
    before = {name: _setting(one_connection, name) for name in planner}
    store.search(collection=collection_name, vector=base[1], k=3, exact=True)
    assert {name: _setting(one_connection, name) for name in planner} == before
    store.search(collection=collection_name, vector=base[1], k=3, ef_search=7)
    assert _setting(one_connection, "hnsw.ef_search") == "7"
    hits = store.search(collection=collection_name, vector=base[1], k=3)  # the collection's default again
    assert hits[0].external_id == "1"
    default = store.get_collection(name=collection_name).default_ef_search
    assert _setting(one_connection, "hnsw.ef_search") == str(default)
    # A search that fails takes the settings it sent with it (its implicit transaction is rolled
    # back), and the next search with those settings sends them again.
    store.search(collection=collection_name, vector=base[1], k=3, ef_search=9)
    failing = statements.SearchSettings(ef_search=11, exact=False, max_scan_tuples=100)
    with pytest.raises(psycopg.errors.DivisionByZero), search_connections(one_connection).connection() as conn:
        statements.run_search(conn, failing, sql.SQL("SELECT 1 / 0"), {})
    assert _setting(one_connection, "hnsw.ef_search") == "9"
    store.search(collection=collection_name, vector=base[1], k=3, ef_search=11)
    assert _setting(one_connection, "hnsw.ef_search") == "11"


def test_a_search_that_fails_on_the_server_leaves_the_connection_usable_and_clean(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    gone = f"{collection_name}_gone"
    _filled(store, gone, rows=20)
    store.search(collection=gone, vector=base[0], k=3)
    table = store.get_collection(name=gone).table
    with one_connection.connect() as conn:  # the table goes behind the store's back
        conn.exec_driver_sql(f"DROP TABLE {table.as_string()}")
        conn.commit()
    try:
        with pytest.raises(CollectionNotFoundError):
            store.search(collection=gone, vector=base[0], k=3, ef_search=3, exact=True)
    finally:
        store.drop_collection(name=gone)  # its registry row too: other tests walk every collection
    assert _setting(one_connection, "enable_indexscan") == "on"
    assert store.search(collection=collection_name, vector=base[2], k=1)[0].external_id == "2"


def test_a_search_inside_a_caller_s_transaction_keeps_its_settings_to_that_transaction(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """``statements.run_search`` on a pooled connection inside a transaction (the duplicates scan, reads
    on a replica): its settings are the transaction's, gone once it ends."""
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    c = store.get_collection(name=collection_name)
    statement = statements.search_statement(c.table_name, c.spec.operator, exact=True, limit=3)
    exact = statements.SearchSettings(ef_search=13, exact=True, max_scan_tuples=100)
    with store.db.read() as conn:
        conn.execute("SELECT 1")  # the transaction is open before the search
        rows = statements.run_search(conn, exact, statement, {"q": base[5]})
        held = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')").fetchone()
        pid = conn.info.backend_pid
    assert rows[0][1] == "5" and held == ("13", "off")
    with store.db.read() as conn:
        assert conn.info.backend_pid == pid  # the pool's one connection, after the transaction
        after = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')").fetchone()
    assert after is not None and after[0] != "13" and after[1] == "on"


def test_an_unfiltered_search_walks_the_graph_once_and_a_filtered_or_deep_one_iterates(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """pgvector's iterative scan costs an unfiltered search time it does not need when its k rows fit
    in one walk's ef_search candidates; a filter, or more rows than ef_search, needs it."""
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    store.search(collection=collection_name, vector=base[2], k=5, ef_search=20)
    assert _setting(one_connection, "hnsw.iterative_scan") == "off"
    store.search(collection=collection_name, vector=base[2], k=5, ef_search=20, filter={"missing": "no"})
    assert _setting(one_connection, "hnsw.iterative_scan") == "relaxed_order"
    store.search(collection=collection_name, vector=base[2], k=30, ef_search=20)
    assert _setting(one_connection, "hnsw.iterative_scan") == "relaxed_order"
    store.search(collection=collection_name, vector=base[2], k=5, ef_search=20, text="anything")  # hybrid
    assert _setting(one_connection, "hnsw.iterative_scan") == "relaxed_order"
    assert store.second_walks == 0  # every walk held its k rows


def _mostly_deleted(store: VectorStore, engine: sa.Engine, name: str) -> tuple[np.ndarray, set[str]]:
    """1,000 rows of which every 20th is kept and the rest deleted, with no vacuum to take them out of
    the graph: a walk of 10 candidates from row 0's vector finds fewer than 10 live rows."""
    rng = np.random.default_rng(11)
    base = rng.normal(size=(1000, 16)).astype(np.float32)
    store.create_collection(name=name, dimensions=16, hnsw_m=4, hnsw_ef_construction=16)
    store.upsert_items(collection=name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)])
    table = store.get_collection(name=name).table.as_string()
    with engine.connect() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        conn.exec_driver_sql(f"ANALYZE {table}")
        conn.commit()
    kept = {str(i) for i in range(0, 1000, 20)}
    store.delete_items(collection=name, external_ids=[str(i) for i in range(1000) if str(i) not in kept])
    with engine.connect() as conn:  # what one walk without the iterative scan finds
        conn.exec_driver_sql("SET hnsw.ef_search = 10")
        conn.exec_driver_sql("SET hnsw.iterative_scan = off")
        conn.exec_driver_sql("SET enable_seqscan = off")
        one_walk = conn.exec_driver_sql(
            f"SELECT id FROM {table} ORDER BY embedding <=> %(q)s LIMIT 10", {"q": str(base[0].tolist())}
        ).fetchall()
        conn.rollback()
    assert len(one_walk) < 10  # the case under test: the walk alone comes back short
    return base, kept


def _complete(hits: list[SearchResult], kept: set[str]) -> None:
    assert len(hits) == 10 and {h.external_id for h in hits} <= kept
    assert hits[0].external_id == "0"
    assert [h.distance for h in hits] == sorted(h.distance for h in hits)  # type: ignore[type-var]


def test_a_search_that_deleted_rows_leave_short_runs_once_more_with_the_iterative_scan(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """Deleted rows stay in the graph until a vacuum; a walk of ef_search candidates that finds fewer
    than k live ones is run again with the iterative scan, which keeps walking until it has k."""
    store = VectorStore(one_connection, settings=settings)
    base, kept = _mostly_deleted(store, one_connection, collection_name)
    store.search(collection=collection_name, vector=base[0], k=10, ef_search=10)  # the registry row cached
    walks = store.second_walks
    with traced(one_connection) as sent:
        hits = store.search(collection=collection_name, vector=base[0], k=10, ef_search=10)
    _complete(hits, kept)
    assert _round_trips(sent) == 2, sent
    assert store.second_walks == walks + 1
    assert _setting(one_connection, "hnsw.iterative_scan") == "relaxed_order"


def test_the_event_loop_s_search_runs_a_short_walk_once_more_too(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(one_connection, settings=settings)
    base, kept = _mostly_deleted(store, one_connection, collection_name)
    query = check_query(mode=None, vector=base[0], text=None, k=10)

    async def search() -> tuple[list[SearchResult] | None, Any]:
        searcher = AsyncSearcher(store, max_connections=1)
        try:
            hits = await searcher.search(collection=collection_name, query=query, ef_search=10)
            async with searcher.connections.connection() as conn:  # the one the search ran on
                cur = await conn.execute("SELECT current_setting('hnsw.iterative_scan')")
                return hits, await cur.fetchone()
        finally:
            await searcher.close()

    walks = store.second_walks
    hits, held = asyncio.run(search())
    assert hits is not None
    _complete(hits, kept)
    assert held == ("relaxed_order",)  # the second run's settings: the first came back short
    assert store.second_walks == walks + 1


def test_a_partitioned_collection_keeps_the_iterative_scan(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """The merge of the partitions' walks would hide one partition's short walk behind another's
    farther rows: its unfiltered searches keep walking while rows are discarded."""
    store = VectorStore(one_connection, settings=settings)
    rng = np.random.default_rng(5)
    base = rng.normal(size=(60, 16)).astype(np.float32)
    store.create_collection(name=collection_name, dimensions=16, partitions=2)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)]
    )
    hits = store.search(collection=collection_name, vector=base[4], k=5, ef_search=20)
    assert hits[0].external_id == "4"
    assert _setting(one_connection, "hnsw.iterative_scan") == "relaxed_order"


def test_a_relaxed_scan_s_rows_are_sorted_again_after_the_walk(
    one_connection: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """pgvector's relaxed iterative scan returns rows slightly out of order; the statement sorts them
    again over its MATERIALIZED CTE. PostgreSQL 17+ takes the CTE's order from its ORDER BY and drops a
    sort by ``distance`` as already done: the plan must keep a Sort above the walk (a search under load
    answered distances out of order)."""
    store = VectorStore(one_connection, settings=settings)
    rng = np.random.default_rng(3)
    store.create_collection(name=collection_name, dimensions=8)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=v, external_id=str(i), text=f"word{i % 3}") for i, v in enumerate(rng.normal(size=(300, 8)))
        ],
    )
    c = store.get_collection(name=collection_name)
    vector = rng.normal(size=8).astype(np.float32)
    plans = {
        "unfiltered": store.plain_search(c, vector=vector, k=5, filter=None, ef_search=None, exact=False),
        "filtered": store.plain_search(
            c,
            vector=vector,
            k=5,
            filter=check_query(mode=None, vector=vector, text=None, k=5, filter={"a": 1}).filter,
            ef_search=None,
            exact=False,
        ),
    }
    with one_connection.connect() as sa_conn:
        conn = sa_conn.connection.driver_connection
        assert isinstance(conn, psycopg.Connection)
        conn.execute("SET enable_seqscan = off")  # the walk, not a scan of a tiny table
        for name, p in plans.items():
            lines = [r[0] for r in conn.execute(sql.SQL("EXPLAIN (COSTS OFF) ") + p.statement, p.params).fetchall()]
            top = [line for line in lines if not line.startswith(" ")]
            assert top and top[0].startswith(("Sort", "Limit")), (name, lines)
            assert any(line.lstrip().startswith("Sort Key: ((c.distance + ") for line in lines), (name, lines)
            assert any("hnsw" in line or "Index Scan" in line for line in lines), (name, lines)
        sa_conn.rollback()
