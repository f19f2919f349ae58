"""Helpers shared by the API tests (imported as ``api_helpers``; fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import uvicorn
from PIL import Image

from encoder.types import EncoderInfo, Priority
from memstore.api.runtime import RuntimeOptions
from memstore.settings import ApiSettings, IngestSettings, Settings
from memstore.web import create_app

TINY = "memstore-tiny"


class FakeBackend:
    """A deterministic stand-in encoder: vectors from a hash of the input; can be told to fail or block."""

    def __init__(self, dimensions: int = 64, model: str = TINY) -> None:
        self.info = EncoderInfo(
            model=model,
            pretrained=None,
            pretrained_weights=False,
            dimensions=dimensions,
            device="cpu",
            precision="fp32",
            image_size=64,
        )
        self.failures: dict[str | bytes, tuple[int, BaseException]] = {}
        self.calls: list[tuple[str, int, Priority]] = []
        self.gate: threading.Event | None = None  # when set to an Event, calls block until it is set
        self.entered = threading.Event()

    def _vec(self, data: bytes) -> np.ndarray:
        rng = np.random.default_rng(int.from_bytes(data[:8].ljust(8, b"\0"), "little") ^ len(data))
        v = rng.standard_normal(self.info.dimensions).astype(np.float32)
        return v / np.linalg.norm(v)

    def fail(self, key: str | bytes, times: int, error: BaseException) -> None:
        """Fail the next ``times`` calls that include this text or image (other calls are untouched)."""
        self.failures[key] = (times, error)

    def _maybe_fail(self, inputs: list[Any]) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(60)
        for key in inputs:
            times, error = self.failures.get(key, (0, None))
            if times and error is not None:
                self.failures[key] = (times - 1, error)
                raise error

    def embed_texts(self, texts: list[str], *, priority: Priority = Priority.QUERY, deadline_s: Any = None) -> Any:
        self.calls.append(("text", len(texts), priority))
        self._maybe_fail(list(texts))
        return np.stack([self._vec(t.encode()) for t in texts])

    def embed_images(
        self,
        images: list[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: Any = None,
        return_tiles: bool = False,
    ) -> Any:
        self.calls.append(("image", len(images), priority))
        self._maybe_fail(list(images))
        return np.stack([self._vec(b[-64:]) for b in images])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime


FAST_INGEST = IngestSettings(
    batch_size=16, max_attempts=3, backoff_base_s=0.2, backoff_max_s=1.0, poll_interval_s=0.5, wait_timeout_s=20
)


WIDE = "memstore-tiny-wide"  # the second offline model: 96 dimensions


@contextlib.contextmanager
def two_model_engine(tiny_engine: Any) -> Iterator[Any]:
    """An encoder engine running the tiny model (the session's, shared) and the wide one, as
    MEMSTORE_MODELS runs two."""
    from encoder.engine import EmbeddingEngine
    from encoder.models import create_encoder

    tiny = tiny_engine.encoder
    wide = create_encoder(WIDE, pretrained=None, device="cpu", batch_size=tiny.batch_size)
    engine = EmbeddingEngine([tiny, wide], tiny_engine.settings).start()
    try:
        yield engine
    finally:
        engine.stop()


def start_server(
    settings: Settings,
    *,
    backend: Any,
    workers: int = 1,
    auth: str = "keys",
    ingest: IngestSettings = FAST_INGEST,
    **api: Any,
) -> LiveServer:
    app = create_app(
        settings,
        api_settings=ApiSettings(auth=auth, query_sample_rate=1.0, key_cache_s=0.5, **api),
        ingest_settings=ingest,
        options=RuntimeOptions(backend=backend, encoder=None if backend else "none", ingest_workers=workers),
    )
    return LiveServer(app)


def make_image(seed: int, size: tuple[int, int] = (96, 72), fmt: str = "JPEG") -> bytes:
    """A distinct picture per seed: random blocks of colour (distinct for any encoder)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, size=(6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize(size, Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def wait_ready(client: httpx.Client, name: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/collections/{name}").json()
        if body["pending"] == 0 or time.monotonic() > deadline:
            return body
        time.sleep(0.1)
