"""How many rows each collection table had their first vector written into, for the maintenance worker.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

A text or an image is stored before it is embedded (its vector NULL), and the ingest worker writes
the vector later with an UPDATE. PostgreSQL counts that update as any other: the row's old version
dies, and the maintenance worker read it as a dead element of the HNSW graph, which never held the
row (pgvector indexes no NULL). A collection that only grew showed a dead fraction of 1 and more, and
was rebuilt for nothing. The worker that writes a first vector now counts it here, per table (a
partition is a table), in the same transaction; the probes take those updates out of the dead
entries and the churn (``maintenance.probes``). Carries its own DDL: it imports nothing from the
project.
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE IF NOT EXISTS memstore_vector_fills ("
        " table_name text PRIMARY KEY,"
        " fills bigint NOT NULL CHECK (fills >= 0))"
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS memstore_vector_fills")
