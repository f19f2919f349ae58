"""The search servers' shares of capacity for background work, for the processes that run it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

A process that answers searches (``memstore serve``, kind ``search``) writes the share its foreground
controller set (``memstore.services.foreground_signal``); ``memstore worker`` and the maintenance
daemon, which answer none, follow the lowest fresh share, and write (kind ``background``) when they
last did work, so that a search server's idle baseline leaves out the windows in which they worked.
UNLOGGED: a signal a second old, rewritten every second or so,
needs no WAL and nothing after a crash (a lost row reads as "no search server": full speed). Carries
its own DDL: it imports nothing from the project.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE UNLOGGED TABLE IF NOT EXISTS memstore_foreground ("
        " source text PRIMARY KEY,"
        " kind text NOT NULL DEFAULT 'search' CHECK (kind IN ('search', 'background')),"
        " share real NOT NULL CHECK (share >= 0 AND share <= 1),"
        " search_p99_ms real,"
        " target_p99_ms real,"
        " worked_at timestamptz,"
        " updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS memstore_foreground")
