"""EmbeddingEngine: continuous batching over text units, global views and tiles from all requests.

Threads: callers submit (cheap header checks happen in the caller); a preprocessing pool decodes
and tiles images while the model runs, by priority class and then fairly between tenants
(``encoder.tenancy``); one scheduler thread runs ticks. Each tick asks a planner
(a pure function of the queue state) for at most B units, runs them as one fixed-shape batch and
scatters the vectors back. A request's future resolves when its last unit is done.

An engine may hold several models (``MEMSTORE_MODELS``): a request names one (default: the first),
and a tick runs one model, the one the most urgent waiting request needs, so the priority classes
hold across models (a query on one model goes before a re-embedding on another).
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

import numpy as np

from .errors import (
    DecodeUnavailableError,
    ImageRejectedError,
    QueueFullError,
    RequestCancelledError,
    RequestTooLargeError,
    UnknownModelError,
)
from .images import SharedDecode, is_light, load_views, plan_for, probe_image
from .metrics import EngineMetrics
from .models import combine_views
from .requests import BatchEncoder, QueuedRequest, TickReport, done_future, fail_future, wait_future
from .scheduling import Planner, QueueState, ShareController, UnitRef, background_pause, plan_batch
from .settings import EncoderSettings, encoder_settings
from .tenancy import TENANT
from .tiling import TilePlan
from .types import EncoderInfo, ImageEmbedding, Modality, Priority
from .workers import PriorityPool

log = logging.getLogger(__name__)


# What Pillow and its codecs raise on truncated or malformed data (OSError: "image file is
# truncated", "broken data stream"; SyntaxError: a bad header; struct and zlib errors in chunks).
_BAD_DATA: tuple[type[BaseException], ...] = (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error)


class EmbeddingEngine:
    """Thread-safe front of the scheduler; also usable synchronously through `tick()` in tests."""

    # embed_images takes ``shared``: a caller in this process may reuse the picture it decodes (the
    # ingest worker's thumbnails). A remote encoder cannot: the bytes travel, the pixels do not.
    shares_decodes = True

    def __init__(
        self,
        encoder: BatchEncoder | Sequence[BatchEncoder],
        settings: EncoderSettings | None = None,
        *,
        planner: Planner = plan_batch,
        adaptive_shares: bool = True,
    ) -> None:
        """``encoder``: one model, or several (the first is the default); each is named by its
        ``info.model``, and all share the engine's fixed batch size."""
        encoders = [encoder] if not isinstance(encoder, Sequence) else list(encoder)
        if not encoders:
            raise ValueError("an engine needs at least one encoder")
        self.settings = settings or encoder_settings()
        self.encoders: dict[str, BatchEncoder] = {}
        for enc in encoders:
            if enc.info.model in self.encoders:
                raise ValueError(f"model {enc.info.model!r} is given twice")
            if self.settings.batch_size != enc.batch_size:
                raise ValueError(
                    f"settings.batch_size is {self.settings.batch_size} but {enc.info.model} was built for "
                    f"{enc.batch_size}; create it with create_encoder(..., batch_size={self.settings.batch_size})"
                )
            self.encoders[enc.info.model] = enc
        self.encoder = encoders[0]  # the default model
        self.batch_size = self.encoder.batch_size
        self.planner = planner
        self.image_options = self.settings.image_options()
        self.limits = self.settings.queue_limits()
        self.byte_limits = self.settings.queue_byte_limits()
        self.controller = ShareController(
            self.settings.slo_query_p99_ms / 1000.0,
            min_query_share=self.settings.min_query_share,
            sync_share=self.settings.sync_ingest_share,
        )
        self.adaptive_shares = adaptive_shares
        # The share of the model's time micro-batches of background work alone may take (1: all it
        # leaves idle), set by the host process's foreground controller: after such a batch took t
        # seconds, the next one waits t x (1 - share) / share; at 0 none runs. Batches with a query
        # or a sync request run as soon as they are ready, filled with background units as before.
        self.background_share = 1.0
        self._background_due = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._requests: dict[int, QueuedRequest] = {}
        self._queued = dict.fromkeys(Priority, 0)
        self._encoded_bytes = dict.fromkeys(Priority, 0)  # per class: image files waiting to be decoded
        self._next_id = 0
        self._ticks = 0
        self._units_done = 0
        self._rate = 0.0  # EWMA of units per second of model time
        self._shares = self.controller.shares()
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        workers = self.settings.preprocess_workers
        self._pool = PriorityPool(workers) if workers else None
        # Images waiting or decoding, per (tenant, heavy): light and heavy images queue apart.
        self._tenant_images: Counter[tuple[str, bool]] = Counter()
        self.metrics = EngineMetrics(self.stats)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def info(self) -> EncoderInfo:
        """The default model's facts."""
        return self.encoder.info

    @property
    def infos(self) -> dict[str, EncoderInfo]:
        """Every model this engine runs, the default first."""
        return {name: enc.info for name, enc in self.encoders.items()}

    def model(self, name: str | None) -> BatchEncoder:
        """The encoder for ``name`` (None: the default); UnknownModelError names the ones there are."""
        if name is None:
            return self.encoder
        found = self.encoders.get(name)
        if found is None:
            raise UnknownModelError(
                f"this encoder does not run model {name!r}; it runs {', '.join(self.encoders)} (MEMSTORE_MODELS)"
            )
        return found

    def start(self) -> EmbeddingEngine:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="encoder-scheduler", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the scheduler; requests still queued fail with RequestCancelledError."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            self._closed = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown()
        with self._lock:
            left = list(self._requests.values())
            for req in left:
                self._remove(req)
        for req in left:
            fail_future(req.future, RequestCancelledError("the encoder engine stopped before this request finished"))

    def __enter__(self) -> EmbeddingEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                idle = self.tick() is None
            except Exception:  # a scheduler bug must not silently strand every waiting caller
                log.exception("encoder tick failed")
                idle = True
            if idle:
                self._wake.wait(self._idle_wait())

    # -- submission -------------------------------------------------------------------------------
    def _check_size(self, priority: Priority, n_units: int) -> None:
        """RequestTooLargeError for a request no queue state could admit: checked before any work."""
        limit = self.limits[priority]
        if n_units > limit:
            self.metrics.rejected.labels(priority.label, "too_large").inc()
            raise RequestTooLargeError(
                f"request needs {n_units} units but the {priority.label} queue holds at most {limit} "
                f"(MEMSTORE_ENCODER_QUEUE_UNITS_{priority.name}); split it into smaller requests"
            )

    def _admit(
        self,
        priority: Priority,
        modality: Modality,
        n_units: int,
        deadline_s: float | None,
        encoder: BatchEncoder,
        n_bytes: int = 0,
    ) -> QueuedRequest:
        """Queue a request, or raise QueueFullError when its class has no room for its units, or for
        its ``n_bytes`` of encoded images (held until each is decoded). A request whose bytes alone
        exceed the byte limit is admitted when no other image of its class waits to be decoded: it is
        the caller's batch, not a fault of its items, and the class then holds that one request."""
        self._check_size(priority, n_units)
        limit = self.limits[priority]
        byte_limit = self.byte_limits[priority]
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise RequestCancelledError("the encoder engine is stopped")
            held = self._encoded_bytes[priority]
            if self._queued[priority] + n_units > limit:
                full = f"is full ({self._queued[priority]} of {limit} units)"
            elif n_bytes and held and held + n_bytes > byte_limit:
                full = (
                    f"holds {held} bytes of images waiting to be decoded and this request brings {n_bytes}; "
                    f"the limit is {byte_limit} (MEMSTORE_ENCODER_QUEUE_BYTES_{priority.name})"
                )
            else:
                full = ""
            if full:
                ahead = sum(v for p, v in self._queued.items() if p >= priority)
                rate = self._rate or self.batch_size / 0.1
                retry = min(60.0, max(0.05, ahead / rate))
                self.metrics.rejected.labels(priority.label, "queue_full").inc()
                raise QueueFullError(
                    f"the {priority.label} queue {full}; retry after {retry:.2f} s",
                    retry_after=retry,
                )
            if deadline_s is None:  # bigger requests get proportionally later default deadlines
                deadline_s = self.settings.default_deadline_s(priority) * max(1, math.ceil(n_units / self.batch_size))
            self._next_id += 1
            req = QueuedRequest(
                self._next_id,
                priority,
                modality,
                n_units,
                now + deadline_s,
                self._next_id,
                now,
                encoder.info.dimensions,
                encoder.info.model,
            )
            self._requests[req.id] = req
            self._queued[priority] += n_units
            req.encoded_bytes = n_bytes
            self._encoded_bytes[priority] += n_bytes
        return req

    def submit_texts(
        self,
        texts: Sequence[str],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        model: str | None = None,
    ) -> Future[np.ndarray]:
        """Future of an (n, d) float32 array of unit vectors, one row per text, from ``model``
        (default: the engine's first)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings")
        encoder = self.model(model)
        if not texts:
            return done_future(np.zeros((0, encoder.info.dimensions), dtype=np.float32))
        # Refused before tokenising (the costly part of a text request): too many, or too long.
        self._check_size(Priority.parse(priority), len(texts))
        longest = max(range(len(texts)), key=lambda i: len(texts[i]))
        if len(texts[longest]) > self.settings.max_text_chars:
            raise RequestTooLargeError(
                f"text {longest} has {len(texts[longest])} characters; the limit is {self.settings.max_text_chars} "
                "(MEMSTORE_ENCODER_MAX_TEXT_CHARS)"
            )
        tokens = np.asarray(encoder.tokenize(texts))
        req = self._admit(Priority.parse(priority), Modality.TEXT, len(texts), deadline_s, encoder)
        with self._lock:
            for i in range(len(texts)):
                req.inputs[i] = tokens[i]
                req.ready[i] = None
            req.pending = 0
        self._wake.set()
        return req.future

    def submit_images(
        self,
        images: Sequence[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        return_tiles: bool = False,
        model: str | None = None,
        shared: Sequence[SharedDecode | None] | None = None,
    ) -> Future[Any]:
        """Future of an (n, d) array, or of a list of ImageEmbedding when return_tiles, from
        ``model`` (default: the engine's first).

        Header checks run here (ImageRejectedError, DecompressionBombError raise at once); decoding
        errors arrive through the future. Cancelling the future drops the tiles not yet encoded.
        ``shared``: per image, another use of its decoded picture (``encoder.images.SharedDecode``,
        the ingest worker's thumbnail): the image is decoded once for both, and every ``take`` has
        run before the future resolves with vectors.
        """
        if not all(isinstance(b, bytes | bytearray | memoryview) for b in images):
            raise TypeError("images must be a list of encoded image bytes")
        encoder = self.model(model)
        if not images:
            return done_future([] if return_tiles else np.zeros((0, encoder.info.dimensions), dtype=np.float32))
        blobs = [bytes(b) for b in images]
        if shared is not None and len(shared) != len(blobs):
            raise ValueError(f"{len(blobs)} images but {len(shared)} shared uses")
        shares = list(shared) if shared is not None else [None] * len(blobs)
        probes = [probe_image(b, self.image_options) for b in blobs]
        plans = [plan_for(p, encoder.spec, self.image_options) for p in probes]
        offsets = np.cumsum([0] + [p.n_units for p in plans]).tolist()
        n_bytes = sum(len(b) for b in blobs)
        req = self._admit(Priority.parse(priority), Modality.IMAGE, offsets[-1], deadline_s, encoder, n_bytes)
        req.plans, req.return_tiles = plans, return_tiles
        # A cancelled request's files are let go at the next tick (``_take``): wake it now.
        req.future.add_done_callback(self._wake_on_cancel)
        tenant = TENANT.get()
        for i, (blob, probe, plan) in enumerate(zip(blobs, probes, plans, strict=True)):
            heavy = not is_light(blob, probe, plan)
            job = (req, offsets[i], blob, probe, plan, (tenant, heavy), shares[i])
            if self._pool is None:
                self._prepare(*job)
                continue
            with self._lock:  # its place among its tenant's images of its weight (encoder.tenancy)
                share = self._tenant_images[tenant, heavy]
                self._tenant_images[tenant, heavy] += 1
            key = (-int(req.priority), share, req.deadline)
            self._pool.submit(key, self._prepare, *job, heavy=heavy, tenant=tenant)
        return req.future

    def _prepare(
        self,
        req: QueuedRequest,
        offset: int,
        blob: bytes,
        probe: Any,
        plan: TilePlan,
        lane: tuple[str, bool] = ("", False),
        share: SharedDecode | None = None,
    ) -> None:
        try:
            self._prepare_views(req, offset, blob, probe, plan, share)
        finally:
            with self._lock:
                self._release_bytes(req, len(blob))  # decoded, refused or skipped: no longer waiting
                if self._pool is not None:
                    self._tenant_images[lane] -= 1
                    if not self._tenant_images[lane]:
                        del self._tenant_images[lane]

    def _release_bytes(self, req: QueuedRequest, n_bytes: int) -> None:
        """Give back the byte room of ``n_bytes`` of the request's images (lock held); at most what
        it still holds, so an image finishing after its request was removed gives back nothing."""
        n_bytes = min(n_bytes, req.encoded_bytes)
        req.encoded_bytes -= n_bytes
        self._encoded_bytes[req.priority] -= n_bytes

    def _wake_on_cancel(self, future: Future[Any]) -> None:
        if future.cancelled():
            self._wake.set()

    def _prepare_views(
        self, req: QueuedRequest, offset: int, blob: bytes, probe: Any, plan: TilePlan, share: SharedDecode | None
    ) -> None:
        if req.future.done():
            return  # cancelled or failed meanwhile: do not decode for nothing
        try:
            # The shared use's ``take`` runs in here, before the views are queued: before the vectors.
            views = load_views(blob, probe, plan, self.encoders[req.model].spec, share=share, priority=req.priority)
        except Exception as exc:
            # What the imaging library raises on bad data blames the image; memory running out is
            # retried later (DecodeUnavailableError); any other error is a fault here, reported as itself.
            error: Exception = exc
            if isinstance(exc, ImageRejectedError | DecodeUnavailableError):
                pass
            elif isinstance(exc, MemoryError):
                error = DecodeUnavailableError("out of memory while preparing the image's views; retry shortly")
            elif isinstance(exc, _BAD_DATA):
                error = ImageRejectedError(f"cannot decode image: {exc}")
            else:
                log.exception("preparing an image's views failed")
            with self._lock:
                self._remove(req)
            fail_future(req.future, error)
            return
        with self._lock:
            if req.id not in self._requests:
                return
            for k in range(len(views)):
                req.inputs[offset + k] = views[k]
                req.ready[offset + k] = None
            req.pending -= len(views)
        self._wake.set()

    # -- blocking helpers ------------------------------------------------------------------------
    def embed_texts(
        self,
        texts: Sequence[str],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        timeout: float | None = None,
        model: str | None = None,
    ) -> np.ndarray:
        fut = self.submit_texts(texts, priority=priority, deadline_s=deadline_s, model=model)
        result: np.ndarray = wait_future(fut, timeout)
        return result

    def embed_images(
        self,
        images: Sequence[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        return_tiles: bool = False,
        timeout: float | None = None,
        model: str | None = None,
        shared: Sequence[SharedDecode | None] | None = None,
    ) -> np.ndarray | list[ImageEmbedding]:
        fut = self.submit_images(
            images, priority=priority, deadline_s=deadline_s, return_tiles=return_tiles, model=model, shared=shared
        )
        result: np.ndarray | list[ImageEmbedding] = wait_future(fut, timeout)
        return result

    # -- the tick -------------------------------------------------------------------------------
    def _remove(self, req: QueuedRequest) -> None:
        """Forget a request and free its queue room (lock held)."""
        if self._requests.pop(req.id, None) is not None:
            self._queued[req.priority] -= req.queued
            req.queued = 0
            self._release_bytes(req, req.encoded_bytes)
            req.inputs = []
            req.ready.clear()

    def tick(self) -> TickReport | None:
        """Run one micro-batch if any unit is ready; None when there was nothing to do (or only
        background work, held back by ``background_share``)."""
        taken = self._take()
        if taken is None:
            return None
        batch, rows = taken
        outcome, seconds = self._execute(batch, rows)
        share = self.background_share
        if share < 1.0 and all(req.priority is Priority.BACKGROUND for req, _ in batch):
            self._background_due = time.monotonic() + background_pause(seconds, share)
        return self._settle(batch, outcome, seconds)

    def _held_back(self, plan: list[UnitRef], now: float) -> bool:
        """Whether ``plan``, background units alone, waits for its turn (``background_share``)."""
        share = self.background_share
        if share >= 1.0 or any(self._requests[ref.request_id].priority is not Priority.BACKGROUND for ref in plan):
            return False
        return share <= 0 or now < self._background_due

    def _idle_wait(self) -> float:
        """How long the scheduler sleeps with nothing to run (a new request wakes it sooner)."""
        if self.background_share >= 1.0:
            return 0.5
        return max(0.005, min(0.1, self._background_due - time.monotonic()))

    def _take(self) -> tuple[list[tuple[QueuedRequest, int]], list[Any]] | None:
        """Ask the planner for the next micro-batch and take its units (and their inputs) off the queues."""
        now = time.monotonic()
        with self._lock:
            for req in [r for r in self._requests.values() if r.future.cancelled()]:
                self._remove(req)  # remaining tiles of cancelled requests are dropped here
                self.metrics.cancelled.inc()
            if self.adaptive_shares:
                self._shares = self.controller.update(now)
            state = QueueState(self.batch_size, tuple(r.state() for r in self._requests.values()), self._shares)
            plan = self.planner(state)
            if not plan or self._held_back(plan, now):
                return None
            batch: list[tuple[QueuedRequest, int]] = []
            rows = []
            for ref in plan:
                req = self._requests[ref.request_id]
                del req.ready[ref.unit]
                rows.append(req.inputs[ref.unit])
                req.inputs[ref.unit] = None  # the batch holds the only reference now
                req.queued -= 1
                req.served += 1
                self._queued[req.priority] -= 1
                batch.append((req, ref.unit))
            return batch, rows

    def _execute(self, batch: list[tuple[QueuedRequest, int]], rows: list[Any]) -> tuple[Any, float]:
        """One fixed-shape pass: the vectors, or the exception the model raised, and its seconds."""
        modality, encoder = batch[0][0].modality, self.encoders[batch[0][0].model]
        urgent = any(req.priority is Priority.QUERY for req, _ in batch)
        started = time.perf_counter()
        try:
            if modality is Modality.TEXT:
                outcome: Any = encoder.encode_text_batch(np.stack(rows), urgent=urgent)
            else:
                outcome = encoder.encode_image_batch(rows, urgent=urgent)
        except Exception as exc:  # a model failure fails the requests in the batch, not the engine
            outcome = exc
        return outcome, time.perf_counter() - started

    def _settle(self, batch: list[tuple[QueuedRequest, int]], outcome: Any, seconds: float) -> TickReport:
        """Scatter a pass's vectors to their requests and resolve the requests it completed."""
        modality, model = batch[0][0].modality, batch[0][0].model
        if isinstance(outcome, Exception):
            with self._lock:
                failed = {req.id: req for req, _ in batch}
                for req in failed.values():
                    self._remove(req)
            for req in failed.values():
                fail_future(req.future, outcome)
            return TickReport(modality, len(batch), tuple(failed), (), seconds, model)
        finished: list[QueuedRequest] = []
        with self._lock:
            for (req, unit), vec in zip(batch, outcome, strict=False):
                if req.id not in self._requests:
                    continue  # cancelled or failed while the batch ran
                req.vectors[unit] = vec
                req.done += 1
                if req.done == req.n_units:
                    self._remove(req)
                    finished.append(req)
            self._ticks += 1
            self._units_done += len(batch)
            rate = len(batch) / max(seconds, 1e-6)
            self._rate = rate if self._rate == 0 else 0.8 * self._rate + 0.2 * rate
        self.metrics.units.labels(modality.value).inc(len(batch))
        self.metrics.batch_fill.labels(modality.value).observe(len(batch) / self.batch_size)
        self.metrics.batch_seconds.labels(modality.value).observe(seconds)
        done_at = time.monotonic()
        for req in finished:
            self._finish(req, done_at)
        ids = tuple(dict.fromkeys(req.id for req, _ in batch))
        return TickReport(modality, len(batch), ids, tuple(r.id for r in finished), seconds, model)

    def _finish(self, req: QueuedRequest, now: float) -> None:
        latency = now - req.submitted
        self.metrics.latency.labels(req.priority.label).observe(latency)
        if req.priority is Priority.QUERY:
            with self._lock:
                self.controller.observe(latency, now)
        result: Any = req.vectors
        if req.modality is Modality.IMAGE:
            embeddings, start = [], 0
            for plan in req.plans:
                embeddings.append(
                    combine_views(plan, req.vectors[start : start + plan.n_units], self.image_options.global_weight)
                )
                start += plan.n_units
            result = embeddings if req.return_tiles else np.stack([e.vector for e in embeddings])
        with contextlib.suppress(InvalidStateError):  # cancelled at the last moment
            req.future.set_result(result)

    # -- health -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        pool = self._pool.state() if self._pool is not None else None  # its own lock, never under ours
        with self._lock:
            queues = {
                p.label: {
                    "requests": 0,
                    "units": 0,
                    "ready": 0,
                    "preprocessing": 0,
                    "limit": self.limits[p],
                    "encoded_bytes": self._encoded_bytes[p],
                    "encoded_bytes_limit": self.byte_limits[p],
                }
                for p in Priority
            }
            for r in self._requests.values():
                q = queues[r.priority.label]
                q["requests"] += 1
                q["units"] += r.queued
                q["ready"] += len(r.ready)
                q["preprocessing"] += r.pending
            p99 = self.controller.p99(time.monotonic())
            return {
                "running": self._thread is not None and self._thread.is_alive(),
                "batch_size": self.batch_size,
                "ticks": self._ticks,
                "units_done": self._units_done,
                "units_per_s": self._rate,
                "queues": queues,
                "shares": {p.label: round(s, 4) for p, s in self._shares.items()},
                "background_share": round(self.background_share, 4),
                "query_p99_ms": None if p99 is None else p99 * 1000.0,
                "slo_query_p99_ms": self.settings.slo_query_p99_ms,
                "preprocessing_pool": pool,  # None: images are prepared in the submitting thread
            }
