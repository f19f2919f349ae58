"""Maintenance statements, run safely online.

Every statement runs on an autocommit connection of its own with ``lock_timeout`` (so no reader or
writer waits behind it for longer than that), is retried on lock timeouts, and is cancelled when the
worker is asked to stop. The ``CONCURRENTLY`` ones run under a long lock timeout (five minutes a
wait): they block no reader or writer, and a short one failed a finished build whenever a
transaction stayed open a few seconds (``memstore.db.online_ddl``). One worker per index: the
caller holds a session advisory lock on the index's name while acting. A failed or cancelled
``REINDEX ... CONCURRENTLY`` leaves an INVALID index behind; it is dropped at once, and any found
later is dropped before anything else is done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
from psycopg import sql
from tenacity import RetryCallState

from maintenance.config import MaintenanceConfig
from maintenance.progress import Kind, ProgressCallback, Watch
from maintenance.targets import Target, leftovers_of
from memstore.catalog.density import Density
from memstore.db import locks, online_ddl, retrying
from memstore.db.retrying import attempt_number, next_pause

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """The worker was asked to stop while a statement ran; the statement was cancelled."""


class Busy(Exception):
    """Another worker holds the index, or the foreground is over its latency SLO: try later."""


class Executor:
    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        config: MaintenanceConfig,
        *,
        stop: threading.Event,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.connect = connect
        self.config = config
        self.stop = stop
        self.on_progress = on_progress

    # ------------------------------------------------------------------ locking

    @contextlib.contextmanager
    def index_lock(self, conn: psycopg.Connection[Any], target: Target) -> Iterator[None]:
        """Hold the index's advisory lock (session level) or raise Busy; released on exit."""
        busy = partial(Busy, f"another worker is maintaining {target.index or target.table}")
        with locks.session_lock(conn, target.lock_key, busy=busy):
            yield

    # ------------------------------------------------------------------ statements

    def execute(
        self,
        conn: psycopg.Connection[Any],
        statement: sql.Composed,
        *,
        label: str,
        kind: Kind | None = None,
        before_retry: Callable[[], object] | None = None,
        concurrently: bool = False,
    ) -> None:
        """Run one statement with the lock timeout, retrying lock timeouts with a growing pause
        (``ddl_retries`` retries, from ``retry_backoff_s``); a stop request ends the wait.
        ``concurrently``: a ``CONCURRENTLY`` statement, run under the long lock timeout of
        ``online_ddl.concurrent_lock_timeout`` (its waits for older transactions are lock waits, and
        it blocks no reader or writer) and cancelled by a stop request."""

        def pause(seconds: float) -> None:
            if self.stop.wait(seconds):
                raise Interrupted(f"stopped while retrying {label}")

        def before_sleep(state: RetryCallState) -> None:
            log.info("%s: lock timeout, retry %d in %.1fs", label, attempt_number(state), next_pause(state))
            if before_retry:
                before_retry()

        strategy = retrying.lock_timeouts(
            attempts=self.config.ddl_retries + 1,
            first_s=self.config.retry_backoff_s,
            sleep=pause,
            before_sleep=before_sleep,
        )
        guard: contextlib.AbstractContextManager[None] = (
            online_ddl.concurrent_lock_timeout(conn) if concurrently else contextlib.nullcontext()
        )
        with guard:
            for attempt in strategy:
                with attempt:
                    if self.stop.is_set():
                        raise Interrupted(f"stopped before {label}")
                    if kind is None and not concurrently:
                        conn.execute(statement)
                    else:
                        self._watched(conn, statement, label=label, kind=kind)

    def _watched(
        self, conn: psycopg.Connection[Any], statement: sql.Composed, *, label: str, kind: Kind | None
    ) -> None:
        """The statement with its progress reported (``kind``; None: none to report); a stop request
        cancels it (Interrupted)."""
        with Watch(
            conn,
            self.connect,
            kind=kind or "create_index",
            label=label,
            stop=self.stop,
            on_progress=self.on_progress if kind is not None else None,
        ) as watch:
            try:
                conn.execute(statement)
            except psycopg.errors.QueryCanceled:
                if watch.cancelled:
                    raise Interrupted(f"cancelled {label}") from None
                raise

    def drop_leftovers(self, conn: psycopg.Connection[Any], target: Target, *, bounded: bool = False) -> list[str]:
        """Drop INVALID indexes of the target's table, unless a build is running there right now.

        The caller holds the index's advisory lock, so no other memstore worker is rebuilding it; the
        progress check protects a build someone started by hand. ``bounded``: under the lock timeout
        (after a failure, where no stop request may cancel the wait: the next pass drops what is
        left); otherwise as long as older transactions keep the drop waiting, cancelled by a stop.
        """
        dropped: list[str] = []
        for leftover in leftovers_of(conn, target.table):
            if leftover.build_running:
                log.warning(
                    "%s: %s is INVALID but a build is running on the table; left alone", target.label, leftover.name
                )
                continue
            self.execute(
                conn,
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(leftover.name)),
                label=f"drop {leftover.name}",
                concurrently=not bounded,
            )
            dropped.append(leftover.name)
        return dropped

    def vacuum(self, conn: psycopg.Connection[Any], target: Target, *, index_cleanup: bool = True) -> None:
        # INDEX_CLEANUP ON overrides the table's vacuum_index_cleanup = off: this is the worker's cleaning.
        option = sql.SQL("ON" if index_cleanup else "OFF")
        self.execute(
            conn,
            sql.SQL("VACUUM (INDEX_CLEANUP {}) {}").format(option, sql.Identifier(target.table)),
            label=target.label,
            kind="vacuum",
        )

    def rebuild(self, conn: psycopg.Connection[Any], target: Target, *, density: Density | None = None) -> None:
        """REINDEX INDEX CONCURRENTLY: readers and writers go on; a failure leaves ``*_ccnew`` behind,
        dropped at once (and before any retry). ``density``: the graph to build instead of the
        index's own. Set on the index first (a catalog change under a brief lock: inserts and searches
        read m from the graph's own metapage, so the old graph works on until its copy takes its
        place); REINDEX CONCURRENTLY builds its copy with the index's options. When the copy never
        took the index's place, the options it had are set back: left on the old graph, they would
        say it was built denser than it is."""
        assert target.index is not None
        restore: tuple[int | None, dict[str, str]] | None = None
        if density is not None:
            restore = (index_oid(conn, target.index), reloptions(conn, target.index) or {})
            self.execute(
                conn,
                sql.SQL("ALTER INDEX {} SET (m = {}, ef_construction = {})").format(
                    sql.Identifier(target.index), sql.Literal(density.m), sql.Literal(density.ef_construction)
                ),
                label=f"{target.label}: graph {density}",
            )
        statement = sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(target.index))
        try:
            self.execute(
                conn,
                statement,
                label=target.label,
                kind="create_index",
                before_retry=lambda: self.drop_leftovers(conn, target),
                concurrently=True,
            )
        except BaseException:
            self._cleanup_after_failure(target, restore)
            raise

    def _cleanup_after_failure(self, target: Target, restore: tuple[int | None, dict[str, str]] | None = None) -> None:
        """Drop what an interrupted rebuild left, on a fresh connection (the old one may be cancelled),
        and set back the options ``restore`` holds (the index's oid then, and its options)."""
        stop, self.stop = self.stop, threading.Event()  # the cleanup must run even while stopping
        try:
            with self.connect() as conn:
                try:
                    self.drop_leftovers(conn, target, bounded=True)
                except Exception as exc:  # the next pass drops it; never hide the original error
                    log.warning("%s: could not drop leftovers yet: %s", target.label, exc)
                if restore is not None:
                    self._restore_options(conn, target, *restore)
        except Exception as exc:  # never hide the original error
            log.error("%s: could not clean up after the failed rebuild: %s", target.label, exc)
        finally:
            self.stop = stop

    def _restore_options(
        self, conn: psycopg.Connection[Any], target: Target, oid: int | None, options: dict[str, str]
    ) -> None:
        assert target.index is not None
        if index_oid(conn, target.index) != oid:
            return  # the copy took the index's place: the graph is the one its options name
        index = sql.Identifier(target.index)
        kept = [(k, options[k]) for k in GRAPH_OPTIONS if k in options]
        unset = [k for k in GRAPH_OPTIONS if k not in options]
        if unset:
            names = sql.SQL(", ").join(sql.SQL(k) for k in unset)
            self.execute(
                conn, sql.SQL("ALTER INDEX {} RESET ({})").format(index, names), label=f"{target.label}: reset"
            )
        if kept:
            values = sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(int(v))) for k, v in kept)
            self.execute(conn, sql.SQL("ALTER INDEX {} SET ({})").format(index, values), label=f"{target.label}: reset")
        log.warning(
            "%s: the rebuild failed; the index's graph options are back to %s", target.label, options or "unset"
        )

    def own_index_cleanup(self, conn: psycopg.Connection[Any], target: Target, *, own: bool = True) -> None:
        """Take index cleanup from autovacuum (``vacuum_index_cleanup = off``) or hand it back."""
        table = sql.Identifier(target.table)
        statement = (
            sql.SQL("ALTER TABLE {} SET (vacuum_index_cleanup = off)").format(table)
            if own
            else sql.SQL("ALTER TABLE {} RESET (vacuum_index_cleanup)").format(table)
        )
        self.execute(conn, statement, label=f"{'own' if own else 'hand back'} index cleanup of {target.label}")


def wait_for_slo(
    latency_ms: Callable[[], float | None], config: MaintenanceConfig, stop: threading.Event
) -> float | None:
    """Wait (doubling pauses) while foreground search latency is over the SLO; Busy after the max wait."""
    deadline = time.monotonic() + config.slo_max_wait_s
    pause = 1.0
    while True:
        current = latency_ms()
        if current is None or current <= config.slo_p99_ms:
            return current
        if time.monotonic() + pause > deadline:
            raise Busy(f"search latency {current:.0f} ms over the {config.slo_p99_ms:.0f} ms SLO")
        log.info("search latency %.0f ms over SLO; waiting %.0fs", current, pause)
        if stop.wait(pause):
            raise Interrupted("stopped while waiting for latency to recover")
        pause = min(pause * 2, 30.0)


GRAPH_OPTIONS = ("m", "ef_construction")


def reloptions(conn: psycopg.Connection[Any], index: str) -> dict[str, str] | None:
    """An index's storage options as set (None: no such index)."""
    row = conn.execute(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass(%s)",
        (sql.Identifier(index).as_string(conn),),
    ).fetchone()
    if row is None:
        return None
    return dict(o.split("=", 1) for o in row[0])


def index_oid(conn: psycopg.Connection[Any], index: str) -> int | None:
    """The index's oid (None: no such index): a concurrent rebuild that swapped gives the name another."""
    row = conn.execute("SELECT to_regclass(%s)::oid", (sql.Identifier(index).as_string(conn),)).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def index_density(conn: psycopg.Connection[Any], index: str) -> Density | None:
    """The (m, ef_construction) an HNSW index's options name (pgvector's defaults where unset)."""
    options = reloptions(conn, index)
    if options is None:
        return None
    return Density(int(options.get("m", 16)), int(options.get("ef_construction", 64)))
