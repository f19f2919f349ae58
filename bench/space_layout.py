"""``python -m bench.space_layout --json``: where a collection's second embedding space should live.

A collection re-embedded by a new model holds two vectors per item for a while. Two layouts, measured
on one embedded server with the same rows (128-d clustered by default, a second 96-d space):

- ``column``: a second vector column on the items table with its own HNSW index. Writing a row's new
  vector is an UPDATE of the items row: it cannot be a HOT update (an indexed column changes), so
  PostgreSQL adds the new row version to *every* index of the table, the first space's HNSW graph
  included (pgvector finds the unchanged vector and adds the new row version's address to it: a
  graph search per row, no growth), and the whole row is written again;
- ``side``: a table of (item id, vector) per space with its own HNSW index; a search joins it to the
  items table by primary key.

Reported: re-embedding rows/s into each layout, how much the first space's index grew while doing
it, and search queries/s on the second space (the side table pays a join). The result is what
docs/spaces.md's layout rests on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from tqdm import tqdm

from bench.data import clustered
from bench.databases import scratch_dir
from memstore.db.core import libpq_url
from memstore.db.embedded import start_embedded_server

BATCH = 500


def _setup(conn: psycopg.Connection[Any], base: np.ndarray) -> None:
    dims = base.shape[1]
    conn.execute("DROP TABLE IF EXISTS items_col, items_side, space2_side")
    for table in ("items_col", "items_side"):
        conn.execute(
            f"CREATE TABLE {table} (id bigint PRIMARY KEY, external_id text UNIQUE, embedding vector({dims}), "
            "metadata jsonb NOT NULL DEFAULT '{}', content bytea)"
        )
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY {table} (id, external_id, embedding) FROM STDIN (FORMAT BINARY)") as cp,
        ):
            cp.set_types(["int8", "text", "vector"])
            for i, v in enumerate(base):
                cp.write_row((i + 1, f"e{i}", v))
        conn.execute(f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)")
    conn.execute("ALTER TABLE items_col ADD COLUMN embedding2 vector")
    conn.execute(
        "CREATE INDEX items_col_hnsw2 ON items_col USING hnsw ((embedding2::vector(96)) vector_cosine_ops) "
        "WHERE embedding2 IS NOT NULL"
    )
    conn.execute("CREATE TABLE space2_side (id bigint PRIMARY KEY, embedding vector(96) NOT NULL)")
    conn.execute("CREATE INDEX space2_side_hnsw ON space2_side USING hnsw (embedding vector_cosine_ops)")
    conn.execute("VACUUM ANALYZE items_col, items_side, space2_side")


def _size(conn: psycopg.Connection[Any], index: str) -> int:
    row = conn.execute("SELECT pg_relation_size(%s::regclass)", (index,)).fetchone()
    return int(row[0]) if row else 0


def _reembed(conn: psycopg.Connection[Any], second: np.ndarray, layout: str) -> dict[str, float]:
    first_index = "items_col_hnsw" if layout == "column" else "items_side_hnsw"
    before = _size(conn, first_index)
    t0 = time.perf_counter()
    for start in tqdm(range(0, len(second), BATCH), desc=f"re-embed ({layout})", file=sys.stderr):
        rows = [(start + j + 1, v) for j, v in enumerate(second[start : start + BATCH])]
        with conn.transaction(), conn.cursor() as cur:
            if layout == "column":
                cur.executemany("UPDATE items_col SET embedding2 = %s WHERE id = %s", [(v, i) for i, v in rows])
            else:
                cur.executemany("INSERT INTO space2_side (id, embedding) VALUES (%s, %s)", rows)
    seconds = time.perf_counter() - t0
    return {
        "rows_per_s": len(second) / seconds,
        "first_index_growth": _size(conn, first_index) / before,
    }


def _search(conn: psycopg.Connection[Any], queries: np.ndarray, layout: str, rounds: int) -> float:
    if layout == "column":
        statement = (
            "SELECT id, external_id, metadata FROM items_col WHERE embedding2 IS NOT NULL "
            "ORDER BY embedding2::vector(96) <=> %s LIMIT 10"
        )
    else:
        statement = (
            "SELECT t.id, t.external_id, t.metadata FROM space2_side s JOIN items_side t ON t.id = s.id "
            "ORDER BY s.embedding <=> %s LIMIT 10"
        )
    conn.execute("SET hnsw.ef_search = 80")
    for q in queries[:20]:
        conn.execute(statement, (q,), prepare=True).fetchall()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for q in queries:
            conn.execute(statement, (q,), prepare=True).fetchall()
    return rounds * len(queries) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.space_layout", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dimensions", type=int, default=128)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    base = clustered(args.rows, args.dimensions, seed=1)
    second = clustered(args.rows + args.queries, 96, seed=2)
    second, queries = second[: args.rows], second[args.rows :]
    with scratch_dir(prefix="memstore-bench-") as tmp:
        url = start_embedded_server(Path(tmp), maintenance_work_mem="512MB", max_parallel_maintenance_workers=1)
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(conn)
            _setup(conn, base)
            result: dict[str, Any] = {"rows": args.rows, "dimensions": args.dimensions, "second_dimensions": 96}
            for layout in ("column", "side"):
                result[layout] = _reembed(conn, second, layout)
            conn.execute("VACUUM ANALYZE items_col, items_side, space2_side")
            for layout in ("column", "side"):
                result[layout]["search_qps"] = _search(conn, queries, layout, args.rounds)
    result["side_over_column"] = {
        "reembed_rows_per_s": result["side"]["rows_per_s"] / result["column"]["rows_per_s"],
        "search_qps": result["side"]["search_qps"] / result["column"]["search_qps"],
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
