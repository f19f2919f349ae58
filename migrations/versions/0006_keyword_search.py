"""Keyword search: each collection's text-search configuration and keyword fields, the function that
makes an item's keywords, and a GIN index on them for every existing collection.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

The index is on an expression, not on a stored column (see ``memstore.keywords``), so existing rows
are never rewritten: each collection's index is built ``CONCURRENTLY`` (partition by partition),
outside the migration's transaction, while searches and writes go on.
"""

from __future__ import annotations

from typing import Any

import psycopg
from alembic import op
from psycopg import sql

from memstore import online_ddl
from memstore.collections import Collection

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


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
        online_ddl.set_lock_timeout(conn)
        for c in collections:
            _build_index(conn, c)
            _no_pending_list(conn, c)


def downgrade() -> None:
    conn = _psycopg(op.get_bind())
    collections = _collections(conn)
    with op.get_context().autocommit_block():
        online_ddl.set_lock_timeout(conn)
        for c in collections:
            for part in c.partition_tables() if c.partitions > 1 else []:
                online_ddl.drop_index(conn, f"{part}_keywords", partitioned=False)
            online_ddl.drop_index(conn, f"{c.table_name}_keywords", partitioned=c.partitions > 1)
    op.execute("DROP FUNCTION IF EXISTS memstore_keywords(text, jsonb, text[], regconfig) CASCADE")
    op.execute("ALTER TABLE memstore_collections DROP COLUMN IF EXISTS text_fields")
    op.execute("ALTER TABLE memstore_collections DROP COLUMN IF EXISTS language")


def _build_index(conn: psycopg.Connection[Any], c: Collection) -> None:
    """The keyword index as this revision defined it: GIN on the keywords expression (revision 0012
    replaced it with stored keywords)."""
    words = sql.SQL("memstore_keywords(text, metadata, {fields}::text[], {cfg}::regconfig)").format(
        fields=sql.Literal(list(c.text_fields)), cfg=sql.Literal(c.language)
    )
    parts = c.partition_tables()
    online_ddl.build_index(
        conn,
        c,
        f"{c.table_name}_keywords",
        sql.SQL("USING gin (({})) WITH (fastupdate = off)").format(words),
        partition_name=lambda i: f"{parts[i]}_keywords",
    )


def _no_pending_list(conn: psycopg.Connection[Any], c: Collection) -> None:
    """The metadata index without GIN's pending list, as new collections have it (see
    ``memstore.keywords``): a quick catalog change, then the list merged into the tree."""
    for (index,) in conn.execute(
        "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
        "JOIN pg_am am ON am.oid = x.relam WHERE am.amname = 'gin' AND x.relkind = 'i' "
        "AND i.indrelid = ANY(%s::regclass[])",
        (c.partition_tables(),),
    ).fetchall():
        online_ddl.execute(conn, sql.SQL("ALTER INDEX {} SET (fastupdate = off)").format(sql.SQL(index)))
        conn.execute("SELECT gin_clean_pending_list(%s::regclass)", (index,))


def _collections(conn: psycopg.Connection[Any]) -> list[Collection]:
    """The collections as this revision knows them (its own column list: a later revision's columns
    do not exist yet when this one runs)."""
    rows = conn.execute(
        "SELECT id, name, table_name, dimensions, metric, hnsw_m, hnsw_ef_construction, default_ef_search, "
        "partitions, language, text_fields FROM memstore_collections ORDER BY id"
    ).fetchall()
    return [
        Collection(
            id=r[0], name=r[1], table_name=r[2], dimensions=r[3], metric=r[4], hnsw_m=r[5],
            hnsw_ef_construction=r[6], default_ef_search=r[7], partitions=r[8], language=r[9], text_fields=r[10],
        )
        for r in rows
    ]  # fmt: skip


def _psycopg(bind: Any) -> psycopg.Connection[Any]:
    return bind.connection.driver_connection
