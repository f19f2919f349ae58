"""Session-level advisory locks: their names and how they are taken, in one place.

- ``index_key(name)``: one maintainer per HNSW index (the maintenance worker's VACUUM and rebuilds,
  and the compact upkeep's REINDEX, take the same lock, so they never rebuild one index twice);
- ``collection_key(id)``: one representation switch or refit per collection.

The claimers' locks (``memstore.queue.claims``) and the migration lock are of another kind (a number per
worker, a transaction lock) and stay with their owners.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg


def index_key(index_or_table: str) -> str:
    return f"memstore.maint.{index_or_table}"


def collection_key(collection_id: int) -> str:
    return f"memstore.compact.{collection_id}"


@contextmanager
def session_lock(
    conn: psycopg.Connection[Any], key: str, *, busy: Callable[[], Exception], wait_s: float = 0.0
) -> Iterator[None]:
    """Hold ``key`` for the block (session level, so it spans the block's own transactions); raise
    ``busy()`` when another session holds it for longer than ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()
        if row and row[0]:
            break
        if time.monotonic() >= deadline:
            raise busy()
        time.sleep(0.2)
    try:
        yield
    finally:
        if not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))
