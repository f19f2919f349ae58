"""Foreground first across processes: the search servers' shares, published in the database and
followed by background work that runs where no search is answered.

In the production layout (compose.yaml) the API answers searches and runs no background work, while
``memstore worker`` processes embed, re-embed and read text and the maintenance daemon vacuums and
rebuilds, all on the same database and often the same machine. A controller sees only the searches
of its own process, so there:

- each process that answers searches publishes its controller's share (``SharePublisher``): a row of
  the UNLOGGED table ``memstore_foreground`` (``sql/foreground_publish.sql``), rewritten when the share
  changes and at least once a window (a heartbeat), deleted when the process stops;
- a process without searches runs a ``ForegroundFollower``: a controller whose share is the lowest
  fresh one published (``sql/foreground_follow.sql``), read every tick, so its workers hold back,
  space out and narrow their connections exactly as the search server's own would. A row older than
  ``fresh_s`` (a crashed or stopped server) counts for nothing; with none fresh the share is 1;
- a follower that did work writes so (a ``background`` row, at most once a window,
  ``sql/foreground_worked.sql``), and a publisher's write reads the latest of those: a search server
  whose target is a multiple of its idle p99 must not take windows in which work ran elsewhere for
  idle ones (its baseline, and so its target, would creep up with the background's load).

Why the database and not a socket or a file: every process already holds a connection to it, it is
the one thing they all share wherever they run, and a one-row write a second is nothing to it. What
a follower on another machine gives up while searches are slow is throughput, not correctness; when
its work does not compete with the searches at all, ``MEMSTORE_FOREGROUND_SHARED=false`` turns it off.
Publishing and reading never raise into their callers: a failed round trip is logged (once a minute
at most) and the follower falls back to full speed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from memstore.db import sqlfiles
from memstore.db.core import Database
from memstore.services.foreground import Decision, ForegroundController
from memstore.settings import Settings

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0  # a failing round trip is logged at most this often
RETRY_S = 5.0  # after a failure, no new connection is tried for this long (ticks must not stall on it)
FRESH_WINDOWS = 5  # a published share counts for this many windows (at least MIN_FRESH_S)
MIN_FRESH_S = 3.0


def source_name() -> str:
    """This process, as its row names it: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def fresh_s(window_s: float) -> float:
    return max(MIN_FRESH_S, FRESH_WINDOWS * window_s)


@dataclass
class _Link:
    """One dedicated autocommit connection, opened on first use and again after a failure."""

    db: Database
    application_name: str
    conn: psycopg.Connection[Any] | None = None
    failed_at: float = -LOG_EVERY_S
    logged_at: float = -LOG_EVERY_S
    failures: int = 0
    ok: bool = False  # the last statement ran

    def execute(self, statement: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """One statement; its first row, or None when it returned none or failed (logged, rate-limited)."""
        self.ok = False
        try:
            if self.conn is None or self.conn.closed:
                if time.monotonic() - self.failed_at < RETRY_S:
                    return None
                self.conn = self.db.dedicated(application_name=self.application_name, vector_types=False)
            cur = self.conn.execute(statement, params)
            row = cur.fetchone() if cur.description else None
            self.ok = True
            return row
        except psycopg.Error as exc:
            self.failures += 1
            self.close()
            now = self.failed_at = time.monotonic()
            if now - self.logged_at >= LOG_EVERY_S:
                self.logged_at = now
                log.warning("%s: %s (%d failure(s) so far)", self.application_name, exc, self.failures)
            return None

    def forget(self, source: str) -> None:
        """The process's row goes with it (a follower stops counting it at once, not after fresh_s)."""
        self.execute(sqlfiles.text("foreground_forget"), {"source": source})

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None


@dataclass
class SharePublisher:
    """Writes a search server's share for the other processes (see the module's docstring)."""

    db: Database
    heartbeat_s: float = 1.0
    source: str = field(default_factory=source_name)
    published: int = 0
    _link: _Link = field(init=False)
    _last: tuple[float, float] | None = None  # (share, when) of the last write

    def __post_init__(self) -> None:
        self._link = _Link(self.db, "memstore-foreground-publisher")

    def __call__(self, controller: ForegroundController) -> None:
        """After each of the controller's ticks: written when the share changed or a heartbeat is due."""
        share, now = controller.share(), time.monotonic()
        if self._last is not None and self._last[0] == share and now - self._last[1] < self.heartbeat_s:
            return
        state = controller.state()
        params = {
            "source": self.source,
            "share": share,
            "p99_ms": state["search_p99_ms"],
            "target_ms": state["target_p99_ms"],
        }
        row = self._link.execute(sqlfiles.text("foreground_publish"), params)
        if self._link.ok:
            self._last = (share, now)
            self.published += 1
            controller.background_elsewhere(None if row is None or row[0] is None else float(row[0]))

    def close(self) -> None:
        self._link.forget(self.source)
        self._link.close()


@dataclass
class Published:
    """What the followers read: the lowest fresh share, the highest p99 among them, and how many."""

    share: float | None
    search_p99_ms: float | None
    servers: int


def read_published(link: _Link, fresh: float) -> Published | None:
    """The search servers' fresh shares (None when the read failed)."""
    row = link.execute(sqlfiles.text("foreground_follow"), {"fresh_s": fresh})
    if row is None:
        return None
    share, p99_ms, servers = row
    return Published(
        share=None if share is None else float(share),
        search_p99_ms=None if p99_ms is None else float(p99_ms),
        servers=int(servers),
    )


@dataclass
class ForegroundFollower(ForegroundController):
    """The controller of a process that answers no searches: its share is the search servers' lowest
    fresh one, read every tick; the units, connections and encoder it paces are the same levers."""

    db: Database | None = None
    fresh_s: float = MIN_FRESH_S
    published: Published | None = None
    source: str = field(default_factory=source_name)
    reported: int = 0  # rows written to say when this process last did background work
    _link: _Link | None = None
    _reported_at: float = -math.inf  # when it last wrote
    _reported_work: float = -math.inf  # the work end it wrote

    @classmethod
    def for_process(cls, db: Database, settings: Settings) -> ForegroundFollower:
        return cls(
            lambda since: [],
            window_s=settings.foreground_window_s,
            connections=settings.background_connections,
            enabled=settings.foreground and settings.foreground_shared,
            db=db,
            fresh_s=fresh_s(settings.foreground_window_s),
        )

    def tick(self) -> Decision:
        if self._link is None and self.db is not None:
            self._link = _Link(self.db, "memstore-foreground-follower")
        if not self.enabled:  # switched off, or forced (stopping): nothing to read or tell
            self._set_share(1.0)
            return Decision(self._share, 0, False)
        self.published = None if self._link is None else read_published(self._link, self.fresh_s)
        share = 1.0 if self.published is None or self.published.share is None else self.published.share
        self._p99_ms = None if self.published is None else self.published.search_p99_ms
        backed_off = share < self._share
        if backed_off:
            self._record_backoff(self._p99_ms, None, share)
        self._set_share(share)
        self._report_work()
        return Decision(self._share, 0, backed_off)

    def _report_work(self) -> None:
        """Tell the search servers when this process last did background work (running units: now),
        at most once a window, so that their idle baselines leave those windows out."""
        now = self.clock()
        with self._cond:
            active, ended = self._running(), self._work_ended
        if self._link is None or now - self._reported_at < self.window_s:
            return
        if active == 0 and ended <= self._reported_work:
            return  # nothing new since the last report
        ago = 0.0 if active else max(0.0, now - ended)
        params = {"source": self.source, "share": self._share, "ago_s": ago}
        self._link.execute(sqlfiles.text("foreground_worked"), params)
        if self._link.ok:
            self._reported_at, self._reported_work = now, ended
            self.reported += 1

    def latency_p99_ms(self) -> float | None:
        """The highest search p99 the servers published lately (the maintenance daemon's back-off)."""
        return None if self.published is None else self.published.search_p99_ms

    def state(self) -> dict[str, Any]:
        out = super().state()
        out["target_from"] = "search servers"
        out["search_servers"] = None if self.published is None else self.published.servers
        return out

    def close(self) -> None:
        super().close()
        if self._link is not None:
            if self.reported:
                self._link.forget(self.source)
            self._link.close()
