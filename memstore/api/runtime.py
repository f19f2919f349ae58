"""What one API process runs besides the routes: the encoder, ingest workers, maintenance, samplers.

``Runtime`` is built in the app's lifespan and reached by routes as ``request.app.state.runtime``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue as stdqueue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import sqlalchemy as sa

from encoder.errors import WeightsNotFoundError
from encoder.images import ImageOptions
from encoder.settings import OFFLINE_HINT
from encoder.types import EmbeddingBackend
from memstore.api.problems import Problem
from memstore.api.settings import ApiSettings
from memstore.async_search import AsyncSearcher
from memstore.claims import Claimer
from memstore.db import raw_connection
from memstore.ingest_worker import IngestWorker, Processor
from memstore.keys import KeyVerifier
from memstore.queue import IngestSettings
from memstore.settings import Settings
from memstore.store import VectorStore

log = logging.getLogger(__name__)

EncoderMode = Literal["local", "remote", "none"]


@dataclass
class RuntimeOptions:
    """How ``create_app`` assembles the process; ``memstore serve`` fills this from its flags."""

    encoder: EncoderMode | None = None  # None: remote if MEMSTORE_ENCODER_URL is set, else local
    encoder_url: str | None = None
    backend: EmbeddingBackend | None = None  # a ready backend (tests, benchmarks); overrides ``encoder``
    ingest_workers: int = 0  # in-process ingest worker threads
    maintenance: bool = False


def open_backend(options: RuntimeOptions) -> tuple[EmbeddingBackend | None, Callable[[], None]]:
    """The encoder this process uses, and how to close it."""
    from encoder.settings import EncoderSettings

    if options.backend is not None:
        return options.backend, lambda: None
    es = EncoderSettings()
    url = options.encoder_url or es.url
    mode = options.encoder or ("remote" if url else "local")
    if mode == "none":
        return None, lambda: None
    if mode == "remote":
        if not url:
            raise ValueError("a remote encoder needs a URL: --encoder-url or MEMSTORE_ENCODER_URL")
        from encoder.client import RemoteEncoder

        remote = RemoteEncoder(url, api_key=es.api_key)
        return remote, getattr(remote, "close", lambda: None)
    from encoder.engine import EmbeddingEngine
    from encoder.models import create_encoder_from_settings

    engine = EmbeddingEngine(create_encoder_from_settings(es), es).start()
    return engine, engine.stop


def image_options_of(backend: EmbeddingBackend | None) -> ImageOptions:
    """The image limits uploads are checked against: the local engine's, else the environment's."""
    from encoder.settings import EncoderSettings

    options = getattr(backend, "image_options", None)
    return options if isinstance(options, ImageOptions) else EncoderSettings().image_options()


class LatencyTracker:
    """Recent search latencies, so maintenance can back off while foreground searches are slow."""

    def __init__(self, size: int = 2048, window_s: float = 60.0) -> None:
        self._samples: collections.deque[tuple[float, float]] = collections.deque(maxlen=size)
        self.window_s = window_s

    def record(self, seconds: float) -> None:
        self._samples.append((time.monotonic(), seconds))  # deque.append is atomic: no lock needed

    def p99_ms(self) -> float | None:
        cutoff = time.monotonic() - self.window_s
        recent = sorted(s for t, s in list(self._samples) if t >= cutoff)
        if len(recent) < 20:
            return None
        return 1000.0 * recent[min(len(recent) - 1, int(0.99 * len(recent)))]


class QuerySampler:
    """Keeps a random share of query vectors in ``memstore_query_samples``, written off the request path."""

    def __init__(self, engine: sa.Engine, rate: float, *, capacity: int = 1000, keep: int = 1000) -> None:
        self.engine = engine
        self.rate = rate
        self.keep = keep  # samples kept per collection (the probes draw from them at random)
        self._queue: stdqueue.Queue[tuple[int, np.ndarray] | None] = stdqueue.Queue(capacity)
        self._thread: threading.Thread | None = None

    def offer(self, collection_id: int, vector: np.ndarray) -> None:
        if self.rate <= 0 or random.random() >= self.rate:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._drain, name="query-sampler", daemon=True)
            self._thread.start()
        # Samples are best effort: never slow a search down for one.
        with contextlib.suppress(stdqueue.Full):
            self._queue.put_nowait((collection_id, vector))

    def _drain(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < 100:
                try:
                    nxt = self._queue.get_nowait()
                except stdqueue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            try:
                with raw_connection(self.engine) as conn, conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO memstore_query_samples (collection_id, embedding) "
                        "SELECT %s, %s WHERE EXISTS (SELECT 1 FROM memstore_collections WHERE id = %s)",
                        [(cid, vec, cid) for cid, vec in batch],
                    )
                    # Keep the most recent `keep` per collection: the table must not grow forever.
                    cur.executemany(
                        "DELETE FROM memstore_query_samples WHERE collection_id = %(c)s AND id <= ("
                        "SELECT id FROM memstore_query_samples WHERE collection_id = %(c)s "
                        "ORDER BY id DESC OFFSET %(keep)s LIMIT 1)",
                        [{"c": cid, "keep": self.keep} for cid in {cid for cid, _ in batch}],
                    )
            except Exception as exc:
                log.warning("query sampler: %s", exc)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)


@dataclass
class Runtime:
    settings: Settings
    api: ApiSettings
    ingest: IngestSettings
    engine: sa.Engine
    store: VectorStore
    backend: EmbeddingBackend | None
    verifier: KeyVerifier
    sampler: QuerySampler
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    image_options: ImageOptions = field(default_factory=ImageOptions)
    latency: LatencyTracker = field(default_factory=LatencyTracker)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=32, thread_name_prefix="search")
    )
    searcher: AsyncSearcher | None = None  # vector searches on the event loop (set by the app's lifespan)
    encoder_state: str = "off"  # off, loading, ready or failed
    encoder_error: str | None = None
    encoder_model: str | None = None  # the model a local encoder is loading (known before it is ready)
    _claimer: Claimer | None = None
    _processor: Processor | None = None
    _claimer_lock: threading.Lock = field(default_factory=threading.Lock)

    def claimer(self) -> Claimer:
        """The identity under which ``?wait=true`` requests claim their own items."""
        with self._claimer_lock:
            if self._claimer is None:
                self._claimer = Claimer(self.engine)
            else:
                self._claimer.ensure()
            return self._claimer

    def start_encoder(self, options: RuntimeOptions) -> None:
        """A given backend is used at once; a model loads in a thread, so the API answers meanwhile."""
        if options.backend is not None:
            self._encoder_ready(options.backend, lambda: None, options.ingest_workers)
            return
        if options.encoder == "none":
            return
        self.encoder_state = "loading"
        from encoder.settings import EncoderSettings

        settings = EncoderSettings()
        if not (options.encoder_url or settings.url) and options.encoder != "remote":
            self.encoder_model = settings.model

        def load() -> None:
            try:
                backend, close = open_backend(options)
                assert backend is not None
                _ = backend.info  # a remote encoder is asked here, so a bad URL fails now, not per request
            except Exception as exc:
                self.encoder_state, self.encoder_error = "failed", f"{type(exc).__name__}: {exc}"
                log.error("the encoder did not start: %s", exc)
                if isinstance(exc, WeightsNotFoundError):
                    log.error("no weights and no network? try memstore offline with: %s", OFFLINE_HINT)
                return
            if self.stop_event.is_set():
                close()
                return
            self._encoder_ready(backend, close, options.ingest_workers)
            log.info("encoder ready: %s", backend.info)
            # Measured: a torch model whose loading thread has exited runs 3-5x slower afterwards
            # (its OpenMP thread pool goes with the thread), so this thread stays until shutdown.
            self.stop_event.wait()

        t = threading.Thread(target=load, name="encoder-loader", daemon=True)
        t.start()
        self.threads.append(t)

    def _encoder_ready(self, backend: EmbeddingBackend, close: Callable[[], None], workers: int) -> None:
        self.image_options = image_options_of(backend)
        self.closers.append(close)
        self.backend = backend
        self.encoder_state = "ready"
        self.start_workers(workers)

    def model_dimensions(self) -> tuple[str, int] | None:
        """The running (or loading) model and its vector size, without waiting for it to load."""
        if self.backend is not None:
            return self.backend.info.model, self.backend.info.dimensions
        if self.encoder_state == "loading" and self.encoder_model is not None:
            from encoder.models import model_dimensions

            dims = model_dimensions(self.encoder_model)
            return None if dims is None else (self.encoder_model, dims)
        return None

    def require_backend(self, purpose: str) -> EmbeddingBackend:
        """The encoder, or a 503 that says why there is none."""
        if self.backend is not None:
            return self.backend
        if self.encoder_state == "loading":
            raise Problem(
                "service-unavailable",
                f"the encoder is still loading; retry shortly ({purpose})",
                headers={"Retry-After": "5"},
            )
        if self.encoder_state == "failed":
            raise Problem("service-unavailable", f"the encoder failed to start ({self.encoder_error}); {purpose}")
        raise Problem("service-unavailable", f"this server runs no encoder: {purpose}")

    def processor(self) -> Processor:
        """The ``?wait=true`` path's processor (kept: it caches collection rows)."""
        assert self.backend is not None
        if self._processor is None or self._processor.backend is not self.backend:
            self._processor = Processor(self.engine, self.backend, self.ingest)
        return self._processor

    def start_workers(self, count: int) -> None:
        if count <= 0:
            return
        if self.backend is None:
            raise ValueError("in-process ingest workers need an encoder; drop --no-encoder or use --no-worker")
        for i in range(count):
            worker = IngestWorker(
                self.engine, self.backend, settings=self.ingest, stop_event=self.stop_event, name=f"ingest-{i}"
            )
            t = threading.Thread(target=worker.run, name=f"ingest-{i}", daemon=True)
            t.start()
            self.threads.append(t)
        self.notes["ingest_workers"] = count

    def start_maintenance(self) -> None:
        try:
            from maintenance.worker import MaintenanceWorker  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            log.warning("--maintenance: maintenance.worker is not installed here (%s); running without it", exc)
            self.notes["maintenance"] = f"unavailable: {exc}"
            return
        worker = MaintenanceWorker(self.engine, settings=self.settings, latency_source=self.latency.p99_ms)
        t = threading.Thread(target=worker.run_forever, args=(self.stop_event,), name="maintenance", daemon=True)
        t.start()
        self.threads.append(t)
        self.notes["maintenance"] = "running"

    def close(self) -> None:
        self.stop_event.set()
        # Workers finish the batch in hand; a model still loading is not waited for (daemon thread).
        deadline = time.monotonic() + 20
        for t in self.threads:
            if t.name != "encoder-loader":
                t.join(max(0.1, deadline - time.monotonic()))
        self.sampler.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._claimer is not None:
            self._claimer.close()
        for close in reversed(self.closers):
            try:
                close()
            except Exception as exc:
                log.warning("closing: %s", exc)
