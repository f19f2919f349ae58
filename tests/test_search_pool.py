"""The connections searches run on (``memstore.db.search_pool`` through ``memstore.db.core.search_connections``):
reused last returned first, bounded, never handed out broken, closed with their engine."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed, PoolTimeout

from memstore.db.core import (
    Database,
    async_search_connections,
    connection_lost,
    create_engine,
    dedicated_connection,
    search_connections,
)
from memstore.db.search_pool import SearchConnections
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore


@pytest.fixture
def three(database_url: str) -> Iterator[sa.Engine]:
    """An engine whose pool keeps three connections: its searches get three too."""
    engine = create_engine(database_url, pool_size=3, max_overflow=0)
    yield engine
    engine.dispose()


def _pid(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


def _filled(store: VectorStore, name: str) -> np.ndarray:
    base = np.random.default_rng(5).normal(size=(50, 8)).astype(np.float32)
    store.create_collection(name=name, dimensions=8)
    store.upsert_items(collection=name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(base)])
    return base


def test_searches_one_after_another_use_one_connection_of_their_own(
    three: sa.Engine, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(three, settings=settings)
    base = _filled(store, collection_name)
    searches = search_connections(three)
    assert searches.max_size == 3  # as many as the engine's pool keeps
    assert search_connections(three) is searches  # one set per engine, whichever store asks
    before = searches.opened
    for i in range(10):
        assert store.search(collection=collection_name, vector=base[i], k=1)[0].external_id == str(i)
    assert searches.opened - before <= 1 and searches.idle_count() == 1
    with searches.connection() as conn:
        assert conn.autocommit  # a search needs no transaction of its own
        assert conn.execute("SELECT current_setting('application_name')").fetchone() == ("memstore-search",)
    store.drop_collection(name=collection_name)


def test_the_connection_returned_last_is_handed_out_first(three: sa.Engine) -> None:
    searches = search_connections(three)
    with searches.connection() as a, searches.connection() as b, searches.connection() as c:
        pids = [_pid(a), _pid(b), _pid(c)]  # a burst of three at once; c is returned first, a last
    assert len(set(pids)) == 3
    for _ in range(5):
        assert searches.run(_pid) == pids[0]


def test_a_search_waits_while_every_connection_is_out_and_then_gives_up(database_url: str) -> None:
    engine = create_engine(database_url)
    searches = SearchConnections(
        lambda: dedicated_connection(engine, application_name="t"), lambda conn: True, max_size=1, timeout_s=0.2
    )
    try:
        with searches.connection() as held:
            with pytest.raises(PoolTimeout, match="all 1 search connections were busy"):
                searches.run(_pid)
            got: list[int] = []
            searches.timeout_s = 60.0
            waiter = threading.Thread(target=lambda: got.append(searches.run(_pid)))
            waiter.start()
            deadline = time.monotonic() + 30
            while searches._waiting == 0 and time.monotonic() < deadline:  # the waiter waits for the one ...
                time.sleep(0.01)
            assert searches._waiting == 1
            held_pid = _pid(held)
        waiter.join(30)  # ... and gets it once it is returned
        assert got == [held_pid] and searches.opened == 1
    finally:
        searches.close()
        engine.dispose()


def test_a_connection_the_server_closed_while_idle_is_dropped_before_a_search_uses_it(
    three: sa.Engine, settings: Settings, collection_name: str
) -> None:
    searches = search_connections(three)
    victim = searches.run(_pid)
    opened = searches.opened
    with three.connect() as admin:  # the server ends that backend (a restart, an idle timeout)
        admin.exec_driver_sql(f"SELECT pg_terminate_backend({victim}, 10000)")  # returns once it is gone
    # No retry here (run has none): the closed connection is found out before the statement is sent.
    assert searches.run(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)
    assert searches.opened == opened + 1 and searches.run(_pid) != victim
    store = VectorStore(three, settings=settings)  # and through the store
    base = _filled(store, collection_name)
    assert store.search(collection=collection_name, vector=base[3], k=1)[0].external_id == "3"
    store.drop_collection(name=collection_name)


def test_a_search_whose_connection_breaks_runs_once_more_and_a_cancelled_one_does_not(three: sa.Engine) -> None:
    db = Database(three)
    calls: list[int] = []

    def killed_on_first_call(conn: psycopg.Connection) -> int:
        calls.append(_pid(conn))
        if len(calls) == 1:  # the server ends the session under the statement (a restart)
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return _pid(conn)

    assert db.run_search(killed_on_first_call) == calls[1] and len(calls) == 2 and calls[0] != calls[1]

    def timed_out(conn: psycopg.Connection) -> None:
        calls.append(_pid(conn))
        conn.execute("SET statement_timeout = 50")
        try:
            conn.execute("SELECT pg_sleep(5)")
        finally:
            conn.execute("RESET statement_timeout")

    calls.clear()
    with pytest.raises(psycopg.errors.QueryCanceled):
        db.run_search(timed_out)
    assert len(calls) == 1  # the server cancelled it: not run again
    assert connection_lost(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert not connection_lost(PoolTimeout("busy")) and not connection_lost(PoolClosed("closed"))


def test_a_forked_child_neither_uses_nor_closes_its_parent_s_connections(three: sa.Engine) -> None:
    searches = search_connections(three)
    with searches.connection() as held, searches.connection() as idle_at_fork:
        parent = [_pid(held), _pid(idle_at_fork)]
    with searches.connection() as held:  # forked while this one is out, the other idle
        child = os.fork()
        if child == 0:  # the child: connections of its own; the parent's left open for the parent
            code = 1
            try:
                searches.close()
                mine = {searches.run(_pid) for _ in range(3)}
                code = 0 if not mine & set(parent) and searches.opened >= 1 and searches.idle_count() == 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert held.execute("SELECT 1").fetchone() == (1,)  # still the parent's own session
    with searches.connection() as a, searches.connection() as b:
        assert sorted([_pid(a), _pid(b)]) == sorted(parent)  # both still open and the parent's
        assert a.execute("SELECT 1").fetchone() == b.execute("SELECT 1").fetchone() == (1,)


def test_a_connection_out_when_the_process_forked_is_left_alone_by_the_child(three: sa.Engine) -> None:
    searches = search_connections(three)
    with searches.connection() as held:
        parent = _pid(held)
        child = os.fork()
        if child == 0:
            searches.close()  # in the child, with the parent's connection still out in this block
    # Both processes leave the block: each gives the connection back to its own copy of the set.
    if child == 0:
        code = 1
        try:
            code = 0 if searches.run(_pid) != parent and searches._out == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The child neither closed the parent's connection (which would end its session on the server)
    # nor kept it: the parent's next search runs on it.
    assert searches.run(lambda conn: (_pid(conn), conn.execute("SELECT 1").fetchone())) == (parent, (1,))


def test_a_connection_left_in_a_transaction_or_broken_is_never_handed_out_again(three: sa.Engine) -> None:
    searches = search_connections(three)
    with searches.connection() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
        left_open = conn
        assert conn.info.transaction_status == TransactionStatus.INTRANS
    assert left_open.closed  # closed on return, not kept with its transaction
    with pytest.raises(ZeroDivisionError), searches.connection() as conn:
        first = conn
        raise ZeroDivisionError  # an error of the caller's: the connection itself is fine
    assert not first.closed and searches.run(lambda c: c is first)


def test_disposing_of_the_engine_closes_its_search_connections(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=2, max_overflow=0)
    searches = search_connections(engine)
    with searches.connection() as out:
        with searches.connection() as idle_one:
            pass
        engine.dispose()
        assert idle_one.closed  # idle: closed at once
        assert not out.closed  # in use: left alone ...
    assert out.closed  # ... and closed on its return
    assert searches.run(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)  # new ones after
    engine.dispose()


def test_the_event_loop_s_connections_are_reused_last_returned_first_bounded_and_closed(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=2, max_overflow=0)

    async def pid(conn: psycopg.AsyncConnection) -> int:
        return conn.info.backend_pid

    async def scenario() -> None:
        searches = async_search_connections(engine, max_size=2)
        searches.timeout_s = 0.2
        async with searches.connection() as a, searches.connection() as b:
            first, second = a.info.backend_pid, b.info.backend_pid  # b is returned first, a last
            assert a.autocommit and first != second
            with pytest.raises(PoolTimeout, match="all 2 search connections were busy"):
                await searches.run(pid)
        assert [await searches.run(pid) for _ in range(4)] == [first] * 4 and searches.opened == 2
        async with searches.connection() as conn:  # the server ends the other backend while it is idle
            await conn.execute("SELECT pg_terminate_backend(%s, 10000)", (second,))  # returns once it is gone
        async with searches.connection() as c, searches.connection() as d:
            pids = {c.info.backend_pid, d.info.backend_pid}
        assert first in pids and second not in pids and searches.opened == 3
        await searches.close()
        assert searches.idle_count() == 0 and c.closed
        with pytest.raises(PoolClosed):
            await searches.run(pid)

    try:
        asyncio.run(scenario())
    finally:
        engine.dispose()
