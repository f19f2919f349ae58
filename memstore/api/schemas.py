"""Request and response bodies, with the examples shown in the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from memstore.catalog.collections import HNSW_MAX_DIMENSIONS, MAX_PARTITIONS
from memstore.catalog.keywords import DEFAULT_LANGUAGE, MAX_TEXT_FIELDS
from memstore.inputs import MAX_EXTERNAL_ID_LENGTH, MAX_K
from memstore.items.vectors import FloatMatrix, decode_vector_b64
from memstore.search.request import MAX_EXAMPLES, MAX_GROUP_SIZE, MAX_WEIGHT, MAX_WINDOW

Metric = Literal["cosine", "l2", "inner_product"]


# A vector as base64 of its float32 values, little-endian (as OpenAI's encoding_format "base64"):
# a 768-d query is 4 KiB of text instead of about 12 KiB of JSON numbers, and decodes without a
# float parser. The longest a collection's vector can be, in base64 characters.
MAX_VECTOR_B64 = 4 * ((HNSW_MAX_DIMENSIONS * 4 + 2) // 3)
_VECTOR_B64 = Field(
    default=None,
    min_length=1,
    max_length=MAX_VECTOR_B64,
    description="The vector as base64 of its float32 values, little-endian (instead of `vector`).",
)


def _one_vector(model: Any) -> Any:
    """``vector_b64`` decoded into the body's private array; both given is refused."""
    if model.vector_b64 is not None:
        if model.vector is not None:
            raise ValueError("give vector or vector_b64, not both")
        model._b64_vector = decode_vector_b64(model.vector_b64)
        model.vector_b64 = None
    return model


def given_vector(body: ItemBody | SearchRequest) -> list[float] | FloatMatrix | None:
    """The vector a body gave: its numbers, or its ``vector_b64`` as a float32 array."""
    return body.vector if body._b64_vector is None else body._b64_vector


class Strict(BaseModel):
    """Request bodies: unknown fields refused, and no coercion ("5" is not a number, true is not 1).
    Multipart forms, whose fields are all text, are validated with strict=False where they are read."""

    model_config = ConfigDict(extra="forbid", strict=True)


class CollectionCreate(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "photos"}, {"name": "notes", "dimensions": 384, "metric": "cosine"}]},
    )

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,47}$", description="Lowercase letters, digits, underscores.")
    dimensions: int | None = Field(
        default=None, ge=1, le=HNSW_MAX_DIMENSIONS, description="Vector size; omit to take the model's."
    )
    model: str | None = Field(
        default=None, max_length=200, description="Encoder model whose vectors this holds (default: the server's)."
    )
    metric: Metric = "cosine"
    hnsw_m: int | None = Field(default=None, ge=2, le=100)
    hnsw_ef_construction: int | None = Field(default=None, ge=4, le=1000)
    ef_search: int | None = Field(default=None, ge=1, le=1000, description="Default ef_search of searches.")
    partitions: int = Field(default=1, ge=1, le=MAX_PARTITIONS)
    language: str = Field(
        default=DEFAULT_LANGUAGE,
        max_length=63,
        description="Text-search configuration of keyword search: simple (as written, any language), english...",
    )
    text_fields: list[str] = Field(
        default_factory=list,
        max_length=MAX_TEXT_FIELDS,
        description="Metadata fields whose values are keywords too (besides the text and the file name).",
    )
    ocr: bool = Field(default=False, description="Read the text in the images (docs/api.md, OCR).")
    recall_target: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="The recall@k default searches should reach (e.g. 0.95): the maintenance worker sets "
        "ef_search to the least that reaches it (docs/maintenance.md, Recall target). null: off.",
    )
    write_path: Literal["graph", "segments"] = Field(
        default="graph",
        description="graph: each row is linked into the live HNSW graph as it is written. segments: for streams "
        "of upserts; rows go to a tail searched exactly and get graphs at index-build speed in the background "
        "(docs/api.md, Streams of upserts). Needs partitions 1 and full vectors.",
    )


class CollectionPatch(Strict):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"text_fields": ["title", "sku"]}, {"language": "english"}]}
    )

    language: str | None = Field(default=None, max_length=63)
    text_fields: list[str] | None = Field(default=None, max_length=MAX_TEXT_FIELDS)
    ocr: bool | None = Field(default=None, description="Read the text in the images (docs/api.md, OCR).")
    recall_target: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="The recall@k default searches should reach (e.g. 0.95): the maintenance worker sets "
        "ef_search to the least that reaches it (docs/maintenance.md, Recall target). "
        "null turns it off; leaving it out keeps it.",
    )


class MetadataIndexIn(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"field": "taken", "type": "timestamp"},
                {"field": "price", "type": "number"},
                {"field": ["image", "taken_at"], "type": "timestamp"},
            ]
        },
    )

    field: str | list[str] = Field(
        description="A metadata field: a key or a dotted path (image.taken_at; a dot inside a key as \\.), "
        'or the list of keys down to a nested one (["image", "taken_at"]); each key 1 to 128 characters.'
    )
    type: Literal["number", "timestamp", "keyword"] = Field(
        description="How the field's values are read: JSON numbers, ISO 8601 dates, or strings."
    )


class MetadataIndexOut(BaseModel):
    field: str | list[str]
    type: str
    name: str = Field(description="The index's name: DELETE .../indexes/{name} drops it.")
    valid: bool = Field(description="Built and usable (false while a build is unfinished).")
    size_bytes: int


class MetadataIndexList(BaseModel):
    indexes: list[MetadataIndexOut]


class GraphOut(BaseModel):
    index: str
    lo: int = Field(description="The graph holds the rows with lo < id <= hi.")
    hi: int


class SegmentsOut(BaseModel):
    graphs: list[GraphOut]
    tail_rows: int = Field(description="Rows above the last graph, searched exactly until sealed.")


class CollectionOut(BaseModel):
    name: str
    dimensions: int = Field(
        description="The active space's vector size (the default space's until another is activated; "
        "GET .../spaces lists each space's)."
    )
    metric: str = Field(description="The active space's distance metric.")
    model: str | None = Field(
        description="The model of the active space: the one that embeds search queries (null: vectors you make)."
    )
    hnsw_m: int
    hnsw_ef_construction: int
    ef_search: int = Field(description="The ef_search of searches that name none (tuned to recall_target when set).")
    recall_target: float | None = Field(
        default=None, description="The recall@k default searches should reach (null: a fixed ef_search)."
    )
    partitions: int
    language: str
    text_fields: list[str]
    ocr: bool = Field(default=False, description="Text in the images is read and found by keyword search.")
    ocr_pending: int | None = Field(
        default=None, description="Images waiting to be read (only when fetched one at a time, with OCR on)."
    )
    ocr_backfilling: bool = Field(
        default=False, description="Images stored before OCR was turned on are still being reached."
    )
    created_at: datetime | None = None
    active_space: str = Field(default="default", description="The embedding space searches use by default.")
    spaces: list[str] = Field(default_factory=lambda: ["default"], description="Its embedding spaces.")
    items: int | None = Field(default=None, description="All items (only when fetched one at a time).")
    ready: int | None = None
    pending: int | None = None
    failed: int | None = None
    index_bytes: int | None = None
    table_bytes: int | None = None
    counts_exact: bool | None = Field(
        default=None,
        description="False when items and ready are estimates (collections past 100,000 rows: the planner's "
        "row estimate, kept current by autovacuum); pending and failed are always exact.",
    )
    write_path: str = Field(default="graph", description="graph or segments (see CollectionCreate).")
    segments: SegmentsOut | None = Field(
        default=None, description="A segmented collection's graphs and tail (only when fetched one at a time)."
    )


class SealOut(BaseModel):
    done: list[dict[str, Any]] = Field(
        description="The seals and merges run: action, index, lo, hi, rows, replaced, seconds (empty: nothing to do)."
    )


class CollectionList(BaseModel):
    collections: list[CollectionOut]


class ItemBody(Strict):
    external_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_EXTERNAL_ID_LENGTH,
        description="Your id; re-sending it updates the item. Default: derived from the content (texts) or random.",
    )
    text: str | None = Field(
        default=None,
        min_length=1,
        description="Text to embed; with a vector, stored and found by keyword search as it is (not embedded).",
    )
    vector: list[float] | None = Field(default=None, min_length=1, max_length=HNSW_MAX_DIMENSIONS)
    vector_b64: str | None = _VECTOR_B64
    _b64_vector: FloatMatrix | None = PrivateAttr(default=None)
    metadata: dict[str, Any] | None = None

    _decode = model_validator(mode="after")(_one_vector)


class ItemsIn(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"items": [{"external_id": "n1", "text": "a red bicycle", "metadata": {"tag": "bike"}}]}]
        },
    )

    items: list[ItemBody] = Field(min_length=1)


class ItemAck(BaseModel):
    id: int
    external_id: str
    status: str = Field(description="pending, ready or failed")
    change: str = Field(description="created, updated, metadata or unchanged")
    error: str | None = None


class ItemsAck(BaseModel):
    items: list[ItemAck]


class OcrOut(BaseModel):
    status: Literal["pending", "done", "failed"]
    text: str | None = Field(default=None, description="The words read, once done ('' when the image has none).")
    error: str | None = Field(default=None, description="Why reading failed (the item itself is unaffected).")


class ItemOut(BaseModel):
    id: int
    external_id: str
    status: str
    metadata: dict[str, Any]
    error: str | None = None
    attempts: int | None = Field(default=None, description="Encoding attempts so far, while queued or failed.")
    text: str | None = None
    content_type: str | None = None
    content_url: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    vector: list[float] | None = None
    ocr: OcrOut | None = Field(default=None, description="Text read in the image, where its collection asked for it.")


class ItemPage(BaseModel):
    items: list[ItemOut]
    next: str | None = Field(default=None, description="URL of the next page, if any (GET).")
    next_after: int | None = Field(
        default=None, description="The `after` that gives the next page, if any (GET and POST), in id order."
    )
    next_cursor: str | None = Field(
        default=None,
        description="The `cursor` that gives the next page of a listing ordered by `order_by`, if any (GET and POST).",
    )


ORDER_CURSOR_MAX = 8192


class ItemQuery(Strict):
    """``POST .../items/list``: a listing by filter, for filters too long for a URL; in id order, or in
    the order of a metadata field (``order_by``) paged by ``cursor``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"filter": {"tags": "cat"}},
                {"order_by": ["image", "taken_at"], "order": "desc", "limit": 50},
            ]
        },
    )

    filter: dict[str, Any] | None = None
    status: Literal["pending", "ready", "failed"] | None = None
    after: int = Field(default=0, ge=0, le=2**63 - 1)
    limit: int = Field(default=100, ge=1, le=1000)
    order_by: str | list[str] | None = Field(
        default=None,
        description="A metadata field to order by: a key or a dotted path (image.taken_at), or the list of "
        'keys to a nested one (["image", "taken_at"]). Items without it (or with a value of another type) come last.',
    )
    order_type: Literal["timestamp", "number", "keyword"] = Field(
        default="timestamp", description="How the field is read (as filters compare it)."
    )
    order: Literal["asc", "desc"] = Field(default="asc", description="The direction of order_by (ties: by id).")
    cursor: str | None = Field(
        default=None,
        max_length=ORDER_CURSOR_MAX,
        description="The next_cursor of the previous page of the same ordered listing.",
    )


class CountQuery(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"filter": {"tags": "cat"}}]})

    filter: dict[str, Any] | None = None
    status: Literal["pending", "ready", "failed"] | None = None


class Counted(BaseModel):
    count: int


class ItemPatch(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"metadata": {"tag": "cat"}}]})

    metadata: dict[str, Any] | None = None
    merge: bool = Field(default=False, description="Merge into the existing metadata instead of replacing it.")
    vector: list[float] | None = Field(default=None, min_length=1, max_length=HNSW_MAX_DIMENSIONS)


class ContentIn(Strict):
    text: str = Field(min_length=1)


class DeleteRequest(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"filter": {"tag": "cat"}}]})

    # Sized to fit the 1 MiB body of a route that is not an upload (MEMSTORE_API_MAX_JSON_BODY_BYTES).
    ids: list[int] | None = Field(default=None, max_length=20_000)
    external_ids: list[str] | None = Field(default=None, max_length=1_000)
    filter: dict[str, Any] | None = None


class Deleted(BaseModel):
    deleted: int


class LookupRequest(Strict):
    external_ids: list[str] = Field(min_length=1, max_length=1_000)  # 1,000 x 512 characters fit in 1 MiB


class LookupOut(BaseModel):
    found: dict[str, int] = Field(description="external_id -> id, for those that exist.")


class SpaceCreate(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "v2", "model": "ViT-B-32"}]})

    name: str = Field(min_length=1, max_length=32, description="Lowercase letters, digits, underscores.")
    model: str = Field(min_length=1, description="A model this server's encoder runs (GET /v1/models).")
    metric: Literal["cosine", "l2", "inner_product"] | None = Field(
        default=None, description="Default: the collection's."
    )
    hnsw_m: int | None = Field(default=None, ge=2, le=100)
    hnsw_ef_construction: int | None = Field(default=None, ge=4, le=1000)
    ef_search: int | None = Field(default=None, ge=1, le=1000)


class SpaceOut(BaseModel):
    name: str
    model: str | None
    pretrained: str | None
    dimensions: int
    metric: str
    state: str = Field(description="filling (vectors being made, no index yet) or ready.")
    active: bool = Field(description="Searches that name no space use this one.")
    created_at: datetime | None
    ready_at: datetime | None
    done: int = Field(description="Items with a vector in the space.")
    total: int = Field(
        description="Items that have or will have one: every item with an original, and those given one."
    )
    pending: int = Field(description="Items queued for the space, not embedded yet.")
    failed: int = Field(description="Items whose embedding gave up after the queue's attempts.")
    without_original: int = Field(
        description="Items stored as bare vectors with none in this space: give theirs (PUT .../vectors) "
        "before activating, or activate with force."
    )
    without_original_ids: list[str] = Field(description="The first 20 of them (external ids).")
    rate_per_s: float | None = Field(description="Vectors made per second since the space was created (filling).")
    eta_s: float | None = Field(description="Seconds until the queued items are embedded, at that rate.")


class SpaceList(BaseModel):
    spaces: list[SpaceOut]


class SpaceActivate(Strict):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(
        default=False, description="Activate although items stored as bare vectors have no vector in the space."
    )


MAX_SPACE_VECTORS = 1000


class SpaceVectors(Strict):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"vectors": {"photo-17": [0.1, 0.2, 0.3]}}]}
    )

    vectors: dict[str, list[float]] = Field(
        min_length=1, max_length=MAX_SPACE_VECTORS, description="Vectors by external id, in the space's dimensions."
    )


class SpaceVectorsOut(BaseModel):
    written: int


class SearchWeights(Strict):
    vector: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)
    keyword: float = Field(default=1.0, ge=0, le=MAX_WEIGHT)


class SearchRequest(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"text": "a dog on a beach", "k": 5},
                {"text": "shutil.copytree", "mode": "keyword", "k": 10},
                {"text": "invoice 2024", "vector": [0.1, 0.2, 0.3], "mode": "hybrid", "k": 10},
                {"vector": [0.1, 0.2, 0.3], "k": 10, "filter": {"tag": "cat"}},
                {"item_id": 42, "k": 10, "exact": True},
            ]
        },
    )

    text: str | None = Field(
        default=None,
        min_length=1,
        description="Embedded with the collection's model (vector, hybrid) and matched by keyword (keyword, hybrid).",
    )
    image: str | None = Field(default=None, min_length=1, description="Base64 image (or upload it as multipart).")
    vector: list[float] | None = Field(default=None, min_length=1, max_length=HNSW_MAX_DIMENSIONS)
    vector_b64: str | None = _VECTOR_B64
    _b64_vector: FloatMatrix | None = PrivateAttr(default=None)
    item_id: int | None = Field(default=None, ge=1, le=2**63 - 1, description="Search with a stored item's vector.")
    mode: Literal["vector", "keyword", "hybrid"] | None = Field(
        default=None,
        description="Default: hybrid when there is a text and a vector can be had for it, else vector.",
    )
    k: int = Field(default=10, ge=1, le=MAX_K)
    offset: int = Field(default=0, ge=0, le=MAX_WINDOW - 1, description="Skip the first hits (offset + k <= 1000).")
    candidates: int | None = Field(
        default=None, ge=1, le=MAX_WINDOW, description="How deep each list of a hybrid search goes."
    )
    weights: SearchWeights | None = Field(default=None, description="Each list's weight in a hybrid search.")
    score_threshold: float | None = Field(default=None, description="Leave out hits that score lower.")
    filter: dict[str, Any] | None = Field(
        default=None,
        description='Metadata filter: {"tag": "cat"} (containment), or operators: {"taken": {"$gte": "2024-05"}}.',
    )
    ef_search: int | None = Field(default=None, ge=1, le=1000)
    exact: bool = Field(default=False, description="Brute force: exact, slower.")
    using: str | None = Field(
        default=None, max_length=32, description="The embedding space searched (default: the collection's active one)."
    )
    with_vector: bool = Field(default=False, description="Answer each hit's stored vector too.")
    group_by: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="A metadata field, a key or a dotted path (exif.camera): k groups of its values.",
    )
    group_size: int = Field(default=1, ge=1, le=MAX_GROUP_SIZE, description="Hits per group (with group_by).")

    _decode = model_validator(mode="after")(_one_vector)


MAX_BATCH_SEARCHES = 100


class Example(Strict):
    """An example given by its content rather than as a stored item's id: exactly one of these."""

    text: str | None = Field(default=None, min_length=1)
    image: str | None = Field(default=None, min_length=1, description="Base64.")
    vector: list[float] | None = Field(default=None, min_length=1, max_length=HNSW_MAX_DIMENSIONS)


class RecommendRequest(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"positive": [42, 43], "negative": [7], "k": 10},
                {"positive": [{"text": "a red bicycle"}], "negative": [{"text": "a car"}], "filter": {"album": "2024"}},
            ]
        },
    )

    positive: list[int | Example] = Field(min_length=1, max_length=MAX_EXAMPLES, description="Item ids or examples.")
    negative: list[int | Example] = Field(default_factory=list, max_length=MAX_EXAMPLES)
    k: int = Field(default=10, ge=1, le=MAX_K)
    filter: dict[str, Any] | None = None
    ef_search: int | None = Field(default=None, ge=1, le=1000)
    exact: bool = False


class SearchBatch(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"searches": [{"text": "kettle", "k": 3}, {"vector": [0.1, 0.2], "k": 5}]}]},
    )

    searches: list[SearchRequest] = Field(min_length=1, max_length=MAX_BATCH_SEARCHES)


class DuplicatesRequest(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"threshold": 0.02, "scan": 500}]})

    threshold: float = Field(ge=0, description="The largest distance of a pair (cosine: 1 - similarity).")
    after: int = Field(default=0, ge=0, le=2**63 - 1, description="Go on after this item id (the answer's next).")
    scan: int = Field(default=500, ge=1, le=5000, description="Items searched for their duplicates in this page.")
    per_item: int = Field(default=5, ge=1, le=100, description="Nearest items looked at for each.")


class DuplicateOut(BaseModel):
    a: dict[str, Any] = Field(description="id and external_id of the item with the lower id.")
    b: dict[str, Any]
    distance: float


class DuplicatesOut(BaseModel):
    pairs: list[DuplicateOut]
    next: int | None = Field(description="Pass as after for the next page; null once every item was scanned.")


class HitRanks(BaseModel):
    vector: int | None = Field(description="Where the vector list placed the item (null: not in it).")
    keyword: int | None = Field(description="Where the keyword list placed the item (null: not in it).")


class SearchHit(BaseModel):
    id: int
    external_id: str
    score: float
    distance: float | None = Field(description="To the query vector; null in a keyword search.")
    ranks: HitRanks
    metadata: dict[str, Any]
    content_url: str | None = Field(description="The stored original (file or text); null for a bare vector.")
    vector: list[float] | None = Field(default=None, description="With with_vector: the stored vector.")


class SearchGroup(BaseModel):
    value: Any = Field(description="The group_by field's value these hits share.")
    hits: list[SearchHit]


class SearchOut(BaseModel):
    results: list[SearchHit]
    groups: list[SearchGroup] | None = Field(default=None, description="With group_by: the hits by group.")


class SearchBatchOut(BaseModel):
    results: list[list[SearchHit]] = Field(description="One list of hits per search, in the order sent.")
    groups: list[list[SearchGroup] | None] | None = Field(
        default=None,
        description="When a search has group_by: each search's groups, in the order sent (null for one without).",
    )
