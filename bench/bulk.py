"""``python -m bench.bulk --json``: what chooses the bulk-load defaults (``memstore.items.bulk_load``).

Two measurements on one embedded server, 128-d clustered vectors by default:
- ``live_scaling``: rows/s of a load into a live HNSW index with 1, 2 and 4 connections inserting
  disjoint batches side by side (``VectorStore.bulk_load(connections=...)``), and each as a ratio to one
  connection: pgvector's insert takes page locks on the graph, so how far it scales is measured, not
  assumed (``MEMSTORE_BULK_CONNECTIONS``);
- ``crossover``: for loads of a fraction f of a collection's rows, the seconds of loading into the live
  graph over the seconds of loading without the index and building it (``speedup`` > 1: rebuilding
  wins). ``MEMSTORE_BULK_FRACTION`` sits where rebuilding wins clearly, since searches are exact scans
  while the index is gone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.data import clustered
from bench.databases import scratch_dir
from memstore.db import migrate
from memstore.db.core import create_engine
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore


def _items(vectors: np.ndarray, start: int) -> list[ItemIn]:
    return [ItemIn(vector=v, external_id=str(start + i)) for i, v in enumerate(vectors)]


def _fresh(store: VectorStore, name: str, base: np.ndarray) -> None:
    if name in {c.name for c in store.list_collections()}:
        store.drop_collection(name=name)
    store.create_collection(name=name, dimensions=base.shape[1])
    store.bulk_load(collection=name, items=_items(base, 0), connections=1)


def live_scaling(store: VectorStore, base: np.ndarray, extra: np.ndarray, connections: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in tqdm(connections, desc="live inserts by connections", file=sys.stderr):
        _fresh(store, "bench_bulk_live", base)
        t0 = time.perf_counter()
        result = store.bulk_load(
            collection="bench_bulk_live", items=_items(extra, len(base)), batch_rows=250, connections=n
        )
        assert not result.deferred_index
        out[str(n)] = len(extra) / (time.perf_counter() - t0)
    return {"rows_per_s": out, "ratio_to_one": {n: v / out[str(connections[0])] for n, v in out.items()}}


def crossover(store: VectorStore, base: np.ndarray, pool: np.ndarray, fractions: list[float]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in tqdm(fractions, desc="live vs rebuilt by load size", file=sys.stderr):
        extra = pool[: int(f * len(base))]
        timing: dict[str, float] = {}
        for way, fraction in (("live", 1e9), ("rebuilt", 0.0)):
            store.settings = store.settings.model_copy(update={"bulk_fraction": fraction, "bulk_min_rows": 1})
            _fresh(store, "bench_bulk_cross", base)
            t0 = time.perf_counter()
            result = store.bulk_load(collection="bench_bulk_cross", items=_items(extra, len(base)), batch_rows=2000)
            timing[way] = time.perf_counter() - t0
            assert result.deferred_index == (way == "rebuilt")
        rows.append({"fraction": f, "rows": len(extra), **timing, "speedup": timing["live"] / timing["rebuilt"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bulk", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--rows", type=int, default=20_000, help="rows already in the collection")
    parser.add_argument("--extra", type=int, default=4_000, help="rows loaded live in the scaling test")
    parser.add_argument("--dimensions", type=int, default=128)
    parser.add_argument("--connections", default="1,2,4")
    parser.add_argument("--fractions", default="0.1,0.25,0.5,1.0")
    args = parser.parse_args(argv)
    connections = [int(x) for x in args.connections.split(",")]
    fractions = [float(x) for x in args.fractions.split(",")]
    every = clustered(args.rows + max(args.extra, int(max(fractions) * args.rows)), args.dimensions, seed=7)
    base, pool = every[: args.rows], every[args.rows :]
    with scratch_dir(prefix="memstore-bench-") as tmp:
        # MEMSTORE_DATABASE_URL (as the tests pass theirs), else a temporary embedded server.
        url = Settings().database_url or start_embedded_server(
            Path(tmp), maintenance_work_mem="1GB", max_parallel_maintenance_workers=1
        )
        migrate.upgrade(url)
        engine = create_engine(url)
        store = VectorStore(engine, settings=Settings(database_url=url, max_parallel_maintenance_workers=1))
        result = {
            "rows": args.rows,
            "dimensions": args.dimensions,
            "live_scaling": live_scaling(store, base, pool[: args.extra], connections),
            "crossover": crossover(store, base, pool, fractions),
        }
        for name in ("bench_bulk_live", "bench_bulk_cross"):
            store.drop_collection(name=name)
        engine.dispose()
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
