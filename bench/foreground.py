"""``python -m bench.foreground --json``: search p99 while background work runs (re-embedding, an
ingest of photos, or OCR), with the foreground controller on and off, side by side in one run.

    python -m bench.foreground --json [--background reembed|ingest|ocr] [--images N] [--round N]
                                      [--phases N] [--phase-s S] [--idle-s S] [--search-rate R]
                                      [--slo-ms MS] [--workers N] [--plot PNG] [--database-url URL]

On a database of its own (the embedded server unless ``--database-url``), with the encoder engine of
``bench.reembed`` (two offline tiny models on CPU, torch threads as ``memstore serve`` takes them):

1. ``--images`` images are stored and embedded by real ``IngestWorker`` threads, each run under one
   ``memstore.services.foreground.ForegroundController`` (as ``memstore serve`` runs them), which also
   holds the engine's ``background_share``: photo-like JPEGs, or for ``ocr`` screenshots with text
   (``bench.ocr``'s set) into a collection that reads text in its images (read before step 2).
   Then, as ``memstore serve`` does, the objects made so far are kept out of the garbage collector's
   passes (``encoder.gc_freeze``; ``MEMSTORE_GC_FREEZE=false``: not).
2. A stream of vector searches (``bench.search_stream``, open loop, ``--search-rate`` a second)
   starts; its latencies feed the controller, as the search route's do in the server. ``--idle-s``
   with no background work: the idle p99 (and the controller's baseline).
3. The background work (``bench.foreground_work``) runs without a break: ``reembed`` creates a space
   of the wide model, waits until it is filled and indexed, then the next; ``ingest`` and ``ocr``
   queue ``--round`` new images at a time (500: an ingest of 500 images), the next round once fewer
   than half a round wait. Meanwhile ``--phases`` phases of ``--phase-s`` alternate the controller
   off (share held at 1) and on, in the order off, on, on, off, off, on, ... so that neither mode
   always comes first; the first second of each phase is left out (the switch settles).
4. The background is stopped (share forced to 0) and the stream measured idle again.

Reported: each phase's p99 and the background's rate (units a second: vectors re-embedded, images
embedded, images read); per mode the median of the phases' p99 over the idle p99 (``p99_ratio_on``,
``p99_ratio_off``; goal on <= 2), and the background's rate on over off
(``background_rate_ratio_on_vs_off``), the controller's back-offs and its share over time.
``--plot`` draws p99 and the background's rate over time (``bench.foreground_plot``). Progress goes to
stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql

from bench import foreground_plot
from bench.databases import drop_database, new_database, scratch_dir
from bench.foreground_work import KINDS, UNITS, Background, Feeder, Reembedding, finished_units
from bench.image_set import image_set
from bench.ocr import image_set as ocr_image_set
from bench.reembed import COLLECTION, TINY, WIDE, log, open_engine, store_images, stored_queries, watch
from bench.search_stream import SearchStream
from encoder.engine import EmbeddingEngine
from encoder.gc_freeze import freeze_startup
from encoder.settings import EncoderSettings
from memstore.catalog.collections import Collection
from memstore.db.core import Database, create_engine, libpq_url, normalise_url
from memstore.db.embedded import start_embedded_server
from memstore.services.foreground import ForegroundController
from memstore.services.foreground_signal import SharePublisher
from memstore.settings import IngestSettings, Settings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker

SETTLE_S = 1.0  # left out at the start of each phase


@contextmanager
def paced_workers(
    db: Database, backend: EmbeddingEngine, fg: ForegroundController, n: int, batch_size: int
) -> Iterator[list[IngestWorker]]:
    settings = IngestSettings(batch_size=batch_size)
    workers = [IngestWorker(db, backend, settings=settings, name=f"ingest-{i}", pace=fg) for i in range(n)]
    threads = [threading.Thread(target=w.run, name=w.name, daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        yield workers
    finally:
        fg.force(1.0)
        for w in workers:
            w.stop()
        for t in threads:
            t.join(60)


@contextmanager
def worker_process(
    url: str, args: argparse.Namespace, log_dir: Path, exits: list[int | None]
) -> Iterator[list[IngestWorker]]:
    """``--split``: the ingest workers in a ``memstore worker`` process of their own, with their own
    encoder (the models of ``open_engine``), as compose.yaml runs them; they follow the share this
    process publishes (``memstore.services.foreground_signal``). Yields no in-process workers."""
    env = dict(os.environ)
    env.update(
        {
            "MEMSTORE_DATABASE_URL": url,
            "MEMSTORE_MODEL": TINY,
            "MEMSTORE_PRETRAINED": "none",
            "MEMSTORE_MODELS": f"{WIDE}=none",
            "MEMSTORE_ENCODER_DEVICE": "cpu",
            "MEMSTORE_ENCODER_BATCH_SIZE": str(args.encoder_batch_size),
            "MEMSTORE_FOREGROUND_WINDOW_S": str(args.window_s),
            "MEMSTORE_BACKGROUND_CONNECTIONS": str(args.connections),
        }
    )
    if args.torch_threads is not None:
        env["MEMSTORE_ENCODER_TORCH_THREADS"] = str(args.torch_threads)
    command = [sys.executable, "-m", "memstore.cli", "worker", "--no-migrate", "--threads", str(args.workers)]
    command += ["--batch-size", str(args.batch_size)]
    out = (log_dir / "worker.log").open("w")
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield []
    finally:
        proc.send_signal(signal.SIGTERM)  # while this process still publishes a share of zero
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        exits.append(proc.returncode)
        if proc.returncode != 0:
            log(f"memstore worker exited {proc.returncode}: {(log_dir / 'worker.log').read_text()[-2000:]}")


def space_vectors(store: VectorStore, conn: psycopg.Connection[Any]) -> int:
    """Vectors written into the collection's side spaces so far (what re-embedding made), counted in
    the database: the workers of ``--split`` run in another process."""
    c = store.get_collection(name=COLLECTION, fresh=True)
    total = 0
    for space in c.spaces:
        if space.side:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(space.table_name))).fetchone()
            total += int(row[0]) if row else 0
    return total


def background(
    args: argparse.Namespace, store: VectorStore, conn: psycopg.Connection[Any], c: Collection,
    images: list[bytes], workers: list[IngestWorker],
) -> Background:  # fmt: skip
    if args.background == "reembed":
        if args.split:
            return Reembedding(store, conn, lambda: space_vectors(store, conn))
        return Reembedding(store, conn, lambda: sum(w.totals.written for w in workers))
    return Feeder(store, conn, c, images, round_size=args.round, finished=finished_units(args.background, c))


def per_second(stream: SearchStream, t0: float) -> list[dict[str, Any]]:
    """The stream's p99 in each whole second since ``t0`` (the plot's upper panel)."""
    samples = list(stream.samples)
    last = max((s.due for s in samples), default=t0)
    out = []
    for second in range(int(last - t0) + 1):
        figures = stream.window(t0 + second, t0 + second + 1)
        if figures["p99_ms"] is not None:
            out.append({"t": second, "p99_ms": figures["p99_ms"]})
    return out


def run(args: argparse.Namespace, url: str, images: list[bytes], log_dir: Path) -> dict[str, Any]:
    load_before = round(os.getloadavg()[0], 2)
    engine = create_engine(url, pool_size=args.workers + 4)
    store = VectorStore(engine, settings=Settings(database_url=url))
    backend: EmbeddingEngine | None = None
    close_backend: Callable[[], None] = lambda: None  # noqa: E731
    if not args.split:  # the encoder in this process (with --split, in the worker process)
        backend, close_backend = open_engine(args.encoder_batch_size, args.torch_threads)
    conn = psycopg.connect(libpq_url(url), autocommit=True)
    register_vector(conn)
    stream: SearchStream | None = None

    def answered(start: float) -> list[tuple[float, float]]:  # what the search route records, in the server
        if stream is None:
            return []
        done = ((s.due + s.latency_s, s.latency_s) for s in list(stream.samples) if s.ok)
        return [(t, lat) for t, lat in done if t >= start]

    fg = ForegroundController(answered, slo_ms=args.slo_ms, window_s=args.window_s, connections=args.connections)
    if backend is None:  # --split: the worker process follows what this one publishes
        fg.publisher = SharePublisher(store.db, heartbeat_s=args.window_s)
    else:
        fg.attach_encoder(backend)
    fg.force(1.0)
    trace: list[dict[str, Any]] = []
    worker_exits: list[int | None] = []  # --split: the worker process's exit status
    phases: list[dict[str, Any]] = []
    try:
        workers_cm = (
            worker_process(url, args, log_dir, worker_exits)
            if backend is None
            else paced_workers(store.db, backend, fg, args.workers, args.batch_size)
        )
        with workers_cm as workers:
            c = store_images(store, conn, images, ocr=args.background == "ocr")
            if args.background == "ocr":  # the stored images read before the idle window
                watch(conn, finished_units("ocr", c), len(images), "ocr (stored images)")
            queries = stored_queries(conn, c, 200)
            freeze_startup("bench.foreground", enabled=store.settings.gc_freeze)  # as memstore serve does
            stream = SearchStream(store, COLLECTION, queries, rate_per_s=args.search_rate).start()
            fg.force(None)
            fg.start()
            t0 = time.monotonic()
            time.sleep(args.idle_s)
            idle_before = stream.window(t0 + SETTLE_S, time.monotonic())
            log(f"idle: {idle_before}; target {fg.target_ms()}")
            work = background(args, store, conn, c, images, workers).start()
            time.sleep(2.0)  # the first backlog queued, the workers busy
            order = ["off", "on", "on", "off"]
            for i in range(args.phases):
                mode = order[i % 4]
                fg.force(1.0 if mode == "off" else None)
                done = work.done()
                backoffs = fg.backoffs
                start = time.monotonic()
                end = start + args.phase_s
                while time.monotonic() < end:
                    time.sleep(0.25)
                    state = fg.state()
                    trace.append({"t": round(time.monotonic() - t0, 2), "mode": mode, "done": work.done(),
                                  "share": state["background_share"], "p99_ms": state["search_p99_ms"]})  # fmt: skip
                figures = stream.window(start + SETTLE_S, end)
                rate = (work.done() - done) / args.phase_s
                phases.append({"mode": mode, **figures, "background_per_s": round(rate, 2),
                               "backoffs": fg.backoffs - backoffs})  # fmt: skip
                log(f"phase {i + 1} ({mode}): {json.dumps(phases[-1])}")
            work.stop()
            fg.force(0.0)  # the background stops between units
            time.sleep(3.0)
            t1 = time.monotonic()
            time.sleep(args.idle_s)
            idle_after = stream.window(t1 + SETTLE_S, time.monotonic())
            stream.stop()
            windows = per_second(stream, t0)
    finally:
        fg.close()
        if stream is not None:
            stream.stop()
        close_backend()
        conn.close()
        engine.dispose()
    idle = idle_before["p99_ms"]

    def mode_figures(mode: str) -> dict[str, Any]:
        mine = [p for p in phases if p["mode"] == mode and p["p99_ms"]]
        p99 = median(p["p99_ms"] for p in mine)
        return {
            "p99_ms_median": round(p99, 3),
            "p99_ratio": round(p99 / idle, 3) if idle else None,
            "p99_ratios": [round(p["p99_ms"] / idle, 3) for p in mine] if idle else None,
            "background_per_s": round(median(p["background_per_s"] for p in mine), 2),
        }

    on, off = mode_figures("on"), mode_figures("off")
    result: dict[str, Any] = {
        "background": args.background,
        "layout": "split" if args.split else "one process",
        "worker_exit": worker_exits[0] if worker_exits else None,
        "unit": UNITS[args.background],
        "round": args.round if args.background != "reembed" else None,
        "images": len(images),
        "workers": args.workers,
        "search_rate_per_s": args.search_rate,
        "phase_s": args.phase_s,
        "slo_ms": args.slo_ms,
        "target_p99_ms": fg.state()["target_p99_ms"],
        "idle_before": idle_before,
        "idle_after": idle_after,
        "on": on,
        "off": off,
        "p99_ratio_on": on["p99_ratio"],
        "p99_ratio_off": off["p99_ratio"],
        "p99_on_vs_off": round(on["p99_ms_median"] / off["p99_ms_median"], 3),
        "background_rate_ratio_on_vs_off": round(on["background_per_s"] / off["background_per_s"], 3)
        if off["background_per_s"]
        else None,
        "backoffs": fg.backoffs,
        "work_started": work.started,
        "failed_searches": sum(p["failed"] for p in phases) + idle_before["failed"] + idle_after["failed"],
        "load_average": {"before": load_before, "after": round(os.getloadavg()[0], 2)},
        "phases": phases,
        "share_trace": trace,
        "search_windows": windows,
    }
    result["goals"] = {"p99_ratio_on<=2": on["p99_ratio"] is not None and on["p99_ratio"] <= 2.0}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.foreground", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--database-url", help="server to create the benchmark database on (default: embedded)")
    p.add_argument("--background", choices=KINDS, default="reembed", help="the background work (default reembed)")
    p.add_argument("--images", type=int, help="stored images (default 300; 60 screenshots for ocr)")
    p.add_argument("--round", type=int, default=500, help="images queued at a time for ingest and ocr")
    p.add_argument("--largest", type=int, default=1200, help="long side of the largest image, pixels")
    p.add_argument("--workers", type=int, default=1, help="ingest worker threads (as memstore serve --workers)")
    p.add_argument("--batch-size", type=int, default=IngestSettings.model_fields["batch_size"].default)
    p.add_argument("--encoder-batch-size", type=int, default=EncoderSettings.model_fields["batch_size"].default,
                   help="the encoder's micro-batch (MEMSTORE_ENCODER_BATCH_SIZE's default)")  # fmt: skip
    p.add_argument("--torch-threads", type=int, help="the encoder's torch threads (default: as serve, cores - 1)")
    p.add_argument("--phases", type=int, default=8, help="alternating phases, controller off and on")
    p.add_argument(
        "--phase-s", type=float, default=20.0, help="seconds per phase (20: a phase's p99 is its fourth-slowest search)"
    )
    p.add_argument("--idle-s", type=float, default=8.0, help="the stream alone, before and after")
    p.add_argument("--search-rate", type=float, default=20.0, help="searches a second in the stream")
    p.add_argument("--slo-ms", type=float, help="MEMSTORE_SEARCH_P99_SLO_MS (default: 2 x the idle baseline)")
    p.add_argument("--window-s", type=float, default=1.0, help="MEMSTORE_FOREGROUND_WINDOW_S")
    p.add_argument("--connections", type=int, default=2, help="MEMSTORE_BACKGROUND_CONNECTIONS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--split",
        action="store_true",
        help="the workers in a memstore worker process of their own, following the share this one publishes",
    )
    p.add_argument("--plot", type=Path, help="write p99 and the background's rate over time here (PNG)")
    args = p.parse_args(argv)
    if args.images is None:
        args.images = 60 if args.background == "ocr" else 300
    if args.background == "ocr":
        images = [r.content for r in ocr_image_set(args.images)]
    else:
        images = image_set(args.images, args.seed, largest=args.largest)
    with scratch_dir(prefix="memstore-bench-") as tmp:
        server = (
            normalise_url(args.database_url)
            if args.database_url
            else start_embedded_server(Path(tmp), maintenance_work_mem="256MB", max_parallel_maintenance_workers=1)
        )
        url = new_database(server, "bench_foreground")
        try:
            result = run(args, url, images, Path(tmp))
        finally:
            drop_database(url)
    if args.plot:
        log(f"plot: {foreground_plot.plot(result, args.plot)}")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
