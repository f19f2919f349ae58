"""The encoder a process uses: a model loaded in this process, a remote encoder service, or none.

A local model loads in a thread, so a server answers while it loads; ``require`` says why there is
no encoder when a request needs one.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

from encoder.errors import WeightsNotFoundError
from encoder.gc_freeze import freeze_startup
from encoder.images import ImageOptions
from encoder.settings import OFFLINE_HINT, encoder_settings
from encoder.types import EmbeddingBackend
from memstore.errors import EncoderUnavailableError
from memstore.settings import get_settings
from memstore.spaces.model_choice import models_of

log = logging.getLogger(__name__)

EncoderMode = Literal["local", "remote", "none"]
EncoderState = Literal["off", "loading", "ready", "failed"]


@dataclass(frozen=True)
class EncoderChoice:
    """Which encoder: ``mode`` None means remote if MEMSTORE_ENCODER_URL is set, else local;
    ``backend`` a ready one (tests, benchmarks), which overrides the rest."""

    mode: EncoderMode | None = None
    url: str | None = None
    backend: EmbeddingBackend | None = None


def open_backend(choice: EncoderChoice) -> tuple[EmbeddingBackend | None, Callable[[], None]]:
    """The encoder ``choice`` names, and how to close it (blocks while a local model loads)."""
    if choice.backend is not None:
        return choice.backend, lambda: None
    es = encoder_settings()
    url = choice.url or es.url
    mode = choice.mode or ("remote" if url else "local")
    if mode == "none":
        return None, lambda: None
    if mode == "remote":
        if not url:
            raise ValueError("a remote encoder needs a URL: --encoder-url or MEMSTORE_ENCODER_URL")
        from encoder.client import RemoteEncoder

        remote = RemoteEncoder(url, api_key=es.api_key)
        return remote, remote.close
    from encoder.engine import EmbeddingEngine
    from encoder.models import create_encoders_from_settings, resolve_device

    # On CPU, cores - 1 torch threads, as the encoder service takes: with every core, torch's threads
    # take the CPU from the searches, the database and the image decoding beside them (a search's p99
    # rose 12x during a re-embedding on 2 cores, for no more images a second; bench.reembed).
    threads = es.service_torch_threads(resolve_device(es.device))
    engine = EmbeddingEngine(create_encoders_from_settings(es, threads=threads), es).start()
    return engine, engine.stop


def image_options_of(backend: EmbeddingBackend | None) -> ImageOptions:
    """The image limits uploads are checked against: the local engine's, else the environment's."""
    options = getattr(backend, "image_options", None)
    return options if isinstance(options, ImageOptions) else encoder_settings().image_options()


LOAD_SWITCH_INTERVAL_S = 0.0005


@contextmanager
def _yielding(on: bool) -> Iterator[None]:
    """While a model loads: the interpreter's switch interval at 0.5 ms (from 5 ms). Building and
    tracing a model is Python work that holds the interpreter lock for long stretches; the event
    loop, which gives the lock up at each wait for the network or the database, waited up to a whole
    interval to get it back, each time: REST searches that need no model ran at 0.36-0.40 of their
    speed while the model loaded (bench.startup). Process-wide, so only for the load."""
    if not on:
        yield
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, LOAD_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@dataclass
class EncoderHost:
    """The process's encoder and its state (off, loading, ready or failed)."""

    stop_event: threading.Event
    backend: EmbeddingBackend | None = None
    state: EncoderState = "off"
    error: str | None = None
    model: str | None = None  # the model a local encoder is loading (known before it is ready)
    models: tuple[str, ...] = ()  # every model it is loading, the default first
    image_options: ImageOptions = field(default_factory=ImageOptions)
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self, choice: EncoderChoice, on_ready: Callable[[EmbeddingBackend], None]) -> None:
        """A given backend is used at once; a model loads in a thread and ``on_ready`` runs after."""
        if choice.backend is not None:
            self._ready(choice.backend, lambda: None, on_ready)
            return
        if choice.mode == "none":
            return
        self.state = "loading"
        settings = encoder_settings()
        if not (choice.url or settings.url) and choice.mode != "remote":
            self.model = settings.model
            self.models = tuple(name for name, _ in settings.all_models())
        self._thread = threading.Thread(target=self._load, args=(choice, on_ready), name="encoder-loader", daemon=True)
        self._thread.start()

    def _load(self, choice: EncoderChoice, on_ready: Callable[[EmbeddingBackend], None]) -> None:
        try:
            with _yielding(get_settings().encoder_load_yield):
                backend, close = open_backend(choice)
            assert backend is not None
            _ = backend.info  # a remote encoder is asked here, so a bad URL fails now, not per request
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("the encoder did not start: %s", exc)
            if isinstance(exc, WeightsNotFoundError):
                log.error("no weights and no network? try memstore offline with: %s", OFFLINE_HINT)
            return
        if self.stop_event.is_set():
            close()
            return
        # While /health still says starting: the one full collection the freeze needs goes before
        # searches that need the model arrive (encoder.gc_freeze).
        freeze_startup("the encoder loaded", enabled=get_settings().gc_freeze)
        self._ready(backend, close, on_ready)
        log.info("encoder ready: %s", backend.info)
        # Measured: a torch model whose loading thread has exited runs 3-5x slower afterwards
        # (its OpenMP thread pool goes with the thread), so this thread stays until shutdown.
        self.stop_event.wait()

    def _ready(
        self, backend: EmbeddingBackend, close: Callable[[], None], on_ready: Callable[[EmbeddingBackend], None]
    ) -> None:
        self.image_options = image_options_of(backend)
        self._closers.append(close)
        self.backend = backend
        self.state = "ready"
        on_ready(backend)

    def model_dimensions(self, name: str | None = None) -> tuple[str, int] | None:
        """The running (or loading) model called ``name`` (None: the default) and its vector size,
        without waiting for it to load; None when no such model runs here."""
        if self.backend is not None:
            infos = models_of(self.backend)
            info = self.backend.info if name is None else infos.get(name)
            return None if info is None else (info.model, info.dimensions)
        if self.state == "loading" and self.model is not None:
            from encoder.models import model_dimensions

            wanted = self.model if name is None else name
            if wanted not in (self.models or (self.model,)):
                return None
            dims = model_dimensions(wanted)
            return None if dims is None else (wanted, dims)
        return None

    def running_models(self) -> tuple[str, ...]:
        """The names of the models that run (or load) here, the default first."""
        if self.backend is not None:
            return tuple(models_of(self.backend))
        if self.state == "loading" and self.model is not None:
            return self.models or (self.model,)
        return ()

    def require(self, purpose: str) -> EmbeddingBackend:
        """The encoder, or EncoderUnavailableError saying why there is none."""
        if self.backend is not None:
            return self.backend
        if self.state == "loading":
            raise EncoderUnavailableError(f"the encoder is still loading; retry shortly ({purpose})", retry_after=5)
        if self.state == "failed":
            raise EncoderUnavailableError(f"the encoder failed to start ({self.error}); {purpose}")
        raise EncoderUnavailableError(f"this server runs no encoder: {purpose}")

    def close(self) -> None:
        """Close the backend; a model still loading is not waited for (its thread is a daemon)."""
        for close in reversed(self._closers):
            try:
                close()
            except Exception as exc:
                log.warning("closing the encoder: %s", exc)
        self._closers.clear()
