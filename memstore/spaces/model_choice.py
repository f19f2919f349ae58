"""Which of the encoder's models fills a collection.

An encoder may run several models (``MEMSTORE_MODELS``); a collection records the model its vectors
come from. The API's checks, its query embeddings, the web pages and the ingest workers all ask here,
so a collection of the second model is filled by the second model, and one of a model that does not
run here is refused with the reason.
"""

from __future__ import annotations

from typing import Any

from encoder.types import EmbeddingBackend, EncoderInfo
from memstore.catalog.collections import Collection, Space


def models_of(backend: EmbeddingBackend) -> dict[str, EncoderInfo]:
    """Every model ``backend`` runs (MEMSTORE_MODELS), its default first."""
    infos: dict[str, EncoderInfo] | None = getattr(backend, "infos", None)
    return dict(infos) if infos else {backend.info.model: backend.info}


def model_for(
    backend: EmbeddingBackend, c: Collection, space: Space | None = None
) -> tuple[dict[str, Any], str | None]:
    """How to ask ``backend`` for the vectors of ``c``'s ``space`` (default: its own, the ``default``
    space): the keyword arguments of ``embed_texts`` and ``embed_images`` (``{"model": name}`` for a
    model other than the default), or why it cannot (a model it does not run, or other dimensions
    than the space's)."""
    s = space or c.default_space
    what = f"collection {c.name!r}" if not s.side else f"space {s.name!r} of collection {c.name!r}"
    infos = models_of(backend)
    default = backend.info
    info = infos.get(s.model, None) if s.model else default
    if info is None:
        runs = ", ".join(infos)
        return {}, f"{what} holds {s.model} vectors but this encoder runs {runs} (add it to MEMSTORE_MODELS)"
    if s.dimensions != info.dimensions:
        return {}, f"{what} has {s.dimensions} dimensions but {info.model} makes {info.dimensions}"
    return ({} if info.model == default.model else {"model": info.model}), None
