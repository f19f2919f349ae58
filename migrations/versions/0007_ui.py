"""The web pages: sessions, maintenance requests, and a thumbnail column on every collection table.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

The column is added empty. This revision once also made the thumbnails of the images already stored,
decoding each with the thumbnail code of the day; a revision is frozen (it imports nothing from
``memstore``, and so cannot decode images), so it adds the column only and the runtime fills it: the
ingest worker makes the thumbnail of every new image, and ``memstore.thumbnails.read`` makes and
stores a missing one the first time a ready image is viewed.
"""

from __future__ import annotations

from typing import Any

import psycopg
from alembic import op
from psycopg import sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only a hash of each session token is stored; a session dies with its key (revoked: the look-up
    # joins it; deleted: the cascade).
    op.execute(
        """
        CREATE TABLE memstore_ui_sessions (
            id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            token_hash bytea NOT NULL UNIQUE,
            key_id     bigint NOT NULL REFERENCES memstore_api_keys (id) ON DELETE CASCADE,
            created_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL
        )
        """
    )
    op.execute("CREATE INDEX memstore_ui_sessions_key ON memstore_ui_sessions (key_id)")
    # "Probe now" from the maintenance page: a row the maintenance worker takes (and deletes) between
    # passes, starting its next pass at once; durable, so a worker in another process sees it too.
    op.execute(
        """
        CREATE TABLE memstore_maintenance_requests (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection   text NOT NULL,
            requested_by text NOT NULL,
            requested_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    conn = _psycopg(op.get_bind())
    tables = _collection_tables(conn)
    for table in tables:
        # Nullable without a default: a catalogue change, no table rewrite; on a partitioned table
        # it reaches every partition.
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS thumbnail bytea").format(sql.Identifier(table)))


def downgrade() -> None:
    conn = _psycopg(op.get_bind())
    for table in _collection_tables(conn):
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS thumbnail").format(sql.Identifier(table)))
    op.execute("DROP TABLE IF EXISTS memstore_maintenance_requests")
    op.execute("DROP TABLE IF EXISTS memstore_ui_sessions")


def _collection_tables(conn: psycopg.Connection[Any]) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT table_name FROM memstore_collections ORDER BY id").fetchall()]


def _psycopg(bind: Any) -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] = bind.connection.driver_connection
    return conn
