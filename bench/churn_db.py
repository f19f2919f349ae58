"""Database helpers shared by ``bench.churn`` and ``bench.churn_calibrate``: plain tables, COPY, top-k."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from pgvector.psycopg import register_vector

from memstore.db import online_ddl
from memstore.db.core import libpq_url, resolve_database_url
from memstore.search.statements import SearchSettings, apply, search_statement
from memstore.settings import get_settings


def connect(autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection to the configured database (``MEMSTORE_DATABASE_URL`` or the embedded server)."""
    settings = get_settings()
    conn = psycopg.connect(libpq_url(resolve_database_url(settings)), autocommit=autocommit)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    # The same build settings the maintenance worker uses, so every strategy gets the same resources.
    online_ddl.build_resources(conn, settings)
    register_vector(conn)
    return conn


def create_table(conn: psycopg.Connection[Any], table: str, dims: int, *, autovacuum: bool) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, embedding vector({dims}) NOT NULL) "
        f"WITH (autovacuum_enabled = {str(autovacuum).lower()})"
    )


def load_rows(conn: psycopg.Connection[Any], table: str, ids: npt.NDArray[Any], vectors: np.ndarray) -> None:
    with conn.cursor() as cur, cur.copy(f"COPY {table} (id, embedding) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "vector"])
        for i, v in zip(ids.tolist(), vectors, strict=True):
            copy.write_row((i, v))


def index_bytes(conn: psycopg.Connection[Any], index: str) -> int:
    row = conn.execute("SELECT pg_relation_size(%s::regclass)", (index,)).fetchone()
    return int(row[0]) if row else 0


def fetch_topk(
    conn: psycopg.Connection[Any],
    table: str,
    queries: np.ndarray,
    k: int,
    *,
    ef_search: int,
    index_only: bool = False,
) -> list[list[int]]:
    """The index's answers, with the store's search settings (iterative scan, re-sorted); ``index_only``:
    from the graph even where the planner would scan a small table instead (what a ladder measures)."""
    out: list[list[int]] = []
    settings = SearchSettings(ef_search=ef_search, exact=False, max_scan_tuples=20_000, index_only=index_only)
    statement = search_statement(table, "<=>", exact=False, ids_only=True)
    with conn.transaction(), conn.cursor() as cur:
        apply(cur, settings)
        for q in queries:
            cur.execute(statement, {"q": q, "k": k})
            out.append([int(r[0]) for r in cur.fetchall()])
    return out


def exact_topk(vectors: np.ndarray, ids: npt.NDArray[Any], queries: np.ndarray, k: int) -> list[set[int]]:
    """Ground truth by cosine distance in numpy (vectors are unit length)."""
    sims = queries @ vectors.T
    top = np.argpartition(-sims, kth=min(k, sims.shape[1] - 1), axis=1)[:, :k]
    return [{int(ids[j]) for j in row} for row in top]


def recall_at(found: list[list[int]], truth: list[set[int]]) -> float:
    k = max(len(t) for t in truth)
    hits = sum(len(set(f) & t) for f, t in zip(found, truth, strict=True))
    return round(hits / (k * len(truth)), 4)
