"""Keyword search: each collection's text-search configuration and keyword fields, the function that
makes an item's keywords, and a GIN index on them for every existing collection.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

The index is on an expression, not on a stored column (see ``memstore.keywords``), so existing rows
are never rewritten: each collection's index is built ``CONCURRENTLY`` (partition by partition),
outside the migration's transaction, while searches and writes go on.

Frozen: this revision imports nothing from ``memstore``; the DDL it runs and the little online-DDL
logic it needs (a short lock timeout with retries, the ``ON ONLY`` recipe for partitioned tables) are
written here, as they were when it was made.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import psycopg
from alembic import op
from psycopg import sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Every statement that takes a lock readers or writers could queue behind waits at most this long and
# is retried (it changed nothing), so the migration costs searches at most that wait.
LOCK_TIMEOUT = "500ms"
LOCK_RETRIES = 120


class _Collection(NamedTuple):
    """What this revision reads of a collection."""

    table_name: str
    partitions: int
    language: str
    text_fields: list[str]

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(self.table_name)

    def partition_tables(self) -> list[str]:
        """The tables that hold rows: the table itself, or each of its partitions."""
        if self.partitions == 1:
            return [self.table_name]
        return [f"{self.table_name}_p{i}" for i in range(self.partitions)]


def upgrade() -> None:
    # Re-runnable: the columns and the function are committed before the indexes are built outside
    # the transaction, so a build that fails leaves them behind for the next run.
    op.execute("ALTER TABLE memstore_collections ADD COLUMN IF NOT EXISTS language text NOT NULL DEFAULT 'simple'")
    op.execute("ALTER TABLE memstore_collections ADD COLUMN IF NOT EXISTS text_fields text[] NOT NULL DEFAULT '{}'")
    # IMMUTABLE holds: to_tsvector with an explicit configuration, jsonpath and regexp_replace are,
    # and an index on the expression needs it. Weights: the file name and the listed fields (A) over
    # the text (B) over the parts of identifiers (D), which ts_rank_cd scores 1.0, 0.4 and 0.1.
    op.execute(
        r"""
        CREATE OR REPLACE FUNCTION memstore_keywords(body text, metadata jsonb, fields text[], config regconfig)
        RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT setweight(to_tsvector(config, concat_ws(' ', metadata ->> 'filename', named.words)), 'A')
                || setweight(to_tsvector(config, coalesce(body, '')), 'B')
                || setweight(to_tsvector(config, regexp_replace(
                       concat_ws(' ', metadata ->> 'filename', named.words, body), '[[:punct:]]+', ' ', 'g')), 'D')
            FROM (
                SELECT string_agg(v #>> '{}', ' ') AS words
                FROM unnest(fields) AS f(name), jsonb_path_query(
                    metadata -> f.name, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v
            ) AS named
        $$
        """
    )
    conn = _psycopg(op.get_bind())
    collections = _collections(conn)
    with op.get_context().autocommit_block():
        _set_lock_timeout(conn)
        for c in collections:
            _build_index(conn, c)
            _no_pending_list(conn, c)


def downgrade() -> None:
    conn = _psycopg(op.get_bind())
    collections = _collections(conn)
    with op.get_context().autocommit_block():
        _set_lock_timeout(conn)
        for c in collections:
            for part in c.partition_tables() if c.partitions > 1 else []:
                _drop_index(conn, f"{part}_keywords", partitioned=False)
            _drop_index(conn, f"{c.table_name}_keywords", partitioned=c.partitions > 1)
    op.execute("DROP FUNCTION IF EXISTS memstore_keywords(text, jsonb, text[], regconfig) CASCADE")
    op.execute("ALTER TABLE memstore_collections DROP COLUMN IF EXISTS text_fields")
    op.execute("ALTER TABLE memstore_collections DROP COLUMN IF EXISTS language")


def _build_index(conn: psycopg.Connection[Any], c: _Collection) -> None:
    """The keyword index as this revision defined it: GIN on the keywords expression (revision 0012
    replaced it with stored keywords)."""
    words = sql.SQL("memstore_keywords(text, metadata, {fields}::text[], {cfg}::regconfig)").format(
        fields=sql.Literal(list(c.text_fields)), cfg=sql.Literal(c.language)
    )
    parts = c.partition_tables()
    _build_online(
        conn,
        c,
        f"{c.table_name}_keywords",
        sql.SQL("USING gin (({})) WITH (fastupdate = off)").format(words),
        partition_name=lambda i: f"{parts[i]}_keywords",
    )


def _no_pending_list(conn: psycopg.Connection[Any], c: _Collection) -> None:
    """The metadata index without GIN's pending list, as new collections have it (see
    ``memstore.keywords``): a quick catalog change, then the list merged into the tree."""
    for (index,) in conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
        "JOIN pg_am am ON am.oid = x.relam WHERE am.amname = 'gin' AND x.relkind = 'i' "
        "AND i.indrelid = ANY(%s::regclass[])",
        (c.partition_tables(),),
    ).fetchall():
        _execute(conn, sql.SQL("ALTER INDEX {} SET (fastupdate = off)").format(sql.SQL(index)))
        conn.execute("SELECT gin_clean_pending_list(%s::regclass)", (index,))


def _collections(conn: psycopg.Connection[Any]) -> list[_Collection]:
    """The collections as this revision knows them (its own column list: a later revision's columns
    do not exist yet when this one runs)."""
    rows = conn.execute(
        "SELECT table_name, partitions, language, text_fields FROM memstore_collections ORDER BY id"
    ).fetchall()
    return [_Collection(table_name=r[0], partitions=r[1], language=r[2], text_fields=list(r[3])) for r in rows]


def _psycopg(bind: Any) -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] = bind.connection.driver_connection
    return conn


# Online DDL as this revision runs it, on the autocommit connection of ``autocommit_block``.


def _set_lock_timeout(conn: psycopg.Connection[Any]) -> None:
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))


def _execute(conn: psycopg.Connection[Any], statement: sql.Composed) -> None:
    """Run one statement, again after a pause (doubling from 50 ms, at most 2 s) each time it gave up
    waiting for its lock (it changed nothing)."""
    pause = 0.05
    for attempt in range(LOCK_RETRIES):
        try:
            conn.execute(statement)
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == LOCK_RETRIES - 1:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def _build_online(
    conn: psycopg.Connection[Any],
    c: _Collection,
    name: str,
    definition: sql.Composable,
    *,
    partition_name: Callable[[int], str],
) -> None:
    """``CREATE INDEX name ON <table> <definition>`` without stalling readers or writers: concurrently
    on a plain table; on a partitioned one, ``ON ONLY`` the parent, each partition's concurrently and
    attached (the parent's becomes valid with the last). Re-runnable: an invalid index left by an
    interrupted build is dropped and built again."""
    if c.partitions == 1:
        _build_table_index(conn, name, c.table, definition)
        return
    _execute(
        conn,
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON ONLY {t} {d}").format(
            i=sql.Identifier(name), t=c.table, d=definition
        ),
    )
    for i, part in enumerate(c.partition_tables()):
        child = partition_name(i)
        _build_table_index(conn, child, sql.Identifier(part), definition)
        attached = conn.execute(
            "SELECT 1 FROM pg_inherits WHERE inhparent = to_regclass(%s) AND inhrelid = to_regclass(%s)",
            (sql.Identifier(name).as_string(conn), sql.Identifier(child).as_string(conn)),
        ).fetchone()
        if attached is None:
            _execute(
                conn, sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(sql.Identifier(name), sql.Identifier(child))
            )


def _build_table_index(
    conn: psycopg.Connection[Any], name: str, table: sql.Composable, definition: sql.Composable
) -> None:
    row = conn.execute(
        "SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = to_regclass(%s)",
        (sql.Identifier(name).as_string(conn),),
    ).fetchone()
    if row is not None and row[0]:
        return
    if row is not None:  # an interrupted concurrent build leaves an invalid index behind
        _drop_index(conn, name, partitioned=False)
    _execute(
        conn,
        sql.SQL("CREATE INDEX CONCURRENTLY {i} ON {t} {d}").format(i=sql.Identifier(name), t=table, d=definition),
    )


def _drop_index(conn: psycopg.Connection[Any], name: str, *, partitioned: bool) -> None:
    """A partitioned index cannot be dropped concurrently; the short lock timeout bounds the stall."""
    concurrently = sql.SQL("") if partitioned else sql.SQL("CONCURRENTLY ")
    _execute(conn, sql.SQL("DROP INDEX {}IF EXISTS {}").format(concurrently, sql.Identifier(name)))
