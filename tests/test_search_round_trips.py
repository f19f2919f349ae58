"""A search through the Python API is one round trip, and what one search sets never reaches the next.

The round trips are counted from libpq's own protocol trace of the search connection
(``memstore.db.search_connections``): every round trip ends with a Sync (extended protocol) or is a
simple Query, so a search that sends one Sync and no Query waited on the server once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg import pq, sql

from memstore import search_sql
from memstore.db import search_connections
from memstore.errors import CollectionNotFoundError
from memstore.models import ItemIn
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
    failing = search_sql.SearchSettings(ef_search=11, exact=False, max_scan_tuples=100)
    with pytest.raises(psycopg.errors.DivisionByZero), search_connections(one_connection).connection() as conn:
        search_sql.run_search(conn, failing, sql.SQL("SELECT 1 / 0"), {})
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
    """``search_sql.run_search`` on a pooled connection inside a transaction (the duplicates scan, reads
    on a replica): its settings are the transaction's, gone once it ends."""
    store = VectorStore(one_connection, settings=settings)
    base = _filled(store, collection_name)
    c = store.get_collection(name=collection_name)
    statement = search_sql.search_statement(c.table_name, c.spec.operator, exact=True, limit=3)
    exact = search_sql.SearchSettings(ef_search=13, exact=True, max_scan_tuples=100)
    with store.db.read() as conn:
        conn.execute("SELECT 1")  # the transaction is open before the search
        rows = search_sql.run_search(conn, exact, statement, {"q": base[5]})
        held = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')").fetchone()
        pid = conn.info.backend_pid
    assert rows[0][1] == "5" and held == ("13", "off")
    with store.db.read() as conn:
        assert conn.info.backend_pid == pid  # the pool's one connection, after the transaction
        after = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('enable_indexscan')").fetchone()
    assert after is not None and after[0] != "13" and after[1] == "on"
