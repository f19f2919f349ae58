"""``memstore worker``: ingest workers as a separate process (scale out, or cron with ``--once``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, get_args

import click

from encoder.cli_support import EXIT_USAGE, exit_cleanly_on_sigterm, json_option, print_json, stop_on_signals
from memstore.settings import CpuPriority  # the CLI has it loaded already (memstore.commands.serve)

if TYPE_CHECKING:
    from memstore.workers.ingest import Report

log = logging.getLogger(__name__)


@click.command("worker", short_help="embed queued items (until stopped, or --once)")
@click.option("--once", is_flag=True, help="drain what is due now, then exit (for cron)")
@click.option("--threads", type=int, default=1, metavar="N", help="worker threads sharing the model")
@click.option("--encoder-url", metavar="URL", help="use the encoder service at URL instead of a local model")
@click.option(
    "--batch-size", type=int, metavar="N", help="items claimed at a time (default MEMSTORE_INGEST_BATCH_SIZE)"
)
@click.option(
    "--cpu-priority",
    type=click.Choice(get_args(CpuPriority)),
    help="this process's CPU priority (default MEMSTORE_INGEST_CPU_PRIORITY: idle, cores searches do not want)",
)
@click.option("--no-migrate", is_flag=True, help="do not apply migrations at start")
@json_option("print a JSON summary at exit")
def command(
    once: bool,
    threads: int,
    encoder_url: str | None,
    batch_size: int | None,
    cpu_priority: str | None,
    no_migrate: bool,
    as_json: bool,
) -> int:
    """Claim pending items from the durable queue, embed them and write the vectors. Any number of
    these may run against one database. SIGTERM finishes the batch in hand, then exits."""
    from memstore.db import migrate
    from memstore.db.core import get_database, resolve_database_url
    from memstore.queue import claims
    from memstore.services import cpu_priority as priority
    from memstore.services.encoder_host import EncoderChoice, open_backend
    from memstore.services.foreground_signal import ForegroundFollower
    from memstore.settings import get_ingest_settings, get_settings
    from memstore.workers.ingest import IngestWorker, Report

    exit_cleanly_on_sigterm()
    if not no_migrate:
        migrate.upgrade(resolve_database_url())
    settings = get_ingest_settings()
    # Before the model and the workers start their threads: they inherit it.
    applied = priority.apply(cpu_priority or settings.cpu_priority)
    if batch_size:
        settings = settings.model_copy(update={"batch_size": batch_size})
    db = get_database(replicas=False)  # workers write: the primary alone, no replica pools or probes
    started = time.monotonic()
    if once and claims.next_due_in(db) != 0:
        # Nothing is due: no model to load (seconds to minutes) for a run that would claim nothing.
        if not as_json:
            click.echo("memstore worker: nothing is due in the queue; the model was not loaded", err=True)
        return _report(as_json, Report(), started, 0, applied)
    try:
        backend, close = open_backend(EncoderChoice(mode="remote" if encoder_url else None, url=encoder_url))
        assert backend is not None
        _ = backend.info
    except Exception as exc:  # missing weights, unknown model, unreachable encoder service
        click.echo(f"memstore worker: the encoder did not start: {exc}", err=True)
        return EXIT_USAGE
    stop = threading.Event()
    # No searches here: the work yields to the search servers' published shares (foreground first).
    follower = ForegroundFollower.for_process(db, get_settings()).start()
    follower.attach_encoder(backend)
    workers = [
        IngestWorker(db, backend, settings=settings, stop_event=stop, name=f"worker-{i}", pace=follower)
        for i in range(max(1, threads))
    ]
    codes = [0] * len(workers)

    def run(i: int) -> None:
        codes[i] = workers[i].run(once=once)

    running = [threading.Thread(target=run, args=(i,), name=w.name) for i, w in enumerate(workers)]
    if not as_json:
        click.echo(
            f"memstore worker: {len(running)} thread(s), model {backend.info.model}, CPU priority {applied}", err=True
        )
    try:
        # Stopping: the batch in hand finishes at full speed (a published share of zero would hold it).
        with stop_on_signals(stop, on_signal=lambda _signum: follower.force(1.0)):
            for t in running:
                t.start()
            while any(t.is_alive() for t in running):
                for t in running:
                    t.join(0.5)
    finally:
        stop.set()
        follower.close()
        close()
    total = Report()
    for w in workers:
        total.add(w.totals)
    return _report(as_json, total, started, max(codes), applied)


def _report(as_json: bool, total: Report, started: float, exit_code: int, cpu_priority: str) -> int:
    summary: dict[str, object] = {
        "claimed": total.claimed,
        "written": total.written,
        "retried": total.retried,
        "failed": total.failed,
        "released": total.released,
        "dropped": total.dropped,
        "seconds": round(time.monotonic() - started, 3),
        "exit_code": exit_code,
        "cpu_priority": cpu_priority,  # what the process ran at (cpu_priority.apply)
    }
    if as_json:
        print_json(summary)
    else:
        click.echo(
            f"memstore worker: wrote {total.written} vectors, {total.failed} failed, {total.retried} to retry", err=True
        )
    return exit_code
