"""Text read in images (OCR): where each item keeps it, the keywords that include it, and the trigger
that marks new images of a collection with OCR on.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Every collection table gets ``ocr_status``, ``ocr_text`` and ``ocr_error`` (nullable columns without a
default: a catalog change, no rewrite) and a partial index on its pending items, built
``CONCURRENTLY`` outside the migration's transaction while searches and writes go on. OCR stays off
until a collection asks for it (``memstore.ocr_items``).

Frozen: this revision imports nothing from ``memstore``; the trigger function, the pending index and
the little online-DDL logic it needs (a short lock timeout with retries, the ``ON ONLY`` recipe for
partitioned tables) are written here, as they were when it was made.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from alembic import op
from psycopg import sql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

LIMIT = 100_000  # as revision 0008's bound on every text the keywords parse
# The function the trigger that marks new images pending runs (a collection installs the trigger, of
# the same name, when OCR is turned on).
TRIGGER = "memstore_ocr_mark"
# Each collection table's index on its pending items (``<table>_ocr_pending``; a partition's
# ``<partition>_ocr_pending``).
PENDING_INDEX = sql.SQL("USING btree (id) WHERE ocr_status = 'pending'")
# Every statement that takes a lock readers or writers could queue behind waits at most this long and
# is retried (it changed nothing), so the migration costs searches at most that wait.
LOCK_TIMEOUT = "500ms"
LOCK_RETRIES = 120

# The keywords of a collection with OCR on (kept as text: revision 0011's downgrade restores it).
KEYWORDS_WITH_SEEN = rf"""
        CREATE OR REPLACE FUNCTION memstore_keywords(body text, metadata jsonb, fields text[], config regconfig,
                                                     seen text)
        RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
            SELECT setweight(to_tsvector(config,
                       left(concat_ws(' ', metadata ->> 'filename', named.words), {LIMIT})), 'A')
                || setweight(to_tsvector(config, left(coalesce(body, ''), {LIMIT})), 'B')
                || setweight(to_tsvector(config, left(coalesce(seen, ''), {LIMIT})), 'C')
                || setweight(to_tsvector(config, regexp_replace(
                       left(concat_ws(' ', metadata ->> 'filename', named.words, body), {LIMIT}),
                       '[[:punct:]]+', ' ', 'g')), 'D')
            FROM (
                SELECT string_agg(v #>> '{{}}', ' ') AS words
                FROM unnest(fields) AS f(name), jsonb_path_query(
                    metadata -> f.name, 'strict $.** ? (@.type() == "string" || @.type() == "number")') AS v
            ) AS named
        $$
        """


def upgrade() -> None:
    # The keywords of a collection with OCR on: revision 0008's, and the text read in the image at
    # weight C (below the file name, the listed fields and the text; above the parts of identifiers).
    # The body repeats the four-argument function's rather than calling it: PostgreSQL evaluates index
    # expressions with search_path set to pg_catalog, where memstore_keywords cannot be found.
    op.execute(KEYWORDS_WITH_SEEN)
    # New content of an image is read again; anything else has nothing to read.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.ocr_status := CASE WHEN NEW.content IS NOT NULL AND NEW.content_type LIKE 'image/%' THEN 'pending' END;
            NEW.ocr_text := NULL;
            NEW.ocr_error := NULL;
            RETURN NEW;
        END
        $$
        """
    )
    conn = _psycopg(op.get_bind())
    collections = _collections(conn)
    # Re-runnable: the functions are committed first, the columns are added IF NOT EXISTS, and an
    # index build that stopped half way is dropped and built again.
    with op.get_context().autocommit_block():
        _set_lock_timeout(conn)
        for table, partitions in collections:
            _execute(
                conn,
                sql.SQL(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS ocr_status text, "
                    "ADD COLUMN IF NOT EXISTS ocr_text text, ADD COLUMN IF NOT EXISTS ocr_error text"
                ).format(sql.Identifier(table)),
            )
            _build_pending_index(conn, table, partitions)


def downgrade() -> None:
    conn = _psycopg(op.get_bind())
    on = conn.execute("SELECT name FROM memstore_collections WHERE (options ->> 'ocr')::boolean").fetchall()
    if on:
        # Their keyword indexes are built on the five-argument function: turn OCR off first.
        raise RuntimeError(
            "turn OCR off first (PATCH /v1/collections/{name} {'ocr': false}) for: " + ", ".join(r[0] for r in on)
        )
    collections = _collections(conn)
    with op.get_context().autocommit_block():
        _set_lock_timeout(conn)
        for table, partitions in collections:
            for part in _partition_tables(table, partitions) if partitions > 1 else []:
                _drop_index(conn, f"{part}_ocr_pending", partitioned=False)
            _drop_index(conn, f"{table}_ocr_pending", partitioned=partitions > 1)
            trigger = sql.Identifier(TRIGGER)
            _execute(conn, sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, sql.Identifier(table)))
            _execute(
                conn,
                sql.SQL(
                    "ALTER TABLE {} DROP COLUMN IF EXISTS ocr_status, DROP COLUMN IF EXISTS ocr_text, "
                    "DROP COLUMN IF EXISTS ocr_error"
                ).format(sql.Identifier(table)),
            )
    op.execute(f"DROP FUNCTION IF EXISTS {TRIGGER}()")
    op.execute("DROP FUNCTION IF EXISTS memstore_keywords(text, jsonb, text[], regconfig, text)")
    op.execute("UPDATE memstore_collections SET options = options - 'ocr' - 'ocr_backfill'")


def _collections(conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
    """Each collection's table and partition count (the columns this revision knows)."""
    rows = conn.execute("SELECT table_name, partitions FROM memstore_collections ORDER BY id").fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def _partition_tables(table: str, partitions: int) -> list[str]:
    """The tables that hold a collection's rows: its table, or each of its partitions."""
    return [table] if partitions == 1 else [f"{table}_p{i}" for i in range(partitions)]


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


def _build_pending_index(conn: psycopg.Connection[Any], table: str, partitions: int) -> None:
    """The pending items' index without stalling readers or writers: concurrently on a plain table; on
    a partitioned one, ``ON ONLY`` the parent, each partition's concurrently and attached (the
    parent's becomes valid with the last). Re-runnable: an invalid index left by an interrupted build
    is dropped and built again."""
    name = f"{table}_ocr_pending"
    if partitions == 1:
        _build_table_index(conn, name, table)
        return
    _execute(
        conn,
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON ONLY {t} {d}").format(
            i=sql.Identifier(name), t=sql.Identifier(table), d=PENDING_INDEX
        ),
    )
    for part in _partition_tables(table, partitions):
        child = f"{part}_ocr_pending"
        _build_table_index(conn, child, part)
        attached = conn.execute(
            "SELECT 1 FROM pg_inherits WHERE inhparent = to_regclass(%s) AND inhrelid = to_regclass(%s)",
            (sql.Identifier(name).as_string(conn), sql.Identifier(child).as_string(conn)),
        ).fetchone()
        if attached is None:
            _execute(
                conn, sql.SQL("ALTER INDEX {} ATTACH PARTITION {}").format(sql.Identifier(name), sql.Identifier(child))
            )


def _build_table_index(conn: psycopg.Connection[Any], name: str, table: str) -> None:
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
        sql.SQL("CREATE INDEX CONCURRENTLY {i} ON {t} {d}").format(
            i=sql.Identifier(name), t=sql.Identifier(table), d=PENDING_INDEX
        ),
    )


def _drop_index(conn: psycopg.Connection[Any], name: str, *, partitioned: bool) -> None:
    """A partitioned index cannot be dropped concurrently; the short lock timeout bounds the stall."""
    concurrently = sql.SQL("") if partitioned else sql.SQL("CONCURRENTLY ")
    _execute(conn, sql.SQL("DROP INDEX {}IF EXISTS {}").format(concurrently, sql.Identifier(name)))
