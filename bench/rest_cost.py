"""``python -m bench.rest_cost --json``: where the REST server's CPU goes per vector search, layer by layer.

A REST search costs the server process CPU that one raw SQL statement does not; this says how much
each layer adds, measured in one run on one database (``--rows`` x ``--dims`` clustered vectors, one
connection, one request at a time, ``--calls`` calls per layer, CPU seconds of the process doing the
work over the calls; the in-process layers on uvloop, as the server runs, taking turns over
``--rounds`` rounds, medians):

- ``cursor``: memstore's own search statement (the plan's SQL, settings and parameters) on a raw
  psycopg ``AsyncConnection`` through its cursor (``execute``, ``fetchall``): what the driver's usual
  path costs, for comparison (not part of the sums);
- ``statement``: the same statement as the route sends it, straight through libpq
  (``memstore.db.direct_fetch``): the driver's and the event loop's cost of one round trip;
- ``execute``: ``memstore.api.routes.search.execute``, what the route runs: the collection looked up,
  the query checked and planned, the statement on the search connections, the answer's dicts;
- ``fast_path``: the JSON fast path (``memstore.api.fastpath``): the body parsed, ``execute``, the
  answer rendered, the response messages;
- ``front``: the whole ASGI app, every plain-ASGI layer in front of the fast path (metrics, the key
  check, the body limit, the search guard's listener, read-your-writes);
- ``server``: ``memstore serve --no-encoder`` in a process of its own (uvicorn, uvloop, the guarded
  httptools protocol, the sampled access log), as ``bench.peers`` runs it, over a kept-alive
  connection (``bench.api.RawClient``): the server process's CPU per search;
- ``http_floor``: that HTTP server answering a canned search-sized answer with a trivial ASGI app,
  the least any answer costs there.

The differences between consecutive layers are what each adds (``added_ms``). Progress goes to
stderr; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg
import uvloop

from bench.api import TINY_ENV, RawClient, load_search, raw_search
from bench.data import clustered
from bench.databases import drop_database, new_database, scratch_dir, server_url
from bench.peers_rest import Serve
from bench.startup import free_port
from memstore.access import keys
from memstore.db.core import Database, create_engine, libpq_url
from memstore.settings import Settings

NAME = "bench_search"  # bench.api's collection
CANNED = json.dumps(
    {
        "results": [
            {"id": i, "external_id": str(i), "score": 0.5, "distance": 0.5, "ranks": {"vector": i + 1, "keyword": None},
             "metadata": {}, "content_url": f"/v1/collections/{NAME}/items/{i}/content"}
            for i in range(10)
        ]
    }
).encode()  # fmt: skip


def log(message: str) -> None:
    print(f"[bench.rest_cost] {message}", file=sys.stderr, flush=True)


def serve_floor(port: int) -> None:
    """``--serve-floor``: memstore serve's HTTP server with a trivial app (the canned answer)."""
    from memstore.api.http_limits import run_server
    from memstore.settings import ApiSettings

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(CANNED)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": CANNED})

    run_server(app, ApiSettings(), host="127.0.0.1", port=port)


async def _in_turns(
    layers: dict[str, Callable[[int], Awaitable[None]]], calls: int, rounds: int
) -> dict[str, dict[str, float]]:
    """CPU and wall ms per call of each layer: ``rounds`` turns of ``calls // rounds`` calls each, the
    layers taking turns (the order turning by one each round) so a drifting machine hits all alike;
    the median over the turns."""
    names = list(layers)
    for fn in layers.values():
        for i in range(min(200, calls)):  # warm: prepared statements, caches
            await fn(i)
    per_turn = max(1, calls // rounds)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn, c0, w0 = layers[name], time.process_time(), time.perf_counter()
            for i in range(per_turn):
                await fn(i)
            cpu[name].append((time.process_time() - c0) * 1000 / per_turn)
            wall[name].append((time.perf_counter() - w0) * 1000 / per_turn)
    out = {
        name: {"cpu_ms": round(statistics.median(cpu[name]), 4), "wall_ms": round(statistics.median(wall[name]), 4)}
        for name in names
    }
    log(f"in process: {out}")
    return out


def _scope(body: bytes, key: str) -> dict[str, Any]:
    path = f"/v1/collections/{NAME}/search"
    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode())]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip


async def in_process(
    url: str, key: str, bodies: list[bytes], queries: np.ndarray, calls: int, rounds: int
) -> dict[str, Any]:
    """The layers measured inside this process (no HTTP server): statement, execute, fast_path, front."""
    from pgvector.psycopg import register_vector_async

    from memstore.api.auth import authenticate_runtime
    from memstore.api.fastpath import SearchFastPath
    from memstore.api.routes.search import execute
    from memstore.api.runtime import RuntimeOptions
    from memstore.api.schemas import SearchRequest
    from memstore.db.direct_fetch import fetch_rows
    from memstore.search.plan import plan
    from memstore.search.request import check_query
    from memstore.search.statements import SESSION_SETTINGS_SQL
    from memstore.settings import ApiSettings
    from memstore.web import create_app

    app: Any = create_app(
        Settings(database_url=url), api_settings=ApiSettings(), options=RuntimeOptions(encoder="none")
    )
    parsed = [SearchRequest.model_validate_json(b) for b in bodies]
    async with app.router.lifespan_context(app):
        rt = app.state.runtime
        c = rt.store.get_collection(name=NAME)
        plans = [
            plan(c, check_query(mode="vector", vector=q, text=None, k=10), ef_search=None, exact=False,
                 max_scan_tuples=rt.store.settings.max_scan_tuples)
            for q in queries
        ]  # fmt: skip
        conn = await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True)
        await register_vector_async(conn)
        await conn.execute(SESSION_SETTINGS_SQL, plans[0].settings.values())

        async def cursor(i: int) -> None:
            p = plans[i % len(plans)]
            await (await conn.execute(p.statement, p.params, prepare=p.prepare)).fetchall()

        async def statement(i: int) -> None:
            p = plans[i % len(plans)]
            await fetch_rows(conn, p.statement, p.params, prepare=p.prepare)

        async def route(i: int) -> None:
            await execute(rt, NAME, parsed[i % len(parsed)], None)

        fast = SearchFastPath(app.dispatch, fastapi_app=app)
        verified = await authenticate_runtime(rt, key)  # what the front's AuthGate leaves in the scope

        def caller(target: Any, state: dict[str, Any]) -> Callable[[int], Awaitable[None]]:
            async def call(i: int) -> None:
                body = bodies[i % len(bodies)]
                pending = [{"type": "http.request", "body": body, "more_body": False}]
                sent: list[dict[str, Any]] = []

                async def receive() -> dict[str, Any]:
                    if pending:
                        return pending.pop()
                    await asyncio.Future()  # the client stays: no disconnect
                    raise AssertionError("unreachable")

                async def send(message: dict[str, Any]) -> None:
                    sent.append(message)

                scope = _scope(body, key)
                scope["state"] = dict(state)
                await target(scope, receive, send)
                if not sent or sent[0]["status"] != 200:
                    raise RuntimeError(f"the search was answered {sent[:1]}")

            return call

        layers = {
            "cursor": cursor,
            "statement": statement,
            "execute": route,
            "fast_path": caller(fast, {"api_key": verified}),
            "front": caller(app, {}),
        }
        try:
            out = await _in_turns(layers, calls, rounds)
        finally:
            await conn.close()
    return out


# The kernel counts a process's CPU time in clock ticks (10 ms): the calls over HTTP go on past
# ``calls`` until the server has used this much, so that the figure is not a tick or two divided.
MIN_SERVER_CPU_S = 0.2
MAX_EXTRA_S = 30.0


def over_http(port: int, cpu: Callable[[], float], key: str, bodies: list[bytes], calls: int) -> dict[str, float]:
    """Server CPU per request (``cpu``: the server process's CPU seconds so far) over one connection:
    at least ``calls`` requests, and more until the server has used ``MIN_SERVER_CPU_S`` (for at most
    ``MAX_EXTRA_S`` more)."""
    requests = [raw_search(key, body, NAME) for body in bodies]
    client = RawClient(port)
    for i in range(min(500, calls)):
        client.request(requests[i % len(requests)])
    used, wall = cpu(), time.perf_counter()
    done = 0
    while done < calls or (cpu() - used < MIN_SERVER_CPU_S and time.perf_counter() - wall < MAX_EXTRA_S):
        for _ in range(max(1, min(calls, 100))):
            if client.request(requests[done % len(requests)]) != 200:
                raise RuntimeError("a search over HTTP was not answered 200")
            done += 1
    return {
        "cpu_ms": round((cpu() - used) * 1000 / done, 4),
        "wall_ms": round((time.perf_counter() - wall) * 1000 / done, 4),
        "calls": done,
    }


def cpu_seconds(pid: int) -> Callable[[], float]:
    """The process ``pid``'s CPU seconds so far (user and system), read when called."""
    process = psutil.Process(pid)
    return lambda: sum(process.cpu_times()[:2])


def floor(key: str, bodies: list[bytes], calls: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.rest_cost", "--serve-floor", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the floor server did not start") from None
                time.sleep(0.2)
        return over_http(port, cpu_seconds(proc.pid), key, bodies, calls)
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rest_cost", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--calls", type=int, default=4000, help="calls per layer")
    p.add_argument("--rounds", type=int, default=8, help="turns the in-process layers take")
    p.add_argument("--database-url", help="server to create the benchmark database on (default: embedded)")
    p.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return 0
    os.environ.update(TINY_ENV)
    queries = clustered(200, args.dims, seed=2)
    bodies = [json.dumps({"vector": q.tolist(), "k": 10}).encode() for q in queries]
    with scratch_dir("memstore-rest-cost-") as tmp:
        url = new_database(server_url(args.database_url, Path(tmp), Settings()), "bench_rest_cost")
        try:
            ns = argparse.Namespace(n=args.rows, dims=args.dims, concurrency=1)
            load_search(ns, url).db.engine.dispose()
            db = Database(create_engine(url))
            _, key = keys.create_key(db, name="bench-rest-cost", scopes=["admin"])
            db.engine.dispose()
            log(f"{args.rows} x {args.dims} loaded; {args.calls} calls a layer")
            # On uvloop, as the server runs them: the layers' figures then differ by the layer alone.
            layers = uvloop.run(in_process(url, key, bodies, queries, args.calls, args.rounds))
            server = Serve(url, Path(tmp), 1000)  # memstore serve --no-encoder, as bench.peers runs it
            try:
                layers["server"] = over_http(server.port, cpu_seconds(server.proc.pid), key, bodies, args.calls)
            finally:
                server.stop()
            log(f"server: {layers['server']}")
            layers["http_floor"] = floor(key, bodies, args.calls)
            log(f"http floor: {layers['http_floor']}")
        finally:
            drop_database(url)
    cpu = {name: figures["cpu_ms"] for name, figures in layers.items()}
    added = {
        "memstore_search (execute - statement)": cpu["execute"] - cpu["statement"],
        "parse_and_render (fast_path - execute)": cpu["fast_path"] - cpu["execute"],
        "asgi_front (front - fast_path)": cpu["front"] - cpu["fast_path"],
        "http_server (server - front)": cpu["server"] - cpu["front"],
    }
    result = {
        "rows": args.rows,
        "dims": args.dims,
        "calls": args.calls,
        "layers": layers,
        "added_ms": {k: round(v, 4) for k, v in added.items()},
        "server_cpu_ms_per_search": cpu["server"],
        # What the route's direct statement saves over psycopg's cursor path (memstore.db.direct_fetch).
        "direct_fetch_saves_ms": round(cpu["cursor"] - cpu["statement"], 4),
        "http_floor_cpu_ms": layers["http_floor"]["cpu_ms"],
        "statement_share_of_server_cpu": round(cpu["statement"] / cpu["server"], 3),
    }
    if not args.json:
        for name, value in result.items():
            print(f"{name:>32}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
