"""What the exact answers behind a recall probe or a tuning cost: one brute-force search per query,
one scan in the server bounded by the index's answers (``memstore.search.exact_answers.bounded_in_server``),
and the rows streamed once and ranked in the client (``ranked_in_client``).

    python -m bench.recall_probe --json [--data FILE.npz] [--rows N] [--repeats R] [--queries 5,20,...]

Loads ``rows`` vectors into a collection (default: 20,000 clustered synthetic 128-d; ``--data`` takes
an npz with ``base`` and ``queries``, e.g. bge-m3's 1024-d from ``python -m bench.churn_data``), asks
the index for each query's k nearest, then times the ways of finding the exact answers for each
count of queries (per query only up to 20: it grows with them), checks that they agree, and reports
the medians. The last line printed is one JSON object; ``crossover`` is the smallest count at which
the client's ranking was cheaper than the server's scan.
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
from maintenance.recall import exact_search, exact_settings, index_search, index_settings
from maintenance.targets import Target, targets_for
from memstore.db import migrate
from memstore.db.core import get_engine, resolve_database_url
from memstore.search.exact_answers import STREAM_FROM, bounded_in_server, ranked_in_client
from memstore.search.statements import apply
from memstore.settings import get_settings
from memstore.store import VectorStore

NAME = "bench_recall_probe"
K = 10


def _per_query(cur: psycopg.Cursor[Any], target: Target, queries: list[np.ndarray]) -> list[list[float]]:
    statement = exact_search(target)
    return [[float(r[1]) for r in cur.execute(statement, {"q": q, "k": K}).fetchall()] for q in queries]


def _in_server(
    cur: psycopg.Cursor[Any], target: Target, queries: list[np.ndarray], found: list[list[tuple[int, float]]]
) -> list[list[float]]:
    s = target.vectors
    answers = bounded_in_server(
        cur,
        table=target.table,
        operator=s.spec.operator,
        dimensions=s.dimensions,
        queries=queries,
        found=found,
        k=K,
    )
    return [[d for _, d in a] for a in answers]


def _in_client(cur: psycopg.Cursor[Any], target: Target, queries: list[np.ndarray]) -> list[list[float]]:
    s = target.vectors
    answers = ranked_in_client(
        cur, table=target.table, operator=s.spec.operator, dimensions=s.dimensions, queries=queries, k=K
    )
    return [[d for _, d in a] for a in answers]


def _agree(a: list[list[float]], b: list[list[float]]) -> bool:
    """The same k distances per query (rows at equal distance, duplicates in real data, may differ;
    the server's distances sum in float4, the client's in float8)."""
    return len(a) == len(b) and all(np.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b, strict=True))


def measure(
    conn: psycopg.Connection[Any], target: Target, queries: np.ndarray, repeats: int, counts: list[int]
) -> dict[str, Any]:
    ef = target.collection.default_ef_search
    index_sql = index_search(target)
    out: dict[str, Any] = {}
    crossover = None
    conn.prepare_threshold = None  # every execution planned, as a probe's first one is
    for n in counts:
        qs = [queries[i % len(queries)] for i in range(n)]
        ways = ("per_query", "in_server", "in_client") if n <= 20 else ("in_server", "in_client")
        rounds = repeats if n <= 20 else max(1, min(repeats, 3))
        with conn.transaction(), conn.cursor() as cur:
            apply(cur, index_settings(target, ef_search=ef, k=K, max_scan_tuples=20_000))
            found = [[(int(i), float(d)) for i, d in cur.execute(index_sql, {"q": q, "k": K}).fetchall()] for q in qs]
            apply(cur, exact_settings(ef_search=ef, max_scan_tuples=20_000))
            times: dict[str, list[float]] = {w: [] for w in ways}
            answers: dict[str, list[list[float]]] = {}
            for _ in range(rounds):
                for way in ways:
                    t0 = time.perf_counter()
                    if way == "per_query":
                        answers[way] = _per_query(cur, target, qs)
                    elif way == "in_server":
                        answers[way] = _in_server(cur, target, qs, found)
                    else:
                        answers[way] = _in_client(cur, target, qs)
                    times[way].append(time.perf_counter() - t0)
        ms = {w: statistics.median(times[w]) * 1000 for w in ways}
        figures: dict[str, Any] = {f"{w}_ms": round(ms[w], 2) for w in ways}
        figures["client_speedup"] = round(ms["in_server"] / ms["in_client"], 2)
        figures["same_answers"] = all(_agree(answers["in_server"], answers[w]) for w in ways)
        if "per_query" in ways:
            figures["speedup"] = round(ms["per_query"] / ms["in_server"], 2)
        if crossover is None and ms["in_client"] < ms["in_server"]:
            crossover = n
        out[f"queries_{n}"] = figures
    out["crossover"] = crossover
    out["stream_from"] = STREAM_FROM
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.recall_probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="npz with arrays base and queries (default: synthetic)")
    parser.add_argument("--rows", type=int, help="rows in the table (default 20,000 synthetic; 80%% of base)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--queries", default="5,20,40,100,400,1000", help="query counts to time")
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    if args.data:
        ds = load_npz(args.data)
        rows = min(args.rows or int(len(ds.base) * 0.8), len(ds.base))
    else:
        rows = args.rows or 20_000
        ds = synthetic(rows + 100, queries=200)
    migrate.upgrade(resolve_database_url(get_settings()))
    store = VectorStore(get_engine(get_settings()), settings=get_settings())
    setup_collection(store, NAME, ds, rows, seed=7)
    try:
        with connect() as conn:
            [target] = targets_for(conn, store.get_collection(name=NAME))
            result = {"dataset": ds.name, "rows": rows, "dims": int(ds.base.shape[1]), "k": K}
            result |= measure(conn, target, ds.queries, args.repeats, [int(n) for n in args.queries.split(",")])
    finally:
        store.drop_collection(name=NAME)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
