"""Raw-SQL pieces of ``bench.stream``: bare tables, COPY, HNSW builds (with the parallel workers they
really got), searches and recall. Every option of the benchmark writes and searches through these, so
that the options differ only in what they are about."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from bench.peers_measure import time_searches
from memstore.db import online_ddl
from memstore.db.core import libpq_url
from memstore.settings import Settings

K = 10
EFS = (40, 80)  # recall is reported at both: 80 is memstore's default ef_search, 40 the cheaper one


def connect(url: str, settings: Settings) -> psycopg.Connection[Any]:
    """An autocommit connection (CREATE INDEX CONCURRENTLY needs one) with memstore's build settings."""
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    online_ddl.build_resources(conn, settings)
    register_vector(conn)
    return conn


def create_table(conn: psycopg.Connection[Any], table: str, dims: int) -> None:
    """``seq`` is the arrival order (the watermark's key); ``id`` the row's identity (the answers).
    Autovacuum is off so that no background ANALYZE or VACUUM lands inside one option's timing."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    conn.execute(
        sql.SQL(
            "CREATE TABLE {} (id bigint PRIMARY KEY, seq bigint NOT NULL, embedding vector({}) NOT NULL) "
            "WITH (autovacuum_enabled = false)"
        ).format(sql.Identifier(table), sql.Literal(dims))
    )


def copy_rows(conn: psycopg.Connection[Any], table: str, ids: np.ndarray, seqs: np.ndarray, rows: np.ndarray) -> None:
    """One COPY BINARY statement (its own transaction on the autocommit connection)."""
    statement = sql.SQL("COPY {} (id, seq, embedding) FROM STDIN (FORMAT BINARY)").format(sql.Identifier(table))
    with conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(["int8", "int8", "vector"])
        for i, s, v in zip(ids.tolist(), seqs.tolist(), rows, strict=True):
            copy.write_row((i, s, v))


def hnsw_clause(settings: Settings) -> sql.Composed:
    return sql.SQL("USING hnsw (embedding vector_cosine_ops) WITH (m = {}, ef_construction = {})").format(
        sql.Literal(settings.default_hnsw_m), sql.Literal(settings.default_hnsw_ef_construction)
    )


@contextmanager
def workers_watched(url: str, settings: Settings, pid: int) -> Iterator[list[int]]:
    """The most parallel workers seen at once under backend ``pid`` (polled from a second connection):
    whether a "parallel" build really ran in parallel depends on the table's size, not only on
    ``max_parallel_maintenance_workers``."""
    seen = [0]
    stop = threading.Event()

    def poll() -> None:
        with connect(url, settings) as watch:
            while not stop.wait(0.02):
                row = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE leader_pid = %s", (pid,)).fetchone()
                seen[0] = max(seen[0], int(row[0]) if row else 0)

    thread = threading.Thread(target=poll, name="bench-stream-workers", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(5)


def build(
    conn: psycopg.Connection[Any],
    url: str,
    settings: Settings,
    statement: sql.Composed,
    *,
    workers: int | None = None,
) -> tuple[float, int]:
    """Seconds of one index build, and the parallel workers it got; ``workers`` overrides the server's
    ``max_parallel_maintenance_workers`` for this build only."""
    if workers is not None:
        conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)", (str(workers),))
    try:
        with workers_watched(url, settings, conn.info.backend_pid) as seen:
            t0 = time.perf_counter()
            conn.execute(statement)
            seconds = time.perf_counter() - t0
    finally:
        online_ddl.build_resources(conn, settings)
    return seconds, seen[0]


def set_ef(conn: psycopg.Connection[Any], ef: int) -> None:
    conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))


def plain_search(table: str, key: str = "id") -> sql.Composed:
    """What raw pgvector runs: one ORDER BY ... LIMIT on the table's one HNSW index."""
    return sql.SQL("SELECT {}::bigint FROM {} ORDER BY embedding <=> %(q)s LIMIT {}").format(
        sql.SQL(key), sql.Identifier(table), sql.Literal(K)
    )


Search = Callable[[np.ndarray], list[int]]


class Side:
    """One way of searching, as ``bench.peers_measure.time_searches`` takes turns between them."""

    def __init__(self, name: str, search: Search) -> None:
        self.name, self.search = name, search


def timed_pair(first: Side, second: Side, queries: np.ndarray) -> dict[str, float]:
    """``first``'s latency against ``second``'s, taking turns of 25 queries (``time_searches``)."""
    a, b = time_searches([first, second], queries, rounds=1, warmup=20)
    return {
        "p50_ms": round(a.p50_ms, 3),
        "p99_ms": round(a.p99_ms, 3),
        f"{second.name}_p50_ms": round(b.p50_ms, 3),
        f"{second.name}_p99_ms": round(b.p99_ms, 3),
        f"p50_ratio_vs_{second.name}": round(a.p50_ms / b.p50_ms, 3),
        f"p99_ratio_vs_{second.name}": round(a.p99_ms / b.p99_ms, 3),
    }


def searcher(conn: psycopg.Connection[Any], statement: sql.SQL | sql.Composed) -> Search:
    """Prepared, as an application's repeated search would be."""
    return lambda q: [int(r[0]) for r in conn.execute(statement, {"q": q}, prepare=True).fetchall()]


def recall(search: Search, queries: np.ndarray, truth: list[set[int]]) -> float:
    hits = sum(len(set(search(q)) & t) for q, t in zip(queries, truth, strict=True))
    return round(hits / (K * len(truth)), 4)


def recall_by_ef(
    conn: psycopg.Connection[Any], statement: sql.Composed, queries: np.ndarray, truth: list[set[int]]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for ef in EFS:
        set_ef(conn, ef)
        out[str(ef)] = recall(searcher(conn, statement), queries, truth)
    return out


def plan_indexes(conn: psycopg.Connection[Any], statement: sql.Composed, q: np.ndarray) -> list[str]:
    """The indexes the planner picks for ``statement`` (EXPLAIN, the query vector inlined): a partial
    index is used only when the query's WHERE implies its predicate."""
    plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) {}").format(statement), {"q": q}).fetchone()
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.append(str(node["Index Name"]))
        for child in node.get("Plans", []):
            walk(child)

    if plan is not None:
        walk(plan[0][0]["Plan"])
    return found
