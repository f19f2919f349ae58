"""How many bytes a freshly built HNSW index would take, from pgvector's on-disk layout.

pgvector (src/hnsw.h) stores per element an element tuple (72-byte header + the vector: 8 + 4*dims)
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


def estimate_index_bytes(rows: int, *, dims: int, m: int) -> int:
    """Bytes of a fresh HNSW build over ``rows`` vectors of ``dims`` float32 dimensions."""
    if rows <= 0:
        return 2 * PAGE
    element = _maxalign(ELEMENT_HEADER + VECTOR_HEADER + 4 * dims)
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


def fresh_bytes(rows: int, *, dims: int, m: int, correction: float | None = None) -> int:
    """The estimate, scaled by what the last real rebuild measured (bounded, to survive odd data)."""
    estimate = estimate_index_bytes(rows, dims=dims, m=m)
    if correction is not None and 0.5 <= correction <= 2.0:
        return int(estimate * correction)
    return estimate
