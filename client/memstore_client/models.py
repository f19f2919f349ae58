"""Typed results (and the item input) of the memstore API.

Fields the server adds later are kept (``extra="allow"``) rather than refused, so an older client
reads a newer server's answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Collection",
    "Content",
    "DeleteResult",
    "DuplicatePair",
    "DuplicatesPage",
    "Health",
    "HitRanks",
    "Item",
    "ItemAck",
    "ItemIn",
    "ItemPage",
    "ItemRef",
    "ItemsAck",
    "LoadResult",
    "MetadataIndex",
    "Ocr",
    "SearchGroup",
    "SearchHit",
    "SearchResult",
    "Space",
]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class Collection(_Answer):
    """``GET /v1/collections/{name}``: the counts (``items``, ``ready``, ``pending``, ``failed``) and
    sizes are filled only when one collection is fetched (``get_collection``)."""

    name: str
    dimensions: int
    metric: str
    model: str | None = None
    hnsw_m: int | None = None
    hnsw_ef_construction: int | None = None
    ef_search: int | None = None
    partitions: int = 1
    language: str = "simple"
    text_fields: list[str] = Field(default_factory=list)
    ocr: bool = False
    ocr_pending: int | None = None
    ocr_backfilling: bool = False
    created_at: datetime | None = None
    active_space: str = "default"
    spaces: list[str] = Field(default_factory=lambda: ["default"])
    items: int | None = None
    ready: int | None = None
    pending: int | None = None
    failed: int | None = None
    index_bytes: int | None = None
    table_bytes: int | None = None
    write_path: str = "graph"
    segments: dict[str, Any] | None = None  # a segmented collection's graphs and tail_rows (get_collection)
    counts_exact: bool | None = None


class ItemIn(BaseModel):
    """One item to add: a ``text``, a ``vector``, or both (a text with a vector is stored for keyword
    search as it is, not embedded). ``external_id`` makes re-sending an update."""

    model_config = ConfigDict(extra="forbid")

    external_id: str | None = None
    text: str | None = None
    vector: list[float] | None = None
    metadata: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ItemAck(_Answer):
    id: int
    external_id: str
    status: str  # pending, ready or failed
    change: str  # created, updated, metadata or unchanged
    error: str | None = None


class ItemsAck(_Answer):
    """The answer to an add: one acknowledgement per item, in order; ``lsn`` is the write's position
    (pass it to reads for read-your-writes across replicas)."""

    items: list[ItemAck]
    lsn: str | None = None


class Ocr(_Answer):
    status: Literal["pending", "done", "failed"] | str
    text: str | None = None
    error: str | None = None


class Item(_Answer):
    id: int
    external_id: str
    status: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    attempts: int | None = None
    text: str | None = None
    content_type: str | None = None
    content_url: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    vector: list[float] | None = None
    ocr: Ocr | None = None


class ItemPage(_Answer):
    """A page of items: ``next`` is the next page's path (a GET listing), ``next_after`` the ``after``
    that gives it (any listing); both None on the last page."""

    items: list[Item]
    next: str | None = None
    next_after: int | None = None


class HitRanks(_Answer):
    vector: int | None = None
    keyword: int | None = None


class SearchHit(_Answer):
    """``score`` is higher for better hits in every mode (similarity, ``ts_rank_cd`` or the fused
    score); ``distance`` is to the query vector (None in a keyword search)."""

    id: int
    external_id: str
    score: float
    distance: float | None = None
    ranks: HitRanks = Field(default_factory=HitRanks)
    metadata: dict[str, Any] = Field(default_factory=dict)
    content_url: str | None = None
    vector: list[float] | None = None


class SearchGroup(_Answer):
    value: Any = None
    hits: list[SearchHit]


class SearchResult(_Answer):
    results: list[SearchHit]
    groups: list[SearchGroup] | None = None


class ItemRef(_Answer):
    id: int
    external_id: str


class DuplicatePair(_Answer):
    a: ItemRef
    b: ItemRef
    distance: float


class DuplicatesPage(_Answer):
    pairs: list[DuplicatePair]
    next: int | None = None


class MetadataIndex(_Answer):
    field: str | list[str]  # a top-level key, or the keys down to a nested field
    type: str
    name: str
    valid: bool
    size_bytes: int


class Space(_Answer):
    name: str
    model: str | None = None
    pretrained: str | None = None
    dimensions: int
    metric: str
    state: str
    active: bool
    created_at: datetime | None = None
    ready_at: datetime | None = None
    done: int = 0
    total: int = 0
    pending: int = 0
    failed: int = 0
    without_original: int = 0
    without_original_ids: list[str] = Field(default_factory=list)
    rate_per_s: float | None = None
    eta_s: float | None = None


class LoadResult(_Answer):
    rows: int
    created: int
    updated: int
    unchanged: int
    deferred_index: bool
    load_s: float
    build_s: float


class DeleteResult(_Answer):
    deleted: int


class Health(_Answer):
    """``status``: ok, starting, degraded or unavailable; the details (database, encoder, workers,
    queue) come as extra fields when the key may see them."""

    status: str
    reasons: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Content:
    """A stored original: the image bytes or the text, with its type and the name to save it under."""

    content: bytes
    content_type: str
    filename: str | None = None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")
