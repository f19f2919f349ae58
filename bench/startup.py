"""``python -m bench.startup --json``: REST vector searches while ``memstore serve`` loads its model,
against the same searches once ``/health`` says ``ok``, with and without the loader's yielding.

    python -m bench.startup --json [--rows N] [--dims D] [--model NAME] [--runs N] [--after-s S]

One database (the embedded server) with ``--rows`` random vectors; then ``--runs`` times each mode,
alternating (``plain``: ``MEMSTORE_ENCODER_LOAD_YIELD=false``; ``yield``: the default), a fresh
``memstore serve`` (auth off, no worker, ``--model`` with random weights on CPU, so it loads without
a network). One keep-alive httpx client searches back to back from the first answer of ``/health``;
another thread reads ``/health`` every 0.2 s. Reported per run: searches a second while ``starting``
and for ``--after-s`` after ``ok``, and their ratio (goal >= 0.8); per mode the median ratio.
Progress goes to stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import numpy as np

from bench.databases import drop_database, new_database, scratch_dir
from memstore.db.core import create_engine, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore

COLLECTION = "v"


def log(msg: str) -> None:
    print(f"[bench.startup] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(args: argparse.Namespace, url: str, mode: str, queries: np.ndarray) -> dict[str, Any]:
    port = free_port()
    env = {
        **os.environ,
        "MEMSTORE_DATABASE_URL": url,
        "MEMSTORE_API_AUTH": "off",
        "MEMSTORE_MODEL": args.model,
        "MEMSTORE_PRETRAINED": "none",
        "MEMSTORE_MODELS": "",
        "MEMSTORE_ENCODER_DEVICE": "cpu",
        "MEMSTORE_ENCODER_LOAD_YIELD": "false" if mode == "plain" else "true",
    }
    cmd = [sys.executable, "-m", "memstore.cli", "serve", "--port", str(port), "--no-worker"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    states: list[tuple[float, str]] = []
    done: list[float] = []
    stop = threading.Event()
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            else:
                raise RuntimeError("the server did not answer /health")

            def watch() -> None:
                with httpx.Client(base_url=base, timeout=30) as h:
                    while not stop.is_set():
                        states.append((time.monotonic(), h.get("/health").json()["status"]))
                        stop.wait(0.2)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            ok_at: float | None = None
            i = 0
            while ok_at is None or time.monotonic() < ok_at + args.after_s:
                q = queries[i % len(queries)].tolist()
                r = client.post(f"/v1/collections/{COLLECTION}/search", json={"vector": q, "k": 10})
                r.raise_for_status()
                done.append(time.monotonic())
                i += 1
                if ok_at is None and states and states[-1][1] == "ok":
                    ok_at = next(t for t, s in states if s == "ok")
                if time.monotonic() > deadline:
                    raise RuntimeError("the encoder did not load in time")
            stop.set()
            watcher.join(5)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(30)
    first = states[0][0]
    starting = [t for t in done if first <= t < ok_at]
    after = [t for t in done if ok_at + 0.5 <= t < ok_at + args.after_s]
    starting_qps = len(starting) / max(1e-9, ok_at - first)
    after_qps = len(after) / (args.after_s - 0.5)
    return {
        "mode": mode,
        "starting_s": round(ok_at - first, 2),
        "starting_qps": round(starting_qps, 1),
        "after_ok_qps": round(after_qps, 1),
        "ratio": round(starting_qps / after_qps, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--database-url", help="server to create the benchmark database on (default: embedded)")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--model", default="ViT-B-32", help="an open_clip model, loaded with random weights")
    p.add_argument("--runs", type=int, default=2, help="server starts per mode (alternating)")
    p.add_argument("--after-s", type=float, default=5.0, help="seconds measured after /health says ok")
    p.add_argument("--modes", default="plain,yield")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.rows, args.dims)).astype(np.float32)
    with scratch_dir(prefix="memstore-bench-") as tmp:
        server = (
            normalise_url(args.database_url)
            if args.database_url
            else start_embedded_server(Path(tmp), maintenance_work_mem="256MB", max_parallel_maintenance_workers=1)
        )
        url = new_database(server, "bench_startup")
        try:
            engine = create_engine(url)
            store = VectorStore(engine, settings=Settings(database_url=url))
            store.create_collection(name=COLLECTION, dimensions=args.dims)
            store.bulk_load(collection=COLLECTION, items=[ItemIn(vector=v) for v in vectors])
            engine.dispose()
            runs = []
            modes = args.modes.split(",")
            for r in range(args.runs):
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    runs.append(one_run(args, url, mode, vectors[:500]))
                    log(json.dumps(runs[-1]))
        finally:
            drop_database(url)
    result: dict[str, Any] = {"rows": args.rows, "dims": args.dims, "model": args.model, "runs": runs}
    for mode in modes:
        mine = [x for x in runs if x["mode"] == mode]
        result[f"ratio_{mode}"] = round(median(x["ratio"] for x in mine), 3)
        result[f"starting_qps_{mode}"] = round(median(x["starting_qps"] for x in mine), 1)
        result[f"after_ok_qps_{mode}"] = round(median(x["after_ok_qps"] for x in mine), 1)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
