"""``python -m bench.build_priority --json``: search latency while an index builds, with the build at
the server's CPU priority and at a lower one (``nice``): whether lowering background builds would let
searches through on a small machine where the server is this machine's own.

One embedded server, one table of ``--rows`` x ``--dims`` clustered vectors (bench.data) with its HNSW
index. One connection searches without pause (a prepared ``ORDER BY embedding <=> $1 LIMIT 10`` at ef
40, the search a memstore collection runs), first with nothing else running (``idle``), then while a
second connection runs ``REINDEX INDEX CONCURRENTLY`` on the same index (what the maintenance worker
does) with the server's ``max_parallel_maintenance_workers``: at ``nice`` 0 and at ``--niceness``
(the build's backend reniced, and its parallel workers as they appear: they are the postmaster's
children and do not inherit it), in turns, ``--rounds`` times. Reports each mode's search p50/p99 and
the build's seconds, and each mode's p99 over idle's. The result decided against shipping it
(docs/performance.md, "Builds at a lower CPU priority").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from typing import Any

import numpy as np
import psutil
import psycopg
from pgvector.psycopg import register_vector
from tqdm import tqdm

from bench.build_settings import raw_table
from bench.data import clustered
from bench.databases import scratch_dir
from bench.stream_memstore import Watcher
from memstore.db.core import libpq_url
from memstore.db.embedded import start_embedded_server

TABLE = "bench_build_priority"
INDEX = f"{TABLE}_hnsw"
QUERY = f"SELECT id FROM {TABLE} ORDER BY embedding <=> %s LIMIT 10"


def _connect(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    return conn


def _searching(conn: psycopg.Connection[Any], queries: np.ndarray) -> Watcher:
    """Searches without pause on ``conn`` (its own thread) while the ``with`` block runs."""
    conn.execute("SET hnsw.ef_search = 40")
    return Watcher(lambda q: conn.execute(QUERY, (q,), prepare=True).fetchall(), queries)


def _renice_workers(url: str, leader: int, niceness: int, stop: threading.Event) -> None:
    """Renice ``leader``'s parallel workers as they appear, until ``stop``."""
    with _connect(url) as conn:
        while not stop.is_set():
            for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (leader,)).fetchall():
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).nice(niceness)
            stop.wait(0.05)


def _build(url: str, niceness: int) -> dict[str, Any]:
    """``REINDEX INDEX CONCURRENTLY`` with its backend and parallel workers at ``niceness`` (0: as is)."""
    with _connect(url) as conn:
        stop = threading.Event()
        watcher = None
        if niceness:
            psutil.Process(conn.info.backend_pid).nice(niceness)  # the embedded server is this machine's
            watcher = threading.Thread(
                target=_renice_workers, args=(url, conn.info.backend_pid, niceness, stop), daemon=True
            )
            watcher.start()
        t0 = time.perf_counter()
        conn.execute(f"REINDEX INDEX CONCURRENTLY {INDEX}")
        result = {
            "build_s": round(time.perf_counter() - t0, 2),
            "backend_nice": psutil.Process(conn.info.backend_pid).nice(),
        }
        stop.set()
        if watcher is not None:
            watcher.join()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build_priority", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--niceness", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of searches with nothing else running")
    parser.add_argument("--workers", type=int, default=1, help="the build's max_parallel_maintenance_workers")
    parser.add_argument("--json", action="store_true", help="print only the JSON result (last line)")
    args = parser.parse_args(argv)
    vectors = clustered(args.rows + args.queries, args.dims, seed=7)
    base, queries = vectors[: args.rows], vectors[args.rows :]
    modes: dict[str, list[dict[str, Any]]] = {"idle": [], "nice_0": [], f"nice_{args.niceness}": []}
    with scratch_dir("memstore-build-priority-") as folder:
        url = start_embedded_server(folder, maintenance_work_mem="1GB", max_parallel_maintenance_workers=args.workers)
        with _connect(url) as conn:
            raw_table(conn, TABLE, base)
            conn.execute(f"CREATE INDEX {INDEX} ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
        steps = [("idle", 0), ("nice_0", 0), (f"nice_{args.niceness}", args.niceness)] * args.rounds
        with _connect(url) as conn:
            for mode, niceness in tqdm(steps, desc="modes", file=sys.stderr):
                built: dict[str, Any] = {}
                with _searching(conn, queries) as searches:
                    if mode == "idle":
                        time.sleep(args.idle_s)
                    else:
                        built = _build(url, niceness)
                modes[mode].append(built | searches.summary())
    idle_p99 = float(np.mean([r["p99_ms"] for r in modes["idle"]]))
    summary = {
        mode: {
            "p99_ms": round(float(np.mean([r["p99_ms"] for r in runs])), 3),
            "p50_ms": round(float(np.mean([r["p50_ms"] for r in runs])), 3),
            "p99_over_idle": round(float(np.mean([r["p99_ms"] for r in runs])) / idle_p99, 3),
            "build_s": round(float(np.mean([r["build_s"] for r in runs])), 2) if mode != "idle" else None,
        }
        for mode, runs in modes.items()
    }
    result = {
        "rows": args.rows,
        "dims": args.dims,
        "workers": args.workers,
        "niceness": args.niceness,
        "runs": modes,
        "summary": summary,
        "command": "python -m bench.build_priority " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
