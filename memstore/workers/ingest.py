"""The ingest worker: claims pending items, has the encoder embed them, writes the vectors.

One class, ``IngestWorker``, for every way of running it: threads inside ``memstore serve``,
``memstore worker`` processes, or ``memstore worker --once`` from cron (drain what is due, then
exit). ``run()`` returns an exit code; SIGTERM finishes the batch in hand, then stops. The
API's ``?wait=true`` path uses the same ``Processor`` at a higher priority.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image
from psycopg import sql

from encoder.errors import (
    DecodeUnavailableError,
    EncoderUnreachableError,
    ImageRejectedError,
    QueueFullError,
    RequestTooLargeError,
)
from encoder.images import SharedDecode
from encoder.tenancy import TENANT
from encoder.types import EmbeddingBackend, Priority
from memstore.catalog.collections import Collection
from memstore.catalog.registry import Registry
from memstore.db.core import Database
from memstore.media import thumbnails
from memstore.queue import claims as queue_claims
from memstore.queue.claims import Claim, Claimer
from memstore.settings import IngestSettings, get_ingest_settings
from memstore.spaces.model_choice import model_for
from memstore.workers.ocr_pass import OcrPass
from memstore.workers.pacing import FULL_SPEED, Pace
from memstore.workers.photo_pass import PhotoFactsPass
from memstore.workers.space_pass import SpacePass

log = logging.getLogger(__name__)

# Errors that another attempt cannot fix: the item is marked failed at once.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (ImageRejectedError, RequestTooLargeError, ValueError)
# The decoder's trouble, not the item's (a decode worker that died or did not start, memory run out):
# retried later like any other failure, never failed at once, whatever classes it comes to share.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (DecodeUnavailableError,)


def is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, PERMANENT_ERRORS) and not isinstance(exc, TRANSIENT_ERRORS)


@dataclass(frozen=True)
class Loaded:
    claim: Claim
    text: str | None
    content: bytes | None


@dataclass(frozen=True)
class EncodeGroup:
    """Items of one collection, one space and one modality: one call to the encoder."""

    collection_id: int
    modality: str  # "text" or "image"
    items: tuple[Loaded, ...]
    space_id: int = 0  # 0: the items' own vectors; else a space of memstore.spaces.lifecycle


def group_for_encoding(items: Sequence[Loaded], *, max_image_bytes: int = 64 * 1024 * 1024) -> list[EncodeGroup]:
    """Split a claimed batch into encoder calls: per collection, space and modality, images capped by
    total bytes.

    A pure function, so batching is tested without a model or a database.
    """
    out: list[EncodeGroup] = []
    buckets: dict[tuple[int, int, str], list[Loaded]] = {}
    for it in items:
        key = (it.claim.collection_id, it.claim.space_id, "text" if it.text is not None else "image")
        buckets.setdefault(key, []).append(it)
    for (cid, space_id, modality), members in buckets.items():
        if modality == "text":
            out.append(EncodeGroup(cid, modality, tuple(members), space_id))
            continue
        chunk: list[Loaded] = []
        size = 0
        for it in members:
            n = len(it.content or b"")
            if chunk and size + n > max_image_bytes:
                out.append(EncodeGroup(cid, modality, tuple(chunk), space_id))
                chunk, size = [], 0
            chunk.append(it)
            size += n
        if chunk:
            out.append(EncodeGroup(cid, modality, tuple(chunk), space_id))
    return out


@dataclass
class Report:
    claimed: int = 0
    written: int = 0
    retried: int = 0
    failed: int = 0
    released: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, other: Report) -> None:
        for name in ("claimed", "written", "retried", "failed", "released", "dropped"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.errors.extend(other.errors[-5:])


# One thread for the process's thumbnails: beside the encoder's work, not in its way.
_THUMBNAILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memstore-thumbnails")


class _Thumbnails:
    """The thumbnails of one encoder call's images, made beside the encoder's work.

    With the encoder in this process (``shares_decodes``: an ``encoder.engine.EmbeddingEngine``), each
    image is decoded once where the engine's decode for the embedding (sized for its views alone, so
    the vector is the one a search with the same image gets) covers the thumbnail: it hands the
    picture over (``encoder.images.SharedDecode``) once its views are cut; it is reduced to thumbnail
    size there, in the decoding thread, so no decoded picture outlives its
    decode, and only that small picture (256 px at most) waits here for its WebP, written on the
    thumbnail thread. A bomb is refused by the engine's checks before any decode, as before, and
    then has no thumbnail. With a remote encoder the bytes travel to it and its pixels stay there:
    the thumbnails are decoded here from the bytes, on the thumbnail thread, while it embeds.
    """

    def __init__(self, items: Sequence[Loaded], *, shared: bool) -> None:
        self._contents = {it.claim.item_id: it.content for it in items}
        self._lock = threading.Lock()
        self._made: dict[int, Future[bytes | None]] = {}
        self._all: Future[dict[int, bytes | None]] | None = None
        self.uses: list[SharedDecode | None] | None = None
        if shared:
            self.uses = [SharedDecode(thumbnails.box, functools.partial(self._take, it.claim.item_id)) for it in items]
        else:
            self._all = _THUMBNAILER.submit(thumbnails.make_many, self._contents)

    def _take(self, item_id: int, decoded: Image.Image) -> None:
        small = thumbnails.shrink(decoded)
        with self._lock:
            self._made[item_id] = _THUMBNAILER.submit(thumbnails.encode_or_none, small, self._contents[item_id])

    def result(self) -> dict[int, bytes | None]:
        """Thumbnails by item id; call once the encoder has answered with the vectors (every shared
        decode has run by then)."""
        if self._all is not None:
            return self._all.result()
        with self._lock:
            made = dict(self._made)
        out = {item_id: found.result() for item_id, found in made.items()}
        # An image whose shared use did not run (a reduced JPEG decode smaller than the thumbnail, a
        # failed reduction, a refused image): decoded from its bytes.
        out.update(thumbnails.make_many({i: c for i, c in self._contents.items() if i not in made}))
        return out


class Processor:
    """Encode claimed rows and settle each one: written, retried later, failed, or released."""

    def __init__(
        self,
        db: Database,
        backend: EmbeddingBackend,
        settings: IngestSettings,
        *,
        registry: Registry | None = None,
    ) -> None:
        self.db = db
        self.backend = backend
        self.settings = settings
        self.registry = registry or Registry(db)  # the API passes its store's: one cache per process

    def collection(self, cid: int) -> Collection | None:
        return self.registry.by_id(cid)

    def process(self, claims: Sequence[Claim], *, priority: Priority) -> Report:
        report = Report(claimed=len(claims))
        loaded, missing = self._load(claims)
        if missing:
            queue_claims.drop(self.db, missing)
            report.dropped += len(missing)
        for group in group_for_encoding(loaded):
            report.add(self._encode_group(group, priority))
        return report

    def _load(self, claims: Sequence[Claim]) -> tuple[list[Loaded], list[Claim]]:
        by_collection: dict[int, list[Claim]] = {}
        for c in claims:
            by_collection.setdefault(c.collection_id, []).append(c)
        loaded: list[Loaded] = []
        missing: list[Claim] = []
        for cid, members in by_collection.items():
            collection = self.collection(cid)
            if collection is None:
                missing.extend(members)
                continue
            with self.db.write() as conn:
                # In binary: the originals come as their bytes. As text, bytea is hex, twice the size
                # on the wire and decoded by the client in one call that holds the interpreter lock
                # (32 photos of 150 kB: 11 ms and 7 ms of CPU, against 3 ms and 1.5 ms in binary),
                # long enough to delay every search the same process answers meanwhile.
                rows = conn.execute(
                    sql.SQL("SELECT id, text, content FROM {} WHERE id = ANY(%s)").format(collection.table),
                    ([c.item_id for c in members],),
                    binary=True,
                ).fetchall()
            found = {int(r[0]): (r[1], r[2]) for r in rows}
            for c in members:
                if c.item_id not in found or (found[c.item_id][0] is None and found[c.item_id][1] is None):
                    missing.append(c)
                else:
                    text, content = found[c.item_id]
                    loaded.append(Loaded(c, text, None if content is None else bytes(content)))
        return loaded, missing

    def _encode(
        self, group: EncodeGroup, priority: Priority, how: dict[str, Any], thumbs: _Thumbnails | None = None
    ) -> np.ndarray:
        """``how``: ``model_for``'s keyword arguments (the collection's model, when the encoder runs several).
        ``thumbs``: the group's thumbnails, made from the encoder's decodes where it runs in this process."""
        if group.modality == "text":
            return np.asarray(self.backend.embed_texts([it.text or "" for it in group.items], priority=priority, **how))
        if thumbs is not None and thumbs.uses is not None:
            how = {**how, "shared": thumbs.uses}
        # Each collection is a tenant of the encoder's image decoding (encoder.tenancy): one
        # collection's slow images do not hold every decoding thread while others wait.
        token = TENANT.set(f"collection:{group.collection_id}")
        try:
            vectors = self.backend.embed_images([it.content or b"" for it in group.items], priority=priority, **how)
        finally:
            TENANT.reset(token)
        return np.asarray(vectors)

    def _encode_group(self, group: EncodeGroup, priority: Priority) -> Report:
        collection = self.collection(group.collection_id)
        claims = [it.claim for it in group.items]
        report = Report()
        space = collection.space_by_id(group.space_id) if collection is not None else None
        if collection is not None and space is None:  # a space newer than this process's registry row?
            collection = self.registry.by_id(group.collection_id, fresh=True)
            space = collection.space_by_id(group.space_id) if collection is not None else None
        if collection is None or space is None:  # dropped since it was queued
            queue_claims.drop(self.db, claims)
            report.dropped += len(claims)
            return report
        how, mismatch = model_for(self.backend, collection, space)
        if mismatch:
            # Not this worker's model: handed back with back-off, so a worker that runs it (workers
            # may run different MEMSTORE_MODELS) takes it; failed once the attempts run out.
            return self._settle_failure(claims, mismatch, permanent=False, collection=collection)
        # The web pages' thumbnails are made while the encoder embeds the images (the imaging library
        # works outside the GIL), from the encoder's own decode where it runs in this process
        # (_Thumbnails), so they cost the worker little of its time; they are written with the
        # vectors, in the same row version.
        thumbs = (
            _Thumbnails(group.items, shared=bool(getattr(self.backend, "shares_decodes", False)))
            if group.modality == "image" and not space.side
            else None
        )
        try:
            vectors = self._encode(group, priority, how, thumbs)
        except QueueFullError as exc:
            queue_claims.release(self.db, claims, delay_s=exc.retry_after)
            report.released += len(claims)
            return report
        except EncoderUnreachableError:
            # Not the items' fault, and no use trying the others: the worker hands the whole batch
            # back without counting the attempt and backs off (IngestWorker.run_batch). Counted, an
            # encoder restart longer than the retry budget failed every row the worker cycled through.
            raise
        except Exception as exc:
            if len(group.items) == 1:
                return self._settle_failure(claims, _describe(exc), permanent=is_permanent(exc), collection=collection)
            # One bad item fails the whole call; encode one by one to find it and keep the rest.
            for it in group.items:
                one = EncodeGroup(group.collection_id, group.modality, (it,), group.space_id)
                report.add(self._encode_group(one, priority))
            return report
        if space.side:
            made = {it.claim.item_id: vectors[i] for i, it in enumerate(group.items)}
            done = queue_claims.complete_space(self.db, collection, space, claims, made)
            report.written += len(done)
            return report
        written = queue_claims.complete(
            self.db,
            collection,
            claims,
            {it.claim.item_id: vectors[i] for i, it in enumerate(group.items)},
            thumbs.result() if thumbs is not None else None,
        )
        report.written += len(written)
        return report

    def _settle_failure(self, claims: list[Claim], error: str, *, permanent: bool, collection: Collection) -> Report:
        failed = queue_claims.fail(
            self.db,
            claims,
            error,
            settings=self.settings,
            permanent=permanent,
            collections={collection.id: collection},
        )
        log.warning("ingest: %d item(s) of %s failed (%s): %s", len(claims), collection.name, len(failed), error)
        return Report(failed=len(failed), retried=len(claims) - len(failed), errors=[error])


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if is_permanent(exc) else f"{type(exc).__name__}: {text}"


class IngestWorker:
    """Claims batches until stopped (or, with ``once``, until nothing is due)."""

    def __init__(
        self,
        db: Database,
        backend: EmbeddingBackend,
        *,
        settings: IngestSettings | None = None,
        stop_event: threading.Event | None = None,
        priority: Priority = Priority.BACKGROUND,
        name: str = "ingest-worker",
        pace: Pace = FULL_SPEED,
    ) -> None:
        self.db = db
        # Each batch and each pass's step is one unit of background work: the process's foreground
        # controller (memstore.services.foreground) holds them back while searches are slow.
        self.pace = pace
        self.settings = settings or get_ingest_settings()
        self.processor = Processor(db, backend, self.settings)
        self.stop_event = stop_event or threading.Event()
        self.priority = priority
        self.name = name
        self.totals = Report()
        self._claimer: Claimer | None = None
        # Text in images, read whenever the ingest queue has nothing due (memstore.workers.ocr_pass).
        self.ocr = OcrPass(db, registry=self.processor.registry)
        # Facts of images stored before they were read at ingest, when idle too (memstore.workers.photo_pass).
        self.photo_facts = PhotoFactsPass(db, registry=self.processor.registry)
        # New embedding spaces: their backlog queued, their index built (memstore.workers.space_pass).
        self.spaces = SpacePass(db, registry=self.processor.registry, pace=pace)

    def stop(self) -> None:
        self.stop_event.set()

    def run_batch(self) -> Report:
        """Claim one batch and settle it; an empty report when nothing was due."""
        if self._claimer is None:
            self._claimer = Claimer(self.db)
        self._claimer.ensure()
        claims = queue_claims.claim(self.db, self._claimer, limit=self.settings.batch_size)
        if not claims:
            return Report()
        try:
            report = self.processor.process(claims, priority=self.priority)
        except Exception:
            # Never sit on claims after an unexpected error (a database blip mid-batch): give them
            # back, or, if even that fails, drop this identity so its lock, and the claims, go.
            try:
                queue_claims.release(self.db, claims, delay_s=self.settings.backoff_base_s)
            except Exception:
                self._claimer.connect()
            raise
        self.totals.add(report)
        return report

    def run(self, *, once: bool = False) -> int:
        """Work until stopped; ``once``: until the queue has nothing due. Returns an exit code."""
        restore = _install_signal_handlers(self.stop_event)
        try:
            return self._loop(once)
        finally:
            restore()
            if self._claimer is not None:
                self._claimer.close()
                self._claimer = None
            self.spaces.close()

    def _loop(self, once: bool) -> int:
        failures = 0
        next_poll = 0.0
        while not self.stop_event.is_set():
            try:
                with self.pace.unit(self.stop_event, "ingest") as unit:
                    report = Report() if self.stop_event.is_set() else self.run_batch()
                    unit.did(report.claimed)
                failures = 0
            except Exception as exc:  # the database or the encoder service gone: keep trying unless running once
                failures += 1
                log.error("%s: %s", self.name, exc)
                if once:
                    return 1
                self.stop_event.wait(self._pause_after(exc, failures))
                continue
            filled = self._paced("spaces", lambda: self.spaces.step(now=once))  # also between batches: it paces itself
            if (
                report.claimed
                or filled
                or self._paced("ocr", self.ocr.step)
                or self._paced("photos", self.photo_facts.step)
            ):
                continue
            if once:
                return 0
            # Nothing due: sleep until a NOTIFY, the next retry's due time, or the poll interval.
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + self.settings.poll_interval_s
                due = queue_claims.next_due_in(self.db)
                if due is not None and due < self.settings.poll_interval_s:
                    next_poll = now + due
            try:
                assert self._claimer is not None
                self._claimer.wait(max(0.01, min(1.0, next_poll - time.monotonic())))
            except Exception as exc:
                log.warning("%s: lost the LISTEN connection (%s); reconnecting", self.name, exc)
        return 0

    def _paced(self, kind: str, step: Callable[[], int]) -> int:
        """One step of a pass as a unit of background work (none once stopping)."""
        with self.pace.unit(self.stop_event, kind) as unit:
            if self.stop_event.is_set():
                return 0
            unit.did(step())
            return unit.work

    def _pause_after(self, exc: Exception, failures: int) -> float:
        """How long to wait after ``failures`` failed batches in a row, at most 30 s: an encoder service
        that cannot be reached is tried again on the queue's back-off (MEMSTORE_INGEST_BACKOFF_*), so
        a restart is noticed soon after it; anything else (the database gone) from 1 s, doubling."""
        if isinstance(exc, EncoderUnreachableError):
            return min(30.0, queue_claims.backoff_seconds(failures, self.settings))
        return min(30.0, 0.5 * 2**failures)


def _install_signal_handlers(stop: threading.Event) -> Any:
    """SIGTERM/SIGINT set ``stop`` (only possible from the main thread); returns a function restoring them."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, _frame: object) -> None:
        log.info("signal %d: finishing the current batch, then stopping", signum)
        stop.set()

    for s in previous:
        signal.signal(s, handler)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
