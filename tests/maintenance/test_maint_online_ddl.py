"""``memstore.db.online_ddl``'s CONCURRENTLY statements: they wait out open transactions (no lock
timeout: they block no reader or writer) and leave no INVALID index behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog.collections import Collection
from memstore.db import online_ddl
from tests.maintenance.maint_helpers import Blocker, ccnew_exists, index_oid, invalid_indexes, wait_for


def _session(dsn: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    online_ddl.set_lock_timeout(conn)
    return conn


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def test_the_statements_that_run_concurrently_are_told_apart(conn: psycopg.Connection[Any]) -> None:
    concurrent = [
        'REINDEX INDEX CONCURRENTLY "x"',
        "reindex (verbose) table concurrently x",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS x ON t (a)",
        "  CREATE UNIQUE INDEX CONCURRENTLY x ON t (a)",
        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier("x")),
    ]
    other = ["DROP INDEX IF EXISTS x", "ALTER INDEX x SET (m = 32)", "CREATE INDEX x ON t (a)", "REINDEX INDEX x"]
    assert all(online_ddl.runs_concurrently(conn, s) for s in concurrent)
    assert not any(online_ddl.runs_concurrently(conn, s) for s in other)


def test_a_concurrent_rebuild_waits_out_an_open_transaction_and_leaves_no_invalid_index(
    dsn: str, conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """Under the 500 ms lock timeout every try failed while a transaction stayed open, each leaving
    its ``*_ccnew`` copy behind for every write to maintain."""
    c = make_collection(1500, 16)
    old = index_oid(conn, c.index_name)
    session = _session(dsn)
    blocker = Blocker(dsn, c.table_name)
    statement = sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(c.index_name))
    t, errors = _in_thread(lambda: online_ddl.execute(session, statement))
    try:
        wait_for(lambda: ccnew_exists(conn, c.table_name))
        time.sleep(2.0)  # four lock timeouts
    finally:
        blocker.release(commit=True)
    t.join(60)
    assert errors == []
    assert index_oid(conn, c.index_name) != old
    assert invalid_indexes(conn, c.table_name) == []
    shown = session.execute("SHOW lock_timeout").fetchone()
    assert shown is not None and shown[0] == online_ddl.LOCK_TIMEOUT  # the session's own again
    session.close()


def test_a_concurrent_build_waits_out_an_open_transaction(
    dsn: str, conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """Under the lock timeout the build failed, and its retry found the name taken by the invalid
    index the first try had left."""
    c = make_collection(1000, 16)
    name = f"{c.table_name}_at"
    session = _session(dsn)
    blocker = Blocker(dsn, c.table_name)
    table, definition = sql.Identifier(c.table_name), sql.SQL("(updated_at)")
    t, errors = _in_thread(lambda: online_ddl.build_table_index(session, name, table, definition))
    try:
        wait_for(lambda: online_ddl.index_valid(conn, name) is False)  # made, waiting for the writer
        time.sleep(2.0)
    finally:
        blocker.release(commit=True)
    t.join(60)
    assert errors == []
    assert online_ddl.index_valid(conn, name) is True
    session.close()


def test_a_failed_concurrent_build_drops_the_invalid_index_it_made(
    dsn: str, conn: psycopg.Connection[Any], make_collection: Callable[..., Collection]
) -> None:
    """Every write to the table would go on maintaining it."""
    c = make_collection(1000, 16)
    name = f"{c.table_name}_odd"
    session = _session(dsn)
    failing = sql.SQL("((1 / (id % 2)))")  # the build divides by zero on the even ids
    try:
        online_ddl.build_table_index(session, name, sql.Identifier(c.table_name), failing)
    except psycopg.errors.DivisionByZero:
        pass
    else:
        raise AssertionError("the build did not fail")
    assert online_ddl.index_valid(conn, name) is None
    assert invalid_indexes(conn, c.table_name) == []
    session.close()
