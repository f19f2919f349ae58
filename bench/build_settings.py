"""``python -m bench.build_settings --json``: what the settings around one HNSW build change, on the same rows.

A bulk load's time is nearly all pgvector's build of the graph (``docs/performance.md``), so this
measures that build on its own: the same ``--rows`` x ``--dims`` clustered vectors (bench.data, seed
42) in a bare table, indexed with m 16 and ef_construction 64 under each variant, one after another,
each index dropped before the next:

- ``workers_N``: a plain ``CREATE INDEX`` with ``max_parallel_maintenance_workers`` N (0 to 3);
- ``concurrently``: ``CREATE INDEX CONCURRENTLY`` with memstore's own setting (what a bulk load and a
  maintenance rebuild run);
- ``inner_product``: the vectors scaled to unit length and indexed with ``vector_ip_ops`` (the same
  ranking as cosine; what an in-process library's cosine space does), memstore's setting.

Per variant: build seconds, recall@10 and q/s at ``--ef`` over ``--queries`` queries (one prepared
statement a search). ``--repeat`` builds each variant that many times, in turns, since two builds of
the same rows differ by more than most of these settings do.
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
from psycopg import sql
from tqdm import tqdm

from bench.data import clustered, exact_neighbours, recall_at_k
from bench.databases import scratch_dir, server_url
from memstore.db import online_ddl
from memstore.db.core import libpq_url
from memstore.settings import Settings

K = 10
TABLES = {"cosine": "bench_build_cosine", "inner_product": "bench_build_ip"}
OPS = {"cosine": ("vector_cosine_ops", "<=>"), "inner_product": ("vector_ip_ops", "<#>")}  # opclass, operator


def _variants(default_workers: int) -> list[dict[str, Any]]:
    plain = [{"name": f"workers_{n}", "table": "cosine", "workers": n, "concurrently": False} for n in range(4)]
    return [
        *plain,
        {"name": "concurrently", "table": "cosine", "workers": default_workers, "concurrently": True},
        {"name": "inner_product", "table": "inner_product", "workers": default_workers, "concurrently": False},
    ]


def raw_table(conn: psycopg.Connection[Any], table: str, rows: np.ndarray) -> None:
    """``table`` afresh: ``rows`` COPYed in with ids from 0, no index yet, vacuumed and analysed."""
    name = sql.Identifier(table)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
    conn.execute(
        sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}))").format(
            name, sql.Literal(rows.shape[1])
        )
    )
    with (
        conn.cursor() as cur,
        cur.copy(sql.SQL("COPY {} (id, embedding) FROM STDIN (FORMAT BINARY)").format(name)) as cp,
    ):
        cp.set_types(["int8", "vector"])
        for i, v in enumerate(rows):
            cp.write_row((i, v))
    conn.execute(sql.SQL("VACUUM ANALYZE {}").format(name))


def _measure(
    conn: psycopg.Connection[Any],
    v: dict[str, Any],
    queries: np.ndarray,
    truth: np.ndarray,
    ef: int,
    settings: Settings,
) -> dict[str, float]:
    table = sql.Identifier(TABLES[v["table"]])
    ops, op = OPS[v["table"]]
    # memstore's build memory, with this variant's workers
    online_ddl.build_resources(conn, settings.model_copy(update={"max_parallel_maintenance_workers": v["workers"]}))
    conn.execute("DROP INDEX IF EXISTS bench_build_hnsw")
    t0 = time.perf_counter()
    conn.execute(
        sql.SQL(
            "CREATE INDEX {} bench_build_hnsw ON {} USING hnsw (embedding {}) WITH (m = 16, ef_construction = 64)"
        ).format(sql.SQL("CONCURRENTLY" if v["concurrently"] else ""), table, sql.SQL(ops))
    )
    build_s = time.perf_counter() - t0
    conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
    statement = sql.SQL("SELECT id FROM {} ORDER BY embedding {} %s LIMIT {}").format(
        table, sql.SQL(op), sql.Literal(K)
    )
    for q in queries[:20]:
        conn.execute(statement, (q,), prepare=True).fetchall()
    t0 = time.perf_counter()
    found = [[r[0] for r in conn.execute(statement, (q,), prepare=True).fetchall()] for q in queries]
    search_s = time.perf_counter() - t0
    conn.execute("DROP INDEX bench_build_hnsw")
    return {"build_s": build_s, "recall": recall_at_k(found, truth), "qps": len(queries) / search_s}


def run(url: str, args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    every = clustered(args.rows + args.queries, args.dims, seed=42)
    base, queries = every[: args.rows], every[args.rows :]
    unit = base / np.linalg.norm(base, axis=1, keepdims=True)
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    truth = exact_neighbours(base, queries, K)
    variants = _variants(settings.max_parallel_maintenance_workers)
    runs: dict[str, list[dict[str, float]]] = {v["name"]: [] for v in variants}
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        raw_table(conn, TABLES["cosine"], base)
        raw_table(conn, TABLES["inner_product"], unit)
        try:
            with tqdm(total=args.repeat * len(variants), desc="builds", file=sys.stderr) as bar:
                for _ in range(args.repeat):
                    for v in variants:
                        q = unit_queries if v["table"] == "inner_product" else queries
                        runs[v["name"]].append(_measure(conn, v, q, truth, args.ef, settings))
                        bar.update()
        finally:
            for table in TABLES.values():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    return {
        "rows": args.rows,
        "dims": args.dims,
        "queries": args.queries,
        "ef": args.ef,
        "repeat": args.repeat,
        "hnsw": {"m": 16, "ef_construction": 64},
        "maintenance_work_mem": settings.maintenance_work_mem,
        "variants": {
            v["name"]: {
                "workers": v["workers"],
                "concurrently": v["concurrently"],
                "opclass": OPS[v["table"]][0],
                "build_s": [round(m["build_s"], 2) for m in runs[v["name"]]],
                "recall": [round(m["recall"], 4) for m in runs[v["name"]]],
                "qps": [round(m["qps"], 1) for m in runs[v["name"]]],
            }
            for v in variants
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.build_settings", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print only one JSON document on stdout")
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--ef", type=int, default=40)
    p.add_argument("--repeat", type=int, default=2, help="builds of each variant, in turns")
    p.add_argument("--database-url", help="an empty database to use (default: a temporary embedded server)")
    args = p.parse_args(argv)
    settings = Settings()
    with scratch_dir(prefix="memstore-build-") as tmp:
        result = run(server_url(args.database_url, Path(tmp), settings), args, settings)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
