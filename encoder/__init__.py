"""memstore's encoder: open_clip models, high-resolution tiling and a TokenFlux-style tile scheduler.

Light names (errors, types, settings, the remote client) import without torch; the model registry
and engine load torch on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    DecodeUnavailableError,
    DecompressionBombError,
    EncoderError,
    ImageRejectedError,
    QueueFullError,
    RequestCancelledError,
    RequestTooLargeError,
    UnknownModelError,
    WeightsNotFoundError,
)
from .types import EmbeddingBackend, EncoderInfo, ImageEmbedding, Modality, Priority

if TYPE_CHECKING:
    from .client import RemoteEncoder
    from .engine import EmbeddingEngine
    from .models import Encoder, create_encoder, list_encoders
    from .settings import EncoderSettings

_LAZY = {
    "create_encoder": "models",
    "list_encoders": "models",
    "Encoder": "models",
    "EmbeddingEngine": "engine",
    "EncoderSettings": "settings",
    "RemoteEncoder": "client",
}

__all__ = [
    "DecodeUnavailableError",
    "DecompressionBombError",
    "EmbeddingBackend",
    "EmbeddingEngine",
    "Encoder",
    "EncoderError",
    "EncoderInfo",
    "EncoderSettings",
    "ImageEmbedding",
    "ImageRejectedError",
    "Modality",
    "Priority",
    "QueueFullError",
    "RemoteEncoder",
    "RequestCancelledError",
    "RequestTooLargeError",
    "UnknownModelError",
    "WeightsNotFoundError",
    "create_encoder",
    "list_encoders",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
