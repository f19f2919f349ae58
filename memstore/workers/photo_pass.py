"""The photo facts backfill: images stored before their facts were read at ingest get them, in the
background, a batch at a time.

New images get their facts as they are stored (``memstore.api.ingest.with_facts``). For the images
already there, every collection is walked once in id order by the ingest workers, whenever their
queue has nothing due (as the OCR pass, ``memstore.workers.ocr_pass``). The walk's cursor is the collection's
``photo_facts_backfill`` option in the registry: the last item id looked at, then ``"done"``. A
collection without the option (one made before this pass existed, or since) is walked from the
start; one whose images all have their facts already costs a look at each item's metadata.

A step looks at the next WINDOW ids of a collection and, among them, at most STEP_IMAGES images
whose metadata has no ``image.width`` (facts never read: every picture with a readable header has a
width). Their rows are locked, the first HEADER_BYTES of each are read (an image's EXIF and XMP are
in its header; a TIFF or WebP can hold them anywhere, so those are read whole), the facts are merged
into the metadata as at ingest (``memstore.media.photo_facts.merge``: never over the client's keys), and
the cursor moves, all in one transaction: a crash anywhere loses nothing and repeats nothing. A
database error is logged and the step tried again on the next idle turn; a picture whose header is
broken is passed over without facts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog.collections import Collection
from memstore.catalog.registry import CACHE_SECONDS, Registry, read_collection, set_option
from memstore.db.core import Database
from memstore.media import photo_facts

log = logging.getLogger(__name__)

OPTION = "photo_facts_backfill"
DONE = "done"
# Advisory transaction locks (namespace, collection id): one backfill step per collection at a time.
LOCK_NAMESPACE = 0x70686F74  # "phot"
WINDOW = 1000  # item ids looked at per step
STEP_IMAGES = 32  # images read per step, at most
HEADER_BYTES = 1024 * 1024  # read of each image (JPEG, PNG): far more than a header holds
WHOLE_TYPES = ("image/tiff", "image/webp")  # their EXIF may follow the pixel data
LOCK_TIMEOUT = "2s"  # a row held longer by a writer: the step is tried again later


def backfill_step(conn: psycopg.Connection[Any], c: Collection) -> bool:
    """Give the next images of ``c``'s walk their facts, inside the caller's transaction; True when
    the cursor moved (there may be more), False when the walk is over or another process holds it."""
    got = conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, c.id)).fetchone()
    if not got or not got[0]:
        return False
    c = read_collection(conn, id=c.id)  # the cursor afresh, under the lock
    cursor = c.options.get(OPTION, 0)
    if not isinstance(cursor, int) or isinstance(cursor, bool):
        return False  # done (or a value this version does not know)
    row = conn.execute(
        sql.SQL("SELECT max(id) FROM (SELECT id FROM {} WHERE id > %s ORDER BY id LIMIT %s) AS w").format(c.table),
        (cursor, WINDOW),
    ).fetchone()
    last = None if row is None else row[0]
    if last is None:
        set_option(conn, c, OPTION, DONE)
        return False
    conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
    rows = conn.execute(
        sql.SQL(
            # The header's first bytes; the whole file where facts may lie anywhere in it (WHOLE_TYPES).
            "SELECT id, metadata, CASE WHEN content_type = ANY(%s) THEN content "
            "ELSE substring(content FROM 1 FOR %s) END FROM {} "
            "WHERE id > %s AND id <= %s AND content IS NOT NULL AND content_type LIKE 'image/%%' "
            "AND NOT coalesce(metadata -> 'image' ? 'width', false) ORDER BY id LIMIT %s FOR UPDATE"
        ).format(c.table),
        (list(WHOLE_TYPES), HEADER_BYTES, cursor, last, STEP_IMAGES),
        binary=True,  # the bytes as they are, not as hex
    ).fetchall()
    updates = []
    for item_id, metadata, data in rows:
        merged = photo_facts.with_facts(metadata, bytes(data))
        if merged is not metadata:
            updates.append((Jsonb(merged), item_id))
    if updates:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("UPDATE {} SET metadata = %s, updated_at = now() WHERE id = %s").format(c.table), updates
            )
    if len(rows) == STEP_IMAGES:
        last = rows[-1][0]  # the window's other images come next step
    set_option(conn, c, OPTION, int(last))
    return True


def backfilling(c: Collection) -> bool:
    """Whether ``c``'s walk is still to be done or under way (as of its registry row)."""
    return c.options.get(OPTION) != DONE


class PhotoFactsPass:
    """One step at a time (``step``), run by an ingest worker whenever its queue has nothing due."""

    def __init__(self, db: Database, *, registry: Registry | None = None) -> None:
        self.db = db
        self.registry = registry or Registry(db)
        self._listed_at = -CACHE_SECONDS
        self._collections: list[Collection] = []

    def step(self) -> int:
        """Walk each collection still walking one step; returns how many moved (0: nothing to do).
        Database errors are logged, not raised: the backfill must never stop the worker's ingest."""
        try:
            work = 0
            for c in self._walking():
                work += self._step_collection(c)
            return work
        except psycopg.Error as exc:
            log.error("photo facts: %s", exc)
            return 0
        except Exception:  # a bug must not end the ingest loop it runs in
            log.exception("photo facts: unexpected error")
            return 0

    def _step_collection(self, c: Collection) -> int:
        try:
            with self.db.write() as conn:
                moved = backfill_step(conn, c)
        except psycopg.errors.UndefinedTable:  # dropped since it was listed
            self._listed_at = -CACHE_SECONDS
            return 0
        except psycopg.errors.LockNotAvailable:  # a writer holds one of the rows: next time
            return 0
        if not moved:
            self._collections = [x for x in self._collections if x.id != c.id]
        return int(moved)

    def _walking(self) -> list[Collection]:
        """The collections whose walk is not over (listed again every CACHE_SECONDS)."""
        now = time.monotonic()
        if now - self._listed_at >= CACHE_SECONDS:
            self._collections = [c for c in self.registry.all() if backfilling(c)]
            self._listed_at = now
        return list(self._collections)
