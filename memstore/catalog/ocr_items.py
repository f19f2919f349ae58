"""Text read in a collection's images: which items wait for it, how it is written, and how turning OCR
on reaches the items already stored.

Every item table has ``ocr_status`` (``pending``, ``done``, ``failed``; NULL: never asked for),
``ocr_text`` and ``ocr_error`` (migration 0009), and a partial index on the pending ones, which is
what the OCR pass (``memstore.workers.ocr_pass``) reads. The registry records the setting in the collection's
options: ``ocr`` (on or off; the keyword index holds ``ocr_text`` exactly when it is on) and
``ocr_backfill`` (while items stored before OCR was turned on are still being reached: the last item
id looked at).

- New content: once OCR has been turned on, a trigger (``memstore_ocr_mark``, migration 0009) marks
  every image written into the table (inserted, or its content replaced) pending and clears what was
  read in the old content; text items and bare vectors get no OCR. The trigger stays when OCR is
  turned off, so text kept from before can never describe content that has changed since.
- Stored items: the backfill walks the table in id order a batch at a time, marking images that were
  never read pending, and moves its cursor in the same transaction: a crash anywhere loses nothing
  and repeats nothing. It marks a new batch only while few items wait, so the pending set stays small
  and new items are never stuck behind a whole collection.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog.collections import Collection
from memstore.catalog.registry import read_collection, set_option
from memstore.db import online_ddl

OPTION = "ocr"
BACKFILL = "ocr_backfill"
TRIGGER = "memstore_ocr_mark"
# Advisory transaction locks (namespace, collection id): one backfill step per collection at a time.
LOCK_NAMESPACE = 0x6D656D6F  # "memo"
BACKFILL_BATCH = 500
# The backfill marks another batch only while fewer items than this wait.
BACKFILL_LOW_WATER = 64


def pending_index_name(c: Collection) -> str:
    return f"{c.table_name}_ocr_pending"


def pending_partition_index_name(c: Collection, i: int) -> str:
    return f"{c.partition_tables()[i]}_ocr_pending"


PENDING_INDEX_DEFINITION = sql.SQL("USING btree (id) WHERE ocr_status = 'pending'")


def pending_index_statement(c: Collection) -> sql.Composed:
    """The pending items' index of a new, empty collection (plain CREATE INDEX: nothing to lock out)."""
    return sql.SQL("CREATE INDEX {i} ON {t} {d}").format(
        i=sql.Identifier(pending_index_name(c)), t=c.table, d=PENDING_INDEX_DEFINITION
    )


def build_pending_index(conn: psycopg.Connection[Any], c: Collection) -> None:
    """The pending items' index of an existing collection, online (an autocommit connection; idempotent)."""
    online_ddl.build_index(
        conn,
        c,
        pending_index_name(c),
        PENDING_INDEX_DEFINITION,
        partition_name=lambda i: pending_partition_index_name(c, i),
    )


def trigger_statement(c: Collection) -> sql.Composed:
    """The trigger that marks new images pending (on a partitioned table, every partition gets it)."""
    return sql.SQL(
        "CREATE OR REPLACE TRIGGER {n} BEFORE INSERT OR UPDATE OF content ON {t} FOR EACH ROW EXECUTE FUNCTION {f}()"
    ).format(n=sql.Identifier(TRIGGER), t=c.table, f=sql.Identifier(TRIGGER))


def install_trigger(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Install the trigger on an existing collection (autocommit; the short lock CREATE TRIGGER takes
    is waited for under online_ddl's lock timeout and retried)."""
    online_ddl.execute(conn, trigger_statement(c))


def record(conn: psycopg.Connection[Any], c: Collection, enabled: bool) -> Collection:
    """Record OCR on or off in the registry (inside the caller's transaction). Turning it on starts
    the backfill from the first item."""
    c = set_option(conn, c, OPTION, enabled)
    return set_option(conn, c, BACKFILL, 0 if enabled else None)


def backfill_step(conn: psycopg.Connection[Any], c: Collection) -> bool:
    """Mark the next batch of stored images pending, inside the caller's transaction; True when it
    marked or moved its cursor (there may be more), False when it had nothing to do now."""
    got = conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, c.id)).fetchone()
    if not got or not got[0]:
        return False
    c = read_collection(conn, id=c.id)  # the cursor afresh, under the lock
    cursor = c.options.get(BACKFILL)
    if cursor is None or not c.ocr:
        return False
    if pending_count(conn, c, limit=BACKFILL_LOW_WATER) >= BACKFILL_LOW_WATER:
        return False
    row = conn.execute(
        sql.SQL("SELECT max(id) FROM (SELECT id FROM {} WHERE id > %s ORDER BY id LIMIT %s) AS batch").format(c.table),
        (cursor, BACKFILL_BATCH),
    ).fetchone()
    last = None if row is None else row[0]
    if last is None:
        set_option(conn, c, BACKFILL, None)
        return False
    conn.execute(
        sql.SQL(
            "UPDATE {} SET ocr_status = 'pending', ocr_text = NULL, ocr_error = NULL "
            "WHERE id > %s AND id <= %s AND ocr_status IS NULL AND content IS NOT NULL AND content_type LIKE 'image/%%'"
        ).format(c.table),
        (cursor, last),
    )
    set_option(conn, c, BACKFILL, int(last))
    return True


def claim(conn: psycopg.Connection[Any], c: Collection) -> tuple[int, bytes] | None:
    """The first pending image no other process is reading, locked for the caller's transaction.
    Items still waiting for their vector come later: OCR never holds up an embedding."""
    row = conn.execute(
        sql.SQL(
            "SELECT id, content FROM {} WHERE ocr_status = 'pending' AND status <> 'pending' "
            "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
        ).format(c.table),
        binary=True,  # the image as its bytes, not as hex (see ingest_worker.Processor._load)
    ).fetchone()
    if row is None:
        return None
    if row[1] is None:  # cannot happen through the trigger; never leave it pending for ever
        write_failure(conn, c, int(row[0]), "the item has no image")
        return None
    return int(row[0]), bytes(row[1])


def write_text(conn: psycopg.Connection[Any], c: Collection, item_id: int, text: str) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET ocr_status = 'done', ocr_text = %s, ocr_error = NULL WHERE id = %s").format(c.table),
        (text, item_id),
    )


def write_failure(conn: psycopg.Connection[Any], c: Collection, item_id: int, reason: str) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET ocr_status = 'failed', ocr_text = NULL, ocr_error = %s WHERE id = %s").format(c.table),
        (reason[:1000], item_id),
    )


def pending_count(conn: psycopg.Connection[Any], c: Collection, *, limit: int | None = None) -> int:
    """Items waiting to be read (up to ``limit``), through the pending index."""
    bound = sql.SQL("") if limit is None else sql.SQL(" LIMIT {}").format(sql.Literal(limit))
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE ocr_status = 'pending'{}) AS waiting").format(
            c.table, bound
        )
    ).fetchone()
    return int(row[0]) if row else 0
