"""The connections searches run on (``memstore.search_pool`` through ``memstore.db.search_connections``):
reused last returned first, bounded, never handed out broken, closed with their engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolClosed, PoolTimeout

from memstore.db import async_search_connections, create_engine, dedicated_connection, search_connections
from memstore.models import ItemIn
from memstore.search_pool import SearchConnections
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
            waiter = threading.Thread(target=lambda: got.append(searches.run(_pid)))
            searches.timeout_s = 30.0
            waiter.start()  # waits for the one connection ...
            held_pid = _pid(held)
        waiter.join(10)  # ... and gets it once it is returned
        assert got == [held_pid] and searches.opened == 1
    finally:
        searches.close()
        engine.dispose()


def test_a_connection_the_server_closed_while_idle_costs_no_failed_search(
    three: sa.Engine, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(three, settings=settings)
    base = _filled(store, collection_name)
    store.search(collection=collection_name, vector=base[0], k=1)
    searches = search_connections(three)
    victim = searches.run(_pid)
    with three.connect() as admin:  # the server ends that backend (a restart, an idle timeout)
        admin.exec_driver_sql(f"SELECT pg_terminate_backend({victim}, 10000)")  # returns once it is gone
    for i in range(3):
        assert store.search(collection=collection_name, vector=base[i], k=1)[0].external_id == str(i)
    assert searches.run(_pid) != victim
    store.drop_collection(name=collection_name)


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
