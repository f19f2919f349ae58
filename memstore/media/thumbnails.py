"""Thumbnails of image items: small WebP pictures stored with the item, for the web pages.

A thumbnail is made where the ingest worker writes the item's vector (``claims.complete`` stores it
in the same UPDATE, so it costs no extra row version), from the picture the encoder decoded for the
vector when it runs in the worker's process (``shrink`` and ``encode``; ``memstore.workers.ingest``),
else from the bytes (``make``). Enqueuing new content clears it, so a stored thumbnail always shows
the content the item holds. Items that have none although they are ready images (a vector written
by hand over a queued image, a worker of an older version) get one on first view (``read``). The
migration that added the column made them for the items already there.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageCms
from psycopg import sql

from encoder.decode_budget import ALLOWED_FORMATS
from encoder.images import ImageOptions, decode_image
from encoder.settings import stored_options
from encoder.types import Priority
from memstore.catalog.collections import Collection
from memstore.db.core import Database

log = logging.getLogger(__name__)

SIZE = 256  # the longer side, in pixels: sharp in a results grid on a high-density screen
QUALITY = 80
MEDIA_TYPE = "image/webp"
# The ingest limit (MEMSTORE_ENCODER_MAX_IMAGE_PIXELS' default): larger images were never accepted, so
# anything over it is not decoded here either.
MAX_PIXELS = 64_000_000
SNIPPET_CHARS = 280


def make(content: bytes, options: ImageOptions | None = None) -> bytes | None:
    """A WebP thumbnail of ``content`` (at most ``SIZE`` pixels on its longer side, EXIF rotation
    applied), or None when the bytes are not an image that decodes within the image limits
    (``encoder.images.decode_image``: the encoder's decode budget, ``MAX_PIXELS`` pixels)."""
    try:
        # JPEG decodes at 1/2, 1/4 or 1/8 scale, the largest reduction that still covers the
        # thumbnail: a 1024 x 768 photo decodes at 256 x 192, a fraction of the work.
        # Bulk work, as OCR: a query's picture takes a free decode worker before it.
        decoded = decode_image(
            content, options or stored_options(MAX_PIXELS), min_size=box, priority=Priority.BACKGROUND
        )
        return encode(in_srgb(shrink(decoded), content))
    except Exception as exc:  # a corrupt, exotic or too costly file: the item simply has no thumbnail
        log.info("no thumbnail: %s: %s", type(exc).__name__, exc)
        return None


def shrink(decoded: Image.Image) -> Image.Image:
    """The thumbnail's picture, from a picture ``decode_image`` made (reduced in place: the caller
    hands it over): at most ``SIZE`` pixels on its longer side, RGB or RGBA."""
    # Halved by box averaging first, then resampled: as sharp at this size, a third quicker.
    decoded.thumbnail((SIZE, SIZE), Image.Resampling.BICUBIC, reducing_gap=2.0)
    return decoded.convert("RGBA" if decoded.mode == "RGBA" else "RGB")


def encode(small: Image.Image) -> bytes:
    """``shrink``'s picture as the stored WebP."""
    out = io.BytesIO()
    # method 0 of 0-6: WebP's least effort; more shrinks a 15 kB picture by a few percent at
    # up to twice the time, and the worker makes one thumbnail per image it embeds.
    small.save(out, format="WEBP", quality=QUALITY, method=0)
    return out.getvalue()


def encode_or_none(small: Image.Image, content: bytes | None = None) -> bytes | None:
    """``encode``, in sRGB where ``content`` (the original) carries a colour profile (``in_srgb``), or
    None (logged) when the picture cannot be written: the item has no thumbnail."""
    try:
        return encode(small if content is None else in_srgb(small, content))
    except Exception as exc:
        log.info("no thumbnail: %s: %s", type(exc).__name__, exc)
        return None


def in_srgb(small: Image.Image, content: bytes) -> Image.Image:
    """``small`` converted to sRGB from the colour profile the original carries (a phone's Display P3,
    a camera's Adobe RGB), as browsers show the original; the decoded pixels are the file's numbers,
    which read as sRGB look washed out. Unchanged without a profile, or when it cannot be used."""
    try:
        # The profile is in the header: no pixel is decoded.
        with Image.open(io.BytesIO(content), formats=ALLOWED_FORMATS) as header:
            profile = header.info.get("icc_profile")
        if not profile or small.mode not in ("RGB", "RGBA"):
            return small
        return ImageCms.applyTransform(small, _to_srgb(profile, small.mode)) or small
    except Exception as exc:  # a broken profile: the pixels as they are
        log.info("thumbnail colour profile not applied: %s: %s", type(exc).__name__, exc)
        return small


@functools.lru_cache(maxsize=16)
def _to_srgb(profile: bytes, mode: str) -> ImageCms.ImageCmsTransform:
    """A transform from ``profile`` to sRGB; one per profile and mode (a phone writes the same one
    into every photo)."""
    return ImageCms.buildTransform(
        ImageCms.ImageCmsProfile(io.BytesIO(profile)), _SRGB, mode, mode, renderingIntent=ImageCms.Intent.PERCEPTUAL
    )


_SRGB = ImageCms.createProfile("sRGB")


def box(width: int, height: int) -> tuple[int, int]:
    """The thumbnail's own size: what a draft decode must still cover (its longer side SIZE)."""
    if width >= height:
        return SIZE, max(1, math.ceil(SIZE * height / max(width, 1)))
    return max(1, math.ceil(SIZE * width / max(height, 1))), SIZE


def make_many(contents: dict[int, bytes | None]) -> dict[int, bytes | None]:
    """Thumbnails by item id (None where an item has no image or it cannot be decoded)."""
    return {item_id: make(data) if data else None for item_id, data in contents.items()}


def etag(thumbnail: bytes) -> str:
    """A strong validator: a digest of the bytes served (so it changes whenever the picture does)."""
    return '"' + hashlib.blake2b(thumbnail, digest_size=12).hexdigest() + '"'


@dataclass(frozen=True)
class Preview:
    """What a result card shows for an item: its thumbnail, or the start of its text."""

    id: int
    is_image: bool
    has_thumbnail: bool
    snippet: str | None
    status: str

    @property
    def shows_thumbnail(self) -> bool:
        """A thumbnail is there, or ``read`` will make one (a ready image); not for an image that
        failed or waits for its vector."""
        return self.has_thumbnail or (self.is_image and self.status == "ready")


def previews(db: Database, collection: Collection, item_ids: list[int]) -> dict[int, Preview]:
    """Previews of many items in one query (search results carry no content facts)."""
    if not item_ids:
        return {}
    with db.write() as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT id, coalesce(content_type LIKE 'image/%%', false), thumbnail IS NOT NULL, left(text, %s), "
                "status FROM {} WHERE id = ANY(%s)"
            ).format(collection.table),
            (SNIPPET_CHARS, item_ids),
        ).fetchall()
    return {int(r[0]): Preview(int(r[0]), bool(r[1]), bool(r[2]), r[3], str(r[4])) for r in rows}


def read(db: Database, collection: Collection, item_id: int) -> bytes | None:
    """The item's thumbnail; made and stored now when a ready image item has none. None when the
    item is not an image, is not ready, or cannot be decoded."""
    with db.write() as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT thumbnail, status = 'ready' AND content IS NOT NULL AND content_type LIKE 'image/%%', "
                "updated_at FROM {} WHERE id = %s"
            ).format(collection.table),
            (item_id,),
        ).fetchone()
    if row is None:
        return None
    stored, fillable, updated_at = row
    if stored is not None:
        return bytes(stored)
    return _fill(db, collection, item_id, updated_at) if fillable else None


# Originals this process could not make a thumbnail of, by (table, item, content version): each is
# decoded once, not again on every view of a page that shows it (a hostile or broken image would
# otherwise cost a decode per view). Bounded: the oldest are forgotten first.
_FAILED: OrderedDict[tuple[str, int, Any], None] = OrderedDict()
_FAILED_LIMIT = 10_000
_failed_lock = threading.Lock()


def _failed_before(key: tuple[str, int, Any]) -> bool:
    with _failed_lock:
        return key in _FAILED


def _remember_failure(key: tuple[str, int, Any]) -> None:
    with _failed_lock:
        _FAILED[key] = None
        while len(_FAILED) > _FAILED_LIMIT:
            _FAILED.popitem(last=False)


def _fill(db: Database, collection: Collection, item_id: int, updated_at: Any) -> bytes | None:
    key = (collection.table_name, item_id, updated_at)
    if _failed_before(key):
        return None
    with db.write() as conn:
        found = conn.execute(
            sql.SQL("SELECT content FROM {} WHERE id = %s").format(collection.table),
            (item_id,),
            binary=True,  # the image as its bytes, not as hex (see ingest_worker.Processor._load)
        ).fetchone()
    made = make(bytes(found[0])) if found and found[0] is not None else None
    if made is None:
        _remember_failure(key)
        return None
    with db.write() as conn:
        # Only over the content it was made from: content re-sent meanwhile changed updated_at.
        conn.execute(
            sql.SQL("UPDATE {} SET thumbnail = %s WHERE id = %s AND updated_at = %s AND thumbnail IS NULL").format(
                collection.table
            ),
            (made, item_id, updated_at),
        )
    return made


def backfill_table(conn: Any, table_name: str, *, batch: int = 64) -> int:
    """Make the missing thumbnails of one table's ready image items, ``batch`` rows per statement,
    one original in memory at a time; returns how many were written. ``conn`` is a psycopg
    connection in autocommit mode, so each batch is committed on its own (an interrupted backfill
    resumes where it stopped, and no transaction holds every image row locked)."""
    table = sql.Identifier(table_name)
    written = 0
    after = 0
    while True:
        ids = [
            int(r[0])
            for r in conn.execute(
                sql.SQL(
                    "SELECT id FROM {} WHERE id > %s AND thumbnail IS NULL AND status = 'ready' "
                    "AND content IS NOT NULL AND content_type LIKE 'image/%%' ORDER BY id LIMIT %s"
                ).format(table),
                (after, batch),
            ).fetchall()
        ]
        if not ids:
            return written
        after = ids[-1]
        made: list[tuple[bytes, int]] = []
        for item_id in ids:
            found = conn.execute(
                sql.SQL("SELECT content FROM {} WHERE id = %s").format(table), (item_id,), binary=True
            ).fetchone()
            thumb = make(bytes(found[0])) if found and found[0] is not None else None
            if thumb is not None:
                made.append((thumb, item_id))
        if made:
            with conn.cursor() as cur:
                cur.executemany(
                    sql.SQL("UPDATE {} SET thumbnail = %s WHERE id = %s AND thumbnail IS NULL").format(table), made
                )
            written += len(made)
