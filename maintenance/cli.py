"""``memstore-maint``: the maintenance worker from cron or as a daemon.

memstore-maint status [--json] [--collection NAME]     a table per collection and partition
memstore-maint probe [--json]                           probe (with sampled recall) and record
memstore-maint vacuum|rebuild [--partition N]           one action now, on every selected index
                                                        (``compact``: the old name of rebuild, kept for a release)
memstore-maint run --once [--json]                      one policy pass (exit 1 when anything failed)
memstore-maint daemon [--interval S]                    passes until SIGTERM/SIGINT
memstore-maint history [--json] [--probes] [--limit N]  the recorded actions (or probes)
memstore-maint report --plot FILE.png                   recall, dead fraction, size over time
memstore-maint handback                                 give index cleanup back to autovacuum

Every subcommand takes --collection (repeatable), --json, --database-url and -v after its name.

Exit codes of vacuum, rebuild and handback: 0 done; 1 failed; 2 usage error; 3 skipped (another worker
holds the index, or searches stayed over the latency SLO: try later); 4 interrupted (SIGTERM or SIGINT
cancelled it). The worst of them where several indexes were selected (1, then 4, then 3); a rebuild
whose VACUUM after it did not run counts as that VACUUM's outcome.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import psycopg

from encoder.cli_support import CONTEXT_SETTINGS, emit, json_option, print_json, run, stop_on_signals
from maintenance.actions import index_density
from maintenance.config import MaintenanceConfig
from maintenance.display import Bars, fmt_bytes, table
from maintenance.targets import Target
from maintenance.worker import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SKIPPED,
    ActionOutcome,
    MaintenanceWorker,
    exit_code,
)
from memstore.catalog import density
from memstore.catalog.collections import Collection
from memstore.db.core import get_database
from memstore.services.foreground_signal import ForegroundFollower
from memstore.settings import Settings, get_settings

log = logging.getLogger("memstore-maint")

# --since-hours: a window of 0 hours or less holds nothing, so it is refused rather than run.
HOURS = click.FloatRange(min=0, min_open=True)


@dataclass(frozen=True)
class Common:
    """The options every subcommand takes."""

    collections: list[str] | None  # None: every collection
    as_json: bool
    database_url: str | None
    verbose: bool


def common_options(command: Callable[..., int]) -> Callable[..., int]:
    """Add the options every subcommand takes and hand them to ``command`` as one :class:`Common`."""

    @click.option(
        "--collection", "collections", multiple=True, metavar="NAME", help="only this collection (repeatable)"
    )
    @json_option("print JSON instead of a table")
    @click.option("--database-url", metavar="URL", help="overrides MEMSTORE_DATABASE_URL")
    @click.option("-v", "--verbose", is_flag=True, help="log more")
    @functools.wraps(command)
    def with_common(
        collections: tuple[str, ...], as_json: bool, database_url: str | None, verbose: bool, **options: Any
    ) -> int:
        return command(Common(list(collections) or None, as_json, database_url, verbose), **options)

    return with_common


@click.group(context_settings=CONTEXT_SETTINGS)
def cli() -> None:
    """HNSW index maintenance for memstore."""


def _run(
    common: Common,
    body: Callable[[MaintenanceWorker], int],
    *,
    daemon: bool = False,
    interval: float | None = None,
    follow: bool = False,
) -> int:
    """Set up logging, the settings and the worker, then run ``body`` with SIGTERM/SIGINT stopping it
    (the running statement is cancelled and recorded, and the pass ends). ``follow``: the passes wait
    while the search servers' published search p99 is over the SLO (``memstore.services.foreground_signal``;
    this process answers no searches of its own)."""
    logging.basicConfig(
        level=logging.INFO if common.verbose or daemon else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings: Settings = get_settings()
    if common.database_url:
        settings = settings.model_copy(update={"database_url": common.database_url})
    config = MaintenanceConfig()
    if interval:
        config = config.model_copy(update={"interval_s": interval})
    db = get_database(settings, replicas=False)  # the primary: what maintenance acts on and measures
    bars = Bars(enabled=not common.as_json and sys.stderr.isatty())
    follower = ForegroundFollower.for_process(db, settings).start() if follow and settings.foreground_shared else None
    worker = MaintenanceWorker(
        db,
        settings=settings,
        config=config,
        collections=common.collections,
        on_progress=bars,
        latency_source=None if follower is None else follower.latency_p99_ms,
        pace=follower,
    )
    try:
        with stop_on_signals(worker.stop, on_signal=_announce_stop):
            return body(worker)
    finally:
        if follower is not None:
            follower.close()


def _announce_stop(signum: int) -> None:
    log.warning("signal %d: stopping after cancelling the running statement", signum)


@cli.command(short_help="state of every index, without a recall probe")
@common_options
def status(common: Common) -> int:
    """Show the state of every index (size, dead rows, last action, recommendation) without probing recall.

    \b
    Columns: live_rows; dead_fraction, dead index entries per live row (above 1 once more rows died
    than live); index and fresh, the index's bytes and those of a fresh build of the live rows, and
    their ratio; recall, the last probe's; owned, whether this worker cleans the index (its
    vacuum_index_cleanup is off) rather than autovacuum; last_action and the recommendation."""
    return _run(common, lambda worker: _status(worker, common, with_recall=False))


@cli.command(short_help="probe every index (with sampled recall) and record it")
@common_options
def probe(common: Common) -> int:
    """Probe every index, with sampled recall, and record the probe."""
    return _run(common, lambda worker: _status(worker, common, with_recall=True))


def _index_action(
    name: str, action: str, summary: str, details: str, *, old_name_of: str | None = None
) -> click.Command:
    """``vacuum`` and ``rebuild``; ``old_name_of`` makes a command under a former name, hidden from the
    help, that says so on stderr and does the same."""

    @click.command(name, short_help=summary, help=details, hidden=old_name_of is not None)
    @click.option("--partition", type=int, metavar="N", help="only this partition of a partitioned collection")
    @common_options
    def command(common: Common, partition: int | None) -> int:
        if old_name_of:
            click.echo(
                f"memstore-maint: '{name}' is now called '{old_name_of}'; the old name goes in the next release",
                err=True,
            )
        requested = old_name_of or name
        return _run(common, lambda worker: _act(worker, common, action, requested=requested, partition=partition))

    return command


EXIT_CODES = (
    "\n\n\b\nExit codes: 0 done; 1 failed; 2 usage error; 3 skipped (another worker holds the index, or\n"
    "searches stayed over the latency SLO: try later); 4 interrupted (SIGTERM or SIGINT cancelled it).\n"
    "With several indexes, the worst (1, then 4, then 3)."
)
REBUILD_DETAILS = (
    "Rebuild every selected index now: REINDEX INDEX CONCURRENTLY (searches and writes go on meanwhile), then "
    "VACUUM (its outcome is the rebuild's follow_up; one not done sets the exit code)." + EXIT_CODES
)
cli.add_command(
    _index_action(
        "vacuum", "vacuum", "VACUUM every selected index now", "VACUUM every selected index now." + EXIT_CODES
    )
)
cli.add_command(_index_action("rebuild", "rebuild", "rebuild every selected index concurrently", REBUILD_DETAILS))
cli.add_command(
    _index_action(
        "compact",
        "rebuild",
        "the old name of rebuild",
        "The old name of rebuild, kept for a release. " + REBUILD_DETAILS,
        old_name_of="rebuild",
    )
)


@cli.command("run", short_help="one pass of the policy")
# A pass, then exit, is all `run` does: --once is accepted for the cron lines that spell it out.
@click.option("--once", is_flag=True, expose_value=False, help="one pass, then exit (the default; for cron)")
@common_options
def run_command(common: Common) -> int:
    """One pass of the policy: probe every index, act where it says so, print what was done. Exits 1
    when any action failed."""

    def one_pass(worker: MaintenanceWorker) -> int:
        errors = _LoggedErrors()
        worker_log = logging.getLogger("maintenance.worker")
        worker_log.addHandler(errors)
        try:
            code = worker.run_once()
        finally:
            worker_log.removeHandler(errors)
        if common.as_json and code != EXIT_OK and not worker.last_outcomes:
            # A pass that failed before it started has no outcome to carry the error, and `[]` would
            # read as a pass with nothing to do in a JSON Lines log.
            print_json({"error": "; ".join(errors.messages) or "the maintenance pass failed"})
            return code
        return max(code, _outcomes(common, worker.last_outcomes))

    return _run(common, one_pass, follow=True)


class _LoggedErrors(logging.Handler):
    """The error lines the worker logs during a pass (it keeps no exception of its own)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@cli.command(short_help="a pass every --interval seconds until SIGTERM")
@click.option("--interval", type=float, metavar="S", help="seconds between passes (default MEMSTORE_MAINT_INTERVAL_S)")
@common_options
def daemon(common: Common, interval: float | None) -> int:
    """Run a pass of the policy every --interval seconds until SIGTERM or SIGINT."""
    return _run(common, lambda worker: worker.run_forever(), daemon=True, interval=interval, follow=True)


@cli.command(short_help="recorded actions (or probes)")
@click.option("--probes", is_flag=True, help="list the recorded probes instead of the actions")
@click.option("--limit", type=click.IntRange(min=1), default=50, metavar="N", help="the most rows shown")
@click.option("--since-hours", type=HOURS, metavar="H", help="only the last H hours")
@common_options
def history(common: Common, probes: bool, limit: int, since_hours: float | None) -> int:
    """List the recorded actions (what was done, why, how long), or with --probes the probes."""
    return _run(common, lambda worker: _history(worker, common, probes=probes, limit=limit, since_hours=since_hours))


@cli.command(short_help="plot the history")
@click.option("--plot", type=click.Path(path_type=Path), required=True, metavar="FILE.png", help="where to write it")
@click.option("--since-hours", type=HOURS, metavar="H", help="only the last H hours")
@common_options
def report(common: Common, plot: Path, since_hours: float | None) -> int:
    """Plot recall, dead fraction and index size over time, with the actions marked."""
    return _run(common, lambda worker: _report(worker, common, plot=plot, since_hours=since_hours))


@cli.command(short_help="give index cleanup back to autovacuum")
@common_options
def handback(common: Common) -> int:
    """Give index cleanup back to autovacuum (do this if you stop running the maintenance worker).

    \b
    Exit codes: 0 done; 1 failed; 2 usage error; 3 skipped (another worker holds the index: try
    later); 4 interrupted (SIGTERM or SIGINT cancelled it). With several indexes, the worst (1, then
    4, then 3)."""
    return _run(common, lambda worker: _act(worker, common, "hand_back", requested="handback"))


def _status(worker: MaintenanceWorker, common: Common, *, with_recall: bool) -> int:
    from maintenance.probes import parse_json

    rows: list[dict[str, Any]] = []
    worst: dict[str, float] = {}  # the lowest fresh recall per collection (a target per partition or space)
    with worker.connect() as conn:
        collections = {c.name: c for c in worker.list_collections(conn)}
        for p, d in worker.probe(with_recall=with_recall, record=with_recall):
            if p.fresh_recall is not None:
                worst[p.collection] = min(p.fresh_recall, worst.get(p.collection, 1.0))
            last = conn.execute(
                "SELECT last_recall, last_action FROM (" + _last_sql() + ") AS x", {"table": p.table}
            ).fetchone()
            last_recall, last_action = (parse_json(last[0]), parse_json(last[1])) if last else (None, None)
            s = p.summary()
            s.update(
                recommendation=d.label,
                reason=d.reason,
                last_recall=(last_recall or {}).get("recall") if not with_recall else p.recall_value,
                last_action=None if not last_action else f"{last_action['action']} {last_action['outcome']}",
            )
            c = collections.get(p.collection)
            if c is not None:
                s.update(ef_search=c.default_ef_search, recall_target=c.recall_target, tuning=c.recall_tuning)
                built = index_density(conn, p.index) if p.index and p.table.startswith(c.table_name) else None
                s.update(graph=density.describe(c, built))
            rows.append(s)
        note = buffer_cache_note(conn)
    floor = worker.config.recall_floor
    notes = [n for c, r in worst.items() if (n := sparse_graph_note(c, r, floor))]
    notes += [n for c in collections.values() if (n := recall_target_note(c.name, c.recall_target, c.recall_tuning))]
    notes += [n for c in collections.values() if (n := graph_note(c))]
    if note:
        notes.append(note)
    columns = [
        "collection",
        "table",
        "live_rows",
        "dead_fraction",
        "index",
        "fresh",
        "ratio",
        "recall",
        "ef_search",
        "target",
        "graph",
        "owned",
        "last_action",
        "recommendation",
    ]

    def shown() -> str:
        cells = [
            r
            | {
                "index": fmt_bytes(r["index_bytes"]),
                "fresh": fmt_bytes(r["fresh_bytes"]),
                "ratio": r["size_ratio"],
                "recall": None if r["last_recall"] is None else round(r["last_recall"], 3),
                "target": target_cell(r.get("recall_target"), r.get("tuning")),
                "graph": density.cell(r["graph"]) if r.get("graph") else None,
            }
            for r in rows
        ]
        return table(cells, columns) if cells else "no collections"

    emit(common.as_json, rows, shown)
    for line in notes:
        click.echo(line, err=True)  # stderr: the JSON on stdout stays one document
    return EXIT_OK


def sparse_graph_note(collection: str, fresh_recall: float | None, floor: float) -> str | None:
    """A line of advice when even a fresh build of a collection's index stays under the recall floor:
    rebuilding cannot help (the policy does not loop on it), a deeper search or a denser graph can
    (a million clustered rows needed ef_construction 128 and m 32: docs/scale.md)."""
    if fresh_recall is None or fresh_recall >= floor:
        return None
    return (
        f"memstore-maint: {collection}: a fresh build of its index reached recall {fresh_recall:.3f}, under the "
        f"floor {floor:.2f}, so no rebuild will do better. Raise the collection's ef_search, or build a denser "
        'graph (hnsw_ef_construction, hnsw_m; docs/scale.md, "What the rows ask of any HNSW graph").'
    )


def graph_note(c: Collection) -> str | None:
    """A line on the graph when its density changes at the next rebuild, or when the user's graph
    costs the target more than the bound (what a denser one would need instead)."""
    info = density.describe(c)
    nxt = info["next_rebuild"]
    if isinstance(nxt, dict):
        return (
            f"memstore-maint: {c.name}: the next rebuild builds a denser graph (m {nxt['m']}, ef_construction "
            f"{nxt['ef_construction']}): {info['why']}."
        )
    if info["source"] == "user" and info["why"]:
        return (
            f"memstore-maint: {c.name}: {info['why']} (m {c.hnsw_m}, ef_construction {c.hnsw_ef_construction}); "
            f"a denser graph (m {density.DENSE_M}, ef_construction {density.DENSE_EF_CONSTRUCTION}) needs about "
            f"ef_search {density.DENSE_EF_BOUND} at a million rows (docs/scale.md)."
        )
    return None


def target_cell(target: float | None, tuning: dict[str, Any] | None) -> str | None:
    """The recall target as the status table shows it: 0.95 (not tuned yet), 0.95 ok, 0.95 UNREACHABLE."""
    if target is None:
        return None
    if tuning is None or tuning.get("target") != target:
        return f"{target:g} (not tuned yet)"
    return f"{target:g} {'ok' if tuning.get('reachable') else 'UNREACHABLE'}"


def recall_target_note(collection: str, target: float | None, tuning: dict[str, Any] | None) -> str | None:
    """A line of advice when the last tuning could not reach the collection's recall target."""
    if target is None or tuning is None or tuning.get("target") != target or tuning.get("reachable"):
        return None
    if tuning.get("sample_limited"):
        return (
            f"memstore-maint: {collection}: recall target {target:g} not shown reached at ef_search {tuning.get('ef')} "
            f"(recall {tuning.get('recall')}): the sample was too small to tell (MEMSTORE_MAINT_TUNE_SAMPLE)."
        )
    return (
        f"memstore-maint: {collection}: recall target {target:g} not reachable with this graph: recall "
        f"{tuning.get('recall')} at ef_search {tuning.get('ef')}, the most tried. Build a denser graph "
        '(hnsw_m, hnsw_ef_construction; docs/scale.md, "What the rows ask of any HNSW graph") or lower the target.'
    )


def buffer_cache_note(conn: psycopg.Connection[Any]) -> str | None:
    """A line of advice when the database's HNSW indexes, together, outgrow the server's buffer cache:
    past it, every search reads graph pages through the kernel's cache (about twice the time a search,
    docs/scale.md)."""
    from memstore.db import sqlfiles

    row = conn.execute(sqlfiles.text("buffer_cache")).fetchone()
    hnsw_bytes, buffer_bytes = (int(row[0]), int(row[1])) if row else (0, 0)
    if not buffer_bytes or hnsw_bytes <= buffer_bytes:
        return None
    return (
        f"memstore-maint: the HNSW indexes take {fmt_bytes(hnsw_bytes)}, more than the server's shared_buffers "
        f"({fmt_bytes(buffer_bytes)}): searches read graph pages through the kernel's cache. Raise "
        "shared_buffers (the embedded server: MEMSTORE_EMBEDDED_SHARED_BUFFERS); see the README, "
        '"Tuning for HNSW".'
    )


def _last_sql() -> str:
    from memstore.db import sqlfiles

    return sqlfiles.text("last_clean")


def _outcomes(common: Common, outcomes: list[ActionOutcome]) -> int:
    """Print the outcomes; EXIT_FAILED when any failed (a pass's code: a skip there is no failure)."""
    payload = [o.__dict__ for o in outcomes]
    columns = ["collection", "table", "decision", "outcome", "duration_s", "reason", "error"]
    emit(common.as_json, payload, lambda: table(payload, columns))
    return EXIT_FAILED if any(o.state == "failed" for o in outcomes) else EXIT_OK


def _act(
    worker: MaintenanceWorker, common: Common, action: str, *, requested: str, partition: int | None = None
) -> int:
    """The action on every selected target: the exit code says whether all of it was done (``exit_code``)."""
    outcomes: list[ActionOutcome] = []
    with worker.connect() as conn:
        targets = worker.targets(conn)
    if partition is not None:
        _check_partition(targets, partition)
    stopped = False
    for target in targets:
        if partition is not None and target.partition != partition:
            continue
        if worker.stop.is_set():
            stopped = True  # the targets left were not acted on
            break
        outcomes.append(worker.act(target, action, reason=f"requested: memstore-maint {requested}"))
    _outcomes(common, outcomes)
    code = exit_code(outcomes)
    return EXIT_INTERRUPTED if stopped and code in (EXIT_OK, EXIT_SKIPPED) else code


def _check_partition(targets: Sequence[Target], partition: int) -> None:
    """Refuse a partition none of the selected collections has: acting on nothing reads as success."""
    counts = {t.collection.name: len(t.collection.partition_tables()) for t in targets if t.partition is not None}
    if any(0 <= partition < n for n in counts.values()):
        return
    names = sorted({t.collection.name for t in targets})
    if counts:
        ranges = ", ".join(f"{name} has partitions 0 to {n - 1}" for name, n in sorted(counts.items()))
        message = f"no partition {partition}: {ranges}"
    elif len(names) == 1:
        message = f"collection {names[0]} is not partitioned"
    else:
        message = "none of the collections is partitioned"
    raise click.BadParameter(message, ctx=click.get_current_context(silent=True), param_hint="'--partition'")


def _since(hours: float | None) -> datetime | None:
    return None if hours is None else datetime.now(UTC) - timedelta(hours=hours)


def _one_collection(common: Common) -> str | None:
    """The collection the history query can filter on in SQL: only when exactly one is asked for."""
    return common.collections[0] if common.collections and len(common.collections) == 1 else None


def _history(worker: MaintenanceWorker, common: Common, *, probes: bool, limit: int, since_hours: float | None) -> int:
    from maintenance import history

    since, collection = _since(since_hours), _one_collection(common)
    with worker.connect() as conn:
        if probes:
            rows = history.list_probes(conn, collection=collection, since=since, limit=limit)
            columns = [
                "taken_at",
                "collection",
                "partition_table",
                "live_rows",
                "dead_rows",
                "index_bytes",
                "fresh_index_bytes",
                "recall",
                "recommendation",
            ]
        else:
            rows = history.list_actions(conn, collection=collection, since=since, limit=limit)
            columns = ["started_at", "collection", "partition_table", "action", "outcome", "duration_s", "reason"]
    if common.collections:
        rows = [r for r in rows if r["collection"] in common.collections]
    emit(common.as_json, rows, lambda: table(rows, columns) if rows else "no history")
    return EXIT_OK


def _report(worker: MaintenanceWorker, common: Common, *, plot: Path, since_hours: float | None) -> int:
    from maintenance import history
    from maintenance.report import plot_history

    since, collection = _since(since_hours), _one_collection(common)
    with worker.connect() as conn:
        probes = history.list_probes(conn, collection=collection, since=since, limit=100_000)
        actions = history.list_actions(conn, collection=collection, since=since, limit=10_000)
    if not probes:
        click.echo("no probes recorded yet: run `memstore-maint probe` or `run --once` first", err=True)
        return EXIT_FAILED
    path = plot_history(probes, actions, plot)
    emit(common.as_json, {"plot": str(path), "probes": len(probes), "actions": len(actions)}, lambda: f"wrote {path}")
    return EXIT_OK


def report_error(exc: Exception) -> int:
    """Cron wants a short line and a non-zero exit, not a traceback (logged at debug level)."""
    if isinstance(exc, LookupError):
        click.echo(f"memstore-maint: {exc}", err=True)
    else:
        log.debug("failed", exc_info=exc)
        click.echo(f"memstore-maint: {type(exc).__name__}: {exc}", err=True)
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    return run(cli, argv, prog="memstore-maint", on_error=report_error)


if __name__ == "__main__":
    raise SystemExit(main())
