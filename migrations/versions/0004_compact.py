"""Compact index representations: versioned low-rank projections and the SQL that applies them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

``memstore_projections`` keeps every fitted projection of a collection (components, offsets, what it
kept of the sample's variance), versioned per collection. ``memstore_project`` applies one to a
vector; ``memstore_compact_sync`` is the statement-level trigger that keeps a collection's side table
of projected vectors in step with every write, whichever code path made it (store, ingest queue, SQL).
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE memstore_projections (
            id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            collection_id integer NOT NULL REFERENCES memstore_collections (id) ON DELETE CASCADE,
            version       integer NOT NULL CHECK (version >= 1),
            rank          integer NOT NULL CHECK (rank BETWEEN 1 AND 4000),
            dimensions    integer NOT NULL,
            unit_norm     boolean NOT NULL,
            components    vector[] NOT NULL,
            offsets       real[] NOT NULL,
            sample_rows   integer NOT NULL,
            kept_variance double precision,
            status        text NOT NULL DEFAULT 'building'
                          CHECK (status IN ('building', 'active', 'retired', 'failed')),
            fitted_at     timestamptz NOT NULL DEFAULT now(),
            activated_at  timestamptz,
            retired_at    timestamptz,
            details       jsonb NOT NULL DEFAULT '{}'::jsonb,
            UNIQUE (collection_id, version)
        )
        """
    )
    # Components are float data: compression only costs time, and the trigger reads them per statement.
    op.execute("ALTER TABLE memstore_projections ALTER COLUMN components SET STORAGE EXTERNAL")
    # PL/pgSQL detoasts x once on entry; `x <#> c` is pgvector's (negative) inner product in C.
    op.execute(
        """
        CREATE FUNCTION memstore_project(x vector, comps vector[], offs real[], unit boolean)
        RETURNS halfvec LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
        DECLARE
            n integer := cardinality(comps);
            res real[] := array_fill(0::real, ARRAY[n]);
        BEGIN
            IF unit THEN
                x := l2_normalize(x);
            END IF;
            FOR i IN 1 .. n LOOP
                res[i] := -(x <#> comps[i]) - offs[i];
            END LOOP;
            RETURN res::halfvec;
        END
        $$
        """
    )
    # One trigger per (side table, projection) and event; set-based over the statement's transition
    # tables, so a 5,000-row COPY upsert costs one INSERT into the side table, not 5,000.
    op.execute(
        """
        CREATE FUNCTION memstore_compact_sync() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            side text := TG_ARGV[0];
            pid bigint := TG_ARGV[1]::bigint;
            cs vector[];
            os real[];
            nz boolean;
        BEGIN
            IF TG_OP = 'DELETE' THEN
                EXECUTE format('DELETE FROM %I s USING old_rows o WHERE s.id = o.id', side);
                RETURN NULL;
            END IF;
            SELECT components, offsets, unit_norm INTO STRICT cs, os, nz FROM memstore_projections WHERE id = pid;
            IF TG_OP = 'INSERT' THEN
                EXECUTE format(
                    'INSERT INTO %I AS s (id, v) SELECT id, memstore_project(embedding, $1, $2, $3) '
                    'FROM new_rows WHERE embedding IS NOT NULL '
                    'ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v', side) USING cs, os, nz;
            ELSE
                EXECUTE format(
                    'DELETE FROM %I s USING new_rows n WHERE s.id = n.id AND n.embedding IS NULL', side);
                EXECUTE format(
                    'INSERT INTO %I AS s (id, v) SELECT n.id, memstore_project(n.embedding, $1, $2, $3) '
                    'FROM new_rows n JOIN old_rows o ON o.id = n.id '
                    'WHERE n.embedding IS NOT NULL AND n.embedding IS DISTINCT FROM o.embedding '
                    'ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v', side) USING cs, os, nz;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )


def downgrade() -> None:
    # CASCADE also drops the triggers of any collection still using a low-rank index.
    op.execute("DROP FUNCTION IF EXISTS memstore_compact_sync() CASCADE")
    op.execute("DROP FUNCTION IF EXISTS memstore_project(vector, vector[], real[], boolean) CASCADE")
    op.execute("DROP TABLE IF EXISTS memstore_projections CASCADE")
