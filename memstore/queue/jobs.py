"""The durable ingest queue: items waiting for a vector, claimed by workers.

An enqueued item is a row in its collection's table (status ``pending``, the original text or bytes,
no vector) plus a row in ``memstore_ingest_queue``, written in one transaction: once ``enqueue``
returns, nothing is lost. Workers claim the rows (``memstore.queue.claims``), woken by ``NOTIFY`` on
``CHANNEL``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.collections import Collection
from memstore.db import retrying
from memstore.db.core import Database
from memstore.errors import CollectionNotFoundError, InvalidInputError
from memstore.inputs import check_external_id, check_metadata

log = logging.getLogger(__name__)

CHANNEL = "memstore_ingest"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
PRIORITY_DEFAULT = 1
PRIORITY_BULK = 0


@dataclass(frozen=True)
class PendingItem:
    """An item whose vector the encoder will make: exactly one of ``text`` and ``content``."""

    text: str | None = None
    content: bytes | None = None
    content_type: str | None = None
    external_id: str | None = None
    metadata: dict[str, Any] | None = None

    def key(self) -> str:
        """The external id; without one, a hash of the content, so re-sending is idempotent."""
        if self.external_id is not None:
            return self.external_id
        data = self.content if self.content is not None else (self.text or "").encode()
        return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Enqueued:
    id: int
    external_id: str
    change: str  # created, updated (re-embedding), metadata (only metadata changed) or unchanged
    status: str  # the item's status after the call: pending, ready or failed


def _check(item: PendingItem) -> None:
    if (item.text is None) == (item.content is None):
        raise InvalidInputError("an item needs exactly one of text or content")
    if item.text is not None and (not item.text.strip() or "\x00" in item.text):
        raise InvalidInputError("text must be non-empty and may not contain NUL characters")
    if item.content is not None and not item.content:
        raise InvalidInputError("content is empty")
    check_external_id(item.key())
    check_metadata(item.metadata)


DEADLOCK_RETRIES = 3


def enqueue(
    db: Database, collection: Collection, items: Sequence[PendingItem], *, priority: int = PRIORITY_DEFAULT
) -> list[Enqueued]:
    """Store ``items`` as pending and queue them for encoding; results in input order (last duplicate wins)."""
    for item in items:
        _check(item)
    latest = {item.key(): item for item in items}
    try:
        # Every writer locks item rows (in id order) before queue rows, so a deadlock is rare: two
        # batches naming the same new external ids in different orders. The transaction was rolled
        # back whole; running it again is safe.
        for attempt in retrying.deadlocks(attempts=DEADLOCK_RETRIES + 1):
            with attempt, db.write() as conn:
                done = _enqueue(conn, collection, latest, priority)
    except psycopg.errors.UndefinedTable:
        raise CollectionNotFoundError(collection.name) from None
    return [done[item.key()] for item in items]


def _enqueue(
    conn: psycopg.Connection[Any], c: Collection, latest: dict[str, PendingItem], priority: int
) -> dict[str, Enqueued]:
    done: dict[str, Enqueued] = {}
    requeue: list[int] = []
    keep_queued: list[int] = []
    todo = dict(latest)
    for _round in range(3):  # a concurrent insert of the same new id sends us round once more
        existing = conn.execute(
            sql.SQL(
                "SELECT external_id, id, status, metadata, text, sha256(content) FROM {} "
                "WHERE external_id = ANY(%s) ORDER BY id FOR UPDATE"  # item rows first, in id order
            ).format(c.table),
            (list(todo),),
        ).fetchall()
        for eid, rid, status, metadata, text, digest in existing:
            item = todo.pop(eid)
            same = text == item.text and digest == (
                hashlib.sha256(item.content).digest() if item.content is not None else None
            )
            new_meta = check_metadata(item.metadata)
            if same and status != "failed":
                if status == "pending":
                    keep_queued.append(rid)
                if metadata == new_meta:
                    done[eid] = Enqueued(rid, eid, "unchanged", status)
                    continue
                conn.execute(
                    sql.SQL("UPDATE {} SET metadata = %s, updated_at = now() WHERE id = %s").format(c.table),
                    (Jsonb(new_meta), rid),
                )
                done[eid] = Enqueued(rid, eid, "metadata", status)
                continue
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET metadata = %s, text = %s, content = %s, content_type = %s, embedding = NULL, "
                    "thumbnail = NULL, status = 'pending', error = NULL, updated_at = now() WHERE id = %s"
                ).format(c.table),
                (Jsonb(new_meta), item.text, item.content, _content_type(item), rid),
            )
            requeue.append(rid)
            done[eid] = Enqueued(rid, eid, "updated", "pending")
        if not todo:
            break
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (external_id, metadata, status, text, content, content_type) "
                    "VALUES (%s, %s, 'pending', %s, %s, %s) "
                    "ON CONFLICT (external_id) DO NOTHING RETURNING id, external_id"
                ).format(c.table),
                [
                    (eid, Jsonb(check_metadata(it.metadata)), it.text, it.content, _content_type(it))
                    for eid, it in todo.items()
                ],
                returning=True,
            )
            inserted: list[tuple[int, str]] = []
            while True:
                inserted.extend(cur.fetchall())
                if not cur.nextset():
                    break
        for rid, eid in inserted:
            todo.pop(eid)
            requeue.append(int(rid))
            done[eid] = Enqueued(int(rid), eid, "created", "pending")
        if not todo:
            break
    if todo:
        raise InvalidInputError(f"could not store {len(todo)} items: their external ids kept changing concurrently")
    if requeue:
        conn.execute(
            """
            INSERT INTO memstore_ingest_queue (collection_id, item_id, priority)
            SELECT %s, unnest(%s::bigint[]), %s
            ON CONFLICT (collection_id, item_id, space_id) DO UPDATE SET
                status = 'pending', attempts = 0, last_error = NULL, not_before = now(), enqueued_at = now(),
                claimed_by = NULL, claimed_at = NULL, priority = EXCLUDED.priority
            """,
            (c.id, requeue, priority),
        )
    if keep_queued:  # self-healing: a pending item must always have its queue row
        conn.execute(
            "INSERT INTO memstore_ingest_queue (collection_id, item_id, priority) "
            "SELECT %s, unnest(%s::bigint[]), %s ON CONFLICT (collection_id, item_id, space_id) DO NOTHING",
            (c.id, keep_queued, priority),
        )
    if requeue or keep_queued:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(c.id)))  # delivered at commit
    return done


def _content_type(item: PendingItem) -> str | None:
    return TEXT_CONTENT_TYPE if item.text is not None else item.content_type


def counts(conn: psycopg.Connection[Any], collection: Collection) -> dict[str, int]:
    """Queued items of one collection by status. Pending and failed items are exactly those with a
    queue row for their own vector (enqueue keeps that invariant; rows of other spaces are
    ``memstore.spaces.lifecycle``' to count), counted through the (collection_id, item_id, space_id) index."""
    rows = conn.execute(
        "SELECT status, count(*) FROM memstore_ingest_queue WHERE collection_id = %s AND space_id = 0 GROUP BY status",
        (collection.id,),
    ).fetchall()
    return {"pending": 0, "failed": 0} | {str(s): int(n) for s, n in rows}


def unqueue(
    conn: psycopg.Connection[Any], collection: Collection, item_ids: Sequence[int], *, deleted: bool = False
) -> None:
    """Drop the queue rows of items whose vector the caller wrote (a queued embedding would otherwise
    overwrite it), or, ``deleted``, every queue row of items that are gone (every space's: a worker
    must not claim an item that is gone). A written vector leaves the other spaces' rows queued: the
    original is still theirs to embed."""
    if item_ids:
        own = "" if deleted else " AND space_id = 0"
        conn.execute(
            "DELETE FROM memstore_ingest_queue WHERE collection_id = %s AND item_id = ANY(%s)" + own,
            (collection.id, list(item_ids)),
        )


def queue_depth(db: Database) -> dict[str, int]:
    with db.write() as conn:
        rows = conn.execute("SELECT status, count(*) FROM memstore_ingest_queue GROUP BY status").fetchall()
    return {"pending": 0, "failed": 0} | {str(s): int(n) for s, n in rows}


def attempts_of(db: Database, collection: Collection, item_ids: Sequence[int]) -> dict[int, tuple[int, str | None]]:
    """Queue facts (attempts, last error) of items that still have a queue row."""
    with db.write() as conn:
        rows = conn.execute(
            "SELECT item_id, attempts, last_error FROM memstore_ingest_queue "
            "WHERE collection_id = %s AND item_id = ANY(%s) AND space_id = 0",
            (collection.id, list(item_ids)),
        ).fetchall()
    return {int(r[0]): (int(r[1]), r[2]) for r in rows}


def statuses(db: Database, collection: Collection, item_ids: Sequence[int]) -> dict[int, tuple[str, str | None]]:
    with db.write() as conn:
        rows = conn.execute(
            sql.SQL("SELECT id, status, error FROM {} WHERE id = ANY(%s)").format(collection.table), (list(item_ids),)
        ).fetchall()
    return {int(r[0]): (str(r[1]), r[2]) for r in rows}


def wait_until_settled(
    db: Database, collection: Collection, item_ids: Sequence[int], *, timeout: float
) -> dict[int, tuple[str, str | None]]:
    """Poll until none of ``item_ids`` is pending (or ``timeout``); returns their (status, error)."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        state = statuses(db, collection, item_ids)
        if all(s != "pending" for s, _ in state.values()) or time.monotonic() >= deadline:
            return state
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 0.25)
