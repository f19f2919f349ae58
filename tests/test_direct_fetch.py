"""``memstore.db.direct_fetch``: a statement sent straight through libpq answers what psycopg's async
cursor answers (the same values, the same errors), prepares as psycopg would, keeps a bounded set of
prepared statements, and leaves no statement running when its task is cancelled."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb

from memstore.db import direct_fetch
from memstore.db.core import async_search_connections, connection_lost, create_engine, libpq_url
from memstore.db.direct_fetch import fetch_rows, to_postgres
from memstore.db.search_pool import _reusable


def test_placeholders_become_numbered_parameters_once_per_name() -> None:
    query, names, formats = to_postgres(b"SELECT %(a)s, %(b)b, %(a)s WHERE x LIKE 'p%%'")
    assert query == b"SELECT $1, $2, $1 WHERE x LIKE 'p%'"
    assert names == ("a", "b")
    assert [f.name for f in formats] == ["AUTO", "BINARY"]
    for bad in (b"SELECT %s", b"SELECT 1 % 2", b"SELECT %(a)s, %(a)t"):
        with pytest.raises(ValueError):
            to_postgres(bad)


@asynccontextmanager
async def search_connection(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A search connection as the search runner gets one (autocommit, pgvector and JSON registered),
    with a small table of its own."""
    engine = create_engine(database_url)
    searches = async_search_connections(engine, max_size=1)
    async with searches.connection() as c:
        await c.execute("CREATE TEMP TABLE t (id bigint PRIMARY KEY, name text, metadata jsonb, embedding vector(3))")
        rows = [
            (i, f"n{i}", Jsonb({"i": i, "tags": ["a", "b"][: i % 3]}), np.array([i, 1, 0], dtype=np.float32))
            for i in range(1, 9)
        ]
        await c.cursor().executemany("INSERT INTO t VALUES (%s, %s, %s, %s)", rows)
        yield c
    await searches.close()
    engine.dispose()


def run(database_url: str, scenario: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with search_connection(database_url) as conn:
            await scenario(conn)

    asyncio.run(main())


async def _cursor_rows(c: psycopg.AsyncConnection[Any], statement: Any, params: dict[str, Any]) -> list[Any]:
    return await (await c.execute(statement, params)).fetchall()


async def _prepared_names(c: psycopg.AsyncConnection[Any]) -> list[str]:
    rows = await (await c.execute("SELECT name FROM pg_prepared_statements ORDER BY name")).fetchall()
    return [r[0] for r in rows if r[0].startswith("memstore_")]


NEAREST = "SELECT id, name, metadata, embedding <-> %(q)s AS d FROM t ORDER BY embedding <-> %(q)s LIMIT 3"


def test_rows_and_values_are_the_cursors(database_url: str) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        q = np.array([4.2, 1, 0], dtype=np.float32)
        got = await fetch_rows(conn, NEAREST, {"q": q}, prepare=True)
        assert got == await _cursor_rows(conn, NEAREST, {"q": q})
        assert [r[0] for r in got] == [4, 5, 3] and got[0][2] == {"i": 4, "tags": ["a"]}
        filtered = sql.SQL("SELECT id, metadata FROM t WHERE metadata @> {m} AND name <> {n} ORDER BY id").format(
            m=sql.Placeholder("m"), n=sql.Placeholder("n")
        )
        params = {"m": Jsonb({"tags": ["a", "b"]}), "n": "n5"}
        got = await fetch_rows(conn, filtered, params, prepare=False)
        assert got == await _cursor_rows(conn, filtered, params)
        assert [r[0] for r in got] == [2, 8]
        assert await fetch_rows(conn, "SELECT id FROM t WHERE id > %(k)s", {"k": 100}, prepare=None) == []

    run(database_url, scenario)


def test_prepared_as_psycopg_would_and_at_most_max_prepared(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        q = np.array([1, 1, 0], dtype=np.float32)
        await fetch_rows(conn, NEAREST, {"q": q}, prepare=False)
        assert await _prepared_names(conn) == []  # False: never
        for run in range(direct_fetch.PREPARE_THRESHOLD):  # None: once it ran that many times
            await fetch_rows(conn, NEAREST, {"q": q}, prepare=None)
            assert await _prepared_names(conn) == [], run
        await fetch_rows(conn, NEAREST, {"q": q}, prepare=None)
        assert len(await _prepared_names(conn)) == 1
        monkeypatch.setattr(direct_fetch, "MAX_PREPARED", 2)
        for limit in (1, 2, 3, 4):
            statement = f"SELECT id FROM t ORDER BY embedding <-> %(q)s LIMIT {limit}"
            rows = await fetch_rows(conn, statement, {"q": q}, prepare=True)
            assert len(rows) == limit
        names = await _prepared_names(conn)
        assert len(names) == 2  # the least recently used ones deallocated

    run(database_url, scenario)


def test_errors_are_psycopgs_and_the_connection_stays_usable(database_url: str) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await fetch_rows(conn, "SELECT id FROM no_such_table WHERE id = %(i)s", {"i": 1}, prepare=True)
        with pytest.raises(psycopg.errors.DivisionByZero):
            await fetch_rows(conn, "SELECT id / %(z)s FROM t", {"z": 0}, prepare=False)
        assert conn.pgconn.transaction_status == TransactionStatus.IDLE and _reusable(conn)
        assert await fetch_rows(conn, "SELECT count(*) FROM t WHERE id > %(i)s", {"i": 0}, prepare=True) == [(8,)]

    run(database_url, scenario)


def test_a_prepared_statement_whose_table_changed_is_prepared_afresh(database_url: str) -> None:
    table = f"direct_fetch_{uuid.uuid4().hex[:8]}"
    statement = f"SELECT * FROM {table} WHERE id = %(i)s"

    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as other:
            await other.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY)")
            await other.execute(f"INSERT INTO {table} VALUES (1)")
            try:
                assert await fetch_rows(conn, statement, {"i": 1}, prepare=True) == [(1,)]
                await other.execute(f"ALTER TABLE {table} ADD COLUMN extra int DEFAULT 7")
                with pytest.raises(psycopg.errors.FeatureNotSupported):  # cached plan must not change result type
                    await fetch_rows(conn, statement, {"i": 1}, prepare=True)
                assert await fetch_rows(conn, statement, {"i": 1}, prepare=True) == [(1, 7)]
            finally:
                await other.execute(f"DROP TABLE {table}")

    run(database_url, scenario)


def test_statements_deallocated_behind_its_back_are_said_so_then_prepared_again(database_url: str) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        q = np.array([1, 1, 0], dtype=np.float32)
        first = await fetch_rows(conn, NEAREST, {"q": q}, prepare=True)
        await conn.execute("DEALLOCATE ALL")  # as psycopg sends after a DROP, an ALTER or a ROLLBACK
        assert await _prepared_names(conn) == []
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):  # the caller's cue: set its settings again
            await fetch_rows(conn, NEAREST, {"q": q}, prepare=True)
        assert await fetch_rows(conn, NEAREST, {"q": q}, prepare=True) == first
        assert len(await _prepared_names(conn)) == 1

    run(database_url, scenario)


async def _sleeping(conn: psycopg.AsyncConnection[Any]) -> tuple[int, asyncio.Task[list[tuple[Any, ...]]]]:
    """A statement of 30 s under way on ``conn``: its backend's pid and the task awaiting it."""
    task = asyncio.create_task(fetch_rows(conn, "SELECT pg_sleep(%(s)s)", {"s": 30}, prepare=False))
    await asyncio.sleep(0.4)
    return conn.info.backend_pid, task


def test_a_cancelled_fetch_leaves_nothing_running(database_url: str) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        pid, task = await _sleeping(conn)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 10
        assert not _reusable(conn)  # a statement was in flight: the search pool closes it, never reuses it
        async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as other:
            for _ in range(50):
                state = await (
                    await other.execute("SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,))
                ).fetchone()
                if state is None or state[0] != "active":
                    break
                await asyncio.sleep(0.1)
            assert state is None or state[0] != "active", f"the cancelled statement still runs: {state}"

    run(database_url, scenario)


def test_a_backend_terminated_mid_statement_answers_the_servers_error(database_url: str) -> None:
    async def scenario(conn: psycopg.AsyncConnection[Any]) -> None:
        pid, task = await _sleeping(conn)
        async with await psycopg.AsyncConnection.connect(libpq_url(database_url), autocommit=True) as other:
            await other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(psycopg.OperationalError) as raised:
            await asyncio.wait_for(task, 20)
        # The server's own error (admin shutdown), not libpq's "connection closed": what the search
        # path's retry rule reads (memstore.db.core.connection_lost).
        assert raised.value.sqlstate == "57P01" and connection_lost(raised.value)
        assert not _reusable(conn)

    run(database_url, scenario)
