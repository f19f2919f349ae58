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
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from maintenance.config import MaintenanceConfig
from maintenance.progress import Progress
from maintenance.worker import EXIT_FAILED, EXIT_OK, ActionOutcome, MaintenanceWorker
from memstore.db import get_engine
from memstore.settings import Settings, get_settings

log = logging.getLogger("memstore-maint")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--collection", action="append", help="only this collection (repeatable)")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--database-url", help="overrides MEMSTORE_DATABASE_URL")
    common.add_argument("-v", "--verbose", action="store_true")
    parser = argparse.ArgumentParser(prog="memstore-maint", description="HNSW index maintenance for memstore")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", parents=[common], help="state of every index, without a recall probe")
    sub.add_parser("probe", parents=[common], help="probe every index (with sampled recall) and record it")
    for name, aliases in (("vacuum", []), ("rebuild", ["compact"])):
        what = "VACUUM" if name == "vacuum" else "rebuild concurrently (REINDEX CONCURRENTLY)"
        p = sub.add_parser(name, aliases=aliases, parents=[common], help=f"{what} every selected index now")
        p.add_argument("--partition", type=int, help="only this partition of a partitioned collection")
    run = sub.add_parser("run", parents=[common], help="one pass of the policy")
    run.add_argument("--once", action="store_true", help="one pass, then exit (the default; for cron)")
    daemon = sub.add_parser("daemon", parents=[common], help="a pass every --interval seconds until SIGTERM")
    daemon.add_argument("--interval", type=float, help="seconds between passes (default MEMSTORE_MAINT_INTERVAL_S)")
    hist = sub.add_parser("history", parents=[common], help="recorded actions (or probes)")
    hist.add_argument("--probes", action="store_true")
    hist.add_argument("--limit", type=int, default=50)
    hist.add_argument("--since-hours", type=float)
    report = sub.add_parser("report", parents=[common], help="plot the history")
    report.add_argument("--plot", type=Path, required=True, metavar="FILE.png")
    report.add_argument("--since-hours", type=float)
    sub.add_parser("handback", parents=[common], help="give index cleanup back to autovacuum")
    return parser


class Bars:
    """tqdm progress bars fed from the progress views, one per target and phase kind."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bars: dict[tuple[str, str], Any] = {}

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        key = (p.label, p.kind)
        bar = self.bars.get(key)
        if p.finished:
            if bar is not None:
                bar.close()
                del self.bars[key]
            return
        if bar is None:
            verb = "rebuild" if p.kind == "create_index" else "vacuum"
            bar = self.bars[key] = tqdm(total=max(p.total, 1), desc=f"{verb} {p.label}", file=sys.stderr, leave=False)
        bar.total = max(p.total, 1)
        bar.n = min(p.done, bar.total)
        bar.set_postfix_str(p.phase, refresh=False)
        bar.refresh()


@contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop``: the running statement is cancelled, recorded, and the pass ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        log.warning("signal %d: stopping after cancelling the running statement", signum)
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}GB"


def format_duration(seconds: float) -> str:
    """A duration for people: 3.1 ms, 0.84 s, 12.3 s, 4 min 05 s, 2 h 03 min."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def format_cell(column: str, value: Any) -> str:
    """A table cell: durations (columns ending in _s) in units, other floats to 4 significant digits,
    times to the second."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_duration(value) if column.endswith("_s") else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[format_cell(c, r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _emit(args: argparse.Namespace, payload: Any, table: Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        print(table())


def _status(worker: MaintenanceWorker, args: argparse.Namespace, *, with_recall: bool) -> int:
    from maintenance.probes import parse_json

    rows: list[dict[str, Any]] = []
    with worker.connect() as conn:
        for p, d in worker.probe(with_recall=with_recall, record=with_recall):
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
            rows.append(s)
    columns = [
        "collection",
        "table",
        "live_rows",
        "dead_fraction",
        "index",
        "fresh",
        "ratio",
        "recall",
        "owned",
        "last_action",
        "recommendation",
    ]

    def table() -> str:
        shown = [
            r
            | {
                "index": _fmt_bytes(r["index_bytes"]),
                "fresh": _fmt_bytes(r["fresh_bytes"]),
                "ratio": r["size_ratio"],
                "recall": None if r["last_recall"] is None else round(r["last_recall"], 3),
            }
            for r in rows
        ]
        return _table(shown, columns) if shown else "no collections"

    _emit(args, rows, table)
    return EXIT_OK


def _last_sql() -> str:
    from maintenance import sqlfiles

    return sqlfiles.text("last_clean")


def _outcomes(args: argparse.Namespace, outcomes: list[ActionOutcome]) -> int:
    payload = [o.__dict__ for o in outcomes]
    columns = ["collection", "table", "decision", "outcome", "duration_s", "reason", "error"]
    _emit(args, payload, lambda: _table(payload, columns))
    return EXIT_FAILED if any(o.outcome == "failed" for o in outcomes) else EXIT_OK


def _act(worker: MaintenanceWorker, args: argparse.Namespace, action: str) -> int:
    outcomes: list[ActionOutcome] = []
    with worker.connect() as conn:
        targets = worker.targets(conn)
    partition = getattr(args, "partition", None)
    for target in targets:
        if partition is not None and target.partition != partition:
            continue
        if worker.stop.is_set():
            break
        outcomes.append(worker.act(target, action, reason=f"requested: memstore-maint {args.command}"))
    return _outcomes(args, outcomes)


def _history(worker: MaintenanceWorker, args: argparse.Namespace) -> int:
    from maintenance import history

    since = datetime.now(UTC) - timedelta(hours=args.since_hours) if args.since_hours else None
    collection = args.collection[0] if args.collection and len(args.collection) == 1 else None
    with worker.connect() as conn:
        if args.probes:
            rows = history.list_probes(conn, collection=collection, since=since, limit=args.limit)
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
            rows = history.list_actions(conn, collection=collection, since=since, limit=args.limit)
            columns = ["started_at", "collection", "partition_table", "action", "outcome", "duration_s", "reason"]
    if args.collection:
        rows = [r for r in rows if r["collection"] in args.collection]
    _emit(args, rows, lambda: _table(rows, columns) if rows else "no history")
    return EXIT_OK


def _report(worker: MaintenanceWorker, args: argparse.Namespace) -> int:
    from maintenance import history
    from maintenance.report import plot_history

    since = datetime.now(UTC) - timedelta(hours=args.since_hours) if args.since_hours else None
    collection = args.collection[0] if args.collection and len(args.collection) == 1 else None
    with worker.connect() as conn:
        probes = history.list_probes(conn, collection=collection, since=since, limit=100_000)
        actions = history.list_actions(conn, collection=collection, since=since, limit=10_000)
    if not probes:
        print("no probes recorded yet: run `memstore-maint probe` or `run --once` first", file=sys.stderr)
        return EXIT_FAILED
    path = plot_history(probes, actions, args.plot)
    _emit(args, {"plot": str(path), "probes": len(probes), "actions": len(actions)}, lambda: f"wrote {path}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "compact":
        print(
            "memstore-maint: 'compact' is now called 'rebuild'; the old name goes in the next release", file=sys.stderr
        )
        args.command = "rebuild"
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "daemon" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    settings: Settings = get_settings()
    if args.database_url:
        settings = settings.model_copy(update={"database_url": args.database_url})
    config = MaintenanceConfig()
    if getattr(args, "interval", None):
        config = config.model_copy(update={"interval_s": args.interval})
    try:
        engine = get_engine(settings)
        bars = Bars(enabled=not args.json and sys.stderr.isatty())
        worker = MaintenanceWorker(
            engine, settings=settings, config=config, collections=args.collection, on_progress=bars
        )
        with _signals(worker.stop):
            if args.command in ("status", "probe"):
                return _status(worker, args, with_recall=args.command == "probe")
            if args.command in ("vacuum", "rebuild"):
                return _act(worker, args, args.command)
            if args.command == "handback":
                return _act(worker, args, "hand_back")
            if args.command == "run":
                code = worker.run_once()
                return max(code, _outcomes(args, worker.last_outcomes))
            if args.command == "daemon":
                return worker.run_forever()
            if args.command == "history":
                return _history(worker, args)
            if args.command == "report":
                return _report(worker, args)
    except LookupError as exc:
        print(f"memstore-maint: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:  # cron wants a short line and a non-zero exit, not a traceback
        log.debug("failed", exc_info=True)
        print(f"memstore-maint: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
