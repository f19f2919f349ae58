"""Progress of a running build or vacuum, read from ``pg_stat_progress_create_index`` and
``pg_stat_progress_vacuum``, and the watchdog that cancels the statement when the worker must stop."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row

from memstore.db import sqlfiles

Kind = Literal["create_index", "vacuum"]


@dataclass(frozen=True)
class Progress:
    label: str  # the target, e.g. "c3_docs" or "docs[p2]"
    kind: Kind
    phase: str
    done: int
    total: int
    finished: bool = False


ProgressCallback = Callable[[Progress], None]


def _figures(kind: Kind, row: dict[str, Any]) -> tuple[int, int]:
    if kind == "create_index":
        # pgvector reports tuples while loading and blocks while scanning; use whichever is moving.
        if row["tuples_total"]:
            return int(row["tuples_done"] or 0), int(row["tuples_total"])
        return int(row["blocks_done"] or 0), int(row["blocks_total"] or 0)
    total = int(row["heap_blks_total"] or 0)
    done = (
        int(row["heap_blks_vacuumed"] or 0) if row["phase"] == "vacuuming heap" else int(row["heap_blks_scanned"] or 0)
    )
    if row["phase"] == "vacuuming indexes" and row["indexes_total"]:
        return int(row["indexes_processed"] or 0), int(row["indexes_total"])
    return done, total


class Watch:
    """While a statement runs on ``conn``: report its progress and cancel it once ``stop`` is set.

    Uses its own connection (``connect``) to read the progress views, so it never touches ``conn``
    except to send a cancel request.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        connect: Callable[[], psycopg.Connection[Any]],
        *,
        kind: Kind,
        label: str,
        stop: threading.Event,
        on_progress: ProgressCallback | None,
        interval_s: float = 0.5,
    ) -> None:
        self.conn, self.connect, self.kind, self.label = conn, connect, kind, label
        self.stop, self.on_progress, self.interval_s = stop, on_progress, interval_s
        self.pid = conn.info.backend_pid
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"maint-watch-{label}", daemon=True)
        self.cancelled = False

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        if self.on_progress:
            self.on_progress(Progress(self.label, self.kind, "done", 1, 1, finished=True))

    def _run(self) -> None:
        monitor: psycopg.Connection[Any] | None = None
        query = sqlfiles.text("progress_create_index" if self.kind == "create_index" else "progress_vacuum")
        try:
            while not self._done.wait(self.interval_s):
                if self.stop.is_set() and not self.cancelled:
                    self.cancelled = True
                    self.conn.cancel_safe()
                if self.on_progress is None:
                    continue
                if monitor is None:
                    monitor = self.connect()
                row = monitor.cursor(row_factory=dict_row).execute(query, {"pid": self.pid}).fetchone()
                if row:
                    done, total = _figures(self.kind, row)
                    self.on_progress(Progress(self.label, self.kind, str(row["phase"]), done, total))
        except psycopg.Error:
            pass  # progress is best effort; the statement itself reports real failures
        finally:
            if monitor is not None:
                monitor.close()
