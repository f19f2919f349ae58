"""What the store takes and gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from memstore.collections import Collection

UpsertStatus = Literal["created", "updated", "unchanged"]


@dataclass(frozen=True)
class Original:
    """What an item was made from: image bytes (``content``, ``content_type``) or a ``text``; neither
    for an item stored as a vector only."""

    external_id: str
    content: bytes | None
    content_type: str | None
    text: str | None
    filename: str | None = None  # the uploaded file's name, when the metadata kept one


@dataclass(frozen=True)
class ItemIn:
    """One item to upsert: a vector with optional external id and metadata."""

    vector: Any
    external_id: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True)
class UpsertResult:
    id: int
    external_id: str
    status: UpsertStatus


@dataclass(frozen=True, slots=True)
class SearchResult:
    id: int
    external_id: str
    distance: float
    score: float
    metadata: dict[str, Any]


@dataclass(frozen=True)
class Item:
    id: int
    external_id: str
    status: str
    metadata: dict[str, Any]
    vector: np.ndarray | None = None
    text: str | None = None
    content_type: str | None = None
    has_content: bool = False
    error: str | None = None
    created_at: Any = None
    updated_at: Any = None


@dataclass(frozen=True)
class CollectionStats:
    collection: Collection
    items: int
    ready: int
    pending: int
    failed: int
    index_bytes: int
    table_bytes: int
    counts_exact: bool = True  # False: items and ready are the planner's estimate (large collections)
    extra: dict[str, Any] = field(default_factory=dict)
