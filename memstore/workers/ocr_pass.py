"""The OCR pass: ingest workers read the text in images between their ingest batches.

A step looks at every collection with OCR on: it lets the backfill mark the next batch of images
stored before OCR was turned on (``memstore.catalog.ocr_items.backfill_step``), then reads one pending image:
the item row is locked (``SKIP LOCKED``: workers never read the same image twice), Tesseract runs
on it (``memstore.media.ocr``, with its rescale and time limit), and the text, or the reason it could not
be read, is written in the same transaction. A worker killed mid-read leaves the item pending for
the next; embedding always comes first, since the worker claims its ingest batch before each step.

A decode worker that died or did not start (``DecodeUnavailableError``) is the decoder's trouble,
not the image's: the item stays pending and is read again on a later step, up to DECODER_TRIES times
in this process before it is failed with the reason (an image that kills every worker must not hold
the queue for ever).

Without Tesseract installed the pass stays idle (items wait, pending) and says so in the log every
few minutes, so adding the package to a worker's host is all it takes to catch up.
"""

from __future__ import annotations

import logging
import time

import psycopg

from encoder.errors import DecodeUnavailableError
from memstore.catalog import ocr_items
from memstore.catalog.collections import Collection
from memstore.catalog.registry import CACHE_SECONDS, Registry
from memstore.db.core import Database
from memstore.media import ocr

log = logging.getLogger(__name__)

# How long the pass trusts its answer to "is Tesseract installed here" when it was no.
RECHECK_S = 300.0
# Reads of one image the decoder itself failed before the item is failed (see the module's docstring).
DECODER_TRIES = 3


class OcrPass:
    """One step at a time (``step``), run by an ingest worker whenever its queue has nothing due."""

    def __init__(
        self, db: Database, *, registry: Registry | None = None, settings: ocr.OcrSettings | None = None
    ) -> None:
        self.db = db
        self.registry = registry or Registry(db)
        self.settings = settings or ocr.OcrSettings()
        self._checked_at: float | None = None
        self._missing: str | None = None
        self._listed_at = -CACHE_SECONDS
        self._collections: list[Collection] = []
        self._decoder_failures: dict[tuple[int, int], int] = {}  # (collection id, item id): failed reads

    def step(self) -> int:
        """Mark or read what is due now; returns how much it did (0: nothing waits). Database errors
        are logged, not raised: OCR must never stop the worker's ingest."""
        try:
            work = 0
            for c in self._reading():
                work += self._step_collection(c)
            return work
        except psycopg.Error as exc:
            log.error("ocr: %s", exc)
            return 0
        except Exception:  # a bug must not end the ingest loop it runs in
            log.exception("ocr: unexpected error")
            return 0

    def read_one(self, c: Collection) -> bool:
        """Read one pending image of ``c``; False when none waits (or another worker has them all)."""
        with self.db.write() as conn:
            claimed = ocr_items.claim(conn, c)
            if claimed is None:
                return False
            item_id, content = claimed
            try:
                text = ocr.extract(content, self.settings)
            except ocr.OcrUnavailableError:
                raise  # the item waits for a worker that can read it
            except DecodeUnavailableError as exc:
                key = (c.id, item_id)
                tries = self._decoder_failures[key] = self._decoder_failures.get(key, 0) + 1
                if tries < DECODER_TRIES:
                    raise  # the claim is undone: the item stays pending for a later step
                self._decoder_failures.pop(key, None)
                reason = f"the image's decode failed {tries} times: {exc}"
                log.info("ocr: item %d of %s: %s", item_id, c.name, reason)
                ocr_items.write_failure(conn, c, item_id, reason)
            except Exception as exc:  # this image's failure (OcrFailedError, or anything the imaging library raises)
                reason = str(exc) if isinstance(exc, ocr.OcrFailedError) else f"{type(exc).__name__}: {exc}"
                log.info("ocr: item %d of %s: %s", item_id, c.name, reason)
                ocr_items.write_failure(conn, c, item_id, reason)
            else:
                ocr_items.write_text(conn, c, item_id, text)
        return True

    def _step_collection(self, c: Collection) -> int:
        work = 0
        try:
            if c.options.get(ocr_items.BACKFILL) is not None:  # as of the registry row, CACHE_SECONDS old at most
                with self.db.write() as conn:
                    work += int(ocr_items.backfill_step(conn, c))
            work += int(self.read_one(c))
        except psycopg.errors.UndefinedTable:  # dropped since it was listed
            self._listed_at = -CACHE_SECONDS
        except ocr.OcrUnavailableError as exc:
            self._missing, self._checked_at = str(exc), time.monotonic()
            log.warning("ocr: %s; images of collections with OCR on wait until it is", exc)
        except DecodeUnavailableError as exc:
            log.warning("ocr: %s; the image is read again on a later step", exc)
        return work

    def _reading(self) -> list[Collection]:
        """The collections with OCR on (listed again every CACHE_SECONDS), or none while this process
        cannot run Tesseract."""
        now = time.monotonic()
        if now - self._listed_at >= CACHE_SECONDS:
            self._collections = [c for c in self.registry.all() if c.ocr]
            self._listed_at = now
        if not self._collections:
            return []
        if self._checked_at is None or (self._missing and now - self._checked_at > RECHECK_S):
            self._checked_at = now
            try:
                ocr.require_tesseract(self.settings.language)
                self._missing = None
            except ocr.OcrUnavailableError as exc:
                self._missing = str(exc)
                log.warning("ocr: %s; images of collections with OCR on wait until it is", exc)
        return [] if self._missing else self._collections
