"""The REST API's tables: API keys, and claim columns on the ingest queue.

Revision ID: 0003
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Only a SHA-256 of each key is stored: keys are 192-bit random strings, so a fast hash is enough
    # (there is nothing to brute-force) and look-ups stay one index probe.
    op.execute(
        """
        CREATE TABLE memstore_api_keys (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name         text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
            prefix       text NOT NULL,
            key_hash     bytea NOT NULL UNIQUE,
            scopes       jsonb NOT NULL DEFAULT '[]'::jsonb,
            created_at   timestamptz NOT NULL DEFAULT now(),
            last_used_at timestamptz,
            revoked_at   timestamptz
        )
        """
    )
    op.execute("CREATE UNIQUE INDEX memstore_api_keys_active_name ON memstore_api_keys (name) WHERE revoked_at IS NULL")
    # A claimed row names its worker; the worker holds a session advisory lock on that number for as
    # long as it lives, so a row whose claimer died (lock released) can be taken over at once.
    op.execute("ALTER TABLE memstore_ingest_queue ADD COLUMN claimed_by bigint, ADD COLUMN claimed_at timestamptz")


def downgrade() -> None:
    op.execute("ALTER TABLE memstore_ingest_queue DROP COLUMN IF EXISTS claimed_by, DROP COLUMN IF EXISTS claimed_at")
    op.execute("DROP TABLE IF EXISTS memstore_api_keys")
