"""Text read in images (OCR): where each item keeps it, the keywords that include it, and the trigger
that marks new images of a collection with OCR on.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

Every collection table gets ``ocr_status``, ``ocr_text`` and ``ocr_error`` (nullable columns without a
default: a catalog change, no rewrite) and a partial index on its pending items, built
``CONCURRENTLY`` outside the migration's transaction while searches and writes go on. OCR stays off
until a collection asks for it (``memstore.ocr_items``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from alembic import op
from psycopg import sql

from memstore import ocr_items, online_ddl
from memstore.collections import Collection

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

LIMIT = 100_000  # as revision 0008's bound on every text the keywords parse

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
        CREATE OR REPLACE FUNCTION {ocr_items.TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
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
        online_ddl.set_lock_timeout(conn)
        for c in collections:
            online_ddl.execute(
                conn,
                sql.SQL(
                    "ALTER TABLE {} ADD COLUMN IF NOT EXISTS ocr_status text, "
                    "ADD COLUMN IF NOT EXISTS ocr_text text, ADD COLUMN IF NOT EXISTS ocr_error text"
                ).format(c.table),
            )
            ocr_items.build_pending_index(conn, c)


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
        online_ddl.set_lock_timeout(conn)
        for c in collections:
            for i in range(c.partitions if c.partitions > 1 else 0):
                online_ddl.drop_index(conn, ocr_items.pending_partition_index_name(c, i), partitioned=False)
            online_ddl.drop_index(conn, ocr_items.pending_index_name(c), partitioned=c.partitions > 1)
            trigger = sql.Identifier(ocr_items.TRIGGER)
            online_ddl.execute(conn, sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(trigger, c.table))
            online_ddl.execute(
                conn,
                sql.SQL(
                    "ALTER TABLE {} DROP COLUMN IF EXISTS ocr_status, DROP COLUMN IF EXISTS ocr_text, "
                    "DROP COLUMN IF EXISTS ocr_error"
                ).format(c.table),
            )
    op.execute(f"DROP FUNCTION IF EXISTS {ocr_items.TRIGGER}()")
    op.execute("DROP FUNCTION IF EXISTS memstore_keywords(text, jsonb, text[], regconfig, text)")
    op.execute("UPDATE memstore_collections SET options = options - 'ocr' - 'ocr_backfill'")


def _collections(conn: psycopg.Connection[Any]) -> list[Collection]:
    """The collections as this revision knows them (its own column list)."""
    rows = conn.execute(
        "SELECT id, name, table_name, dimensions, metric, hnsw_m, hnsw_ef_construction, default_ef_search, "
        "partitions FROM memstore_collections ORDER BY id"
    ).fetchall()
    return [
        Collection(
            id=r[0], name=r[1], table_name=r[2], dimensions=r[3], metric=r[4], hnsw_m=r[5],
            hnsw_ef_construction=r[6], default_ef_search=r[7], partitions=r[8],
        )
        for r in rows
    ]  # fmt: skip


def _psycopg(bind: Any) -> psycopg.Connection[Any]:
    return bind.connection.driver_connection
