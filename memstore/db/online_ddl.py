"""Online DDL on a collection's table: statements that never stall readers or writers for long.

Every statement that takes a lock readers or writers could queue behind runs under the caller's short
``lock_timeout`` and is retried, so a schema change costs searches at most that wait. Indexes are
built ``CONCURRENTLY``; a partitioned table cannot build one that way, so its index is made ``ON
ONLY`` the parent, each partition's is built concurrently and attached (PostgreSQL's own recipe),
and the parent's becomes valid once the last partition's is attached.

The compact index switch, the keyword index and the typed metadata indexes all build through here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from memstore.db import retrying

if TYPE_CHECKING:
    from memstore.catalog.collections import Collection
    from memstore.settings import Settings

LOCK_TIMEOUT = "500ms"
LOCK_RETRIES = 120


def build_resources(conn: psycopg.Connection[Any], settings: Settings) -> None:
    """Give ``conn``'s session the build memory (a graph that fits builds several times faster) and
    parallel workers ``settings`` name, so that every HNSW build (the maintenance worker's rebuilds, a
    bulk load's build, the benchmarks' baselines) gets the same."""
    conn.execute(
        "SELECT set_config('maintenance_work_mem', %s, false), "
        "set_config('max_parallel_maintenance_workers', %s, false)",
        (settings.maintenance_work_mem, str(settings.max_parallel_maintenance_workers)),
    )


def paced_build_workers(settings: Settings, share: float) -> int:
    """The parallel workers a build that starts now may take: the configured number scaled by the
    background's share of the machine (``memstore.workers.pacing``), so a build that starts while
    searches are slower than their target takes one core, not all of them. A build cannot be paused
    once it runs, and its workers are fixed when it starts."""
    full = settings.max_parallel_maintenance_workers
    return min(full, max(0, int(share * full)))


def set_build_workers(conn: psycopg.Connection[Any], workers: int) -> None:
    """The parallel workers of the session's next index builds."""
    conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, false)", (str(workers),))


def set_lock_timeout(conn: psycopg.Connection[Any]) -> None:
    """The short wait every statement of this module is written for (on the caller's connection)."""
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))


def execute(conn: psycopg.Connection[Any], statement: sql.Composable | str, params: Any = None) -> None:
    """Run one statement, retrying lock timeouts (the statement waited, nothing was changed)."""
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
    execute(
        conn,
        sql.SQL("CREATE INDEX CONCURRENTLY {i} ON {t} {d}").format(i=sql.Identifier(name), t=table, d=definition),
    )


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
