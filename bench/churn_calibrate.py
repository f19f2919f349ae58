"""The measurements behind the maintenance policy's thresholds (see docs/maintenance.md).

``python -m bench.churn_calibrate --json [--rows N] [--fractions 0.002,0.01,...]``: for each dead
fraction ``d`` (deleted rows), time plain ``VACUUM`` (pgvector repairs the graph) against compaction
(``REINDEX INDEX CONCURRENTLY`` then ``VACUUM``) and heap-only ``VACUUM (INDEX_CLEANUP OFF)``, and
measure recall and index size with no maintenance at all. The crossover fraction is where compaction
becomes the cheaper way to clean an index.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import psycopg

from bench.churn_data import synthetic
from bench.churn_db import connect, create_table, exact_topk, fetch_topk, index_bytes, load_rows, recall_at

TABLE = "bench_calibrate"


def _timed(conn: psycopg.Connection[Any], statement: str) -> float:
    t0 = time.perf_counter()
    conn.execute(statement)
    return time.perf_counter() - t0


def _prepared(conn: psycopg.Connection[Any], base: np.ndarray, deleted: np.ndarray) -> float:
    create_table(conn, TABLE, base.shape[1], autovacuum=False)
    load_rows(conn, TABLE, np.arange(len(base)), base)
    build = _timed(conn, f"CREATE INDEX {TABLE}_hnsw ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
    conn.execute(f"DELETE FROM {TABLE} WHERE id = ANY(%s)", (deleted.tolist(),))
    return build


def measure(rows: int, fractions: list[float], queries: int = 100, k: int = 10) -> dict[str, Any]:
    ds = synthetic(rows, queries=queries)
    rng = np.random.default_rng(7)
    out: list[dict[str, Any]] = []
    with connect() as conn:
        for d in fractions:
            deleted = rng.choice(rows, size=max(1, int(rows * d)), replace=False)
            keep = np.setdiff1d(np.arange(rows), deleted)
            truth = exact_topk(ds.base[keep], keep, ds.queries, k)
            build = _prepared(conn, ds.base, deleted)
            fresh_bytes = index_bytes(conn, f"{TABLE}_hnsw")
            recall_dirty = recall_at(fetch_topk(conn, TABLE, ds.queries, k, ef_search=80), truth)
            heap_only = _timed(conn, f"VACUUM (INDEX_CLEANUP OFF) {TABLE}")
            vacuum = _timed(conn, f"VACUUM (INDEX_CLEANUP ON) {TABLE}")
            recall_vacuum = recall_at(fetch_topk(conn, TABLE, ds.queries, k, ef_search=80), truth)
            _prepared(conn, ds.base, deleted)
            reindex = _timed(conn, f"REINDEX INDEX CONCURRENTLY {TABLE}_hnsw")
            after = _timed(conn, f"VACUUM (INDEX_CLEANUP ON) {TABLE}")
            recall_compact = recall_at(fetch_topk(conn, TABLE, ds.queries, k, ef_search=80), truth)
            out.append(
                {
                    "dead_fraction": d,
                    "build_s": round(build, 3),
                    "vacuum_s": round(vacuum, 3),
                    "heap_only_vacuum_s": round(heap_only, 3),
                    "compact_s": round(reindex + after, 3),
                    "compact_over_vacuum": round((reindex + after) / max(vacuum, 1e-9), 3),
                    "recall_no_maintenance": recall_dirty,
                    "recall_after_vacuum": recall_vacuum,
                    "recall_after_compact": recall_compact,
                    "index_bytes_fresh_build": fresh_bytes,
                    "index_bytes_compacted": index_bytes(conn, f"{TABLE}_hnsw"),
                }
            )
            print(json.dumps(out[-1]), flush=True)
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    crossover = next((r["dead_fraction"] for r in out if r["compact_s"] < r["vacuum_s"]), None)
    return {
        "rows": rows,
        "dims": int(ds.base.shape[1]),
        "k": k,
        "ef_search": 80,
        "runs": out,
        "compaction_cheaper_from_dead_fraction": crossover,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.churn_calibrate", description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--fractions", default="0.001,0.005,0.02,0.1")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line (always last)")
    args = parser.parse_args(argv)
    result = measure(args.rows, [float(x) for x in args.fractions.split(",")])
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
