"""The space pass: ingest workers fill new embedding spaces between their batches.

Every ``INTERVAL_S`` a step looks at the spaces still filling (``memstore.spaces.lifecycle``): it queues the
next batch of a space's backlog of stored originals, and builds the index of a space whose backlog
is queued and embedded. The queued rows are then claimed like any others, at the bulk priority, so
a re-embedding takes what new items and interactive queries leave. Each step is one transaction or
one concurrent index build, so a worker killed at any point leaves the next one to carry on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from memstore.catalog.collections import Collection, Space
from memstore.catalog.registry import CACHE_SECONDS, Registry, read_collection
from memstore.db import online_ddl
from memstore.db.core import Database
from memstore.settings import Settings, get_settings
from memstore.spaces import lifecycle
from memstore.workers.pacing import FULL_SPEED, Pace

log = logging.getLogger(__name__)

# How often a worker looks at the filling spaces (a step is cheap: a row lock and a batch insert).
INTERVAL_S = 0.5


class SpacePass:
    def __init__(
        self,
        db: Database,
        *,
        registry: Registry | None = None,
        settings: Settings | None = None,
        pace: Pace = FULL_SPEED,
    ) -> None:
        self.db = db
        # The worker's pace: an index build that starts while searches are held back takes fewer
        # parallel workers (online_ddl.paced_build_workers).
        self.pace = pace
        self.registry = registry or Registry(db)
        self.settings = settings or get_settings()
        self._conn: psycopg.Connection[Any] | None = None
        self._due = 0.0
        self._listed_at = -CACHE_SECONDS
        self._filling: list[tuple[Collection, Space]] = []

    def step(self, *, now: bool = False) -> int:
        """Queue a batch or build an index where one is due; returns how much it did (0: nothing).
        ``now``: without waiting for the interval (a worker draining the queue once). Errors are
        logged, not raised: filling a space must never stop the worker's ingest."""
        at = time.monotonic()
        if at < self._due and not now:
            return 0
        self._due = at + INTERVAL_S
        done = 0
        try:
            for c, space in self._spaces(at, fresh=now):
                try:
                    done += self._step_space(c, space)
                except psycopg.Error as exc:
                    if _server_trouble(exc):
                        raise  # the connection or the server: the other spaces would fail alike
                    # this space's trouble (a lock timeout, a statement refused): the others go on
                    log.error("spaces: space %r of %s: %s", space.name, c.name, exc)
        except psycopg.Error as exc:
            log.error("spaces: %s", exc)
        except Exception:  # a bug must not end the ingest loop it runs in
            log.exception("spaces: unexpected error")
        return done

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> psycopg.Connection[Any]:
        """The pass's own autocommit connection (its index builds set session settings and hold a
        session lock, which must not reach a pooled connection)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self.db.dedicated(application_name="memstore-spaces")
            online_ddl.build_resources(self._conn, self.settings, background=True)
        return self._conn

    def _step_space(self, c: Collection, space: Space) -> int:
        conn = self._connection()
        try:
            queued = lifecycle.queue_backlog_step(conn, c, space)
            if queued is not None:
                return max(queued, 1)
            fresh = read_collection(conn, id=c.id).space_by_id(space.id)
            workers = online_ddl.paced_build_workers(self.settings, self.pace.share())
            if fresh is not None and lifecycle.build_index(conn, c, fresh, workers=workers):
                log.info("spaces: space %r of %s is ready", space.name, c.name)
                self._listed_at = -CACHE_SECONDS
                return 1
        except (psycopg.errors.UndefinedTable, LookupError):  # dropped since it was listed
            self._listed_at = -CACHE_SECONDS
        except psycopg.OperationalError:
            self.close()
            raise
        return 0

    def _spaces(self, now: float, *, fresh: bool) -> list[tuple[Collection, Space]]:
        """The spaces still filling: listed again every CACHE_SECONDS, and at once when the ids of the
        filling spaces changed (one small query a step), so a new space starts filling within a step
        rather than within the registry's cache time (most of a small collection's re-embedding)."""
        ids = self._filling_ids()
        if fresh or now - self._listed_at >= CACHE_SECONDS or ids != [s.id for _, s in self._filling]:
            self._filling = sorted(
                ((c, s) for c in self.registry.all() for s in c.spaces if s.state == "filling"), key=lambda cs: cs[1].id
            )
            self._listed_at = now
        return self._filling

    def _filling_ids(self) -> list[int]:
        with self.db.write() as conn:
            rows = conn.execute("SELECT id FROM memstore_spaces WHERE state = 'filling' ORDER BY id").fetchall()
        return [int(r[0]) for r in rows]


def _server_trouble(exc: psycopg.Error) -> bool:
    """A lost connection or a server going away (no SQLSTATE, class 08 or 57), as opposed to one
    statement's failure (a lock timeout is 55P03, also an OperationalError in psycopg)."""
    state = exc.sqlstate
    return state is None or state[:2] in ("08", "57")
