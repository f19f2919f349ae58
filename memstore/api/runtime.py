"""What one API process runs besides the routes, composed from ``memstore.services``.

``Runtime`` is built in the app's lifespan and reached by routes as ``request.app.state.runtime``.
Background services other than ingest workers (the maintenance worker) are handed in by the command
that starts the server: ``memstore.api`` never imports ``maintenance``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from encoder.requests import wait_future
from encoder.types import EmbeddingBackend, Priority
from memstore.access.keys import KeyVerifier
from memstore.db.core import Database
from memstore.db.search_pool import CANCEL, Cancel
from memstore.queue.claims import Claimer
from memstore.search.runner import AsyncSearcher
from memstore.services.encoder_host import EncoderChoice, EncoderHost, EncoderMode
from memstore.services.foreground import ForegroundController
from memstore.services.foreground_signal import SharePublisher
from memstore.services.latency import LatencyTracker
from memstore.services.query_sampler import QuerySampler
from memstore.services.workers import BackgroundService, InProcessWorkers, ServiceContext
from memstore.settings import ApiSettings, IngestSettings, Settings
from memstore.store import VectorStore
from memstore.workers.ingest import Processor

T = TypeVar("T")

log = logging.getLogger(__name__)


# The longest a request waits for the encoder to embed its query (a text or an image at query
# priority, normally milliseconds): past it the encoder's work is cancelled and the request answers
# 503, instead of holding its thread for as long as the encoder is stuck.
QUERY_EMBED_TIMEOUT_S = 30.0


class EncoderWork:
    """The encoder requests one API request has in flight (in ``ENCODER_WORK``, a context variable
    ``Runtime.off_loop`` sets): when the request is cancelled (its client went away), they are
    cancelled too, and the engine drops what it has not run of them. One added after that is
    cancelled at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: set[Future[Any]] = set()
        self.cancelled = False

    def add(self, fut: Future[Any]) -> None:
        with self._lock:
            cancelled = self.cancelled
            if not cancelled:
                self._futures.add(fut)
        if cancelled:
            fut.cancel()
        else:  # outside the lock: a future already done runs the callback at once, in this thread
            fut.add_done_callback(self._forget)

    def _forget(self, fut: Future[Any]) -> None:
        with self._lock:
            self._futures.discard(fut)

    def cancel(self) -> None:
        """Non-blocking (a future's cancel takes its lock for a moment): safe on the event loop."""
        with self._lock:
            self.cancelled = True
            futures = list(self._futures)
        for fut in futures:
            fut.cancel()


ENCODER_WORK: contextvars.ContextVar[EncoderWork | None] = contextvars.ContextVar("memstore_encoder_work", default=None)


def embed_query(
    backend: EmbeddingBackend,
    *,
    text: str | None = None,
    image: bytes | None = None,
    timeout_s: float | None = None,
    **how: Any,
) -> np.ndarray:
    """The vector of one query text or image at query priority (``how``: the model, as
    ``memstore.spaces.model_choice`` gives it). An encoder in this process is waited for at most
    ``timeout_s`` (QUERY_EMBED_TIMEOUT_S), and its work is cancelled on a timeout or when the request
    is (``EncoderWork``); a remote encoder's one HTTP call is bounded by its client's timeout."""
    kind = "texts" if text is not None else "images"
    inputs: list[Any] = [text] if text is not None else [image]
    submit = getattr(backend, f"submit_{kind}", None)
    if submit is None:
        return np.asarray(getattr(backend, f"embed_{kind}")(inputs, priority=Priority.QUERY, **how))[0]
    fut: Future[Any] = submit(inputs, priority=Priority.QUERY, **how)
    work = ENCODER_WORK.get()
    if work is not None:
        work.add(fut)
    return np.asarray(wait_future(fut, QUERY_EMBED_TIMEOUT_S if timeout_s is None else timeout_s))[0]


@dataclass
class RuntimeOptions:
    """How ``build_app`` assembles the process; ``memstore serve`` fills this from its flags."""

    encoder: EncoderMode | None = None  # None: remote if MEMSTORE_ENCODER_URL is set, else local
    encoder_url: str | None = None
    backend: EmbeddingBackend | None = None  # a ready backend (tests, benchmarks); overrides ``encoder``
    ingest_workers: int = 0  # in-process ingest worker threads
    services: Sequence[BackgroundService] = ()  # e.g. the maintenance worker (memstore serve --maintenance)

    def encoder_choice(self) -> EncoderChoice:
        return EncoderChoice(mode=self.encoder, url=self.encoder_url, backend=self.backend)


@dataclass
class Runtime:
    settings: Settings
    api: ApiSettings
    ingest: IngestSettings
    db: Database
    store: VectorStore
    verifier: KeyVerifier
    sampler: QuerySampler
    stop_event: threading.Event = field(default_factory=threading.Event)
    encoder: EncoderHost = field(init=False)
    foreground: ForegroundController = field(init=False)
    workers: InProcessWorkers = field(init=False)
    background: list[threading.Thread] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    latency: LatencyTracker = field(default_factory=LatencyTracker)
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=32, thread_name_prefix="search")
    )
    searcher: AsyncSearcher | None = None  # vector searches on the event loop (set by the app's lifespan)
    _claimer: Claimer | None = None
    _processor: Processor | None = None
    _claimer_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.encoder = EncoderHost(self.stop_event)
        # Background work yields to the searches this process answers (their latency, self.latency).
        self.foreground = ForegroundController.from_settings(self.settings, self.latency.since)
        if self.settings.foreground_shared:  # and in other processes: memstore worker, the maintenance daemon
            self.foreground.publisher = SharePublisher(self.db, heartbeat_s=self.settings.foreground_window_s)
        self.workers = InProcessWorkers(self.db, self.ingest, self.stop_event, pace=self.foreground)
        self.store.sealer.pace = self.foreground  # seals and merges of segmented collections yield too

    def claimer(self) -> Claimer:
        """The identity under which ``?wait=true`` requests claim their own items."""
        with self._claimer_lock:
            if self._claimer is None:
                self._claimer = Claimer(self.db)
            else:
                self._claimer.ensure()
            return self._claimer

    def start(self, options: RuntimeOptions) -> None:
        """The encoder (its workers start once it is ready), then the background services."""
        self.workers.configured = options.ingest_workers
        self.foreground.start()

        def on_ready(backend: EmbeddingBackend) -> None:
            self.foreground.attach_encoder(backend)
            self.workers.start(backend)

        self.encoder.start(options.encoder_choice(), on_ready)
        context = ServiceContext(self.db, self.settings, self.latency.p99_ms, self.stop_event, pace=self.foreground)
        for service in options.services:
            thread, note = service.start(context)
            self.notes[service.name] = note
            if thread is not None:
                self.background.append(thread)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the executor, in a copy of the request's context (a read's ``min_lsn``
        travels in a context variable; ``run_in_executor`` alone would drop it). When the request is
        cancelled (its client went away), a search ``fn`` runs is cancelled on the server too
        (``memstore.db.search_pool.Cancel``), so its connection is free at once, and so is the
        encoder work it waits for (``EncoderWork``: a query's vector, ``embed_query``)."""
        context = contextvars.copy_context()
        scope = Cancel()
        work = EncoderWork()
        context.run(CANCEL.set, scope)
        context.run(ENCODER_WORK.set, work)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, context.run, fn, *args)
        except asyncio.CancelledError:
            work.cancel()
            loop.run_in_executor(self.executor, scope.cancel)  # a round trip: not on the event loop
            raise

    def processor(self) -> Processor:
        """The ``?wait=true`` path's processor (kept: it caches collection rows)."""
        backend = self.encoder.require("wait=true needs the encoder")
        if self._processor is None or self._processor.backend is not backend:
            self._processor = Processor(self.db, backend, self.ingest, registry=self.store.registry)
        return self._processor

    def threads(self) -> list[threading.Thread]:
        return [*self.workers.threads, *self.background]

    def close(self) -> None:
        self.stop_event.set()
        self.foreground.force(1.0)  # the work in hand finishes at full speed, not held by a share of zero
        # Workers finish the batch in hand; a model still loading is not waited for (daemon thread).
        deadline = time.monotonic() + 20
        for t in self.threads():
            t.join(max(0.1, deadline - time.monotonic()))
        self.store.sealer.close()
        self.foreground.close()
        self.sampler.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._claimer is not None:
            self._claimer.close()
        self.encoder.close()
