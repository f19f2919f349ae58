"""How many bytes a freshly built HNSW index would take, from pgvector's on-disk layout.

pgvector (src/hnsw.h) stores per element an element tuple (72-byte header + the indexed value: an
8-byte header and 4 bytes a dimension for a ``vector``, 2 for a ``halfvec``, 1 bit for a ``bit``)
and a neighbour tuple (4-byte header + 6-byte TIDs: 2m at layer 0, m per higher layer), side by side on
8 kB pages. A build packs them densely; churn leaves dead elements and half-used pages behind.
When the worker has rebuilt an index it keeps the real bytes-per-row of that build as a correction.
"""

from __future__ import annotations

import math

PAGE = 8192
PAGE_HEADER = 24
SPECIAL = 8  # HnswPageOpaqueData
LINE_POINTER = 4
ELEMENT_HEADER = 72
VECTOR_HEADER = 8


def _maxalign(n: float) -> int:
    return int(math.ceil(n / 8.0) * 8)


def value_bytes(representation: str, dims: int) -> int:
    """Bytes of one indexed value past its header: what the index holds of a vector. A compact index
    on a collection's table (``memstore.catalog.index_spec``) holds ``halfvec`` (2 bytes a dimension)
    or ``bit`` (1 bit). Estimated at 4 bytes a dimension, fresh builds of 2,000 rows read 0.70 of the
    estimate (halfvec, 128 dimensions), 0.39 (binary, 128) and 0.10 (binary, 768): the size rule saw
    bloat only once it had grown the index past its float32 size, and a rebuild's correction of a
    binary index fell outside the bounds ``fresh_bytes`` keeps, so the rule never fired."""
    if representation == "full":
        return 4 * dims
    if representation == "halfvec":
        return 2 * dims
    if representation == "binary":
        return math.ceil(dims / 8)
    raise ValueError(f"no index of representation {representation!r} on a collection's table")


def estimate_index_bytes(rows: int, *, dims: int, m: int, representation: str = "full") -> int:
    """Bytes of a fresh HNSW build over ``rows`` vectors of ``dims`` dimensions, held as
    ``representation`` (``full``: float32)."""
    if rows <= 0:
        return 2 * PAGE
    element = _maxalign(ELEMENT_HEADER + VECTOR_HEADER + value_bytes(representation, dims))
    # Levels are geometric with P(level >= l) = m^-l, so the mean number of upper layers is 1/(m-1).
    neighbours = _maxalign(4 + 6 * m * (2 + 1.0 / (m - 1)))
    per_element = element + neighbours + 2 * LINE_POINTER
    usable = PAGE - PAGE_HEADER - SPECIAL
    if per_element <= usable:
        pages = math.ceil(rows / (usable // per_element))
    else:
        # An element that does not share a page with its neighbour tuple takes its own pages.
        pages = rows * math.ceil(per_element / usable)
    return (pages + 1) * PAGE  # + the metapage


def fresh_bytes(rows: int, *, dims: int, m: int, correction: float | None = None, representation: str = "full") -> int:
    """The estimate, scaled by what the last real rebuild measured (bounded, to survive odd data: a
    correction outside the bounds is discarded, so the estimate itself must be near the truth)."""
    estimate = estimate_index_bytes(rows, dims=dims, m=m, representation=representation)
    if correction is not None and 0.5 <= correction <= 2.0:
        return int(estimate * correction)
    return estimate
