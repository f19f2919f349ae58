"""Every search statement is bounded by ``MEMSTORE_SEARCH_TIMEOUT_MS`` (PostgreSQL's statement_timeout
on the search connections): a statement past it is cancelled on the server, raises QueryCanceled (the
API answers 504), and its connection serves the next search."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa

from memstore.db.core import Database, create_engine


@pytest.fixture
def fresh(database_url: str) -> Iterator[sa.Engine]:
    """An engine of its own: the search connections are made per engine, with its first caller's bound."""
    engine = create_engine(database_url, pool_size=2, max_overflow=0)
    yield engine
    engine.dispose()


def test_a_search_past_the_timeout_is_cancelled_and_its_connection_serves_the_next(fresh: sa.Engine) -> None:
    db = Database(fresh, search_timeout_ms=300)
    with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
        db.run_search(lambda conn: conn.execute("SELECT pg_sleep(30)").fetchall())
    assert db.run_search(lambda conn: conn.execute("SHOW statement_timeout").fetchone()) == ("300ms",)
    assert db.run_search(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)


def test_the_event_loops_search_connections_carry_the_same_bound(fresh: sa.Engine) -> None:
    db = Database(fresh, search_timeout_ms=300)

    async def run() -> tuple[str, ...]:
        connections = db.async_search_connections(max_size=1)
        try:
            async with connections.connection() as conn:
                with pytest.raises(psycopg.errors.QueryCanceled):
                    await conn.execute("SELECT pg_sleep(30)")
            async with connections.connection() as conn:
                cur = await conn.execute("SHOW statement_timeout")
                row = await cur.fetchone()
                assert row is not None
                return tuple(row)
        finally:
            await connections.close()

    assert asyncio.run(run()) == ("300ms",)


def test_with_replicas_the_bound_is_the_searchs_own_transaction(fresh: sa.Engine, database_url: str) -> None:
    """Read pools also serve reads that are not searches: the bound is SET LOCAL, gone after the search."""
    replica = create_engine(database_url, pool_size=1, max_overflow=0)
    db = Database(fresh, [replica], search_timeout_ms=300, probe_s=3600)
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            db.run_search(lambda conn: conn.execute("SELECT pg_sleep(30)").fetchall())
        assert db.run_search(lambda conn: conn.execute("SHOW statement_timeout").fetchone()) == ("300ms",)
        assert db.run_read(lambda conn: conn.execute("SHOW statement_timeout").fetchone()) == ("0",)
    finally:
        db.close()
        replica.dispose()


def test_a_search_on_a_thread_is_cancelled_on_the_server_when_asked(fresh: sa.Engine) -> None:
    """The API cancels a thread's search when its client goes away (``Runtime.off_loop``): the
    statement stops on the server at once and the connection serves the next search."""
    import contextvars
    import threading
    import time

    from memstore.db.search_pool import CANCEL, Cancel

    db = Database(fresh, search_timeout_ms=60_000)
    scope = Cancel()
    context = contextvars.copy_context()
    context.run(CANCEL.set, scope)
    outcome: list[BaseException | object] = []

    def search() -> None:
        try:
            outcome.append(db.run_search(lambda conn: conn.execute("SELECT pg_sleep(30)").fetchall()))
        except BaseException as exc:  # the outcome is what the test reads
            outcome.append(exc)

    thread = threading.Thread(target=context.run, args=(search,))
    started = time.monotonic()
    thread.start()
    time.sleep(0.5)
    scope.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive() and time.monotonic() - started < 10
    assert isinstance(outcome[0], psycopg.errors.QueryCanceled)
    assert db.run_search(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)
    # A search that starts after the cancel does not run.
    with pytest.raises(psycopg.errors.QueryCanceled, match="before it ran"):
        context.run(db.run_search, lambda conn: conn.execute("SELECT 1").fetchone())
