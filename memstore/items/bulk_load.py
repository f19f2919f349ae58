"""Bulk loads at index-build speed.

pgvector inserts a row into a live HNSW graph one at a time (a search of the graph per row); building
the graph over rows already in the table is several times faster, and in parallel. So a load that is
large against its collection runs as:

1. take the collection's locks (no representation switch, no maintenance rebuild, no keyword change
   meanwhile), record the load in the registry (``options.bulk_load``) and drop the collection's HNSW
   index and its metadata GIN index (concurrently for a plain table; a partitioned index under the
   short lock timeout);
2. write the rows in batches (COPY into a staging table, then one upsert per batch), touching no graph
   and no GIN tree;
3. build the indexes again (``CREATE INDEX CONCURRENTLY``, parallel workers as the server allows; per
   partition, then attached), and clear the record.

The metadata GIN index goes with the graph because inserting its entries row by row costs a load
more than building it afterwards. The keywords of the rows are written by the collection's triggers
into its keyword side table, one statement per batch (``memstore.catalog.keywords``); rows without text,
file name or listed fields write nothing there.

Searches answer throughout: without the indexes they are exact scans of the table, so every
committed row is found (and slower, which is the price of the load: the load is only chosen when it
is large against what is there, ``defers``). The load's call returns after the index is back. Writes from other
clients go on meanwhile and need no graph either. A load whose process died leaves its record behind;
the next load of that collection or the maintenance worker (``finish_interrupted``) builds the index.

Smaller loads go into the live index; several connections insert disjoint batches side by side
(``VectorStore.bulk_load``'s ``connections``: HNSW inserts take page locks, and the measured scaling is
in docs/performance.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from memstore.catalog import density, registry, segments
from memstore.catalog import index_spec as compact_spec
from memstore.catalog.collections import Collection
from memstore.catalog.tables import METADATA_INDEX, metadata_index_name
from memstore.db import locks, online_ddl, sqlfiles
from memstore.db.core import Database
from memstore.settings import Settings

log = logging.getLogger(__name__)

MARKER = "bulk_load"  # options key: a load is running, or died before its index was rebuilt
LOCK_WAIT_S = 5.0  # how long a load waits for a maintenance rebuild or a switch before loading live
SEAL_WAIT_S = 300.0  # how long a load into a segmented collection waits for a seal under way to end


class BulkLoadBusyError(RuntimeError):
    """Another process holds the collection's index (a maintenance rebuild, a switch, another load)."""


@dataclass(frozen=True)
class LoadResult:
    """What a bulk load did: rows written by status, whether it deferred the index, and its times."""

    created: int
    updated: int
    unchanged: int
    deferred_index: bool
    load_s: float
    build_s: float

    @property
    def rows(self) -> int:
        return self.created + self.updated + self.unchanged

    @property
    def rows_per_s(self) -> float:
        total = self.load_s + self.build_s
        return self.rows / total if total > 0 else 0.0


def defers(c: Collection, rows_in_load: int, rows_now: int, settings: Settings) -> bool:
    """Whether a load of ``rows_in_load`` rows into ``c`` (holding about ``rows_now``) should go in
    without the index and rebuild it. Only full-precision indexes: a compact index's switch has
    states of its own (``memstore.compact``), and those loads go into the live index."""
    spec = compact_spec.index_spec(c)
    if spec.representation != "full" or spec.pending or segments.segmented(c):
        # A segmented collection's writes link into no graph anyway; its sealer builds them.
        return False
    return rows_in_load >= settings.bulk_min_rows and rows_in_load >= settings.bulk_fraction * rows_now


def in_progress(c: Collection) -> bool:
    """The registry records a load of ``c`` that has not rebuilt its index yet."""
    return bool(c.options.get(MARKER))


def _maintenance_keys(c: Collection) -> list[str]:
    """The maintenance worker's lock per index (``maintenance.targets.Target.lock_key``)."""
    if c.partitions == 1:
        return [locks.index_key(c.index_name)]
    return [locks.index_key(f"{part}_hnsw") for part in c.partition_tables()]


@contextlib.contextmanager
def _locked(conn: psycopg.Connection[Any], c: Collection, wait_s: float) -> Iterator[None]:
    def busy() -> Exception:
        return BulkLoadBusyError(f"another process is changing the index of collection {c.name!r}")

    with contextlib.ExitStack() as held:
        held.enter_context(locks.session_lock(conn, locks.collection_key(c.id), busy=busy, wait_s=wait_s))
        for key in _maintenance_keys(c):
            held.enter_context(locks.session_lock(conn, key, busy=busy, wait_s=wait_s))
        yield


@contextlib.contextmanager
def deferred_index(
    db: Database,
    c: Collection,
    settings: Settings,
    *,
    progress: bool = False,
    wait_s: float = LOCK_WAIT_S,
    on_build: Callable[[float], None] | None = None,
) -> Iterator[None]:
    """Drop the collection's HNSW index for the block and build it again after, whatever the block
    did: rows it committed are acknowledged and must become indexed. Raises ``BulkLoadBusyError``
    when the collection's locks stay taken for ``wait_s``. ``on_build`` receives the build's
    seconds."""
    with _connect(db, settings) as conn, _locked(conn, c, wait_s):
        # Afresh under the locks: a keyword change that ended a moment ago decides the index built after.
        c = registry.read_collection(conn, id=c.id)
        with conn.transaction():
            # Whether the load starts from an empty table: then its build may pick the density for its size.
            row = conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(c.table)).fetchone()
            started = {"started_at": datetime.now(UTC).isoformat(), "empty": bool(row and row[0])}
            registry.set_option(conn, c, MARKER, started)
        # The table's indexes (a partitioned table's parent index takes its partitions' with it).
        for index in _deferred_indexes(c):
            online_ddl.drop_index(conn, index.name, partitioned=c.partitions > 1)
        try:
            yield
        finally:
            t0 = time.perf_counter()
            try:
                _build(db, conn, c, progress=progress)
            except psycopg.errors.UndefinedTable:
                log.info("collection %r was dropped during its bulk load; no index to build", c.name)
            else:
                if on_build is not None:
                    on_build(time.perf_counter() - t0)


def finish_interrupted(db: Database, c: Collection, settings: Settings, *, progress: bool = False) -> bool:
    """Build the index of a load that died before doing so; False when another process holds the
    collection (its load is still running) or there is nothing to finish."""
    if not in_progress(c):
        return False
    with _connect(db, settings) as conn:
        try:
            with _locked(conn, c, wait_s=0.0):
                fresh = registry.read_collection(conn, id=c.id)
                if not in_progress(fresh):
                    return False
                log.warning("collection %r: a bulk load ended before its index was built; building it", c.name)
                _build(db, conn, fresh, progress=progress)
                return True
        except BulkLoadBusyError:
            return False


def _connect(db: Database, settings: Settings) -> psycopg.Connection[Any]:
    """A dedicated connection with the short lock timeout and the build's memory and workers, as the
    maintenance worker's rebuilds have them."""
    conn = db.dedicated(application_name="memstore-bulk-load")
    online_ddl.set_lock_timeout(conn)
    online_ddl.build_resources(conn, settings)
    return conn


class _Index(NamedTuple):
    name: str
    definition: sql.Composable  # what follows the table in CREATE INDEX
    partition_name: Callable[[int], str]


def _deferred_indexes(c: Collection) -> list[_Index]:
    """The indexes a load drops and builds after, as ``create_table_statements`` makes them: the
    metadata GIN index (built first: a second or two), then the HNSW graph."""
    parts = c.partition_tables()
    hnsw = sql.SQL("USING hnsw ({k} {o}) WITH (m = {m}, ef_construction = {ef})").format(
        k=sql.SQL(compact_spec.key_expression("full", c.dimensions)),
        o=sql.SQL(compact_spec.opclass("full", c.metric)),
        m=sql.Literal(c.hnsw_m),
        ef=sql.Literal(c.hnsw_ef_construction),
    )
    out = [_Index(metadata_index_name(c), METADATA_INDEX, lambda i: f"{parts[i]}_metadata")]
    out.append(_Index(c.index_name, hnsw, lambda i: f"{parts[i]}_hnsw"))
    return out


def _build(db: Database, conn: psycopg.Connection[Any], c: Collection, *, progress: bool) -> None:
    """The indexes the load dropped, built online; then the registry forgets the load."""
    c = _density_for_load(conn, c)
    with _BuildProgress(db, conn, enabled=progress, label=c.name):
        for index in _deferred_indexes(c):
            online_ddl.build_index(conn, c, index.name, index.definition, partition_name=index.partition_name)
    # The planner's picture of a table that grew many times over (autovacuum would get to it later):
    # a search right after the load must not be planned as a scan of the few rows there were.
    conn.execute(sql.SQL("ANALYZE {}").format(c.table))
    with conn.transaction():
        registry.clear_option(conn, c, MARKER)


def _density_for_load(conn: psycopg.Connection[Any], c: Collection) -> Collection:
    """The graph a load into an empty collection with a recall target builds: the denser one for its
    size (``memstore.catalog.density.for_rows``) unless the user chose the graph; recorded in the
    registry (``hnsw_m``, ``hnsw_ef_construction`` and the ``hnsw_density`` option)."""
    c = registry.read_collection(conn, id=c.id)
    marker = c.options.get(MARKER)
    if not isinstance(marker, dict) or not marker.get("empty") or c.recall_target is None or density.explicit(c):
        return c
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(c.table)).fetchone()
    rows = int(row[0]) if row else 0
    want = density.for_rows(density.of(c), rows, c.recall_target)
    if want is None:
        return c
    why = f"{rows} rows loaded at recall target {c.recall_target:g}: {density.DENSE_ROWS} or more need a denser graph"
    info = {
        "m": want.m,
        "ef_construction": want.ef_construction,
        "from": {"m": c.hnsw_m, "ef_construction": c.hnsw_ef_construction},
        "by": "bulk_load",
        "reason": why,
        "at": datetime.now(UTC).isoformat(),
    }
    with conn.transaction():
        c = registry.set_hnsw_density(conn, c, m=want.m, ef_construction=want.ef_construction)
        c = registry.set_option(conn, c, density.HNSW_DENSITY, info)
    log.info("collection %r: %s (%s)", c.name, why, want)
    return c


class _BuildProgress:
    """A progress bar for the index build, read from ``pg_stat_progress_create_index`` on a second
    connection (the building one is busy)."""

    def __init__(self, db: Database, conn: psycopg.Connection[Any], *, enabled: bool, label: str) -> None:
        self.db, self.pid, self.enabled, self.label = db, conn.info.backend_pid, enabled, label
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _BuildProgress:
        if self.enabled:
            self._thread = threading.Thread(target=self._show, name="memstore-build-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _show(self) -> None:
        from tqdm import tqdm

        with (
            self.db.dedicated(application_name="memstore-build-progress") as conn,
            tqdm(desc=f"{self.label}: building the index", unit="row", leave=False) as bar,
        ):
            while not self._stop.wait(0.5):
                row = conn.execute(sqlfiles.text("progress_create_index"), {"pid": self.pid}).fetchone()
                if row is None:
                    continue
                phase, _, _, total, done = row
                bar.set_postfix_str(str(phase))
                if total:
                    bar.total = int(total)
                    bar.n = int(done or 0)
                    bar.refresh()
