"""The vector extension and the registry tables: collections, ingest queue, maintenance history.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute(
        """
        CREATE TABLE memstore_collections (
            id                   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            name                 text NOT NULL UNIQUE CHECK (name ~ '^[a-z][a-z0-9_]{0,47}$'),
            table_name           text NOT NULL UNIQUE,
            dimensions           integer NOT NULL CHECK (dimensions BETWEEN 1 AND 16000),
            metric               text NOT NULL CHECK (metric IN ('cosine', 'l2', 'inner_product')),
            hnsw_m               integer NOT NULL CHECK (hnsw_m BETWEEN 2 AND 100),
            hnsw_ef_construction integer NOT NULL CHECK (hnsw_ef_construction BETWEEN 4 AND 1000),
            default_ef_search    integer NOT NULL CHECK (default_ef_search BETWEEN 1 AND 1000),
            partitions           integer NOT NULL DEFAULT 1 CHECK (partitions BETWEEN 1 AND 256),
            model                text,
            options              jsonb NOT NULL DEFAULT '{}'::jsonb,
            created_at           timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    # The durable ingest queue: a row per item waiting for its vector. The item row itself (with the
    # original bytes) lives in the collection's table; this row is what workers claim.
    op.execute(
        """
        CREATE TABLE memstore_ingest_queue (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection_id integer NOT NULL REFERENCES memstore_collections (id) ON DELETE CASCADE,
            item_id       bigint NOT NULL,
            status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'failed')),
            priority      smallint NOT NULL DEFAULT 1,
            attempts      integer NOT NULL DEFAULT 0,
            last_error    text,
            not_before    timestamptz NOT NULL DEFAULT now(),
            enqueued_at   timestamptz NOT NULL DEFAULT now(),
            UNIQUE (collection_id, item_id)
        )
        """
    )
    op.execute(
        "CREATE INDEX memstore_ingest_queue_ready ON memstore_ingest_queue (priority, not_before) "
        "WHERE status = 'pending'"
    )
    # Query vectors sampled by the API, so recall probes measure the searches users really run.
    op.execute(
        """
        CREATE TABLE memstore_query_samples (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection_id integer NOT NULL REFERENCES memstore_collections (id) ON DELETE CASCADE,
            embedding     vector NOT NULL,
            sampled_at    timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX memstore_query_samples_recent ON memstore_query_samples (collection_id, id DESC)")
    # Maintenance history. Rows keep the collection's name so they outlive a dropped collection.
    op.execute(
        """
        CREATE TABLE memstore_maintenance_probes (
            id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection         text NOT NULL,
            partition_table    text NOT NULL,
            index_name         text,
            taken_at           timestamptz NOT NULL DEFAULT now(),
            live_rows          bigint,
            dead_rows          bigint,
            churn_since_rebuild bigint,
            index_bytes        bigint,
            fresh_index_bytes  bigint,
            invalid_indexes    integer NOT NULL DEFAULT 0,
            recall             double precision,
            recall_k           integer,
            recall_sample      integer,
            ef_search          integer,
            duration_s         double precision,
            recommendation     text,
            details            jsonb NOT NULL DEFAULT '{}'::jsonb
        )
        """
    )
    op.execute(
        "CREATE INDEX memstore_maintenance_probes_by_table ON memstore_maintenance_probes "
        "(partition_table, taken_at DESC)"
    )
    op.execute(
        """
        CREATE TABLE memstore_maintenance_actions (
            id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection      text NOT NULL,
            partition_table text NOT NULL,
            index_name      text,
            action          text NOT NULL,
            reason          text NOT NULL,
            started_at      timestamptz NOT NULL DEFAULT now(),
            finished_at     timestamptz,
            duration_s      double precision,
            outcome         text NOT NULL DEFAULT 'running'
                            CHECK (outcome IN ('running', 'ok', 'failed', 'skipped', 'interrupted')),
            before          jsonb NOT NULL DEFAULT '{}'::jsonb,
            after           jsonb NOT NULL DEFAULT '{}'::jsonb,
            error           text
        )
        """
    )
    op.execute(
        "CREATE INDEX memstore_maintenance_actions_by_table ON memstore_maintenance_actions "
        "(partition_table, started_at DESC)"
    )


def downgrade() -> None:
    for table in (
        "memstore_maintenance_actions",
        "memstore_maintenance_probes",
        "memstore_query_samples",
        "memstore_ingest_queue",
        "memstore_collections",
    ):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
