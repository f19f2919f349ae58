"""Claiming queued items: worker identities, claims, and how each claim is settled.

A claimed queue row names its claimer; each claimer holds a session advisory lock on that number for
as long as it lives, so the rows of a worker that died (its connection closed, the lock released) are
claimed again at once by the next worker. Settling a claim (writing the vector, recording a failure,
giving it back) only touches rows that still carry the claimer's number: a row re-sent with new content
or taken over meanwhile is never overwritten by a stale result.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog.collections import Collection, Space
from memstore.db.core import Database
from memstore.queue.jobs import CHANNEL
from memstore.settings import IngestSettings

# First key of the two-int advisory locks claimers hold (the second is the claimer number).
LOCK_NAMESPACE = 0x6D656D71  # "memq"


@dataclass(frozen=True)
class Claim:
    queue_id: int
    collection_id: int
    item_id: int
    attempts: int
    claimer: int
    space_id: int = 0  # 0: the item's own vector; else a space of memstore.spaces.lifecycle


class Claimer:
    """A worker identity: a connection holding the advisory lock on its number, also used to LISTEN."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn: psycopg.Connection[Any] | None = None
        self.number = 0
        self.connect()

    def connect(self) -> None:
        self.close()
        conn = self.db.dedicated(application_name="memstore-ingest", vector_types=False)
        while True:
            number = secrets.randbelow(2**31 - 2) + 1
            row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, number)).fetchone()
            if row and row[0]:
                break
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        self.conn, self.number = conn, number

    def ensure(self) -> None:
        """Reconnect (with a new number) when the identity connection broke."""
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.connect()

    def wait(self, timeout: float) -> bool:
        """True when a NOTIFY arrived within ``timeout`` seconds."""
        self.ensure()
        assert self.conn is not None
        try:
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                return True
        except psycopg.OperationalError:
            self.conn.close()
            raise
        return False

    def close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        self.conn = None


# The picked rows are a MATERIALIZED CTE, run exactly once: as a subquery in FROM, the planner may
# put it on the inner side of a nested loop and run it again for every queue row it joins, each run
# locking more rows past its LIMIT (seen: a claim of 5 came back with 10).
_CLAIM = """
WITH picked AS MATERIALIZED (
    SELECT id FROM memstore_ingest_queue
    WHERE status = 'pending' AND not_before <= now() {scope}
      AND (claimed_by IS NULL
           OR (claimed_by <> %(me)s AND pg_try_advisory_xact_lock(%(ns)s, claimed_by::integer)))
    ORDER BY priority DESC, not_before, id
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
UPDATE memstore_ingest_queue AS q
SET claimed_by = %(me)s, claimed_at = now(), attempts = q.attempts + 1
FROM picked
WHERE q.id = picked.id
RETURNING q.id, q.collection_id, q.item_id, q.attempts, q.space_id
"""


def claim(
    db: Database,
    claimer: Claimer,
    *,
    limit: int,
    collection_id: int | None = None,
    item_ids: Iterable[int] | None = None,
    space_id: int | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` due rows (optionally only these items of one collection, only the rows
    of one space: 0 for the items' own vectors)."""
    params: dict[str, Any] = {"me": claimer.number, "ns": LOCK_NAMESPACE, "n": limit}
    scope = ""
    if collection_id is not None:
        scope += " AND collection_id = %(cid)s"
        params["cid"] = collection_id
    if item_ids is not None:
        scope += " AND item_id = ANY(%(items)s)"
        params["items"] = list(item_ids)
    if space_id is not None:
        scope += " AND space_id = %(space)s"
        params["space"] = space_id
    with db.write() as conn:
        rows = conn.execute(_CLAIM.format(scope=scope), params).fetchall()
    return [Claim(int(r[0]), int(r[1]), int(r[2]), int(r[3]), claimer.number, int(r[4])) for r in rows]


def complete(
    db: Database,
    collection: Collection,
    claims: Sequence[Claim],
    vectors: dict[int, Any],
    thumbnails: dict[int, bytes | None] | None = None,
) -> list[int]:
    """Write the vectors (and the thumbnails of images, in the same row version) of still-held claims
    and drop their queue rows; returns the item ids written."""
    write = sql.SQL(
        "UPDATE {} SET embedding = %s, thumbnail = %s, status = 'ready', error = NULL, updated_at = now() "
        "WHERE id = %s RETURNING tableoid::regclass::text, old.embedding IS NULL"
    ).format(collection.table)
    return _settle_held(
        db, collection, claims, write, lambda i: (vectors[i], (thumbnails or {}).get(i), i), on_rows=_count_fills
    )


def _count_fills(conn: psycopg.Connection[Any], written: list[tuple[Any, ...]]) -> None:
    """Count the rows whose first vector was just written, per table (a partition is one): their
    update killed no element of the HNSW graph, which holds no NULL (migration 0017)."""
    fills = Counter(table for table, was_null in written if was_null)
    if fills:
        conn.execute(
            "INSERT INTO memstore_vector_fills (table_name, fills) SELECT * FROM unnest(%s::text[], %s::bigint[]) "
            "ON CONFLICT (table_name) DO UPDATE SET fills = memstore_vector_fills.fills + EXCLUDED.fills",
            (list(fills), list(fills.values())),
        )


def complete_space(
    db: Database, collection: Collection, space: Space, claims: Sequence[Claim], vectors: dict[int, Any]
) -> list[int]:
    """Write the vectors of still-held claims into a side space's table and drop their queue rows;
    returns the item ids written. An item whose original changed meanwhile had its claim reset by
    the trigger that queued it again, so its stale vector is never written."""
    write = sql.SQL(
        # Only for an item still there (its row is locked first): a deleted item's trigger has
        # already cleared the space, and must stay cleared.
        "INSERT INTO {side} (id, embedding) SELECT %(id)s, %(v)s "
        "WHERE EXISTS (SELECT 1 FROM {t} WHERE id = %(id)s) "
        "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding"
    ).format(side=sql.Identifier(space.table_name), t=collection.table)
    return _settle_held(db, collection, claims, write, lambda i: {"id": i, "v": vectors[i]})


def _settle_held(
    db: Database,
    collection: Collection,
    claims: Sequence[Claim],
    write: sql.Composed,
    params: Callable[[int], Any],
    on_rows: Callable[[psycopg.Connection[Any], list[tuple[Any, ...]]], None] | None = None,
) -> list[int]:
    """In one transaction: drop the queue rows of ``claims`` their claimer still holds, and run
    ``write`` with ``params(item_id)`` for each of their items; returns those item ids.

    Locks in the one order every writer takes them: the item rows (by id), then their queue rows.
    The API's enqueue locks an item and then upserts its queue row; taking the queue rows first
    deadlocked with it (seen with 20 concurrent posts of one external_id)."""
    if not claims:
        return []
    by_queue = {c.queue_id: c for c in claims}
    with db.write() as conn:
        lock_items(conn, collection, [c.item_id for c in claims])
        held = conn.execute(
            "DELETE FROM memstore_ingest_queue WHERE id = ANY(%s) AND claimed_by = %s RETURNING id",
            (list(by_queue), claims[0].claimer),
        ).fetchall()
        items = [by_queue[int(r[0])].item_id for r in held]
        if items:
            with conn.cursor() as cur:
                cur.executemany(write, [params(i) for i in items], returning=on_rows is not None)
                if on_rows is not None:  # what ``write`` returned, in the same transaction
                    rows: list[tuple[Any, ...]] = []
                    while True:
                        rows.extend(cur.fetchall())
                        if not cur.nextset():
                            break
                    on_rows(conn, rows)
    return items


def lock_items(conn: psycopg.Connection[Any], collection: Collection, item_ids: Sequence[int]) -> None:
    """Lock item rows in id order (the first lock of every transaction that writes items and queue rows)."""
    if item_ids:
        conn.execute(
            sql.SQL("SELECT id FROM {} WHERE id = ANY(%s) ORDER BY id FOR UPDATE").format(collection.table),
            (sorted(set(item_ids)),),
        )


def backoff_seconds(attempts: int, settings: IngestSettings) -> float:
    """Exponential back-off with +-20% jitter, so retries of one failed batch spread out."""
    base = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** max(0, attempts - 1))
    return base * (0.8 + 0.4 * secrets.randbelow(1000) / 1000)


def fail(
    db: Database,
    claims: Sequence[Claim],
    error: str,
    *,
    settings: IngestSettings,
    permanent: bool = False,
    collections: dict[int, Collection] | None = None,
) -> list[int]:
    """Record a failed attempt: retry later with back-off, or mark the item failed; returns failed item ids."""
    failed: list[int] = []
    error = error[:2000]
    with db.write() as conn:
        # Item rows first, in id order, as every writer takes them (then the queue rows, below).
        for cid in sorted({c.collection_id for c in claims}):
            known = (collections or {}).get(cid)
            if known is not None:
                lock_items(conn, known, [c.item_id for c in claims if c.collection_id == cid])
        for c in claims:
            collection = (collections or {}).get(c.collection_id)
            row = conn.execute(
                """
                UPDATE memstore_ingest_queue
                SET claimed_by = NULL, claimed_at = NULL, last_error = %s,
                    status = CASE WHEN %s OR attempts >= %s THEN 'failed' ELSE 'pending' END,
                    not_before = now() + make_interval(secs => %s)
                WHERE id = %s AND claimed_by = %s
                RETURNING status
                """,
                (error, permanent, settings.max_attempts, backoff_seconds(c.attempts, settings), c.queue_id, c.claimer),
            ).fetchone()
            if row is None or row[0] != "failed" or c.space_id:
                continue  # a space's vector failing leaves the item as it is (the queue row keeps the error)
            if collection is not None:
                conn.execute(
                    sql.SQL("UPDATE {} SET status = 'failed', error = %s, updated_at = now() WHERE id = %s").format(
                        collection.table
                    ),
                    (error, c.item_id),
                )
            failed.append(c.item_id)
    return failed


def release(db: Database, claims: Sequence[Claim], *, delay_s: float) -> None:
    """Give claims back without counting the attempt (the encoder was busy, not the item at fault)."""
    if not claims:
        return
    with db.write() as conn:
        conn.execute(
            """
            UPDATE memstore_ingest_queue
            SET claimed_by = NULL, claimed_at = NULL, attempts = greatest(attempts - 1, 0),
                not_before = now() + make_interval(secs => %s)
            WHERE id = ANY(%s) AND claimed_by = %s
            """,
            (delay_s, [c.queue_id for c in claims], claims[0].claimer),
        )


def drop(db: Database, claims: Sequence[Claim]) -> None:
    """Forget claims whose item no longer exists (deleted while it waited)."""
    if claims:
        with db.write() as conn:
            conn.execute(
                "DELETE FROM memstore_ingest_queue WHERE id = ANY(%s) AND claimed_by = %s",
                ([c.queue_id for c in claims], claims[0].claimer),
            )


def next_due_in(db: Database) -> float | None:
    """Seconds until the earliest pending row becomes due (0 if one is due now); None if none waits."""
    with db.write() as conn:
        # No greatest(0, ...) here: PostgreSQL's greatest ignores NULL, so an empty queue would read
        # as "a row is due now" and an idle worker would poll without pause.
        row = conn.execute(
            "SELECT extract(epoch FROM min(not_before) - now()) FROM memstore_ingest_queue WHERE status = 'pending'"
        ).fetchone()
    return None if row is None or row[0] is None else max(0.0, float(row[0]))
