"""Embedding spaces: more than one vector per item, each space in a side table of its own.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

A collection's first space, ``default``, is the ``embedding`` column of its table, as before. Every
other space is a row of ``memstore_spaces`` and a table ``c<collection id>_s<space id>`` of
``(id, embedding)`` with its own HNSW index (docs/spaces.md says why a side table and not a column).

The ingest queue gains ``space_id`` (0: the item's own vector, as every queued row was so far): a
space is filled through the same durable queue, claims and retries as a new item. The trigger
function below keeps a collection's spaces in step with its items: an item whose original changes
loses its stale vectors and is queued again for each space; a deleted item's vectors go with it.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE memstore_spaces (
            id                   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection_id        integer NOT NULL REFERENCES memstore_collections (id) ON DELETE CASCADE,
            name                 text NOT NULL CHECK (name ~ '^[a-z][a-z0-9_]{0,31}$' AND name <> 'default'),
            model                text NOT NULL,
            pretrained           text,
            dimensions           integer NOT NULL CHECK (dimensions BETWEEN 1 AND 2000),
            metric               text NOT NULL,
            hnsw_m               integer NOT NULL,
            hnsw_ef_construction integer NOT NULL,
            default_ef_search    integer NOT NULL,
            table_name           text NOT NULL UNIQUE,
            state                text NOT NULL DEFAULT 'filling' CHECK (state IN ('filling', 'ready')),
            queued_through       bigint NOT NULL DEFAULT 0,
            queued_at            timestamptz,
            ready_at             timestamptz,
            created_at           timestamptz NOT NULL DEFAULT now(),
            UNIQUE (collection_id, name)
        )
        """
    )
    # Plain DDL on the queue: it holds the rows waiting for a worker, small by design.
    op.execute("ALTER TABLE memstore_ingest_queue ADD COLUMN space_id integer NOT NULL DEFAULT 0")
    op.execute("ALTER TABLE memstore_ingest_queue DROP CONSTRAINT memstore_ingest_queue_collection_id_item_id_key")
    op.execute(
        "ALTER TABLE memstore_ingest_queue ADD CONSTRAINT memstore_ingest_queue_item_space "
        "UNIQUE (collection_id, item_id, space_id)"
    )
    # TG_ARGV[0]: the collection's id. New originals are queued for each space at the normal ingest
    # priority; the first fill of a space queues at the bulk priority below them.
    op.execute(
        """
        CREATE FUNCTION memstore_spaces_sync() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            s record;
        BEGIN
            FOR s IN SELECT id, table_name FROM memstore_spaces WHERE collection_id = TG_ARGV[0]::integer LOOP
                IF TG_OP <> 'INSERT' THEN
                    EXECUTE format('DELETE FROM %I WHERE id = $1', s.table_name) USING OLD.id;
                END IF;
                IF TG_OP <> 'DELETE' AND (NEW.text IS NOT NULL OR NEW.content IS NOT NULL) THEN
                    INSERT INTO memstore_ingest_queue (collection_id, item_id, space_id, priority)
                    VALUES (TG_ARGV[0]::integer, NEW.id, s.id, 1)
                    ON CONFLICT (collection_id, item_id, space_id) DO UPDATE SET
                        status = 'pending', attempts = 0, last_error = NULL, not_before = now(),
                        enqueued_at = now(), claimed_by = NULL, claimed_at = NULL, priority = 1;
                END IF;
            END LOOP;
            RETURN NULL;
        END
        $$
        """
    )


def downgrade() -> None:
    tables = op.get_bind().exec_driver_sql("SELECT table_name FROM memstore_spaces").fetchall()
    for (table,) in tables:
        op.execute(f'DROP TABLE IF EXISTS "{table}"')
    op.execute(
        "DO $$ DECLARE t record; BEGIN FOR t IN SELECT tgrelid::regclass AS rel, tgname FROM pg_trigger "
        "WHERE tgname = 'memstore_spaces_sync' AND tgparentid = 0 LOOP "
        "EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.rel); END LOOP; END $$"
    )
    op.execute("DROP FUNCTION IF EXISTS memstore_spaces_sync()")
    op.execute("DELETE FROM memstore_ingest_queue WHERE space_id <> 0")
    op.execute("ALTER TABLE memstore_ingest_queue DROP CONSTRAINT memstore_ingest_queue_item_space")
    op.execute("ALTER TABLE memstore_ingest_queue DROP COLUMN space_id")
    op.execute(
        "ALTER TABLE memstore_ingest_queue ADD CONSTRAINT memstore_ingest_queue_collection_id_item_id_key "
        "UNIQUE (collection_id, item_id)"
    )
    op.execute("DROP TABLE memstore_spaces")
    op.execute("UPDATE memstore_collections SET options = options - 'active_space'")
