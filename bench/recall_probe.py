"""What the recall probe's exact answers cost: one scan of the table for all the queries
(``maintenance.recall.exact_answers``) against one brute-force search per query.

    python -m bench.recall_probe --json [--data FILE.npz] [--rows N] [--repeats R]

Loads ``rows`` vectors into a collection (default: 20,000 clustered synthetic 128-d; ``--data`` takes
an npz with ``base`` and ``queries``, e.g. bge-m3's 1024-d from ``python -m bench.churn_data``), asks
the index for each query's k nearest, then times both ways of finding the exact answers for 5 and 20
queries (the probe's minimum and its default sample), checks that they agree, and reports the medians
and their ratio. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench.churn import setup_collection
from bench.churn_data import load_npz, synthetic
from bench.churn_db import connect
from maintenance.recall import exact_answers, exact_search, exact_settings, index_search, index_settings
from maintenance.targets import Target, targets_for
from memstore.db import migrate
from memstore.db.core import get_engine, resolve_database_url
from memstore.search.statements import apply
from memstore.settings import get_settings
from memstore.store import VectorStore

NAME = "bench_recall_probe"
K = 10


def _per_query(cur: psycopg.Cursor[Any], target: Target, queries: list[np.ndarray]) -> list[list[float]]:
    statement = exact_search(target)
    return [[float(r[1]) for r in cur.execute(statement, {"q": q, "k": K}).fetchall()] for q in queries]


def _one_scan(
    cur: psycopg.Cursor[Any], target: Target, queries: list[np.ndarray], found: list[list[tuple[int, float]]]
) -> list[list[float]]:
    return [[d for _, d in a] for a in exact_answers(cur, target, queries, found, K)]


def measure(conn: psycopg.Connection[Any], target: Target, queries: np.ndarray, repeats: int) -> dict[str, Any]:
    ef = target.collection.default_ef_search
    index_sql = index_search(target)
    out: dict[str, Any] = {}
    conn.prepare_threshold = None  # every execution planned, as a probe's first one is
    for n in (5, 20):
        qs = list(queries[:n])
        with conn.transaction(), conn.cursor() as cur:
            apply(cur, index_settings(ef_search=ef, max_scan_tuples=20_000))
            found = [[(int(i), float(d)) for i, d in cur.execute(index_sql, {"q": q, "k": K}).fetchall()] for q in qs]
            apply(cur, exact_settings(ef_search=ef, max_scan_tuples=20_000))
            times: dict[str, list[float]] = {"per_query": [], "one_scan": []}
            answers: dict[str, list[list[float]]] = {}
            for _ in range(repeats):
                for way in ("per_query", "one_scan"):
                    t0 = time.perf_counter()
                    answers[way] = (
                        _per_query(cur, target, qs) if way == "per_query" else _one_scan(cur, target, qs, found)
                    )
                    times[way].append(time.perf_counter() - t0)
        per_query, one_scan = (statistics.median(times[w]) * 1000 for w in ("per_query", "one_scan"))
        out[f"queries_{n}"] = {
            "per_query_ms": round(per_query, 2),
            "one_scan_ms": round(one_scan, 2),
            "speedup": round(per_query / one_scan, 2),
            # The same k distances per query (rows at equal distance, duplicates in real data, may differ).
            "same_answers": all(
                np.allclose(a, b, rtol=0, atol=1e-9)
                for a, b in zip(answers["per_query"], answers["one_scan"], strict=True)
            ),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall_probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="npz with arrays base and queries (default: synthetic)")
    parser.add_argument("--rows", type=int, help="rows in the table (default 20,000 synthetic; 80%% of base)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    if args.data:
        ds = load_npz(args.data)
        rows = min(args.rows or int(len(ds.base) * 0.8), len(ds.base))
    else:
        rows = args.rows or 20_000
        ds = synthetic(rows + 100, queries=20)
    migrate.upgrade(resolve_database_url(get_settings()))
    store = VectorStore(get_engine(get_settings()), settings=get_settings())
    setup_collection(store, NAME, ds, rows, seed=7)
    try:
        with connect() as conn:
            [target] = targets_for(conn, store.get_collection(name=NAME))
            result = {"dataset": ds.name, "rows": rows, "dims": int(ds.base.shape[1]), "k": K}
            result |= measure(conn, target, ds.queries, args.repeats)
    finally:
        store.drop_collection(name=NAME)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
