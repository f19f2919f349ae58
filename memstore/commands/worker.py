"""``memstore worker``: ingest workers as a separate process (scale out, or cron with ``--once``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memstore.ingest_worker import Report

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = sub.add_parser(
        "worker",
        help="embed queued items (until stopped, or --once)",
        description="Claims pending items from the durable queue, embeds them and writes the vectors. "
        "Any number of these may run against one database. SIGTERM finishes the batch in hand, then exits.",
    )
    worker.add_argument("--once", action="store_true", help="drain what is due now, then exit (for cron)")
    worker.add_argument("--threads", type=int, default=1, metavar="N", help="worker threads sharing the model")
    worker.add_argument("--encoder-url", metavar="URL", help="use the encoder service at URL instead of a local model")
    worker.add_argument("--batch-size", type=int, metavar="N", help="items claimed at a time (MEMSTORE_INGEST_*)")
    worker.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    worker.add_argument("--json", action="store_true", help="print a JSON summary at exit")
    worker.set_defaults(func=_worker)


def _worker(args: argparse.Namespace) -> int:
    from memstore import claims, migrate
    from memstore.db import get_engine, resolve_database_url
    from memstore.embedded import exit_cleanly_on_sigterm
    from memstore.ingest_worker import IngestWorker, Report
    from memstore.queue import IngestSettings
    from memstore.services.encoder_host import EncoderChoice, open_backend

    exit_cleanly_on_sigterm()
    if not args.no_migrate:
        migrate.upgrade(resolve_database_url())
    settings = IngestSettings()
    if args.batch_size:
        settings = settings.model_copy(update={"batch_size": args.batch_size})
    engine = get_engine()
    started = time.monotonic()
    if args.once and claims.next_due_in(engine) != 0:
        # Nothing is due: no model to load (seconds to minutes) for a run that would claim nothing.
        if not args.json:
            print("memstore worker: nothing is due in the queue; the model was not loaded", file=sys.stderr)
        return _report(args, Report(), started, 0)
    try:
        backend, close = open_backend(EncoderChoice(mode="remote" if args.encoder_url else None, url=args.encoder_url))
        assert backend is not None
        _ = backend.info
    except Exception as exc:  # missing weights, unknown model, unreachable encoder service
        print(f"memstore worker: the encoder did not start: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    workers = [
        IngestWorker(engine, backend, settings=settings, stop_event=stop, name=f"worker-{i}")
        for i in range(max(1, args.threads))
    ]
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda signum, _frame: stop.set())
    codes = [0] * len(workers)

    def run(i: int) -> None:
        codes[i] = workers[i].run(once=args.once)

    threads = [threading.Thread(target=run, args=(i,), name=w.name) for i, w in enumerate(workers)]
    if not args.json:
        print(f"memstore worker: {len(threads)} thread(s), model {backend.info.model}", file=sys.stderr, flush=True)
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.5)
    finally:
        stop.set()
        for s, h in previous.items():
            signal.signal(s, h)
        close()
    total = Report()
    for w in workers:
        total.add(w.totals)
    return _report(args, total, started, max(codes))


def _report(args: argparse.Namespace, total: Report, started: float, exit_code: int) -> int:
    summary = {
        "claimed": total.claimed,
        "written": total.written,
        "retried": total.retried,
        "failed": total.failed,
        "released": total.released,
        "dropped": total.dropped,
        "seconds": round(time.monotonic() - started, 3),
        "exit_code": exit_code,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"memstore worker: wrote {total.written} vectors, {total.failed} failed, {total.retried} to retry",
            file=sys.stderr,
        )
    return exit_code
