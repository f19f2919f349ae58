"""What a search asks for, checked before any database work, and how its rows become results.

Three modes (docs/search.md):

- ``vector``: the nearest items to a vector (the HNSW index);
- ``keyword``: the items whose keywords (``memstore.catalog.keywords``) best match a text, by ``ts_rank_cd``;
- ``hybrid``: both lists fused by Reciprocal Rank Fusion in one statement (``search_sql.hybrid_statement``).

The store has no model: a hybrid search needs the vector given with the text (the REST API embeds the
text with the collection's model). With no ``mode``, a text and a vector search ``hybrid``, a vector
alone ``vector``; ``keyword`` must be asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from memstore.catalog.collections import Collection, validate_space_name
from memstore.catalog.field_paths import split_names
from memstore.errors import InvalidInputError
from memstore.inputs import MAX_K
from memstore.models import SearchResult
from memstore.search.filter_language import CompiledFilter, compile_filter

Mode = Literal["vector", "keyword", "hybrid"]
MODES: tuple[str, ...] = ("vector", "keyword", "hybrid")

# offset + k: deeper pages are a sign of a scan, not a search (export with the listing instead).
MAX_WINDOW = 1000
MAX_QUERY_TEXT = 4096  # a keyword or hybrid search's text: its words become one tsquery
MAX_WEIGHT = 100.0


@dataclass(frozen=True)
class Weights:
    """How much each list counts in a hybrid search's fusion."""

    vector: float = 1.0
    keyword: float = 1.0


@dataclass(frozen=True)
class SearchQuery:
    mode: Mode
    k: int
    vector: Any
    text: str | None
    filter: CompiledFilter | None  # memstore.search.filter_language: its SQL and parameters
    offset: int
    candidates: int
    weights: Weights
    score_threshold: float | None
    pool: int | None
    using: str | None = None  # the embedding space searched (None: the collection's active one)

    @property
    def window(self) -> int:
        """How many rows of the ranked list the answer reaches down to."""
        return self.offset + self.k


def check_query(
    *,
    mode: str | None,
    vector: Any,
    text: str | None,
    k: int,
    filter: dict[str, Any] | None = None,
    offset: int = 0,
    candidates: int | None = None,
    weights: Weights | dict[str, float] | None = None,
    score_threshold: float | None = None,
    pool: int | None = None,
    using: str | None = None,
) -> SearchQuery:
    """A search's arguments, checked; InvalidInputError names the first that is wrong."""
    k = check_count("k", k, 1, MAX_K)
    offset = check_count("offset", offset, 0, MAX_WINDOW - 1)
    if offset + k > MAX_WINDOW:
        raise InvalidInputError(f"offset + k is {offset + k}; the limit is {MAX_WINDOW}")
    if pool is not None:
        check_count("pool", pool, 1, MAX_K)
    chosen = resolve_mode(mode, has_text=text is not None, has_vector=vector is not None)
    if chosen != "vector":
        if not isinstance(text, str) or not text.strip() or "\x00" in text:
            raise InvalidInputError("text must be a non-blank string without NUL characters")
        if len(text) > MAX_QUERY_TEXT:
            raise InvalidInputError(
                f"text has {len(text)} characters; the limit for the text of a {chosen} search is "
                f"{MAX_QUERY_TEXT} (its words become one full-text query; mode vector embeds up to "
                "MEMSTORE_API_MAX_TEXT_CHARS)"
            )
    if candidates is None:
        # Not a function of offset while the page fits: the pages of one query then fuse the same two
        # lists and neither skip nor repeat a hit. Deeper pages must pass the same candidates on
        # each page (docs/search.md).
        candidates = min(MAX_WINDOW, max(50, 4 * k, offset + k))
    candidates = check_count("candidates", candidates, 1, MAX_WINDOW)
    if candidates < offset + k:
        raise InvalidInputError(f"candidates ({candidates}) must be at least offset + k ({offset + k})")
    if score_threshold is not None and (
        isinstance(score_threshold, bool)
        or not isinstance(score_threshold, int | float)
        or not math.isfinite(score_threshold)
    ):
        raise InvalidInputError(f"score_threshold must be a finite number, not {score_threshold!r}")
    return SearchQuery(
        mode=chosen,
        k=k,
        vector=vector if chosen != "keyword" else None,
        text=text if chosen != "vector" else None,
        filter=compile_filter(filter) if filter else None,
        offset=offset,
        candidates=candidates,
        weights=_weights(weights),
        score_threshold=None if score_threshold is None else float(score_threshold),
        pool=pool,
        using=None if using is None else validate_space_name(using),
    )


def resolve_mode(mode: str | None, *, has_text: bool, has_vector: bool) -> Mode:
    if mode is None:
        if has_vector:
            return "hybrid" if has_text else "vector"
        if has_text:
            raise InvalidInputError(
                "a text alone searches by keyword: ask for mode='keyword', or give the text's vector too (hybrid)"
            )
        raise InvalidInputError("give a vector, a text, or both")
    if mode not in MODES:
        raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if mode in ("vector", "hybrid") and not has_vector:
        raise InvalidInputError(f"a {mode} search needs a vector")
    if mode in ("keyword", "hybrid") and not has_text:
        raise InvalidInputError(f"a {mode} search needs a text")
    if mode == "keyword" and has_vector:
        # As the REST API answers it: a vector left unused would look like a search that used it.
        raise InvalidInputError("a keyword search takes no vector: leave vector out, or ask for mode='hybrid'")
    return mode  # type: ignore[return-value]


def check_count(name: str, value: Any, low: int, high: int) -> int:
    """An integer (not a bool) between ``low`` and ``high``, or InvalidInputError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInputError(f"{name} must be an integer between {low} and {high}, not {value!r}")
    return value


_EQUAL_WEIGHTS = Weights()


def _weights(value: Weights | dict[str, float] | None) -> Weights:
    if value is None:
        return _EQUAL_WEIGHTS  # frozen: one instance serves every search that leaves the weights alone
    if isinstance(value, Weights):
        given = {"vector": value.vector, "keyword": value.keyword}
    elif isinstance(value, dict):
        unknown = set(value) - {"vector", "keyword"}
        if unknown:
            raise InvalidInputError(f"weights takes 'vector' and 'keyword', not {', '.join(sorted(unknown))}")
        given = {"vector": value.get("vector", 1.0), "keyword": value.get("keyword", 1.0)}
    else:
        raise InvalidInputError(f"weights must be an object such as {{'vector': 1, 'keyword': 1}}, not {value!r}")
    for name, w in given.items():
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 <= w <= MAX_WEIGHT:
            raise InvalidInputError(f"weights.{name} must be a number between 0 and {MAX_WEIGHT:g}, not {w!r}")
    if given["vector"] == 0 and given["keyword"] == 0:
        raise InvalidInputError("weights cannot both be 0")
    return Weights(vector=float(given["vector"]), keyword=float(given["keyword"]))


def results(c: Collection, q: SearchQuery, rows: list[tuple[Any, ...]]) -> list[SearchResult]:
    """A search's rows as results, best first.

    Vector rows are (id, external_id, metadata, distance, original): the first ``offset`` are skipped
    here and the score is the metric's similarity. Keyword and hybrid rows carry their score and both
    ranks before ``original`` (``statements.original_of``). A row whose distance is not a number (a
    zero vector stored in a cosine collection before such vectors were refused) is near nothing: a
    vector search leaves it out, as it does an infinite distance (only vectors stored before
    ``vectors.MAX_SQUARED_LENGTH`` bounded their length can overflow one)."""
    out: list[SearchResult] = []
    if q.mode == "vector":
        spec = c.space(q.using).spec  # looked up once for every row; its score computed inline
        sign, offset, finite = spec.score_sign, spec.score_offset, math.isfinite
        # Rows near nothing are left out before the page is cut, so ranks stay contiguous.
        near = [(d, r) for r in rows if finite(d := float(r[3]))]  # each distance converted once
        for rank, (d, r) in enumerate(near[q.offset : q.window], start=q.offset + 1):
            out.append(SearchResult(r[0], r[1], d, sign * d + offset, r[2], rank, None, r[4]))
    else:
        for r in rows:
            distance = None if r[3] is None or not math.isfinite(r[3]) else float(r[3])
            out.append(SearchResult(r[0], r[1], distance, float(r[4]), r[2], r[5], r[6], r[7]))
    if q.score_threshold is not None:
        out = [r for r in out if r.score >= q.score_threshold]
    return out


MAX_EXAMPLES = 100


def recommendation(positive: list[np.ndarray], negative: list[np.ndarray], metric: str) -> np.ndarray:
    """The query vector of "more like these, not like those": the mean of the positive examples moved
    away from the mean of the negative ones by as much again (``2 x mean(positive) - mean(negative)``,
    the average-vector strategy), each example first scaled to unit length in a cosine collection so
    that no example weighs more for being longer."""
    if not positive:
        raise InvalidInputError("give at least one positive example")
    if len(positive) + len(negative) > MAX_EXAMPLES:
        raise InvalidInputError(f"{len(positive) + len(negative)} examples; the limit is {MAX_EXAMPLES}")

    def mean(vectors: list[np.ndarray]) -> np.ndarray:
        stacked = np.stack([np.asarray(v, dtype=np.float64) for v in vectors])
        if metric == "cosine":
            stacked = stacked / np.linalg.norm(stacked, axis=1, keepdims=True)
        return np.asarray(stacked.mean(axis=0))

    target = mean(positive)
    if negative:
        target = 2 * target - mean(negative)
    return target.astype(np.float32)


MAX_GROUP_SIZE = 100
H = TypeVar("H")


def group_values(metadata: dict[str, Any], names: tuple[str, ...]) -> list[Any]:
    """The groups a hit belongs to: the value of its field at ``names`` (a nested field's path, as a
    filter's dotted key names it); each element of a list (as a filter's equality matches a list by
    its elements, and as Qdrant groups an array field: a photo tagged ``["beach", "family"]`` is
    among the best of both); none when it has no such field or an empty list."""
    value: Any = metadata
    for name in names:
        if not isinstance(value, dict) or name not in value:
            return []
        value = value[name]
    return list(value) if isinstance(value, list) else [value]


def _group_key(value: Any) -> tuple[str, Any]:
    """One key per value as a filter tells values apart: 1 and 1.0 are one number (an equality
    filter matches both), true is not 1, an object or a list is its JSON with sorted keys, its numbers
    written one way (``{"a": 1}`` and ``{"a": 1.0}`` are equal JSONB)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return type(value).__name__, value
    if isinstance(value, int | float):
        return "number", value
    return "json", json.dumps(_same_numbers(value), sort_keys=True, ensure_ascii=False)


def _same_numbers(value: Any) -> Any:
    """``value`` with every whole float as its integer, so equal numbers serialise alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_same_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _same_numbers(v) for k, v in value.items()}
    return value


def group_window(groups: int, size: int) -> int:
    """How deep the ranked list is read to fill ``groups`` groups of ``size``: four times what they
    hold (at least 50, at most MAX_WINDOW); a group whose hits lie deeper comes out short or not at all."""
    return min(MAX_WINDOW, max(50, 4 * groups * size))


class Group(list[H]):
    """One group's hits, best first (a list), and the field's value they share (``value``)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def grouped(
    hits: Sequence[H], field: str, groups: int, size: int, *, metadata: Callable[[H], dict[str, Any]]
) -> list[Group[H]]:
    """The best ``size`` hits of each of the first ``groups`` groups, groups in the order of their
    best hit (``group_values``: a hit whose field is a list is in the group of each element; hits
    without the field belong to no group). ``metadata(hit)`` reads a hit's metadata (results of the
    store, or hits as the API renders them)."""
    names = split_names(field, "group_by")
    out: dict[tuple[str, Any], Group[H]] = {}
    for hit in hits:
        for value in group_values(metadata(hit), names):
            key = _group_key(value)
            group = out.get(key)
            if group is None:
                if len(out) == groups:
                    continue
                group = out[key] = Group(value)
            if len(group) < size and (not group or group[-1] is not hit):  # a list naming a value twice
                group.append(hit)
    return list(out.values())
