"""Sealing and merging the graphs of collections written as segments (``memstore.catalog.segments``).

- ``seal``: the tail's rows get a graph of their own, ``CREATE INDEX CONCURRENTLY`` over their id
  range (parallel workers as the server allows: the bulk build's cost per row, whatever the batches
  the rows came in); the layout in the registry gains it once it is valid.
- ``merge``: several graphs become one, built the same way over their joint range; the layout names
  it, then the graphs it replaces are dropped.
- ``Sealer``: a thread that does both for the collections this process writes to, as their tails
  fill and when their writes pause.

Nothing here moves a row: a graph is an index over rows that stay where they are, so a build that
dies (a killed backend, a server crash) loses nothing. The layout changes only after its new index is
valid; an interrupted build leaves an INVALID index, and an index built but not yet recorded (or
recorded and not yet dropped) is a leftover: the next seal or merge drops both before it builds
(``_drop_leftovers``). Until then the rows it would have covered are the tail's, read exactly.

One process seals a collection at a time: the collection's lock (``memstore.db.locks.collection_key``,
which representation switches and bulk loads take too), tried without waiting by the sealer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog import registry, segments, tables
from memstore.catalog.collections import Collection
from memstore.catalog.segments import Graph, Layout
from memstore.db import locks, online_ddl
from memstore.db.core import Database
from memstore.errors import CollectionNotFoundError
from memstore.settings import Settings

log = logging.getLogger(__name__)


# The tail's rows a seal takes: those up to the first one still waiting for its vector (an image or a
# text queued for the encoder). A graph built over it would take its vector later through pgvector's
# per-row insert, what segments are for avoiding; it stays in the tail, read exactly, until embedded.
_TAIL_SQL = sql.SQL(
    "SELECT count(*), max(id) FROM {t} WHERE id > %(low)s AND id < coalesce("
    "(SELECT min(id) FROM {t} WHERE id > %(low)s AND status = 'pending'), 9223372036854775807)"
)
_WAITING_SQL = sql.SQL("SELECT EXISTS (SELECT 1 FROM {t} WHERE id > %(low)s AND status = 'pending')")


class SealBusyError(RuntimeError):
    """Another process is sealing or merging this collection, or changing its index."""


@dataclass(frozen=True)
class Sealed:
    """One seal or merge: the graph built, its rows, the graphs it replaced and its seconds."""

    action: str  # "seal" or "merge"
    graph: Graph
    rows: int
    replaced: tuple[str, ...]
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "index": self.graph.index,
            "lo": self.graph.lo,
            "hi": self.graph.hi,
            "rows": self.rows,
            "replaced": list(self.replaced),
            "seconds": round(self.seconds, 3),
        }


def seal(
    db: Database, c: Collection, settings: Settings, *, min_rows: int | None = None, wait_s: float = 0.0
) -> Sealed | None:
    """Give ``c``'s tail a graph when it holds at least ``min_rows`` rows (default: the
    ``seal_rows`` setting; 1: whatever it holds). None when there was nothing to seal. Raises
    ``SealBusyError`` when another process holds the collection for longer than ``wait_s``."""
    least = settings.seal_rows if min_rows is None else max(1, min_rows)
    with _held(db, c, settings, wait_s) as (conn, c, layout):
        low = layout.watermark
        row = conn.execute(_TAIL_SQL.format(t=c.table), {"low": low}).fetchone()
        rows, high = (int(row[0]), row[1]) if row else (0, None)
        if rows < least or high is None:
            return None
        graph = Graph(low, int(high), segments.index_name(c, low, int(high)))
        t0 = time.perf_counter()
        _build(conn, c, graph)
        _record(conn, c, Layout((*layout.graphs, graph)))
        done = Sealed("seal", graph, rows, (), time.perf_counter() - t0)
    log.info("collection %r: sealed %d rows (ids %d to %d) in %.1f s", c.name, rows, low + 1, high, done.seconds)
    return done


def merge(
    db: Database, c: Collection, settings: Settings, *, quiet: bool, everything: bool = False, wait_s: float = 0.0
) -> Sealed | None:
    """Merge ``c``'s graphs as ``segments.merge_span`` says for a collection whose writes have (or
    have not) paused; ``everything``: all of them into one. None when nothing is to be merged."""
    with _held(db, c, settings, wait_s) as (conn, c, layout):
        if everything:
            span = (0, len(layout.graphs)) if len(layout.graphs) > 1 else None
        else:
            span = segments.merge_span(layout, quiet=quiet, max_graphs=settings.segments_max)
        if span is None:
            return None
        start, end = span
        old = layout.graphs[start:end]
        graph = Graph(old[0].lo, old[-1].hi, segments.index_name(c, old[0].lo, old[-1].hi))
        t0 = time.perf_counter()
        with contextlib.ExitStack() as maintained:
            # The maintenance worker rebuilds the first graph under its index lock; not while it goes.
            for g in old:
                maintained.enter_context(
                    locks.session_lock(conn, locks.index_key(g.index), busy=_busy(c), wait_s=wait_s)
                )
            _build(conn, c, graph)
            _record(conn, c, Layout((*layout.graphs[:start], graph, *layout.graphs[end:])))
            # Searches that read the layout before now still name the old ranges: correct without
            # their indexes (a range scan), and they read the new layout within seconds.
            for g in old:
                online_ddl.drop_index(conn, g.index, partitioned=False)
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE {}").format(c.table, segments.range_predicate(graph.lo, graph.hi))
        ).fetchone()
        done = Sealed("merge", graph, int(row[0]) if row else 0, tuple(g.index for g in old), time.perf_counter() - t0)
    log.info("collection %r: merged %d graphs into %s in %.1f s", c.name, len(old), graph.index, done.seconds)
    return done


def _busy(c: Collection) -> Any:
    return lambda: SealBusyError(f"another process is changing the graphs of collection {c.name!r}")


@contextlib.contextmanager
def _held(
    db: Database, c: Collection, settings: Settings, wait_s: float
) -> Iterator[tuple[psycopg.Connection[Any], Collection, Layout]]:
    """A build connection holding ``c``'s lock, ``c`` read afresh under it, and its layout with any
    leftovers of an interrupted build dropped."""
    with db.dedicated(application_name="memstore-sealer") as conn:
        online_ddl.set_lock_timeout(conn)
        online_ddl.build_resources(conn, settings)
        with locks.session_lock(conn, locks.collection_key(c.id), busy=_busy(c), wait_s=wait_s):
            fresh = registry.read_collection(conn, id=c.id)
            found = segments.layout(fresh)
            if found is None:
                raise ValueError(f"collection {c.name!r} is not written as segments")
            _drop_leftovers(conn, fresh, found)
            yield conn, fresh, found


def _build(conn: psycopg.Connection[Any], c: Collection, graph: Graph) -> None:
    online_ddl.build_table_index(conn, graph.index, c.table, segments.graph_definition(c, graph.lo, graph.hi))
    # The planner's row count and the ids' histogram (a table that grew): without them the tail's
    # branch may be planned as a scan of the whole table. The id column alone: the sample is read
    # either way, the vectors' statistics would only cost more.
    conn.execute(sql.SQL("ANALYZE {} (id)").format(c.table))


def _record(conn: psycopg.Connection[Any], c: Collection, layout: Layout) -> None:
    with conn.transaction():
        registry.set_option(conn, c, segments.LAYOUT, layout.to_json())


def _drop_leftovers(conn: psycopg.Connection[Any], c: Collection, layout: Layout) -> None:
    """Drop ``c``'s graph indexes the layout does not name: an INVALID one (a build that died), a
    valid one built but not recorded, or one a merge recorded away but did not drop."""
    named = {g.index for g in layout.graphs}
    rows = conn.execute(
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(%s) AND i.relname ~ %s",
        (c.table.as_string(conn), segments.index_pattern(c)),
    ).fetchall()
    for (name,) in rows:
        if name not in named:
            log.warning("collection %r: dropping %s, left by an interrupted seal or merge", c.name, name)
            online_ddl.drop_index(conn, name, partitioned=False)


def graphs_state(conn: psycopg.Connection[Any], c: Collection) -> dict[str, Any] | None:
    """What status pages show of a segmented collection: its graphs and its tail's rows."""
    layout = segments.layout(c)
    if layout is None:
        return None
    row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE id > %s").format(c.table), (layout.watermark,)).fetchone()
    return {
        "graphs": [{"index": g.index, "lo": g.lo, "hi": g.hi} for g in layout.graphs],
        "tail_rows": int(row[0]) if row else 0,
    }


class Sealer:
    """Seals and merges, in a thread of its own, the segmented collections this process writes to.

    ``wrote(c, high_id)`` after each write: the thread looks at ``c`` within ``seal_interval_s``, seals
    its tail once it holds ``seal_rows`` rows, merges its graphs when they reach ``segments_max`` and,
    once neither a write nor a seal has come for ``segments_quiet_s``, as ``segments.merge_span``
    says; then it forgets ``c`` until the next write. Another process sealing the same collection is
    left to it.

    Back-pressure: a writer whose rows leave more than ``BACKLOG`` x ``seal_rows`` rows in the tail
    waits (``wrote`` returns) until the sealer has brought it under that, for at most
    ``BACKLOG_WAIT_S``. A writer faster than the builds would otherwise grow the tail without bound,
    and every search reads the tail exactly. ``seal_now`` (a stream's end) goes before the thread's
    next step."""

    BACKLOG = 2
    BACKLOG_WAIT_S = 120.0

    def __init__(
        self, db: Database, settings: Settings, *, changed: Callable[[Collection], None] | None = None
    ) -> None:
        self.db, self.settings = db, settings
        self._changed = changed  # told of each new layout (the store drops its cached registry row)
        self._active: dict[int, float] = {}  # collection id: when this process last wrote to or sealed it
        self._lock = threading.Lock()
        self._callers = 0  # seal_now calls under way: the thread starts nothing new meanwhile
        self._wake = threading.Event()
        self._progress = threading.Event()  # set after each seal or merge this process ran
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.done: list[Sealed] = []  # the latest seals and merges, newest last (a few)
        # What each seal or merge waits on before it starts: the process's foreground controller
        # (``memstore.workers.pacing``: held back while searches are slower than their target) where
        # the process answers searches; None: at once.
        self.pace: Any = None

    def wrote(self, c: Collection, high_id: int | None = None) -> None:
        """``c`` was written to, its highest new id ``high_id``: wake the thread and, given
        ``high_id``, wait while the tail is over the back-pressure bound."""
        with self._lock:
            self._active[c.id] = time.monotonic()
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="memstore-sealer", daemon=True)
                self._thread.start()
        layout = segments.layout(c)
        if high_id is None or layout is None or high_id - layout.watermark <= self._bound():
            return
        self.wait_for_room(c, high_id)

    def room(self, c: Collection) -> bool:
        """Whether ``c``'s tail is within the back-pressure bound now (its sequence's last id against
        the layout in the registry): what a caller that waits on an event loop polls (the REST API)."""
        with self.db.write() as conn:
            fresh = registry.read_collection(conn, id=c.id)
            layout = segments.layout(fresh)
            if layout is None:
                return True
            row = conn.execute(
                "SELECT pg_sequence_last_value(%s::regclass)",
                (sql.Identifier(tables.id_sequence(c)).as_string(conn),),
            ).fetchone()
        last = int(row[0]) if row and row[0] is not None else 0
        if last - layout.watermark > self._bound():
            self._wake.set()
            return False
        return True

    def wait_for_room(self, c: Collection, high_id: int) -> None:
        """Block until the sealer has brought ``c``'s tail under the bound for rows up to ``high_id``."""
        self._wake.set()
        deadline = time.monotonic() + self.BACKLOG_WAIT_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._progress.clear()
            with self.db.write() as conn:
                fresh = segments.layout(registry.read_collection(conn, id=c.id))
            if fresh is None or high_id - fresh.watermark <= self._bound():
                return
            # This process's sealer says when it sealed; another process's seal is seen within 0.5 s.
            self._progress.wait(0.5)
        log.warning(
            "collection %r: the tail stayed over %d rows for %.0f s", c.name, self._bound(), self.BACKLOG_WAIT_S
        )

    def _bound(self) -> int:
        return self.BACKLOG * self.settings.seal_rows

    def seal_now(self, c: Collection, *, merge_all: bool = False, wait_s: float = 300.0) -> list[Sealed]:
        """Seal ``c``'s tail now whatever its size (and with ``merge_all`` merge every graph into one),
        waiting up to ``wait_s`` for a build under way; the thread starts nothing new meanwhile."""
        with self._lock:
            self._callers += 1
        try:
            done = [seal(self.db, c, self.settings, min_rows=1, wait_s=wait_s)]
            if merge_all:
                done.append(merge(self.db, c, self.settings, quiet=True, everything=True, wait_s=wait_s))
        finally:
            with self._lock:
                self._callers -= 1
                if c.id in self._active:
                    self._active[c.id] = time.monotonic()
        found = [d for d in done if d is not None]
        self._record(c, found)
        return found

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.seal_interval_s)
            self._wake.clear()
            with self._lock:
                active = dict(self._active)
            for cid, at in active.items():
                if self._stop.is_set():
                    return
                if self._callers:
                    break  # a seal_now goes first; looked at again when it is done
                try:
                    finished = self.step(cid, quiet=time.monotonic() - at >= self.settings.segments_quiet_s)
                except SealBusyError:
                    finished = False
                except CollectionNotFoundError:
                    finished = True
                except Exception:  # a failed build is logged and tried again at the next look
                    log.exception("sealing collection %d failed", cid)
                    finished = False
                with self._lock:
                    if finished and self._active.get(cid) == at:  # nothing came meanwhile
                        del self._active[cid]

    def step(self, cid: int, *, quiet: bool) -> bool:
        """One look at collection ``cid``: a seal if due, else a merge if due. True when nothing is
        left to do until the next write (quiet, tail under the bound, nothing to merge)."""
        with self.db.write() as conn:
            c = registry.read_collection(conn, id=cid)
        if not segments.segmented(c):
            return True
        with contextlib.ExitStack() as paced:
            if self.pace is not None:
                paced.enter_context(self.pace.unit(self._stop, kind="seal")).did(1)
            if self._stop.is_set():
                return False
            done = self._next(c, quiet=quiet)
        if done is None:
            return quiet and not self._waiting(c)
        self._record(c, [done])
        with self._lock:
            if done.action == "seal" and cid in self._active:
                self._active[cid] = time.monotonic()  # a pause counts from the last seal too
        self._wake.set()  # more may be due (a tail that filled while this one was built)
        return False

    def _waiting(self, c: Collection) -> bool:
        """Rows in ``c``'s tail still wait for their vectors: the thread keeps looking, to seal them
        once the ingest workers have embedded them."""
        layout = segments.layout(c)
        if layout is None:
            return False
        with self.db.write() as conn:
            row = conn.execute(_WAITING_SQL.format(t=c.table), {"low": layout.watermark}).fetchone()
        return bool(row and row[0])

    def _next(self, c: Collection, *, quiet: bool) -> Sealed | None:
        """A merge first when the graphs reached their cap (else a stream that keeps the tail full
        would leave them to grow), then a seal, then a merge the pause calls for."""
        layout = segments.layout(c)
        settings = self._build_settings()
        if layout is not None and len(layout.graphs) >= settings.segments_max:
            done = merge(self.db, c, settings, quiet=False)
            if done is not None:
                return done
        return seal(self.db, c, settings) or merge(self.db, c, settings, quiet=quiet)

    def _build_settings(self) -> Settings:
        """The settings a build starts with: its parallel workers as the foreground's share allows
        (``online_ddl.background_settings``)."""
        return online_ddl.background_settings(self.settings, 1.0 if self.pace is None else float(self.pace.share()))

    def _record(self, c: Collection, done: list[Sealed]) -> None:
        if not done:
            return
        self.done = [*self.done, *done][-10:]
        if self._changed is not None:
            self._changed(c)
        self._progress.set()  # writers held back by the tail's bound look again
