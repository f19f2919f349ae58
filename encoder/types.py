"""Plain value types shared by the engine, the HTTP service and the remote client.

Nothing here imports torch, so `encoder.client` stays usable in processes without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol

import numpy as np


class Priority(IntEnum):
    """Scheduling class; a larger value is served first (QUERY > SYNC_INGEST > BACKGROUND)."""

    BACKGROUND = 0
    SYNC_INGEST = 1
    QUERY = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.strip().upper()]
        except KeyError:
            names = ", ".join(p.label for p in cls)
            raise ValueError(f"unknown priority {value!r}; expected one of {names}") from None


class Modality(StrEnum):
    TEXT = "text"
    IMAGE = "image"


@dataclass(frozen=True)
class EncoderInfo:
    """Facts about the loaded model that health checks and stored vectors depend on."""

    model: str
    pretrained: str | None
    pretrained_weights: bool
    dimensions: int
    device: str
    precision: str
    image_size: int
    context_length: int = 77
    batch_size: int = 32
    graph: str = "eager"  # "trace": micro-batches run through a traced fixed-shape graph

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "pretrained": self.pretrained,
            "pretrained_weights": self.pretrained_weights,
            "dimensions": self.dimensions,
            "device": self.device,
            "precision": self.precision,
            "image_size": self.image_size,
            "context_length": self.context_length,
            "batch_size": self.batch_size,
            "graph": self.graph,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> EncoderInfo:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in data.items() if k in names})  # type: ignore[arg-type]


@dataclass(frozen=True)
class ImageEmbedding:
    """One image's vector plus the per-view vectors it was combined from.

    `tiles[i]` covers `boxes[i]` = (x0, y0, x1, y1) in the image's pixel coordinates after EXIF
    rotation, and entered the combination with `weights[i]` (the share of that tile covered by
    image content rather than padding).
    """

    vector: np.ndarray
    global_vector: np.ndarray
    tiles: np.ndarray
    boxes: list[tuple[int, int, int, int]] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    grid: tuple[int, int] = (0, 0)  # (columns, rows); (0, 0) when the image was not tiled


class EmbeddingBackend(Protocol):
    """What the API and ingest workers need: a local EmbeddingEngine or a RemoteEncoder."""

    @property
    def info(self) -> EncoderInfo: ...

    def embed_texts(
        self, texts: list[str], *, priority: Priority = Priority.QUERY, deadline_s: float | None = None
    ) -> np.ndarray: ...

    def embed_images(
        self,
        images: list[bytes],
        *,
        priority: Priority = Priority.QUERY,
        deadline_s: float | None = None,
        return_tiles: bool = False,
    ) -> np.ndarray | list[ImageEmbedding]: ...
