"""The pool's connections come back clean: what a borrower left open is rolled back on return (the
pool's reset event does it only when something is open; an idle connection costs nothing)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from psycopg.pq import TransactionStatus

from memstore.db.core import create_engine, raw_connection


def test_a_connection_returned_inside_a_transaction_is_rolled_back(one_connection: sa.Engine) -> None:
    proxied = one_connection.raw_connection()
    conn = proxied.driver_connection
    assert conn is not None
    conn.execute("CREATE TEMP TABLE left_open (n int)")  # a transaction begins, and is never ended
    conn.execute("INSERT INTO left_open VALUES (1)")
    assert conn.info.transaction_status == TransactionStatus.INTRANS
    proxied.close()  # back to the pool with the transaction open
    with raw_connection(one_connection) as again:
        assert again is conn  # the pool's one connection ...
        assert again.info.transaction_status == TransactionStatus.IDLE  # ... rolled back on return
        row = again.execute("SELECT to_regclass('pg_temp.left_open')").fetchone()
        assert row == (None,)  # the uncommitted table went with it


def test_a_failed_transaction_is_rolled_back_on_return(one_connection: sa.Engine) -> None:
    proxied = one_connection.raw_connection()
    conn = proxied.driver_connection
    assert conn is not None
    with pytest.raises(Exception, match="division by zero"):
        conn.execute("SELECT 1 / 0")
    assert conn.info.transaction_status == TransactionStatus.INERROR
    proxied.close()
    with raw_connection(one_connection) as again:
        assert again.execute("SELECT 1").fetchone() == (1,)  # usable: not stuck in the failed transaction


def test_requests_one_after_another_keep_to_the_last_returned_connection(database_url: str) -> None:
    """The pool hands out the connection returned last (LIFO): after a burst opened several, requests
    in a row reuse one warm backend instead of taking turns through them all."""
    engine = create_engine(database_url, pool_size=3, max_overflow=0)
    try:
        burst = [engine.raw_connection() for _ in range(3)]  # three at once, as side-by-side writers
        pids = [c.driver_connection.info.backend_pid for c in burst]  # type: ignore[union-attr]
        assert len(set(pids)) == 3
        for proxied in burst:
            proxied.close()  # returned in order: pids[2] last
        seen = set()
        for _ in range(6):
            with raw_connection(engine) as conn:
                seen.add(conn.info.backend_pid)
        assert seen == {pids[2]}
    finally:
        engine.dispose()
