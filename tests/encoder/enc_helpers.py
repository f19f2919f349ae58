"""Helpers shared by the encoder tests."""

from __future__ import annotations

import hashlib
import io
import threading

import numpy as np
import torch
from PIL import Image

from encoder.images import ImageSpec
from encoder.settings import EncoderSettings
from encoder.types import EncoderInfo


def make_image(width: int, height: int, fmt: str = "PNG", *, seed: int = 0, mode: str = "RGB", **save) -> bytes:
    """A noisy picture (so views differ from each other), encoded as `fmt`."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    img = Image.fromarray(pixels, "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def settings_for(**overrides) -> EncoderSettings:
    """Explicit settings, whatever MEMSTORE_* variables the environment holds."""
    base = dict(model="memstore-tiny", pretrained=None, batch_size=8, preprocess_workers=0, max_tiles=64)
    base.update(overrides)
    return EncoderSettings(_env_file=None, **base)


class FakeEncoder:
    """A model whose cost is counted in ticks: it records every batch it is asked to run.

    Text vectors are a function of the token row, image vectors of the view's pixels, so tests can
    check that every result went back to the request it belongs to. `gate`, when set, makes each
    batch wait for a release, so a test can hold the scheduler mid-batch.
    """

    def __init__(self, batch_size: int = 8, dims: int = 8, image_size: int = 16) -> None:
        self.batch_size = batch_size
        self.info = EncoderInfo("fake", None, False, dims, "cpu", "fp32", image_size, dims, batch_size)
        self.spec = ImageSpec(image_size, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
        self.batches: list[tuple[str, int]] = []
        self.gate: threading.Semaphore | None = None
        self.lock = threading.Lock()

    def tokenize(self, texts):
        rows = [list(hashlib.sha256(t.encode()).digest()[: self.info.dimensions]) for t in texts]
        return torch.tensor(rows, dtype=torch.long)

    def text_vector(self, text: str) -> np.ndarray:
        v = self.tokenize([text])[0].numpy().astype(np.float32) + 1.0
        return v / np.linalg.norm(v)

    def _record(self, kind: str, n: int) -> None:
        assert 0 < n <= self.batch_size, f"batch of {n} rows for B={self.batch_size}"
        if self.gate is not None:
            assert self.gate.acquire(timeout=30), "test never released the gate"
        with self.lock:
            self.batches.append((kind, n))

    def encode_text_batch(self, tokens, *, urgent=True):
        tokens = np.asarray(tokens)
        self._record("text", tokens.shape[0])
        v = tokens.astype(np.float32) + 1.0
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def encode_image_batch(self, views, *, urgent=True):
        views = np.asarray(views)  # the engine hands over a list of per-unit arrays
        self._record("image", views.shape[0])
        x = np.asarray(views, dtype=np.float32).reshape(views.shape[0], -1, 3)
        v = np.concatenate([x.mean(axis=1), x.std(axis=1), np.ones((len(x), self.info.dimensions - 6))], axis=1)
        return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)

    @property
    def units(self) -> int:
        return sum(n for _, n in self.batches)
