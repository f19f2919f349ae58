"""``python -m bench.build_priority --json``: search latency while an index builds, the build taking
the server's parallel workers at the server's CPU priority, at a lower one (``nice``, Linux's
``SCHED_IDLE``), or with the workers memstore gives a build nobody waits for
(``online_ddl.background_build_workers``): what lets searches through on a machine whose cores the
server shares.

One embedded server, one table of ``--rows`` x ``--dims`` clustered vectors (bench.data) with its HNSW
index. One connection searches without pause (a prepared ``ORDER BY embedding <=> $1 LIMIT 10`` at ef
40, the search a memstore collection runs), first with nothing else running (``idle``), then while a
second connection runs ``REINDEX INDEX CONCURRENTLY`` on the same index (what the maintenance worker
does), in turns, ``--rounds`` times, in these modes (``--modes``):

- ``parallel``: ``--workers`` parallel workers (the server's ``max_parallel_maintenance_workers``);
- ``nice_<N>``: the same, the build's backend and its parallel workers reniced to ``--niceness`` as
  they appear (they are the postmaster's children and do not inherit it);
- ``sched_idle``: the same under ``SCHED_IDLE`` (Linux);
- ``background``: ``background_build_workers`` for this machine (its cores less two, at most
  ``--workers``), at the server's priority.

Reports each mode's search p50/p99, the build's seconds, and each mode's p99 over idle's. On Linux,
for the slowest 1% of searches, how long the search's backend and the searching thread waited for a
core (``/proc/.../schedstat``, the run queue's delay): whether a slow search waited for a core or
for something else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path
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
from memstore.db import online_ddl
from memstore.db.core import libpq_url
from memstore.db.embedded import start_embedded_server
from memstore.settings import Settings

TABLE = "bench_build_priority"
INDEX = f"{TABLE}_hnsw"
QUERY = f"SELECT id FROM {TABLE} ORDER BY embedding <=> %s LIMIT 10"


def _connect(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(conn)
    return conn


def _run_queue_ns(path: Path) -> int | None:
    """Nanoseconds a process or thread has waited on a run queue (Linux's schedstat), None elsewhere."""
    try:
        return int(path.read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class Searches(Watcher):
    """Searches without pause on ``conn`` (a thread of its own) while the ``with`` block runs, keeping
    each search's latency and how long its backend and its thread waited for a core meanwhile."""

    def __init__(self, conn: psycopg.Connection[Any], queries: np.ndarray) -> None:
        super().__init__(lambda q: conn.execute(QUERY, (q,), prepare=True).fetchall(), queries)
        self.conn = conn
        self.rows: list[tuple[float, float | None, float | None]] = []

    def _run(self) -> None:
        backend = Path(f"/proc/{self.conn.info.backend_pid}/schedstat")
        thread = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat")
        i = 0
        while not self._stop.is_set():
            q = self.queries[i % len(self.queries)]
            b0, c0, t0 = _run_queue_ns(backend), _run_queue_ns(thread), time.perf_counter()
            self.search(q)
            elapsed = time.perf_counter() - t0
            b1, c1 = _run_queue_ns(backend), _run_queue_ns(thread)
            waited_backend = (b1 - b0) / 1e6 if b0 is not None and b1 is not None else None
            waited_thread = (c1 - c0) / 1e6 if c0 is not None and c1 is not None else None
            self.rows.append((elapsed * 1000, waited_backend, waited_thread))
            i += 1

    def summary(self) -> dict[str, Any]:
        ms = np.asarray([r[0] for r in self.rows])
        slow = ms >= np.percentile(ms, 99)
        result: dict[str, Any] = {
            "searches": len(ms),
            "p50_ms": round(float(np.percentile(ms, 50)), 3),
            "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "slowest_1pct_ms": round(float(ms[slow].mean()), 3),
        }
        for name, column in (("backend", 1), ("client", 2)):
            waits = [w for r, s in zip(self.rows, slow, strict=True) if s and (w := r[column]) is not None]
            result[f"slowest_1pct_{name}_run_queue_ms"] = round(float(np.mean(waits)), 3) if waits else None
        return result


def _lower(pid: int, priority: str) -> None:
    if priority == "sched_idle":
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined,unused-ignore]
    else:
        psutil.Process(pid).nice(int(priority.removeprefix("nice_")))


def _lower_workers(url: str, leader: int, priority: str, stop: threading.Event) -> None:
    """Lower ``leader``'s parallel workers as they appear, until ``stop``."""
    with _connect(url) as conn:
        while not stop.is_set():
            for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (leader,)).fetchall():
                with contextlib.suppress(psutil.Error, OSError):
                    _lower(pid, priority)
            stop.wait(0.02)


def _build(url: str, workers: int, priority: str | None) -> dict[str, Any]:
    """``REINDEX INDEX CONCURRENTLY`` with ``workers`` parallel workers, its backend and workers at
    ``priority`` (None: as the server runs them)."""
    with _connect(url) as conn:
        conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)", (str(workers),))
        stop = threading.Event()
        watcher = None
        if priority is not None:
            _lower(conn.info.backend_pid, priority)  # the embedded server is this machine's
            watcher = threading.Thread(
                target=_lower_workers, args=(url, conn.info.backend_pid, priority, stop), daemon=True
            )
            watcher.start()
        t0 = time.perf_counter()
        conn.execute(f"REINDEX INDEX CONCURRENTLY {INDEX}")
        result = {
            "build_s": round(time.perf_counter() - t0, 2),
            "workers": workers,
            "backend_nice": psutil.Process(conn.info.backend_pid).nice(),
        }
        stop.set()
        if watcher is not None:
            watcher.join()
    return result


def _mode(name: str, args: argparse.Namespace, background_workers: int) -> tuple[int, str | None]:
    """A mode's parallel workers and CPU priority."""
    if name == "background":
        return background_workers, None
    if name == "parallel":
        return args.workers, None
    if name == "sched_idle" or (name.startswith("nice_") and name.removeprefix("nice_").isdigit()):
        return args.workers, name
    raise SystemExit(f"unknown mode {name!r}: parallel, nice_<N>, sched_idle, background")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.build_priority", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dims", type=int, default=128)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--modes", default="parallel,nice_10,sched_idle,background", help="comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of searches with nothing else running")
    parser.add_argument("--workers", type=int, default=2, help="the server's max_parallel_maintenance_workers")
    parser.add_argument("--json", action="store_true", help="print only the JSON result (last line)")
    args = parser.parse_args(argv)
    names = [m for m in args.modes.split(",") if m]
    if "sched_idle" in names and not hasattr(os, "SCHED_IDLE"):
        raise SystemExit("sched_idle needs Linux's SCHED_IDLE")
    background_workers = online_ddl.background_build_workers(
        Settings(database_url=None, max_parallel_maintenance_workers=args.workers)  # this machine's server
    )
    modes = {name: _mode(name, args, background_workers) for name in names}
    vectors = clustered(args.rows + args.queries, args.dims, seed=7)
    base, queries = vectors[: args.rows], vectors[args.rows :]
    runs: dict[str, list[dict[str, Any]]] = {"idle": [], **{name: [] for name in modes}}
    with scratch_dir("memstore-build-priority-") as folder:
        url = start_embedded_server(folder, maintenance_work_mem="1GB", max_parallel_maintenance_workers=args.workers)
        with _connect(url) as conn:
            raw_table(conn, TABLE, base)
            conn.execute(f"CREATE INDEX {INDEX} ON {TABLE} USING hnsw (embedding vector_cosine_ops)")
        steps = ["idle", *modes] * args.rounds
        with _connect(url) as conn:
            conn.execute("SET hnsw.ef_search = 40")
            for mode in tqdm(steps, desc="modes", file=sys.stderr):
                built: dict[str, Any] = {}
                with Searches(conn, queries) as searches:
                    if mode == "idle":
                        time.sleep(args.idle_s)
                    else:
                        built = _build(url, *modes[mode])
                runs[mode].append(built | searches.summary())
    idle_p99 = float(np.mean([r["p99_ms"] for r in runs["idle"]]))

    def mean(rows: list[dict[str, Any]], key: str, digits: int = 3) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return round(float(np.mean(values)), digits) if values else None

    summary = {
        mode: {
            "p99_ms": mean(rows, "p99_ms"),
            "p50_ms": mean(rows, "p50_ms"),
            "p99_over_idle": round(float(np.mean([r["p99_ms"] for r in rows])) / idle_p99, 3),
            "slowest_1pct_backend_run_queue_ms": mean(rows, "slowest_1pct_backend_run_queue_ms"),
            "slowest_1pct_client_run_queue_ms": mean(rows, "slowest_1pct_client_run_queue_ms"),
            "build_s": mean(rows, "build_s", 2),
            "workers": None if mode == "idle" else modes[mode][0],
        }
        for mode, rows in runs.items()
    }
    result = {
        "rows": args.rows,
        "dims": args.dims,
        "cores": online_ddl.machine_cores(),
        "workers": args.workers,
        "background_workers": background_workers,
        "runs": runs,
        "summary": summary,
        "command": "python -m bench.build_priority " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
