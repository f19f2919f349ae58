"""Which representation a collection's HNSW index holds, read from ``memstore_collections.options``.

The full-precision ``embedding`` column is always kept; only the index changes:

- ``full``: ``vector`` HNSW on ``embedding`` (pgvector's default; distances are exact already);
- ``halfvec``: an expression index on ``embedding::halfvec(d)`` (2 bytes a number);
- ``binary``: an expression index on ``binary_quantize(embedding)::bit(d)`` with Hamming distance
  (1 bit a number);
- ``lowrank``: a fitted projection to ``r`` numbers stored as ``halfvec(r)`` in a side table kept in
  step by triggers (a projection is too costly to evaluate per row at query time, and a refit must not
  rewrite the collection's own table).

Every compact search takes ``pool(k)`` candidates from the compact index and re-ranks them exactly on
the full vectors. The options live under the ``"index"`` key:
``{"representation": "lowrank", "rank": 64, "projection_id": 7, "version": 2, "pool_factor": 8}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from psycopg import sql

from memstore.errors import InvalidInputError

if TYPE_CHECKING:
    from memstore.catalog.collections import Collection

Representation = Literal["full", "halfvec", "lowrank", "binary"]
REPRESENTATIONS: tuple[str, ...] = ("full", "halfvec", "lowrank", "binary")
OPTIONS_KEY = "index"

# Candidates fetched per requested result, by representation: halfvec loses almost nothing, a low-rank
# projection and especially 1-bit codes reorder near neighbours more (measured by bench.compress).
DEFAULT_POOL_FACTOR: dict[str, float] = {"full": 1.0, "halfvec": 2.0, "lowrank": 8.0, "binary": 10.0}
MAX_POOL = 1000
HALFVEC_MAX_DIMENSIONS = 4000
MAX_RANK = 1024


@dataclass(frozen=True)
class IndexSpec:
    representation: str = "full"
    rank: int | None = None  # lowrank: numbers per row (None before the first fit: chosen then)
    projection_id: int | None = None  # lowrank: the active projection's registry row
    version: int | None = None  # lowrank: the active projection's version (names its side table)
    pool_factor: float | None = None  # None: DEFAULT_POOL_FACTOR of the representation
    pending: dict[str, Any] | None = None  # asked for, not built yet (lowrank needs rows to fit on)

    @property
    def compact(self) -> bool:
        return self.representation != "full"

    def pool(self, k: int, override: int | None = None) -> int:
        """Candidates to take from the compact index for ``k`` results (at least k, at most MAX_POOL)."""
        if self.representation == "full":
            return k  # the full index's own distances are exact: nothing to re-rank
        if override is not None:
            return min(MAX_POOL, max(k, override))
        factor = self.pool_factor if self.pool_factor is not None else DEFAULT_POOL_FACTOR[self.representation]
        return min(MAX_POOL, max(k, math.ceil(factor * k)))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"representation": self.representation}
        for key in ("rank", "projection_id", "version", "pool_factor", "pending"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_options(cls, options: dict[str, Any] | None) -> IndexSpec:
        raw = (options or {}).get(OPTIONS_KEY) or {}
        return cls(
            representation=str(raw.get("representation", "full")),
            rank=raw.get("rank"),
            projection_id=raw.get("projection_id"),
            version=raw.get("version"),
            pool_factor=raw.get("pool_factor"),
            pending=raw.get("pending"),
        )


def index_spec(c: Collection) -> IndexSpec:
    """The index representation a registry row names (read once per row: ``Collection.index_spec``)."""
    return c.index_spec


def validate_choice(
    *, representation: str, dimensions: int, rank: int | None = None, pool_factor: float | None = None
) -> None:
    if representation not in REPRESENTATIONS:
        raise InvalidInputError(f"representation must be one of {', '.join(REPRESENTATIONS)}, not {representation!r}")
    if representation == "halfvec" and dimensions > HALFVEC_MAX_DIMENSIONS:
        raise InvalidInputError(f"halfvec indexes take at most {HALFVEC_MAX_DIMENSIONS} dimensions, not {dimensions}")
    if rank is not None:
        if representation != "lowrank":
            raise InvalidInputError(f"rank applies to the lowrank representation only, not {representation!r}")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < dimensions or rank > MAX_RANK:
            raise InvalidInputError(
                f"rank must be an integer between 1 and {min(dimensions - 1, MAX_RANK)}, not {rank!r}"
            )
    if pool_factor is not None and (
        not isinstance(pool_factor, int | float) or isinstance(pool_factor, bool) or not 1 <= pool_factor <= 100
    ):
        raise InvalidInputError(f"pool_factor must be a number between 1 and 100, not {pool_factor!r}")


# ---------------------------------------------------------------------- SQL pieces

_HALFVEC_OPS = {"cosine": "halfvec_cosine_ops", "l2": "halfvec_l2_ops", "inner_product": "halfvec_ip_ops"}
_OPERATORS = {"cosine": "<=>", "l2": "<->", "inner_product": "<#>"}


def key_expression(representation: str, dimensions: int) -> str:
    """The indexed expression on the collection's own table (lowrank indexes a side table instead)."""
    if representation == "full":
        return "embedding"
    if representation == "halfvec":
        return f"(embedding::halfvec({dimensions}))"
    if representation == "binary":
        return f"(binary_quantize(embedding)::bit({dimensions}))"
    raise ValueError(f"{representation} has no index on the collection's table")


def opclass(representation: str, metric: str) -> str:
    if representation == "full":
        return {"cosine": "vector_cosine_ops", "l2": "vector_l2_ops", "inner_product": "vector_ip_ops"}[metric]
    if representation == "halfvec":
        return _HALFVEC_OPS[metric]
    if representation == "binary":
        return "bit_hamming_ops"
    # Projected cosine data is centred unit vectors: Euclidean distance there tracks cosine distance.
    return "halfvec_ip_ops" if metric == "inner_product" else "halfvec_l2_ops"


def order_operator(representation: str, metric: str) -> str:
    if representation == "binary":
        return "<~>"
    if representation == "lowrank":
        return "<#>" if metric == "inner_product" else "<->"
    return _OPERATORS[metric]


def inline_vectors_statement(table: sql.Identifier) -> sql.Composed:
    """Keep vectors in the row (not TOASTed out of line) so re-ranking reads one page per candidate.

    A 768-dimension vector is 3 kB, over PostgreSQL's 2 kB threshold for moving a value to the TOAST
    table; fetching it back costs a TOAST index probe and two more page reads. A full search fetches k
    vectors, a compact one ``pool``: measured at 100k x 768 rows, inline vectors made re-ranked
    searches 1.5-2x faster. Only rows written afterwards change (no rewrite, so a switch stays online);
    the statement is a catalog change under a brief ACCESS EXCLUSIVE lock. Recurses to partitions.
    """
    return sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE MAIN").format(table)


# ---------------------------------------------------------------------- names (all < 64 bytes)


def side_table(collection_id: int, version: int) -> str:
    # "memstore_" cannot collide with a collection's tables, which all start with "c<id>_".
    return f"memstore_lr_c{collection_id}_v{version}"


def side_index(collection_id: int, version: int) -> str:
    return f"{side_table(collection_id, version)}_hnsw"


def next_index(collection_id: int, partition: int | None = None) -> str:
    """Where a new index of the collection's table is built before it takes the usual name."""
    return (
        f"memstore_next_c{collection_id}_hnsw"
        if partition is None
        else f"memstore_next_c{collection_id}_p{partition}_hnsw"
    )


def trigger_names(version: int) -> dict[str, str]:
    return {event: f"memstore_lr_v{version}_{event[:3].lower()}" for event in ("INSERT", "UPDATE", "DELETE")}
