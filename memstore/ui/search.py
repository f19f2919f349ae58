"""Searching from the pages: query vectors (text, image, a stored item), metadata filter chips, and
the cards of a results grid. The work is the API's own: the same encoder priorities, checks and limits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np

from encoder.types import Priority
from memstore import thumbnails
from memstore.api import bodies
from memstore.api.ingest import check_encodable, check_text
from memstore.api.problems import Problem
from memstore.api.routes.search import query_image_options
from memstore.api.runtime import Runtime
from memstore.collections import Collection
from memstore.models import SearchResult

MAX_CHIPS = 8
MAX_CHIP_CHARS = 200


@dataclass(frozen=True)
class Chip:
    """One metadata filter: items whose metadata holds ``key`` with exactly ``value``."""

    key: str
    value: Any

    @property
    def param(self) -> str:
        """As it travels in the query string (``f=key=value``): a string that would read as another JSON
        value (``2020``, ``true``) is quoted, so it stays a string."""
        if isinstance(self.value, str):
            try:
                json.loads(self.value)
            except ValueError:
                return f"{self.key}={self.value}"
        return f"{self.key}={json.dumps(self.value, ensure_ascii=False)}"

    @property
    def label(self) -> str:
        return f"{self.key}: {self.value if isinstance(self.value, str) else json.dumps(self.value)}"


def parse_chip(text: str) -> Chip | None:
    """``key=value``; the value is a JSON number, boolean or null when it reads as one, else a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or len(text) > MAX_CHIP_CHARS:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    if isinstance(value, dict | list):
        value = raw
    return Chip(key, value)


def parse_chips(values: list[str]) -> list[Chip]:
    chips: dict[str, Chip] = {}
    for text in values[: MAX_CHIPS * 2]:
        chip = parse_chip(text)
        if chip is not None:
            chips[chip.key] = chip  # one value per key: a later chip for the same key replaces it
    return list(chips.values())[:MAX_CHIPS]


def filter_of(chips: list[Chip]) -> dict[str, Any] | None:
    return {c.key: c.value for c in chips} or None


@dataclass(frozen=True)
class SearchView:
    """The search a page shows, and the links that change it."""

    ui: str
    collection: str
    query: str = ""
    like: int | None = None
    chips: tuple[Chip, ...] = ()

    @property
    def page(self) -> str:
        return f"{self.ui}/c/{quote(self.collection)}"

    def url(self, *, query: str | None = None, like: int | None = None, chips: tuple[Chip, ...] | None = None) -> str:
        params: list[tuple[str, str]] = []
        q = self.query if query is None else query
        if like is not None:
            params.append(("like", str(like)))
        elif q:
            params.append(("q", q))
        params += [("f", c.param) for c in (self.chips if chips is None else chips)]
        return self.page + ("?" + urlencode(params) if params else "")

    def without(self, chip: Chip) -> str:
        return self.url(like=self.like, chips=tuple(c for c in self.chips if c.key != chip.key))

    def adding(self, key: str, value: Any) -> str:
        kept = tuple(c for c in self.chips if c.key != key)
        return self.url(like=self.like, chips=(*kept, Chip(key, value)))

    def more_like(self, item_id: int) -> str:
        return self.url(like=item_id)

    def item(self, item_id: int) -> str:
        return f"{self.page}/items/{item_id}"

    def filter_query(self) -> str:
        """The chips alone, for the image search's form."""
        return urlencode([("f", c.param) for c in self.chips])


def text_vector(rt: Runtime, c: Collection, text: str) -> np.ndarray | None:
    """The query's vector from the model of the collection's active space, for a hybrid search; None
    when this server cannot embed for it (no model, still loading, another model): the words alone
    then search, by keyword."""
    check_text(rt, text, "the query")
    if rt.encoder.backend is None:
        return None
    try:
        how = check_encodable(rt, c, c.space())
    except Problem:
        return None
    return np.asarray(rt.encoder.backend.embed_texts([text], priority=Priority.QUERY, **how))[0]


def image_vector(rt: Runtime, c: Collection, data: bytes) -> np.ndarray:
    backend = rt.encoder.require("search by a stored item instead ('more like this')")
    how = check_encodable(rt, c, c.space())
    checked, _ = bodies.check_image(data, "the query image", query_image_options(rt))
    return np.asarray(backend.embed_images([checked], priority=Priority.QUERY, **how))[0]


def item_vector(rt: Runtime, c: Collection, item_id: int) -> np.ndarray:
    """The item's vector in the collection's active space (the one the pages search)."""
    item = rt.store.get_item(collection=c.name, id=item_id)
    found = rt.store.vectors(collection=c.name, ids=[item_id]).get(item_id)
    if found is None:
        raise Problem("conflict", f"item {item_id} has no vector yet (it is {item.status}): try again once it is ready")
    return found


def nearest(
    rt: Runtime,
    c: Collection,
    vector: Any,
    *,
    k: int,
    chips: list[Chip],
    sample: bool = True,
    text: str | None = None,
) -> list[SearchResult]:
    """The search itself: by ``vector``, by ``text``'s keywords too when given (hybrid; keyword alone
    without a vector). Typed and image queries are offered to the recall probes' samples, as the
    API's are (a stored item's vector is not a query anybody typed; the probes measure the default
    space). The pages search the collection's active space."""
    mode = "keyword" if vector is None else None
    results = rt.store.search(collection=c.name, vector=vector, text=text, mode=mode, k=k, filter=filter_of(chips))
    if vector is not None and sample and rt.sampler.rate > 0 and not c.space().side:
        rt.sampler.offer(c.id, np.asarray(vector, dtype=np.float32))
    return results


@dataclass(frozen=True)
class Card:
    """One hit (or one listed item) in a grid."""

    id: int
    title: str
    score: float | None
    url: str
    like_url: str
    thumbnail_url: str | None
    snippet: str | None
    status: str  # pending and failed images show their state instead of a picture
    chips: tuple[tuple[str, str, str], ...]  # (key, shown value, link adding it as a filter)


def title_of(external_id: str, metadata: dict[str, Any]) -> str:
    name = metadata.get("filename")
    return name if isinstance(name, str) and name else external_id


def cards(
    rt: Runtime, c: Collection, view: SearchView, hits: Sequence[tuple[int, str, dict[str, Any], float | None]]
) -> list[Card]:
    """Cards for (id, external id, metadata, score) rows, with their previews read in one query."""
    previews = thumbnails.previews(rt.engine, c, [h[0] for h in hits])
    out = []
    for item_id, external_id, metadata, score in hits:
        preview = previews.get(item_id)
        scalar = [(k, v) for k, v in metadata.items() if isinstance(v, str | int | float | bool) and k != "filename"]
        out.append(
            Card(
                id=item_id,
                title=title_of(external_id, metadata),
                score=score,
                url=view.item(item_id),
                like_url=view.more_like(item_id),
                thumbnail_url=f"{view.item(item_id)}/thumbnail" if preview and preview.shows_thumbnail else None,
                snippet=preview.snippet if preview else None,
                status=preview.status if preview else "ready",
                chips=tuple((k, _shown(v), view.adding(k, v)) for k, v in scalar[:4]),
            )
        )
    return out


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"
