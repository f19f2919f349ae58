"""SQL for items and search, kept apart from the store's argument checking."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.collections import Collection
from memstore.catalog.tables import id_sequence
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
# The id: the one given out for the row's place in the request, or for a batch of one the default.
_UPSERT_ONE = (
    "INSERT INTO {} AS t (id, external_id, embedding, metadata, text, status) "
    "VALUES (coalesce(%s, nextval({})), %s, %s, %s, %s, 'ready')"
)
# memstore_stage3: the staging table's third shape (with the text, then the id); a session that made
# an earlier one before an upgrade keeps it, so each new shape needs a new name. Rows are staged in
# the order they are written, which the INSERT keeps (a sequential scan of a table filled once).
_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS memstore_stage3 "
    "(id bigint, external_id text, embedding vector, metadata jsonb, text text) ON COMMIT DELETE ROWS"
)
_UPSERT_FROM_STAGE = (
    "INSERT INTO {} AS t (id, external_id, embedding, metadata, text, status) "
    "SELECT id, external_id, embedding, metadata, text, 'ready' FROM memstore_stage3"
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


def _ids_in_request_order(conn: psycopg.Connection[Any], c: Collection, unique: list[int]) -> dict[int, int | None]:
    """An id from the collection's sequence for each row of ``unique``, given out in the order of
    the rows' places in the request (their indices), so that a batch's new items are listed in the
    order they were sent while the rows are written in another. An INSERT ... ON CONFLICT takes a
    sequence value for every row it proposes, an existing one too; so does this."""
    if len(unique) == 1:
        return {unique[0]: None}  # one row: the table's default, in the INSERT itself
    taken = conn.execute(
        sql.SQL("SELECT nextval({}) FROM generate_series(1, %s)").format(sql.Literal(id_sequence(c))), (len(unique),)
    ).fetchall()
    return dict(zip(sorted(unique), (int(r[0]) for r in taken), strict=True))


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
    """Upsert rows ``unique`` (indices into ids/matrix/metas/texts), in that order; ``bulk`` stages
    them with COPY BINARY first. A new row's id follows its place in the request whatever the order
    rows are written in (``_ids_in_request_order``)."""
    row_ids = _ids_in_request_order(conn, c, unique)
    with conn.cursor() as cur:
        if bulk:
            cur.execute(_STAGE)
            with cur.copy(
                "COPY memstore_stage3 (id, external_id, embedding, metadata, text) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["int8", "text", "vector", "jsonb", "text"])
                for i in unique:
                    copy.write_row((row_ids[i], ids[i], matrix[i], Jsonb(metas[i]), texts[i]))
            rows = cur.execute(sql.SQL(_UPSERT_FROM_STAGE + _UPSERT_TAIL).format(c.table)).fetchall()
        else:
            query = sql.SQL(_UPSERT_ONE + _UPSERT_TAIL).format(c.table, sql.Literal(id_sequence(c)))
            params = [(row_ids[i], ids[i], matrix[i], Jsonb(metas[i]), texts[i]) for i in unique]
            cur.executemany(query, params, returning=True)
            rows = []
            while True:
                rows.extend(cur.fetchall())
                if not cur.nextset():
                    break
    returned = _collect(rows)
    _forget_queued(conn, c, returned)
    return returned
