"""The DDL of a new collection's table: columns, partitions, and every index and trigger it starts
with, each from the module that owns it (the vector index's representation, the keyword index, the
OCR columns' index and trigger)."""

from __future__ import annotations

from psycopg import sql

from memstore.catalog import index_spec as compact_spec
from memstore.catalog import keywords, ocr_items, segments
from memstore.catalog.collections import Collection

# The metadata filters' index (``@>`` containment), after its table.
METADATA_INDEX = sql.SQL("USING gin (metadata jsonb_path_ops) WITH (fastupdate = off)")


def metadata_index_name(c: Collection) -> str:
    return f"{c.table_name}_metadata"


def id_sequence(c: Collection) -> str:
    """The name of the sequence that gives the collection's rows their ids (its table's default)."""
    return f"{c.table_name}_id_seq"


def create_table_statements(c: Collection) -> list[sql.Composed]:
    """DDL for a new, empty collection (so a plain CREATE INDEX is fine: there is nothing to lock out)."""
    table = c.table
    seq = sql.Identifier(id_sequence(c))
    columns = sql.SQL(
        """
        id           bigint NOT NULL DEFAULT nextval({seq_text}),
        external_id  text NOT NULL,
        embedding    vector({dims}),
        metadata     jsonb NOT NULL DEFAULT '{{}}'::jsonb,
        status       text NOT NULL DEFAULT 'ready' CHECK (status IN ('pending', 'ready', 'failed')),
        error        text,
        text         text,
        content      bytea,
        content_type text,
        thumbnail    bytea,
        ocr_status   text,
        ocr_text     text,
        ocr_error    text,
        created_at   timestamptz NOT NULL DEFAULT now(),
        updated_at   timestamptz NOT NULL DEFAULT now()
        """
    ).format(seq_text=sql.Literal(id_sequence(c)), dims=sql.Literal(c.dimensions))
    hnsw_with = sql.SQL("WITH (m = {m}, ef_construction = {ef})").format(
        m=sql.Literal(c.hnsw_m), ef=sql.Literal(c.hnsw_ef_construction)
    )
    # The index holds the full vectors, or a compact form of them (a low-rank index needs rows to fit
    # a projection on, so a new collection starts with the full index and switches later).
    index = compact_spec.index_spec(c)
    representation = "full" if index.representation == "lowrank" else index.representation
    key = sql.SQL(compact_spec.key_expression(representation, c.dimensions))
    opclass = sql.SQL(compact_spec.opclass(representation, c.metric))
    out: list[sql.Composed] = [sql.SQL("CREATE SEQUENCE {}").format(seq)]
    if c.partitions == 1:
        out.append(
            sql.SQL("CREATE TABLE {t} ({cols}, PRIMARY KEY (id), UNIQUE (external_id))").format(t=table, cols=columns)
        )
        # A collection written as segments starts with no graph: its rows are the tail's until sealed.
        if not segments.segmented(c):
            out.append(
                sql.SQL("CREATE INDEX {i} ON {t} USING hnsw ({k} {ops}) {w}").format(
                    i=sql.Identifier(c.index_name), t=table, k=key, ops=opclass, w=hnsw_with
                )
            )
    else:
        # A unique constraint on a partitioned table must contain the partition key, so rows are
        # spread by external_id; ids come from one sequence and stay unique across partitions.
        out.append(
            sql.SQL("CREATE TABLE {t} ({cols}, UNIQUE (external_id)) PARTITION BY HASH (external_id)").format(
                t=table, cols=columns
            )
        )
        out += [
            sql.SQL("CREATE TABLE {p} PARTITION OF {t} FOR VALUES WITH (MODULUS {n}, REMAINDER {r})").format(
                p=sql.Identifier(part), t=table, n=sql.Literal(c.partitions), r=sql.Literal(i)
            )
            for i, part in enumerate(c.partition_tables())
        ]
        # Named per-partition indexes (maintenance rebuilds them one at a time), attached to the parent's.
        out.append(
            sql.SQL("CREATE INDEX {i} ON ONLY {t} USING hnsw ({k} {ops}) {w}").format(
                i=sql.Identifier(c.index_name), t=table, k=key, ops=opclass, w=hnsw_with
            )
        )
        for part in c.partition_tables():
            out += [
                sql.SQL("CREATE INDEX {i} ON {p} USING hnsw ({k} {ops}) {w}").format(
                    i=sql.Identifier(f"{part}_hnsw"), p=sql.Identifier(part), k=key, ops=opclass, w=hnsw_with
                ),
                sql.SQL("ALTER INDEX {parent} ATTACH PARTITION {child}").format(
                    parent=sql.Identifier(c.index_name), child=sql.Identifier(f"{part}_hnsw")
                ),
            ]
    if c.partitions > 1:
        # The primary key cannot be enforced across partitions; look-ups by id still need an index.
        out.append(sql.SQL("CREATE INDEX {i} ON {t} (id)").format(i=sql.Identifier(f"{c.table_name}_id"), t=table))
    if index.compact or index.pending:
        out.append(compact_spec.inline_vectors_statement(table))
    out += [
        # fastupdate off: see memstore.catalog.keywords._index_definition (a pending list slows every filtered search).
        sql.SQL("CREATE INDEX {i} ON {t} {d}").format(
            i=sql.Identifier(metadata_index_name(c)), t=table, d=METADATA_INDEX
        ),
        *keywords.create_statements(c),
        ocr_items.pending_index_statement(c),
        sql.SQL("ALTER SEQUENCE {s} OWNED BY {t}.id").format(s=seq, t=table),
    ]
    if c.ocr:
        out.append(ocr_items.trigger_statement(c))
    return out
