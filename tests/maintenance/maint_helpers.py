"""Helpers shared by the maintenance tests (a module with a unique name: tests have no packages)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psycopg

from memstore.catalog.collections import Collection


def clustered(n: int, dims: int, *, seed: int = 0, clusters: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, dims))
    x = centres[rng.integers(0, clusters, size=n)] * 0.7 + rng.normal(size=(n, dims))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def churn(
    conn: psycopg.Connection[Any], c: Collection, *, update: float = 0.0, delete: float = 0.0, seed: int = 1
) -> None:
    """Update and delete fractions of the rows (new vectors: real index churn), then flush the statistics."""
    rng = np.random.default_rng(seed)
    ids = np.array([r[0] for r in conn.execute(f'SELECT id FROM "{c.table_name}" ORDER BY id').fetchall()])
    picked = rng.permutation(ids)
    n_upd, n_del = int(len(ids) * update), int(len(ids) * delete)
    if n_upd:
        new = clustered(n_upd, c.dimensions, seed=seed + 100)
        with conn.cursor() as cur:
            cur.executemany(
                f'UPDATE "{c.table_name}" SET embedding = %s WHERE id = %s',
                [(v, int(i)) for v, i in zip(new, picked[:n_upd], strict=True)],
            )
    if n_del:
        conn.execute(f'DELETE FROM "{c.table_name}" WHERE id = ANY(%s)', (picked[n_upd : n_upd + n_del].tolist(),))
    conn.execute("SELECT pg_stat_force_next_flush()")


def invalid_indexes(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(%s) AND NOT x.indisvalid",
        (table,),
    ).fetchall()
    return [r[0] for r in rows]


def index_oid(conn: psycopg.Connection[Any], index: str) -> int:
    row = conn.execute("SELECT to_regclass(%s)::oid", (index,)).fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


class Blocker:
    """An open transaction that has written to the table: REINDEX CONCURRENTLY waits for it after it
    has created (and committed) its ``*_ccnew`` index, which makes the interruption deterministic.
    ``snapshot_only``: a transaction that only holds a snapshot (read elsewhere), which the build
    waits for too, without a lock on the table or its indexes (an ALTER INDEX goes through)."""

    def __init__(self, dsn: str, table: str, *, snapshot_only: bool = False) -> None:
        self.conn = psycopg.connect(dsn)
        if snapshot_only:
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            self.conn.execute("SELECT 1")
        else:
            self.conn.execute(f'UPDATE "{table}" SET updated_at = now() WHERE id = (SELECT min(id) FROM "{table}")')

    def release(self, *, commit: bool = False) -> None:
        if commit:
            self.conn.commit()
        else:
            self.conn.rollback()
        self.conn.close()


def ccnew_exists(conn: psycopg.Connection[Any], table: str) -> bool:
    return any("_ccnew" in name for name in invalid_indexes(conn, table))
