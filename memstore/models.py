"""What the store takes and gives back."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from memstore.catalog.collections import Collection

UpsertStatus = Literal["created", "updated", "metadata", "unchanged"]  # metadata: nothing else changed


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
    """One item to upsert: a vector with optional external id, metadata and text (stored and found by
    keyword search as it is; the vector is the caller's)."""

    vector: Any
    external_id: str | None = None
    metadata: dict[str, Any] | None = None
    text: str | None = None


@dataclass(frozen=True)
class UpsertResult:
    id: int
    external_id: str
    status: UpsertStatus


@dataclass(frozen=True, slots=True, init=False)
class SearchResult:
    """One hit. ``score``: higher is better (the metric's similarity for a vector search, ``ts_rank_cd``
    for a keyword search, the fused score for a hybrid one); ``distance``: to the query vector (None in
    a keyword search); the ranks: where each list placed the item (None where it missed it)."""

    id: int
    external_id: str
    distance: float | None
    score: float
    metadata: dict[str, Any]
    vector_rank: int | None = None
    keyword_rank: int | None = None
    has_original: bool = True  # a file or a text to download; an item stored as a bare vector has none

    def __init__(
        self,
        id: int,
        external_id: str,
        distance: float | None,
        score: float,
        metadata: dict[str, Any],
        vector_rank: int | None = None,
        keyword_rank: int | None = None,
        has_original: bool = True,
    ) -> None:
        # What the frozen dataclass's own __init__ does (one object.__setattr__ per field, looked up
        # each time), through the slots' setters fetched once: every search builds one per hit, and
        # the generated __init__ cost more than decoding the hit's row.
        _SET_ID(self, id)
        _SET_EXTERNAL_ID(self, external_id)
        _SET_DISTANCE(self, distance)
        _SET_SCORE(self, score)
        _SET_METADATA(self, metadata)
        _SET_VECTOR_RANK(self, vector_rank)
        _SET_KEYWORD_RANK(self, keyword_rank)
        _SET_HAS_ORIGINAL(self, has_original)

    @property
    def ranks(self) -> dict[str, int | None]:
        return {"vector": self.vector_rank, "keyword": self.keyword_rank}


(
    _SET_ID,
    _SET_EXTERNAL_ID,
    _SET_DISTANCE,
    _SET_SCORE,
    _SET_METADATA,
    _SET_VECTOR_RANK,
    _SET_KEYWORD_RANK,
    _SET_HAS_ORIGINAL,
) = (SearchResult.__dict__[f.name].__set__ for f in fields(SearchResult))


@dataclass(frozen=True)
class DuplicatePair:
    """Two items whose vectors are within the asked distance of each other (``a_id < b_id``)."""

    a_id: int
    a_external_id: str
    b_id: int
    b_external_id: str
    distance: float


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
    # Text read in the image (memstore.catalog.ocr_items): status pending, done or failed; None when never asked for.
    ocr_status: str | None = None
    ocr_text: str | None = None
    ocr_error: str | None = None


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
