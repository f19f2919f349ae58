"""SQL for items and search, kept apart from the store's argument checking."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.collections import Collection
from memstore.models import Item
from memstore.queue import jobs

ITEM_COLUMNS = (
    "id, external_id, status, metadata, text, content_type, content IS NOT NULL AS has_content, error, "
    "created_at, updated_at, ocr_status, ocr_text, ocr_error"  # the last three: memstore.catalog.ocr_items
)
SIZES_SQL = (
    "SELECT sum(pg_table_size(to_regclass(t))), sum(pg_indexes_size(to_regclass(t))) FROM unnest(%s::text[]) AS t"
)

# xmax cannot be read through a partitioned table, so a row made by this statement is told apart by
# its creation time: now() is the transaction's start, and the store runs one upsert per transaction.
# An upsert that would store exactly what is there already is skipped: no dead tuple, no index work.
# An update that left the vector, the text and the original as they were changed the metadata alone
# (PostgreSQL 18's RETURNING old.*, the row before the update; null for an insert).
_UPSERT_TAIL = """
    ON CONFLICT (external_id) DO UPDATE SET
        embedding = EXCLUDED.embedding, metadata = EXCLUDED.metadata, status = 'ready', error = NULL,
        text = EXCLUDED.text, content = NULL, content_type = NULL, thumbnail = NULL, updated_at = now()
    WHERE (t.embedding, t.metadata, t.status, t.text, t.content IS NULL)
          IS DISTINCT FROM (EXCLUDED.embedding, EXCLUDED.metadata, 'ready', EXCLUDED.text, true)
    RETURNING id, external_id, (t.created_at = now()) AS inserted,
        coalesce(old.embedding = new.embedding AND old.text IS NOT DISTINCT FROM new.text
                 AND old.content IS NULL AND old.status = 'ready', false) AS metadata_only
"""
_UPSERT_ONE = "INSERT INTO {} AS t (external_id, embedding, metadata, text, status) VALUES (%s, %s, %s, %s, 'ready')"
# memstore_stage2: the staging table's second shape (with the text); a session that made the first
# one before an upgrade keeps it, so the new shape needs a new name.
_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS memstore_stage2 (external_id text, embedding vector, metadata jsonb, text text) "
    "ON COMMIT DELETE ROWS"
)
_UPSERT_FROM_STAGE = (
    "INSERT INTO {} AS t (external_id, embedding, metadata, text, status) "
    "SELECT external_id, embedding, metadata, text, 'ready' FROM memstore_stage2"
)

Returned = dict[str, tuple[int, Any]]


def item_from_row(row: dict[str, Any]) -> Item:
    embedding = row.pop("embedding", None)
    vector = None if embedding is None else np.asarray(embedding.to_numpy(), dtype=np.float32)
    return Item(vector=vector, **row)


def _collect(rows: Sequence[tuple[Any, ...]]) -> Returned:
    return {
        eid: (int(rid), "created" if inserted else "metadata" if metadata_only else "updated")
        for rid, eid, inserted, metadata_only in rows
    }


def _forget_queued(conn: psycopg.Connection[Any], c: Collection, returned: Returned) -> None:
    """A vector written by the caller supersedes any embedding still queued for that item."""
    updated = [rid for rid, status in returned.values() if status in ("updated", "metadata")]
    jobs.unqueue(conn, c, updated)


def upsert(
    conn: psycopg.Connection[Any],
    c: Collection,
    ids: list[str],
    matrix: np.ndarray,
    metas: list[dict[str, Any]],
    texts: list[str | None],
    unique: list[int],
    *,
    bulk: bool,
) -> Returned:
    """Upsert rows ``unique`` (indices into ids/matrix/metas/texts); ``bulk`` stages them with COPY
    BINARY first."""
    with conn.cursor() as cur:
        if bulk:
            cur.execute(_STAGE)
            with cur.copy(
                "COPY memstore_stage2 (external_id, embedding, metadata, text) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "vector", "jsonb", "text"])
                for i in unique:
                    copy.write_row((ids[i], matrix[i], Jsonb(metas[i]), texts[i]))
            rows = cur.execute(sql.SQL(_UPSERT_FROM_STAGE + _UPSERT_TAIL).format(c.table)).fetchall()
        else:
            query = sql.SQL(_UPSERT_ONE + _UPSERT_TAIL).format(c.table)
            cur.executemany(query, [(ids[i], matrix[i], Jsonb(metas[i]), texts[i]) for i in unique], returning=True)
            rows = []
            while True:
                rows.extend(cur.fetchall())
                if not cur.nextset():
                    break
    returned = _collect(rows)
    _forget_queued(conn, c, returned)
    return returned
