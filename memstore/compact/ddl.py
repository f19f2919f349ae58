"""Online DDL for compact indexes, on an autocommit connection of its own.

Every statement that takes a lock readers or writers could queue behind runs with a short
``lock_timeout`` and is retried, so a switch never stalls searches for more than that. Indexes are
built ``CONCURRENTLY`` (a partitioned table: an index ``ON ONLY`` the parent, each partition's built
concurrently and attached). A new index of the collection's table is built as ``memstore_next_c<id>…``
and renamed to the usual ``<table>_hnsw`` once the old one is gone, so maintenance keeps finding it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from typing import Any

import psycopg
from pgvector import Vector
from psycopg import sql

from memstore.catalog import index_spec as specs
from memstore.catalog.collections import Collection
from memstore.compact.projection import Projection
from memstore.db import locks, online_ddl
from memstore.db.core import Database

log = logging.getLogger(__name__)

FILL_BATCH_IDS = 20_000


class CompactBusyError(RuntimeError):
    """Another process is switching or refitting this collection's index."""


@contextlib.contextmanager
def connect(db: Database) -> Iterator[psycopg.Connection[Any]]:
    with db.dedicated(application_name="memstore-compact") as conn:
        online_ddl.set_lock_timeout(conn)
        yield conn


@contextlib.contextmanager
def collection_lock(conn: psycopg.Connection[Any], c: Collection, *, wait_s: float = 0.0) -> Iterator[None]:
    """One switch/refit per collection at a time (session-level advisory lock)."""
    busy = partial(CompactBusyError, f"another process is changing the index of collection {c.name!r}")
    with locks.session_lock(conn, locks.collection_key(c.id), busy=busy, wait_s=wait_s):
        yield


def _with(c: Collection) -> sql.Composed:
    return sql.SQL("WITH (m = {}, ef_construction = {})").format(
        sql.Literal(c.hnsw_m), sql.Literal(c.hnsw_ef_construction)
    )


# ---------------------------------------------------------------------- indexes of the collection's table


def build_next_index(conn: psycopg.Connection[Any], c: Collection, representation: str) -> None:
    """Build the collection's index for ``representation`` under the ``memstore_next_c<id>`` names."""
    definition = sql.SQL("USING hnsw ({k} {o}) {w}").format(
        k=sql.SQL(specs.key_expression(representation, c.dimensions)),
        o=sql.SQL(specs.opclass(representation, c.metric)),
        w=_with(c),
    )
    online_ddl.build_index(
        conn, c, specs.next_index(c.id), definition, partition_name=lambda i: specs.next_index(c.id, i)
    )


def promote_next_index(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Give the freshly built index the collection's usual index names (the old ones must be gone)."""
    renames = [(specs.next_index(c.id), c.index_name)]
    if c.partitions > 1:
        renames += [(specs.next_index(c.id, i), f"{part}_hnsw") for i, part in enumerate(c.partition_tables())]
    for old, new in renames:
        online_ddl.rename_index(conn, old, new)


def main_indexes(conn: psycopg.Connection[Any], c: Collection) -> list[dict[str, Any]]:
    """The HNSW indexes on the collection's table (the parent's, for a partitioned one)."""
    rows = conn.execute(
        """
        SELECT i.relname, x.indisvalid, pg_get_indexdef(x.indexrelid)
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am am ON am.oid = i.relam
        WHERE x.indrelid = to_regclass(%s) AND am.amname = 'hnsw'
        """,
        (c.table_name,),
    ).fetchall()
    return [{"name": r[0], "valid": bool(r[1]), "definition": r[2]} for r in rows]


def index_matches(definition: str, representation: str, metric: str) -> bool:
    return f" {specs.opclass(representation, metric)}" in definition


# ---------------------------------------------------------------------- the low-rank side table


def _triggers(c: Collection, p: Projection) -> list[sql.Composed]:
    table = specs.side_table(c.id, p.version)
    names = specs.trigger_names(p.version)
    out = []
    for event, name in names.items():
        refs = {"INSERT": "NEW TABLE AS new_rows", "UPDATE": "OLD TABLE AS old_rows NEW TABLE AS new_rows"}.get(
            event, "OLD TABLE AS old_rows"
        )
        out.append(
            sql.SQL(
                "CREATE TRIGGER {n} AFTER {e} ON {t} REFERENCING {r} FOR EACH STATEMENT "
                "EXECUTE FUNCTION memstore_compact_sync({side}, {pid})"
            ).format(
                n=sql.Identifier(name),
                e=sql.SQL(event),
                t=c.table,
                r=sql.SQL(refs),
                side=sql.Literal(table),
                pid=sql.Literal(str(p.id)),
            )
        )
    return out


def projection_params(p: Projection) -> dict[str, Any]:
    return {"comps": [Vector(v) for v in p.components], "offs": p.offsets.astype(float).tolist(), "nz": p.normalize}


def build_side(conn: psycopg.Connection[Any], c: Collection, p: Projection) -> None:
    """Side table of projections: created, kept in step by triggers, back-filled, then indexed."""
    table = sql.Identifier(specs.side_table(c.id, p.version))
    online_ddl.execute(
        conn,
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, v halfvec({}) NOT NULL)").format(
            table, sql.Literal(p.rank)
        ),
    )
    # Triggers first: every write from here on reaches the side table; the back-fill then covers the
    # rest (ON CONFLICT DO NOTHING: a row a trigger wrote meanwhile is newer than what the fill read).
    for statement in _triggers(c, p):
        online_ddl.execute(conn, statement)
    params = projection_params(p)
    bounds = conn.execute(sql.SQL("SELECT min(id), max(id) FROM {}").format(c.table)).fetchone()
    if bounds and bounds[0] is not None:
        fill = sql.SQL(
            "INSERT INTO {s} (id, v) SELECT id, memstore_project(embedding, %(comps)s, %(offs)s::real[], %(nz)s) "
            "FROM {t} WHERE id >= %(lo)s AND id < %(hi)s AND embedding IS NOT NULL ON CONFLICT (id) DO NOTHING"
        ).format(s=table, t=c.table)
        for lo in range(int(bounds[0]), int(bounds[1]) + 1, FILL_BATCH_IDS):
            online_ddl.execute(conn, fill, {**params, "lo": lo, "hi": lo + FILL_BATCH_IDS})
    # A row deleted (or emptied) while the fill ran may have been filled from the older snapshot.
    online_ddl.execute(
        conn,
        sql.SQL(
            "DELETE FROM {s} s WHERE NOT EXISTS (SELECT 1 FROM {t} m WHERE m.id = s.id AND m.embedding IS NOT NULL)"
        ).format(s=table, t=c.table),
    )
    online_ddl.execute(
        conn,
        sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {i} ON {s} USING hnsw (v {o}) {w}").format(
            i=sql.Identifier(specs.side_index(c.id, p.version)),
            s=table,
            o=sql.SQL(specs.opclass("lowrank", c.metric)),
            w=_with(c),
        ),
    )
    online_ddl.execute(conn, sql.SQL("ANALYZE {}").format(table))


def drop_side(conn: psycopg.Connection[Any], c: Collection, version: int) -> None:
    for name in specs.trigger_names(version).values():
        online_ddl.execute(conn, sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(name), c.table))
    online_ddl.execute(conn, sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(specs.side_table(c.id, version))))


def side_versions(conn: psycopg.Connection[Any], c: Collection) -> list[int]:
    """Versions that have a side table or triggers left in the database (whatever the registry says)."""
    prefix = f"memstore_lr_c{c.id}_v"
    tables = conn.execute(
        "SELECT relname FROM pg_class WHERE relkind = 'r' AND starts_with(relname, %s)", (prefix,)
    ).fetchall()
    triggers = conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND starts_with(tgname, 'memstore_lr_v')",
        (c.table_name,),
    ).fetchall()
    versions = {int(r[0][len(prefix) :]) for r in tables if r[0][len(prefix) :].isdigit()}
    versions |= {int(r[0].split("_")[2][1:]) for r in triggers}
    return sorted(versions)
