"""What ``bench.scale``'s rows ask of any HNSW graph: ``python -m bench.scale_reference --json``.

The same rows and queries as ``bench.scale`` (same generator, seed, query count and ``--ef-grid``)
go into hnswlib, in process, with the graph parameters of the collection (``--m`` 16,
``--ef-construction`` 64). For each size: the build's seconds, recall@10 at every ef of the grid,
the lowest ef reaching 0.95, and how recall spreads over the queries (the share of queries that find
fewer than half of their neighbours at the largest ef: queries the graph barely reaches, which no
ef of the grid fixed). Read beside ``bench.scale``'s sweep, it tells whether an ef that grows with the rows is the
data's doing (both graphs need it) or pgvector's (hnswlib does not).

Needs hnswlib (the ``peers`` extra). The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.scale import EF_GRID, RECALL_GOAL, SEED, K, _sizes, exact_topk, size_dataset


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    import hnswlib

    ds = size_dataset(n, args)  # bench.scale's own rows and queries for this size
    base, queries = ds.base[:n], ds.queries[: args.queries]
    truth = exact_topk(base, queries, K)
    index = hnswlib.Index(space="cosine", dim=args.dims)
    index.init_index(max_elements=n, M=args.m, ef_construction=args.ef_construction, random_seed=args.seed % 2**31)
    t0 = time.perf_counter()
    step = 50_000
    for start in tqdm(range(0, n, step), desc=f"{n} rows: hnswlib build", file=sys.stderr, leave=False):
        index.add_items(base[start : start + step], np.arange(start, min(n, start + step)), num_threads=args.threads)
    build_s = time.perf_counter() - t0
    recall: dict[str, float] = {}
    per_query = np.zeros(len(queries))
    for ef in args.ef_grid:
        index.set_ef(max(ef, K))
        labels, _ = index.knn_query(queries, k=K, num_threads=1)
        per_query = np.array([len(set(a.tolist()) & set(b.tolist())) / K for a, b in zip(labels, truth, strict=True)])
        recall[str(ef)] = round(float(per_query.mean()), 4)
    reached = [int(ef) for ef, r in recall.items() if r >= RECALL_GOAL]
    return {
        "rows": n,
        "build_s": round(build_s, 3),
        "recall_by_ef": recall,
        "ef_for_goal": min(reached) if reached else None,
        "queries_below_half_at_top_ef": round(float((per_query < 0.5).mean()), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale_reference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=_sizes, default=_sizes("10000,100000,1000000"), help="rows, comma-separated")
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--queries", type=int, default=300, help="as bench.scale (the same queries)")
    parser.add_argument("--ef-grid", type=_sizes, default=_sizes(EF_GRID))
    parser.add_argument("--churn", type=float, default=0.02, help="as bench.scale (it sets how many rows are drawn)")
    parser.add_argument("--seed", type=int, default=SEED, help="as bench.scale")
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--ef-construction", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="build threads")
    parser.add_argument("--json", action="store_true", help="(the last line is always the JSON result)")
    args = parser.parse_args(argv)
    try:
        import hnswlib  # noqa: F401
    except ImportError:
        parser.error("needs hnswlib: pip install -e '.[peers]'")
    sizes = [measure(n, args) for n in args.sizes]
    for s in sizes:
        reached = f"ef for recall {RECALL_GOAL}: {s['ef_for_goal']}"
        print(f"{s['rows']:>9} rows: {reached}; {s['recall_by_ef']}", file=sys.stderr)
    result = {
        "dataset": f"synthetic-{args.dims}d-clustered",
        "system": "hnswlib",
        "k": K,
        "recall_goal": RECALL_GOAL,
        "hnsw": {"m": args.m, "ef_construction": args.ef_construction},
        "sizes": sizes,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
