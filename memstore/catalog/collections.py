"""Collections: their registry row, naming rules, metrics and the DDL of their tables.

Each collection is a table of its own (``c<id>_<name>``), with an HNSW index on ``embedding``, a GIN
index on ``metadata``, a GIN index on its keywords (``memstore.catalog.keywords``) and a unique
``external_id``. A collection made with ``partitions > 1`` is
hash-partitioned on ``external_id``: every partition has its own HNSW index, so maintenance can
vacuum or rebuild one partition at a time and the extra space of a rebuild stays bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from psycopg import sql

from memstore.catalog import index_spec as compact_spec
from memstore.errors import InvalidInputError, SpaceNotFoundError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
# pgvector indexes `vector` columns of at most 2,000 dimensions with HNSW.
HNSW_MAX_DIMENSIONS = 2000
MAX_PARTITIONS = 256
# The recall a collection's searches should reach (``options``): the maintenance worker then sets its
# default ef_search to the least that reaches it (``maintenance.tuning``), and records how in RECALL_TUNING.
RECALL_TARGET = "recall_target"
RECALL_TUNING = "recall_tuning"

Metric = Literal["cosine", "l2", "inner_product"]


@dataclass(frozen=True)
class MetricSpec:
    operator: str  # pgvector's distance operator
    opclass: str  # the HNSW operator class
    # score = sign * distance + offset: "higher is more similar" for every metric.
    score_sign: float
    score_offset: float

    def score(self, distance: float) -> float:
        return self.score_sign * distance + self.score_offset


METRICS: dict[str, MetricSpec] = {
    # cosine distance is 1 - cosine similarity; the score is the similarity.
    "cosine": MetricSpec("<=>", "vector_cosine_ops", -1.0, 1.0),
    # Euclidean distance; the score is its negation.
    "l2": MetricSpec("<->", "vector_l2_ops", -1.0, 0.0),
    # pgvector's <#> is the negative inner product; the score is the inner product.
    "inner_product": MetricSpec("<#>", "vector_ip_ops", -1.0, 0.0),
}


DEFAULT_SPACE = "default"
SPACE_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass(frozen=True)
class Space:
    """One embedding space of a collection: the vectors of one model, with their own HNSW index.

    The ``default`` space (id 0) is the ``embedding`` column of the collection's table; every other
    space is a side table ``c<collection id>_s<space id>`` of ``(id, embedding)`` (``memstore.spaces.lifecycle``).
    ``state``: ``filling`` while its vectors are being made (searches on it are exact scans, it has no
    index yet), ``ready`` once its index is built."""

    id: int
    name: str
    model: str | None
    dimensions: int
    metric: Metric
    hnsw_m: int
    hnsw_ef_construction: int
    default_ef_search: int
    table_name: str
    pretrained: str | None = None
    state: str = "ready"
    queued_through: int = 0
    queued_at: datetime | None = None
    ready_at: datetime | None = None
    created_at: datetime | None = None
    collection_id: int | None = None

    @property
    def side(self) -> bool:
        """Held in a side table (every space but ``default``)."""
        return self.id != 0

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    @property
    def index_name(self) -> str:
        return f"{self.table_name}_hnsw"

    def score(self, distance: float) -> float:
        return self.spec.score_sign * distance + self.spec.score_offset


@dataclass(frozen=True)
class Collection:
    id: int
    name: str
    table_name: str
    dimensions: int
    metric: Metric
    hnsw_m: int
    hnsw_ef_construction: int
    default_ef_search: int
    partitions: int
    model: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    # Keyword search (memstore.catalog.keywords): the text-search configuration and the metadata fields
    # whose values are keywords besides the text and the file name.
    language: str = "simple"
    text_fields: tuple[str, ...] = ()
    # The spaces besides ``default`` (memstore.spaces.lifecycle), by id.
    spaces: tuple[Space, ...] = ()

    def __post_init__(self) -> None:
        # The database answers lists; tuples keep the row hashable and immutable.
        object.__setattr__(self, "text_fields", tuple(self.text_fields))
        object.__setattr__(
            self, "spaces", tuple(s if isinstance(s, Space) else _space_from_row(s) for s in self.spaces)
        )

    # A row is frozen, so what is derived from it is derived once: the search path asks for its
    # space on every search, and building the default one afresh cost more than the rest of the lookup.
    @cached_property
    def default_space(self) -> Space:
        """The item table's own vectors, as a space."""
        return Space(
            id=0,
            name=DEFAULT_SPACE,
            model=self.model,
            dimensions=self.dimensions,
            metric=self.metric,
            hnsw_m=self.hnsw_m,
            hnsw_ef_construction=self.hnsw_ef_construction,
            default_ef_search=self.default_ef_search,
            table_name=self.table_name,
            created_at=self.created_at,
            collection_id=self.id,
        )

    @cached_property
    def index_spec(self) -> compact_spec.IndexSpec:
        """The representation of the item table's index (``memstore.compact``), from the options."""
        return compact_spec.IndexSpec.from_options(self.options)

    @cached_property
    def active_space_name(self) -> str:
        """The space searches use when they name none."""
        return str(self.options.get("active_space") or DEFAULT_SPACE)

    def all_spaces(self) -> list[Space]:
        return [self.default_space, *self.spaces]

    @cached_property
    def _spaces_by_name(self) -> dict[str, Space]:
        return {s.name: s for s in self.all_spaces()}

    def space_by_id(self, space_id: int) -> Space | None:
        """The space with this id (0: ``default``), as queue rows name it; None when it is gone."""
        return next((s for s in self.all_spaces() if s.id == space_id), None)

    def space(self, name: str | None = None) -> Space:
        """The space ``name`` (default: the active one); InvalidInputError names the ones there are."""
        wanted = self.active_space_name if name is None else name
        found = self._spaces_by_name.get(wanted)
        if found is not None:
            return found
        raise SpaceNotFoundError(self.name, wanted, [s.name for s in self.all_spaces()])

    @property
    def spec(self) -> MetricSpec:
        return METRICS[self.metric]

    @property
    def table(self) -> sql.Identifier:
        return sql.Identifier(self.table_name)

    @property
    def index_name(self) -> str:
        return f"{self.table_name}_hnsw"

    @property
    def ocr(self) -> bool:
        """Text is read in the collection's images and is part of its keywords (``memstore.catalog.ocr_items``)."""
        return bool(self.options.get("ocr"))

    @property
    def recall_target(self) -> float | None:
        """The recall@k its default searches should reach (None: a fixed ef_search)."""
        value = self.options.get(RECALL_TARGET)
        return None if value is None else float(value)

    @property
    def recall_tuning(self) -> dict[str, Any] | None:
        """The last tuning of ef_search to the recall target (``maintenance.tuning.Tuning.as_json``)."""
        value = self.options.get(RECALL_TUNING)
        return value if isinstance(value, dict) else None

    def partition_tables(self) -> list[str]:
        """The tables that hold rows: the table itself, or each of its partitions."""
        if self.partitions == 1:
            return [self.table_name]
        return [partition_table_name(self.table_name, i) for i in range(self.partitions)]

    def score(self, distance: float) -> float:
        return self.spec.score(distance)


def _space_from_row(row: dict[str, Any]) -> Space:
    """A space as the registry reads it (a JSON object per ``memstore_spaces`` row)."""
    fields = {k: row[k] for k in Space.__dataclass_fields__ if k in row}
    for key in ("queued_at", "ready_at", "created_at"):
        if isinstance(fields.get(key), str):
            fields[key] = datetime.fromisoformat(fields[key])
    return Space(**fields)


def validate_space_name(name: object) -> str:
    if not isinstance(name, str) or not SPACE_NAME_PATTERN.fullmatch(name):
        raise InvalidInputError(
            f"invalid space name {name!r}: use 1 to 32 characters, lowercase letters, digits and "
            "underscores, starting with a letter"
        )
    return name


def partition_table_name(table_name: str, index: int) -> str:
    return f"{table_name}_p{index}"


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidInputError(
            f"invalid collection name {name!r}: use 1 to 48 characters, lowercase letters, digits and "
            "underscores, starting with a letter"
        )
    return name


def validate_collection_params(
    *, dimensions: int, metric: str, hnsw_m: int, hnsw_ef_construction: int, ef_search: int, partitions: int
) -> None:
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        raise InvalidInputError(f"dimensions must be a positive integer, not {dimensions!r}")
    if dimensions > HNSW_MAX_DIMENSIONS:
        raise InvalidInputError(
            f"dimensions {dimensions} is over pgvector's HNSW limit of {HNSW_MAX_DIMENSIONS} for vector columns"
        )
    if metric not in METRICS:
        raise InvalidInputError(f"metric must be one of {', '.join(METRICS)}, not {metric!r}")
    if not 2 <= hnsw_m <= 100:
        raise InvalidInputError(f"hnsw_m must be between 2 and 100, not {hnsw_m}")
    if not 4 <= hnsw_ef_construction <= 1000:
        raise InvalidInputError(f"hnsw_ef_construction must be between 4 and 1000, not {hnsw_ef_construction}")
    if hnsw_ef_construction < 2 * hnsw_m:
        raise InvalidInputError(
            f"hnsw_ef_construction ({hnsw_ef_construction}) must be at least twice hnsw_m ({hnsw_m})"
        )
    if not 1 <= ef_search <= 1000:
        raise InvalidInputError(f"ef_search must be between 1 and 1000, not {ef_search}")
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidInputError(f"partitions must be between 1 and {MAX_PARTITIONS}, not {partitions}")


def validate_recall_target(target: object) -> float | None:
    """A recall target lies strictly between 0 and 1 (None: off)."""
    if target is None:
        return None
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0.0 < float(target) < 1.0:
        raise InvalidInputError(f"recall_target must lie strictly between 0 and 1 (e.g. 0.95), not {target!r}")
    return float(target)
