"""Online DDL on a collection's table: statements that never stall readers or writers for long.

Every statement that takes a lock readers or writers could queue behind runs under the caller's short
``lock_timeout`` and is retried, so a schema change costs searches at most that wait. Indexes are
built ``CONCURRENTLY``; a partitioned table cannot build one that way, so its index is made ``ON
ONLY`` the parent, each partition's is built concurrently and attached (PostgreSQL's own recipe),
and the parent's becomes valid once the last partition's is attached.

A ``CONCURRENTLY`` statement runs under a long lock timeout (``concurrent_lock_timeout``,
CONCURRENT_LOCK_TIMEOUT): it takes SHARE UPDATE EXCLUSIVE, which no reader or writer queues behind,
and its own waits (for transactions older than its snapshots, for the readers of an index before it
is swapped or dropped) are lock waits, so a short lock timeout made any transaction open a few
seconds fail a build that had finished; with none, a session left idle in a transaction (or a
manual VACUUM holding the table) would hold a seal, a keyword change or an API request for ever. It
is run once, never retried: it commits as it goes, and a failure leaves an INVALID index behind,
which ``build_table_index`` drops.

The compact index switch, the keyword index and the typed metadata indexes all build through here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from memstore.db import retrying

if TYPE_CHECKING:
    from memstore.catalog.collections import Collection
    from memstore.settings import Settings

log = logging.getLogger(__name__)

LOCK_TIMEOUT = "500ms"
# Each lock wait of a CONCURRENTLY statement (see the module's docstring): long enough for the
# transactions a running service has open, short enough that a forgotten one cannot stall it for good.
CONCURRENT_LOCK_TIMEOUT = "5min"
LOCK_RETRIES = 120
# Statements that build or drop an index CONCURRENTLY (``REINDEX (VERBOSE) TABLE CONCURRENTLY`` too).
_CONCURRENTLY = re.compile(
    r"^\s*(?:CREATE\s+(?:UNIQUE\s+)?INDEX|REINDEX(?:\s*\([^)]*\))?\s+\w+|DROP\s+INDEX)\s+CONCURRENTLY\b",
    re.IGNORECASE,
)


def build_resources(conn: psycopg.Connection[Any], settings: Settings, *, background: bool = False) -> None:
    """Give ``conn``'s session the build memory (a graph that fits builds several times faster) and
    parallel workers ``settings`` name, so that every HNSW build (the maintenance worker's rebuilds, a
    bulk load's build, the benchmarks' baselines) gets the same; a ``background`` session (one whose
    builds nobody waits for) gets ``background_build_workers``."""
    workers = background_build_workers(settings) if background else settings.max_parallel_maintenance_workers
    conn.execute(
        "SELECT set_config('maintenance_work_mem', %s, false), "
        "set_config('max_parallel_maintenance_workers', %s, false)",
        (settings.maintenance_work_mem, str(workers)),
    )


def background_build_workers(settings: Settings) -> int:
    """The parallel workers of a build nobody waits for (a seal, a merge, a rebuild, a new space's
    index), with every search served: ``MEMSTORE_BACKGROUND_BUILD_WORKERS`` when set; on a server on
    this machine (the embedded one, or one reached over a Unix socket or a loopback address), the
    machine's cores less two, so that the build's processes (its leader and workers) leave one core to
    searches; on another server, whose cores this process cannot see,
    ``max_parallel_maintenance_workers``. Never more than ``max_parallel_maintenance_workers``.

    A build's processes run at full speed until it ends and a lower CPU priority does not let a waking
    search through (measured: docs/performance.md, "Background builds leave a core to searches"), so
    the one lever that works is how many cores the build takes."""
    full = settings.max_parallel_maintenance_workers
    if settings.background_build_workers is not None:
        return min(full, settings.background_build_workers)
    if not server_on_this_machine(settings.database_url):
        return full
    return min(full, max(0, machine_cores() - 2))


def server_on_this_machine(database_url: str | None) -> bool:
    """Whether the database runs on this machine's cores: the embedded server (no URL), or every
    address libpq connects to (the URL's hostaddr or host, else ``PGHOSTADDR`` or ``PGHOST``) a Unix
    socket's folder or a loopback address."""
    if not database_url:
        return True
    from memstore.db.core import libpq_url  # core imports this module's users

    try:
        info = conninfo_to_dict(libpq_url(database_url))
    except psycopg.ProgrammingError:
        return False
    # As libpq connects: to hostaddr when one is given (host then only names the server), else to
    # host; the environment's PGHOSTADDR and PGHOST stand for what the URL leaves out.
    hosts = info.get("hostaddr") or os.environ.get("PGHOSTADDR") or info.get("host") or os.environ.get("PGHOST", "")
    return all(_local_host(h.strip()) for h in str(hosts).split(","))


def _local_host(host: str) -> bool:
    if host == "" or host.startswith("/") or host == "localhost":
        return True  # libpq's default and a socket folder are this machine's
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def machine_cores(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity where the platform has one, and no more than a
    container's CPU quota (``docker run --cpus 2`` on a larger host) allows, rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_quota(root: Path) -> float | None:
    """The CPUs' worth of time a cgroup quota allows this process (cgroup v2's ``cpu.max``, v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``), None without one."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def paced_build_workers(settings: Settings, share: float) -> int:
    """The parallel workers a background build that starts now may take: ``background_build_workers``
    scaled by the background's share of the machine (``memstore.workers.pacing``), so a build that
    starts while searches are slower than their target takes one core, not all of them. A build cannot
    be paused once it runs, and its workers are fixed when it starts."""
    full = background_build_workers(settings)
    return min(full, max(0, int(share * full)))


def background_settings(settings: Settings, share: float = 1.0) -> Settings:
    """``settings`` for a build nobody waits for that starts now (``build_resources`` gives its
    session ``paced_build_workers``): the same object when that is the configured number."""
    workers = paced_build_workers(settings, share)
    if workers == settings.max_parallel_maintenance_workers:
        return settings
    return settings.model_copy(update={"max_parallel_maintenance_workers": workers})


def set_build_workers(conn: psycopg.Connection[Any], workers: int) -> None:
    """The parallel workers of the session's next index builds."""
    conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)", (str(workers),))


def set_lock_timeout(conn: psycopg.Connection[Any]) -> None:
    """The short wait every statement of this module is written for (on the caller's connection)."""
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))


def runs_concurrently(conn: psycopg.Connection[Any], statement: sql.Composable | str) -> bool:
    """Whether ``statement`` builds, rebuilds or drops an index ``CONCURRENTLY``."""
    text = statement if isinstance(statement, str) else statement.as_string(conn)
    return _CONCURRENTLY.match(text) is not None


@contextlib.contextmanager
def concurrent_lock_timeout(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """``lock_timeout = CONCURRENT_LOCK_TIMEOUT`` on ``conn``'s session for the block (a ``CONCURRENTLY``
    statement: see the module's docstring), then the caller's own again."""
    row = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
    previous = str(row[0]) if row else "0"
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (CONCURRENT_LOCK_TIMEOUT,))
    try:
        yield
    finally:
        if not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", (previous,))


def execute(conn: psycopg.Connection[Any], statement: sql.Composable | str, params: Any = None) -> None:
    """Run one statement, retrying lock timeouts (the statement waited, nothing was changed). A
    ``CONCURRENTLY`` statement runs once under the long CONCURRENT_LOCK_TIMEOUT (see the module's
    docstring): what a failure of it leaves is the caller's to drop."""
    if runs_concurrently(conn, statement):
        with concurrent_lock_timeout(conn):
            conn.execute(statement, params)  # type: ignore[arg-type]
        return
    for attempt in lock_retries():
        with attempt:
            conn.execute(statement, params)  # type: ignore[arg-type]


def lock_retries() -> Any:
    """Attempts for a transaction of several statements that must each wait briefly for their locks:
    ``for attempt in lock_retries(): with attempt, conn.transaction(): ...`` runs the whole
    transaction again after a lock timeout (it was rolled back, nothing was changed)."""
    return retrying.lock_timeouts(attempts=LOCK_RETRIES, first_s=0.05, max_s=2.0)


def build_index(
    conn: psycopg.Connection[Any],
    c: Collection,
    name: str,
    definition: sql.Composable,
    *,
    partition_name: Callable[[int], str],
) -> None:
    """``CREATE INDEX name ON <table> <definition>`` online, on an autocommit connection.

    ``definition`` is what follows the table (``USING gin (...)``); ``partition_name(i)`` names the
    index of partition ``i`` of a partitioned collection. Idempotent: an invalid index left by an
    interrupted build is dropped and built again."""
    if c.partitions == 1:
        build_table_index(conn, name, c.table, definition)
        return
    execute(
        conn,
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON ONLY {t} {d}").format(
            i=sql.Identifier(name), t=c.table, d=definition
        ),
    )
    for i, part in enumerate(c.partition_tables()):
        child = partition_name(i)
        build_table_index(conn, child, sql.Identifier(part), definition)
        if not _attached(conn, name, child):
            execute(
                conn, sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(sql.Identifier(name), sql.Identifier(child))
            )


def build_table_index(
    conn: psycopg.Connection[Any], name: str, table: sql.Composable, definition: sql.Composable
) -> None:
    """``CREATE INDEX CONCURRENTLY name ON table definition`` on a plain table (autocommit ``conn``);
    idempotent as ``build_index``."""
    valid = index_valid(conn, name)
    if valid:
        return
    if valid is not None:  # an interrupted concurrent build leaves an invalid index behind
        drop_index(conn, name, partitioned=False)
    try:
        execute(
            conn,
            sql.SQL("CREATE INDEX CONCURRENTLY {i} ON {t} {d}").format(i=sql.Identifier(name), t=table, d=definition),
        )
    except BaseException:
        drop_invalid(conn, name)
        raise


def drop_invalid(conn: psycopg.Connection[Any], name: str) -> None:
    """Drop ``name`` if it is an INVALID index, what a failed concurrent build leaves (every write to
    the table keeps maintaining it). Best effort, once and under the caller's own lock timeout (a
    transaction still open keeps the drop waiting): the next build of it drops it otherwise."""
    try:
        if index_valid(conn, name) is False:
            conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    except Exception as exc:  # never hide the build's own error
        log.warning("could not drop the invalid index %s yet: %s", name, exc)


def index_valid(conn: psycopg.Connection[Any], name: str) -> bool | None:
    """True/False for an existing index's validity; None when there is no such index."""
    row = conn.execute(
        "SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = to_regclass(%s)",
        (sql.Identifier(name).as_string(conn),),
    ).fetchone()
    return None if row is None else bool(row[0])


def _attached(conn: psycopg.Connection[Any], parent: str, child: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM pg_inherits WHERE inhparent = to_regclass(%s) AND inhrelid = to_regclass(%s)",
        (sql.Identifier(parent).as_string(conn), sql.Identifier(child).as_string(conn)),
    ).fetchone()
    return row is not None


def drop_index(conn: psycopg.Connection[Any], name: str, *, partitioned: bool) -> None:
    """Drop an index if it exists. A partitioned index cannot be dropped concurrently; the short
    lock_timeout bounds the stall."""
    concurrently = sql.SQL("") if partitioned else sql.SQL("CONCURRENTLY ")
    execute(conn, sql.SQL("DROP INDEX {}IF EXISTS {}").format(concurrently, sql.Identifier(name)))


def rename_index(conn: psycopg.Connection[Any], old: str, new: str) -> None:
    execute(conn, sql.SQL("ALTER INDEX {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(new)))
