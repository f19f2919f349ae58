"""``python -m bench.replicas --json``: read replicas on this machine, measured in one run.

The primary is the embedded server; the standby is made by ``memstore.db.standby`` (as
``memstore db replica create`` makes it), on the same machine, so on a small machine the figures
measure what routing costs, not what a second machine would add.

- replica_qps_ratio: vector searches per second through the API (its own process, keys on,
  keep-alive connections) with reads on the standby (``MEMSTORE_READ_DATABASE_URLS``) over the same
  API with reads on the primary; the sides alternate in short windows so a noisy machine hits both
  alike. Also ``routing_qps_ratio``: over an API that reads the primary through the same blocking
  path (with standbys configured the event-loop fast path is off; see docs/operations.md). Goal
  ``replica_qps_ratio`` >= 0.85.
- lag: while vectors are upserted as fast as one writer can (batches as ``memstore ingest`` sends
  them), the time from each batch's commit to the standby having replayed it (its WAL position
  polled every 2 ms): p50, p99, max.
- conflicts: searches on the standby cancelled by the replay of maintenance on the primary (deletes,
  VACUUM, REINDEX CONCURRENTLY), and the longest replay wait, per standby setting: PostgreSQL's
  defaults, replay that never waits (``max_standby_streaming_delay = 0``), that with
  ``hot_standby_feedback``, and what memstore's standbys get (``memstore.db.standby.SAFE_SETTINGS``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql
from tqdm import tqdm

from bench.api import RawClient, _run_for
from bench.data import clustered
from bench.databases import new_database, scratch_dir
from memstore.access import keys
from memstore.db.core import Database, create_engine, libpq_url, normalise_url, parse_lsn
from memstore.db.embedded import start_embedded_server
from memstore.db.standby import Standby, embedded_socket
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

COLLECTION = "bench_replicas"


def serve(url: str, reads: str, port: int) -> None:
    """The server side (``--serve``): memstore serve on the benchmark's database, reads on ``reads``."""
    import uvicorn

    from memstore.api.runtime import RuntimeOptions
    from memstore.web import create_app

    settings = Settings(database_url=url, read_database_urls=[reads] if reads else [])
    app = create_app(settings, options=RuntimeOptions(encoder="none", ingest_workers=0))
    # Connections wait idle while the other sides run their windows: keep them open meanwhile.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, timeout_keep_alive=3600)


class Server:
    """An API process; ``reads``: its MEMSTORE_READ_DATABASE_URLS ("" for none)."""

    def __init__(self, url: str, reads: str) -> None:
        import http.client
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        cmd = [sys.executable, "-m", "bench.replicas", "--serve", url, "--reads", reads, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "MEMSTORE_API_HEALTH_DETAIL": "public"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.proc.kill()
        raise RuntimeError("the API server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def load(url: str, n: int, dims: int) -> VectorStore:
    store = VectorStore(create_engine(url), settings=Settings(database_url=url))
    store.create_collection(name=COLLECTION, dimensions=dims)
    base = clustered(n, dims, seed=1)
    for start in tqdm(range(0, n, 2000), desc="loading", unit="batch", file=sys.stderr):
        rows = base[start : start + 2000]
        store.upsert_items(
            collection=COLLECTION, items=[ItemIn(vector=r, external_id=str(start + i)) for i, r in enumerate(rows)]
        )
    return store


def replayed(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_last_wal_replay_lsn()::text").fetchone()
    return parse_lsn(row[0]) if row and row[0] else 0


def wait_replayed(standby_url: str, lsn: int, timeout: float = 300) -> None:
    with psycopg.connect(libpq_url(standby_url), autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while replayed(conn) < lsn:
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not catch up")
            time.sleep(0.01)


def bench_search(args: argparse.Namespace, url: str, standby: Standby, key: str) -> dict[str, Any]:
    queries = clustered(200, args.dims, seed=2)
    bodies = [json.dumps({"vector": q.tolist(), "k": args.k}).encode() for q in queries]
    # The primary's own URL as a "replica": the probe finds it is no standby, so reads go to the
    # primary, through the same blocking path a server with standbys uses.
    servers = {"primary": Server(url, ""), "replica": Server(url, standby.url), "primary_blocking": Server(url, url)}
    try:
        requests = [
            b"POST /v1/collections/%s/search HTTP/1.1\r\nHost: 127.0.0.1\r\n" % COLLECTION.encode()
            + f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
            for body in bodies
        ]
        counts = dict.fromkeys(servers, 0)
        bad: list[int] = []

        def side(name: str) -> Any:
            conns = [RawClient(servers[name].port) for _ in range(args.concurrency)]

            def one(t: int, i: int) -> None:
                try:
                    status = conns[t].request(requests[(i * 7 + t) % len(requests)])
                except OSError as exc:  # the run is void: say so at the end instead of dying in a thread
                    bad.append(-1)
                    conns[t] = RawClient(servers[name].port)
                    print(f"{name}: {exc}", file=sys.stderr)
                    return
                if status != 200:
                    bad.append(status)

            return one

        calls = {name: side(name) for name in servers}
        for name in servers:  # warm every side
            _run_for(1.0, args.concurrency, calls[name])
        window = args.seconds / args.rounds
        names = list(servers)
        for r in tqdm(range(args.rounds), desc="search rounds", file=sys.stderr):
            for name in names if r % 2 == 0 else reversed(names):
                counts[name] += _run_for(window, args.concurrency, calls[name])
        if bad:
            raise RuntimeError(f"API searches failed: {sorted(set(bad))}")
    finally:
        for server in servers.values():
            server.stop()
    qps = {name: round(n / args.seconds, 1) for name, n in counts.items()}
    return {
        "replica_qps_ratio": round(qps["replica"] / qps["primary"], 3),
        "routing_qps_ratio": round(qps["replica"] / qps["primary_blocking"], 3),
        "qps": qps,
        "rows": args.n,
        "dimensions": args.dims,
        "k": args.k,
        "concurrency": args.concurrency,
        "seconds_per_side": args.seconds,
    }


def bench_lag(args: argparse.Namespace, url: str, standby: Standby) -> dict[str, Any]:
    """Commit-to-replay time of each batch written as fast as one writer writes."""
    db = Database(create_engine(url))
    store = VectorStore(db, settings=Settings(database_url=url))
    rows = clustered(args.lag_batches * args.batch, args.dims, seed=5)
    written: list[tuple[int, float]] = []
    seen: list[tuple[float, int]] = []
    done = threading.Event()

    def poll() -> None:
        with psycopg.connect(libpq_url(standby.url), autocommit=True) as conn:
            while not done.is_set():
                seen.append((time.perf_counter(), replayed(conn)))
                time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    started = time.perf_counter()
    try:
        for b in tqdm(range(args.lag_batches), desc="ingest batches", file=sys.stderr):
            chunk = rows[b * args.batch : (b + 1) * args.batch]
            items = [ItemIn(vector=r, external_id=f"lag-{b}-{i}") for i, r in enumerate(chunk)]
            store.upsert_items(collection=COLLECTION, items=items)
            written.append((parse_lsn(db.current_lsn()), time.perf_counter()))
        elapsed = time.perf_counter() - started
        wait_replayed(standby.url, written[-1][0])
        time.sleep(0.01)
    finally:
        done.set()
        poller.join()
    lags, j = [], 0
    for lsn, at in written:  # both lists are in time order
        while j < len(seen) and (seen[j][1] < lsn or seen[j][0] < at):
            j += 1
        if j < len(seen):
            lags.append(seen[j][0] - at)
    lags.sort()
    return {
        "lag_p50_ms": round(1000 * statistics.median(lags), 1),
        "lag_p99_ms": round(1000 * lags[min(len(lags) - 1, int(0.99 * len(lags)))], 1),
        "lag_max_ms": round(1000 * lags[-1], 1),
        "batches": len(written),
        "batch": args.batch,
        "rows_per_s": round(len(written) * args.batch / elapsed),
    }


CONFLICT_SETTINGS: dict[str, dict[str, str]] = {
    "postgres_defaults": {"hot_standby_feedback": "off", "max_standby_streaming_delay": "30s"},
    "replay_never_waits": {"hot_standby_feedback": "off", "max_standby_streaming_delay": "0"},
    "feedback_replay_never_waits": {"hot_standby_feedback": "on", "max_standby_streaming_delay": "0"},
    "memstore_standby": {"hot_standby_feedback": "on", "max_standby_streaming_delay": "30s"},
}


def bench_conflicts(args: argparse.Namespace, url: str, standby: Standby) -> dict[str, Any]:
    """Each setting on the standby in turn (reloaded, no restart); the same maintenance each time."""
    out: dict[str, Any] = {}
    for name, settings in tqdm(CONFLICT_SETTINGS.items(), desc="standby settings", file=sys.stderr):
        with psycopg.connect(libpq_url(standby.url), autocommit=True) as conn:
            for setting, value in settings.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(setting), sql.Literal(value)))
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)  # the feedback setting reaches the primary with the next status message
        out[name] = {**settings, **_maintenance_under_searches(args, url, standby, f"conflicts_{name}")}
    return out


def _maintenance_under_searches(args: argparse.Namespace, url: str, standby: Standby, name: str) -> dict[str, Any]:
    store = VectorStore(create_engine(url), settings=Settings(database_url=url))
    store.create_collection(name=name, dimensions=args.dims)
    base = clustered(args.conflict_rows, args.dims, seed=7)
    for start in range(0, len(base), 2000):
        rows = base[start : start + 2000]
        store.upsert_items(
            collection=name, items=[ItemIn(vector=r, external_id=str(start + i)) for i, r in enumerate(rows)]
        )
    table = store.get_collection(name=name).table_name
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        primary_lsn = parse_lsn(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
    wait_replayed(standby.url, primary_lsn)
    queries = clustered(50, args.dims, seed=8)
    stop = threading.Event()
    counts = {"searches": 0, "cancelled": 0, "other_errors": 0}
    lags: list[float] = []
    ident = sql.Identifier(table)

    def stream(t: int) -> None:
        with psycopg.connect(libpq_url(standby.url), autocommit=True) as conn:
            conn.execute("SET enable_indexscan = off")  # exact scans: searches that take a while
            i = t
            while not stop.is_set():
                # An exact scan of the whole table: a search that holds its snapshot for a while.
                q = "[" + ",".join(f"{x:.5f}" for x in queries[i % len(queries)]) + "]"
                try:
                    conn.execute(
                        sql.SQL("SELECT id FROM {} ORDER BY embedding <=> %s::vector LIMIT 10").format(ident), (q,)
                    ).fetchall()
                    counts["searches"] += 1
                except psycopg.errors.SerializationFailure:  # canceling statement due to conflict with recovery
                    counts["cancelled"] += 1
                except psycopg.Error:
                    counts["other_errors"] += 1
                    if conn.closed or conn.broken:
                        return
                i += 3

    def watch_lag() -> None:
        with psycopg.connect(libpq_url(standby.url), autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 "
                    "ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END"
                ).fetchone()
                lags.append(float(row[0] or 0) if row else 0.0)
                time.sleep(0.05)

    before = _conflict_kinds(standby)
    threads = [threading.Thread(target=stream, args=(t,)) for t in range(args.concurrency)]
    threads.append(threading.Thread(target=watch_lag))
    for th in threads:
        th.start()
    started = time.monotonic()
    try:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            index = conn.execute(
                "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw' AND i.indrelid = %s::regclass",
                (table,),
            ).fetchone()
            for _ in range(args.conflict_passes):
                conn.execute(sql.SQL("DELETE FROM {} WHERE mod(id, 4) = 0").format(ident))
                conn.execute(sql.SQL("VACUUM {}").format(ident))
                if index is not None:
                    conn.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(index[0])))
                conn.execute(
                    sql.SQL("UPDATE {} SET metadata = metadata || '{{\"touched\": 1}}' WHERE mod(id, 4) = 1").format(
                        ident
                    )
                )
                conn.execute(sql.SQL("VACUUM {}").format(ident))
            lsn = parse_lsn(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
        wait_replayed(standby.url, lsn)
        maintenance_s = time.monotonic() - started
    finally:
        stop.set()
        for th in threads:
            th.join()
    time.sleep(0.6)  # the standby's statistics are flushed at most once a second
    after = _conflict_kinds(standby)
    store.drop_collection(name=name)
    return {
        **counts,
        "cancelled_by": {kind: after[kind] - before[kind] for kind in after},
        "max_lag_s": round(max(lags, default=0.0), 2),
        "maintenance_s": round(maintenance_s, 1),
    }


def _conflict_kinds(standby: Standby) -> dict[str, int]:
    """The standby's cancellations so far in this database, by kind of recovery conflict."""
    with psycopg.connect(libpq_url(standby.url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT confl_snapshot, confl_lock, confl_bufferpin, confl_deadlock "
            "FROM pg_stat_database_conflicts WHERE datname = current_database()"
        ).fetchone()
    return dict(zip(("snapshot", "lock", "bufferpin", "deadlock"), map(int, row or (0, 0, 0, 0)), strict=True))


def _database(args: argparse.Namespace, tmp: Path) -> str:
    if args.database_url:
        server = normalise_url(args.database_url)
        if embedded_socket(server) is None:
            raise SystemExit(
                "bench.replicas makes a standby of a server on this machine: give a URL that reaches it "
                "through its socket folder (?host=/path), or none for the embedded server"
            )
    else:
        server = start_embedded_server(Path(tmp), maintenance_work_mem="256MB", max_parallel_maintenance_workers=1)
    return new_database(server, "bench_replicas")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument(
        "--database-url",
        default=os.environ.get("MEMSTORE_DATABASE_URL"),
        help="a server on this machine (reached by its socket folder) to make the benchmark database and "
        "the standby of (default: MEMSTORE_DATABASE_URL, else a new embedded server)",
    )
    p.add_argument("--n", type=int, default=20_000, help="rows in the search collection")
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=max(2, os.cpu_count() or 2), help="default: CPU cores")
    p.add_argument("--seconds", type=float, default=12.0, help="total search time per side")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--batch", type=int, default=256, help="rows per upsert in the lag measurement")
    p.add_argument("--lag-batches", type=int, default=60, help="upserts in the lag measurement")
    p.add_argument("--conflict-rows", type=int, default=20_000, help="rows of each maintenance run's table")
    p.add_argument("--conflict-passes", type=int, default=2, help="delete/VACUUM/REINDEX rounds per setting")
    p.add_argument("--only", choices=("search", "lag", "conflicts"), help="run one part (the others are null)")
    p.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--reads", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args.serve, args.reads, args.port)
        return 0
    with scratch_dir(prefix="memstore-bench-") as tmp:
        os.chmod(tmp, 0o755)  # as root, the standby's server user must reach its folder inside
        url = _database(args, tmp)
        socket = embedded_socket(url)
        assert socket is not None
        standby = Standby.create(Path(tmp) / "standby", socket, database=str(sa.make_url(url).database))
        standby.start()
        try:
            search = lag = conflicts = None
            if args.only in (None, "search", "lag"):
                load(url, args.n, args.dims)
            if args.only in (None, "search"):
                _, key = keys.create_key(Database(create_engine(url)), name="bench", scopes=["admin"])
                with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                    lsn = parse_lsn(str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]))  # type: ignore[index]
                wait_replayed(standby.url, lsn)
                search = bench_search(args, url, standby, key)
                print(f"search: {search}", file=sys.stderr)
            if args.only in (None, "lag"):
                lag = bench_lag(args, url, standby)
                print(f"lag: {lag}", file=sys.stderr)
            if args.only in (None, "conflicts"):
                conflicts = bench_conflicts(args, url, standby)
                print(f"conflicts: {conflicts}", file=sys.stderr)
        finally:
            standby.remove()
    result: dict[str, Any] = {
        "replica_qps_ratio": search["replica_qps_ratio"] if search else None,
        "replica_lag_p99_ms": lag["lag_p99_ms"] if lag else None,
        "search": search,
        "lag": lag,
        "conflicts": conflicts,
        "goals": {"replica_qps_ratio": 0.85},
    }
    result["goals_met"] = (result["replica_qps_ratio"] or 0) >= 0.85
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
