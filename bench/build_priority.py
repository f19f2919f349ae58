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
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import psycopg
from pgvector.psycopg import register_vector
from tqdm import tqdm

from bench.data import clustered
from bench.databases import scratch_dir
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


def _load(url: str, vectors: np.ndarray) -> None:
    with _connect(url) as conn:
        conn.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, embedding vector({vectors.shape[1]}))")
        with conn.cursor() as cur, cur.copy(f"COPY {TABLE} (id, embedding) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "vector"])
            for i, v in enumerate(tqdm(vectors, desc="COPY", file=sys.stderr, leave=False)):
                copy.write_row((i, v))
        conn.execute(f"CREATE INDEX {INDEX} ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
        conn.execute(f"VACUUM ANALYZE {TABLE}")


def _timed_searches(url: str, queries: np.ndarray, until: Callable[[], bool]) -> list[float]:
    """Search without pause until ``until()``; each search's milliseconds."""
    out: list[float] = []
    with _connect(url) as conn:
        conn.execute("SET hnsw.ef_search = 40")
        i = 0
        while not until():
            t0 = time.perf_counter()
            conn.execute(QUERY, (queries[i % len(queries)],), prepare=True).fetchall()
            out.append((time.perf_counter() - t0) * 1000)
            i += 1
    return out


def _after(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def _figures(ms: list[float]) -> dict[str, Any]:
    a = np.asarray(ms)
    return {
        "searches": len(a),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
    }


def _renice_workers(url: str, leader: int, niceness: int, stop: threading.Event) -> None:
    """Renice ``leader``'s parallel workers as they appear, until ``stop``."""
    with _connect(url) as conn:
        while not stop.is_set():
            for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (leader,)).fetchall():
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).nice(niceness)
            stop.wait(0.05)


def _during_build(url: str, queries: np.ndarray, niceness: int) -> dict[str, Any]:
    done = threading.Event()
    result: dict[str, Any] = {}

    def build() -> None:
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
            result["build_s"] = round(time.perf_counter() - t0, 2)
            result["backend_nice"] = psutil.Process(conn.info.backend_pid).nice()
            stop.set()
            if watcher is not None:
                watcher.join()
        done.set()

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    ms = _timed_searches(url, queries, done.is_set)
    thread.join()
    return result | _figures(ms)


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
        _load(url, base)
        steps = [("idle", 0), ("nice_0", 0), (f"nice_{args.niceness}", args.niceness)] * args.rounds
        for mode, niceness in tqdm(steps, desc="modes", file=sys.stderr):
            if mode == "idle":
                modes[mode].append(_figures(_timed_searches(url, queries, _after(args.idle_s))))
            else:
                modes[mode].append(_during_build(url, queries, niceness))
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
