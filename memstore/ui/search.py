"""Searching from the pages: query vectors (text, image, a stored item), metadata filter chips, and
the cards of a results grid. The work is the API's own: the same encoder priorities, checks and limits.

A chip is one condition of the filter language (``memstore.search.filter_language``, docs/search.md):
``key=value`` (a plain value: equal, or an element of a list), ``key>=value``, ``key>value``,
``key<=value`` and ``key<value`` (ranges over numbers, ISO 8601 dates and strings). Chips on one key
all hold (``taken>=2024-05-01`` and ``taken<2024-06-01`` make one range; ``tags=a`` and ``tags=b`` ask
for both tags).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import numpy as np

from memstore.api import bodies
from memstore.api.ingest import check_encodable, check_text
from memstore.api.problems import Problem
from memstore.api.routes.search import query_image_options
from memstore.api.runtime import Runtime, embed_query
from memstore.catalog.collections import Collection
from memstore.catalog.field_paths import escape_name
from memstore.media import thumbnails
from memstore.models import SearchResult
from memstore.search.filter_language import compile_filter

MAX_CHIPS = 8
MAX_CHIP_CHARS = 200
MAX_LIST_CHIPS = 8  # list elements shown on one card
RANGES = {">=": "$gte", ">": "$gt", "<=": "$lte", "<": "$lt"}
OPERATORS = ("=", *RANGES)
MODES = ("hybrid", "vector", "keyword")  # the search form's switch; hybrid is the default
CHIP_FORM = "write key=value, key>=value, key>value, key<=value or key<value"


@dataclass(frozen=True)
class Chip:
    """One metadata filter: items whose metadata ``key`` is ``value`` (or a list holding it), or
    compares to it by ``op``."""

    key: str
    value: Any
    op: str = "="
    nested: bool = False  # the key is a path of fields: ``image.taken_at``

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.key.split(".")) if self.nested else (self.key,)

    @property
    def param(self) -> str:
        """As it travels in the query string (``f=key=value``, ``f=price>=10``): a string that would read
        as another JSON value (``2020``, ``true``) or lose its spaces is quoted, so it stays the same
        string; a key holding an operator's character or a dot (one key, not a path), or no character
        at all, is quoted too."""
        return f"{self._key_text}{self.op}{_value_text(self.value)}"

    @property
    def label(self) -> str:
        """As the page shows it: quoted where the address quotes it, so two chips never read alike
        (``year: 2020``, the number, and ``year: "2020"``, the string)."""
        shown = _value_text(self.value)
        return f"{self._key_text}: {shown}" if self.op == "=" else f"{self._key_text} {_SHOWN_OPS[self.op]} {shown}"

    @property
    def _key_text(self) -> str:
        literal = not self.nested and (_needs_quotes(self.key) or "." in self.key)
        return json.dumps(self.key, ensure_ascii=False) if literal else self.key

    @property
    def linkable(self) -> bool:
        """Whether the chip survives the address: a link with a chip the page would refuse (a value
        over MAX_CHIP_CHARS) is no link to offer."""
        return parse_chip(self.param) == self

    @property
    def leaf(self) -> Any:
        """What the chip asks of its field: the plain value, or the range operator's object."""
        return self.value if self.op == "=" else {RANGES[self.op]: self.value}

    @property
    def condition(self) -> dict[str, Any]:
        """The chip as a filter of the filter language."""
        return _at(self.fields, self.leaf)

    @property
    def identity(self) -> tuple[str, bool, str, str]:
        """Chips with one identity are one chip (the later one kept): one bound of a range per key
        and operator, any number of values per key."""
        if self.op != "=":
            return (self.key, self.nested, self.op, "")
        return (self.key, self.nested, "=", json.dumps(self.value, sort_keys=True))


def _at(fields: tuple[str, ...], leaf: Any) -> dict[str, Any]:
    """``leaf`` under the nested fields: ``{"image": {"taken_at": leaf}}``, each name escaped, so a
    key holding a dot stays one name (the filter language reads a dot as a path's separator)."""
    out: Any = leaf
    for name in reversed(fields):
        out = {escape_name(name): out}
    return dict(out)


_SHOWN_OPS = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}


def _needs_quotes(key: str) -> bool:
    return not key or key.startswith('"') or key != key.strip() or any(ch in key for ch in "<>=")


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            if value == value.strip():
                return value
    return json.dumps(value, ensure_ascii=False)


@dataclass
class ChipErrors:
    """What the address asked for that is not a chip, or is a chip past the MAX_CHIPS first, to say so
    on the page."""

    refused: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    @property
    def message(self) -> str | None:
        parts = []
        if self.refused:
            shown = ", ".join(f"“{_clip(text)}”" for text in self.refused[:3])
            parts.append(
                f"Not a filter: {shown}; {CHIP_FORM} (at most {MAX_CHIPS} filters of {MAX_CHIP_CHARS} characters)."
            )
        if self.left_out:
            shown = ", ".join(_clip(text) for text in self.left_out[:5])
            more = f" and {len(self.left_out) - 5} more" if len(self.left_out) > 5 else ""
            parts.append(f"At most {MAX_CHIPS} filters; left out: {shown}{more}.")
        return " ".join(parts) or None


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def parse_chip(text: str) -> Chip | None:
    """``key=value`` or ``key<op>value``; the value is a JSON number, boolean or null when it reads as
    one (a list of them after ``=``: every one of them in a list), else the string as typed, its
    surrounding spaces dropped. A key with dots is a path (``image.taken_at``: the field ``taken_at``
    of the object ``image``); a key written as a JSON string is one key as it is (to hold ``.``,
    ``=``, ``<`` or ``>``)."""
    if len(text) > MAX_CHIP_CHARS:
        return None
    stripped = text.strip()
    quoted = stripped.startswith('"')
    if quoted:
        try:
            key, end = json.JSONDecoder().raw_decode(stripped)
        except ValueError:
            return None
        if not isinstance(key, str):
            return None
        rest = stripped[end:].lstrip()
    else:
        at = min((i for i in (stripped.find(ch) for ch in "<>=") if i >= 0), default=-1)
        if at < 0:
            return None
        key, rest = stripped[:at].strip(), stripped[at:]
    op = next((o for o in (">=", "<=", ">", "<", "=") if rest.startswith(o)), None)
    if op is None or not (key or quoted):  # "" (quoted) names the empty key; =1 names none
        return None
    raw = rest[len(op) :].strip()
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except ValueError:
        value = raw
    if isinstance(value, float) and not math.isfinite(value):  # 1e400
        value = raw
    if isinstance(value, dict) or (isinstance(value, list) and (op != "=" or not _scalars(value))):
        value = raw
    nested = not quoted and "." in key and all(key.split("."))
    return Chip(key, value, op, nested)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _scalars(values: list[Any]) -> bool:
    return bool(values) and all(not isinstance(v, dict | list) for v in values)


def parse_chips(values: Iterable[str], errors: ChipErrors | None = None) -> list[Chip]:
    """The chips of the address (``f=``), the first MAX_CHIPS of them; blank ones are ignored, others
    that are not chips, and chips past the limit, are counted in ``errors``."""
    chips: dict[tuple[str, bool, str, str], Chip] = {}
    for text in values:
        if not text.strip():
            continue
        chip = parse_chip(text)
        if chip is None:
            if errors is not None:
                errors.refused.append(text)
            continue
        if chip.identity not in chips and len(chips) == MAX_CHIPS:
            if errors is not None:
                errors.left_out.append(text)
            continue
        chips[chip.identity] = chip  # a later chip for the same bound replaces it, in its place
    return list(chips.values())


def filter_of(chips: Sequence[Chip]) -> dict[str, Any] | None:
    """The chips as one filter: one object when every chip has its own key, ranges on one key
    merged, else every chip's condition under ``$and``."""
    if not chips:
        return None
    everything = {"$and": [chip.condition for chip in chips]}
    leaves: dict[tuple[str, ...], Any] = {}
    for chip in chips:
        if chip.fields not in leaves:
            leaves[chip.fields] = chip.leaf
        elif chip.op != "=" and _is_range(leaves[chip.fields]):
            leaves[chip.fields] = {**leaves[chip.fields], RANGES[chip.op]: chip.value}
        else:
            return everything
    if len({fields[0] for fields in leaves}) < len(leaves):  # two paths under one key
        return everything
    merged: dict[str, Any] = {}
    for fields, leaf in leaves.items():
        merged.update(_at(fields, leaf))  # one key each: the first names differ (checked above)
    return merged


def _is_range(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(k in RANGES.values() for k in value)


def check_chips(chips: Sequence[Chip]) -> None:
    """InvalidInputError (the filter language's message) for chips the store would refuse."""
    flt = filter_of(chips)
    if flt is not None:
        compile_filter(flt)


# The browse page's orders: the value of ``sort`` and what the page calls it. "added" is id order.
SORTS: dict[str, str] = {
    "added": "added",
    "taken-desc": "newest taken first",
    "taken-asc": "oldest taken first",
}
# The field the "taken" orders read: a photo's date taken (memstore.media.photo_facts), as a timestamp.
TAKEN_FIELD = ("image", "taken_at")


@dataclass(frozen=True)
class SearchView:
    """The search a page shows, and the links that change it. ``mode``: the search form's switch for
    a typed query (``hybrid``, the default, ``vector`` or ``keyword``). ``sort``: the order of a
    listing without a query (one of SORTS; ``added``, id order, the default)."""

    ui: str
    collection: str
    query: str = ""
    like: int | None = None
    chips: tuple[Chip, ...] = ()
    mode: str = "hybrid"
    sort: str = "added"

    @property
    def page(self) -> str:
        return f"{self.ui}/c/{quote(self.collection)}"

    @property
    def sorts(self) -> list[tuple[str, str]]:
        return list(SORTS.items())

    def url(
        self,
        *,
        query: str | None = None,
        like: int | None = None,
        chips: tuple[Chip, ...] | None = None,
        after: int | None = None,
        cursor: str | None = None,
    ) -> str:
        params: list[tuple[str, str]] = []
        q = self.query if query is None else query
        if like is not None:
            params.append(("like", str(like)))
        elif q:
            params.append(("q", q))
            if self.mode != "hybrid":
                params.append(("mode", self.mode))
        params += [("f", c.param) for c in (self.chips if chips is None else chips)]
        if like is None and not q and self.sort != "added":  # a listing keeps its order
            params.append(("sort", self.sort))
        if after is not None:
            params.append(("after", str(after)))
        if cursor is not None:
            params.append(("cursor", cursor))
        return self.page + ("?" + urlencode(params) if params else "")

    def without(self, chip: Chip) -> str:
        return self.url(like=self.like, chips=tuple(c for c in self.chips if c != chip))

    def adding(self, key: str, value: Any) -> str | None:
        """The filter ``key=value`` in place of the other values of ``key`` (a card's scalar field);
        None for a chip the page would refuse."""
        chip = Chip(key, value)
        if not chip.linkable:
            return None
        kept = tuple(c for c in self.chips if c.key != key or c.op != "=" or c.nested)
        return self.url(like=self.like, chips=(*kept, chip))

    def also(self, key: str, value: Any) -> str | None:
        """The filter ``key=value`` besides the others (an element of a card's list: one more tag);
        None for a chip the page would refuse."""
        chip = Chip(key, value)
        if not chip.linkable:
            return None
        kept = tuple(c for c in self.chips if c.identity != chip.identity)
        return self.url(like=self.like, chips=(*kept, chip))

    def more_like(self, item_id: int) -> str:
        return self.url(like=item_id)

    def item(self, item_id: int) -> str:
        return f"{self.page}/items/{item_id}"

    def filter_query(self) -> str:
        """The chips alone, for the image search's form."""
        return urlencode([("f", c.param) for c in self.chips])


def check_query_text(rt: Runtime, text: str) -> None:
    check_text(rt, text, "the query")


def text_vector(rt: Runtime, c: Collection, text: str) -> np.ndarray | None:
    """The query's vector from the model of the collection's active space, for a hybrid search; None
    when this server cannot embed for it (no model, still loading, another model): the words alone
    then search, by keyword."""
    check_query_text(rt, text)
    if rt.encoder.backend is None:
        return None
    try:
        how = check_encodable(rt, c, c.space())
    except Problem:
        return None
    return embed_query(rt.encoder.backend, text=text, **how)  # bounded in time, as the API's


def image_vector(rt: Runtime, c: Collection, data: bytes) -> np.ndarray:
    backend = rt.encoder.require("search by a stored item instead ('more like this')")
    how = check_encodable(rt, c, c.space())
    checked, _ = bodies.check_image(data, "the query image", query_image_options(rt))
    return embed_query(backend, image=checked, **how)


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
    chips: Sequence[Chip],
    sample: bool = True,
    text: str | None = None,
    mode: str | None = None,
) -> list[SearchResult]:
    """The search itself: by ``vector``, by ``text``'s keywords too when given (hybrid; keyword alone
    without a vector), or in the ``mode`` asked for. Typed and image queries are offered to the recall
    probes' samples, as the API's are (a stored item's vector is not a query anybody typed; the
    probes measure the default space). The pages search the collection's active space."""
    if mode is None:
        mode = "keyword" if vector is None else None
    results = rt.store.search(
        collection=c.name,
        vector=None if mode == "keyword" else vector,
        text=None if mode == "vector" else text,
        mode=mode,
        k=k,
        filter=filter_of(chips),
    )
    if vector is not None and mode != "keyword" and sample and not c.space().side:
        rt.sampler.offer(c.id, vector)  # drawn first; made float32 only when kept
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
    chips: tuple[tuple[str, str, str | None], ...]  # (key, shown value, link adding it as a filter)
    tags: tuple[tuple[str, str, str | None], ...] = ()  # elements of list fields: (key, shown value, link)
    found_by: str | None = None  # a hybrid hit: "both", "keyword" or "vector"
    ranks: str = ""  # where each list placed it, in words
    taken: str | None = None  # metadata.image.taken_at (a photo's date taken), as written


def title_of(external_id: str, metadata: dict[str, Any]) -> str:
    name = metadata.get("filename")
    return name if isinstance(name, str) and name else external_id


def found_by(hit: SearchResult) -> tuple[str | None, str]:
    """Which list of a hybrid search found the hit, and where each placed it."""
    v, k = hit.vector_rank, hit.keyword_rank
    vector = f"vector list: #{v}" if v is not None else "not in the vector list"
    keyword = f"keyword list: #{k}" if k is not None else "not in the keyword list"
    words = f"{vector}, {keyword}"
    if v is not None and k is not None:
        return "both", words
    if k is not None:
        return "keyword", words
    if v is not None:
        return "vector", words
    return None, ""


def taken_of(metadata: dict[str, Any]) -> str | None:
    image = metadata.get("image")
    taken = image.get("taken_at") if isinstance(image, dict) else None
    return taken[:40] if isinstance(taken, str) and taken else None


def cards(
    rt: Runtime,
    c: Collection,
    view: SearchView,
    hits: Sequence[tuple[int, str, dict[str, Any], float | None]],
    *,
    found: dict[int, SearchResult] | None = None,
) -> list[Card]:
    """Cards for (id, external id, metadata, score) rows, with their previews read in one query;
    ``found``: the hits of a hybrid search by id, to say which list found each."""
    previews = thumbnails.previews(rt.db, c, [h[0] for h in hits])
    out = []
    for item_id, external_id, metadata, score in hits:
        preview = previews.get(item_id)
        scalar = [(k, v) for k, v in metadata.items() if isinstance(v, str | int | float | bool) and k != "filename"]
        listed = [
            (k, v)
            for k, values in metadata.items()
            if isinstance(values, list)
            for v in values
            if isinstance(v, str | int | float | bool)
        ]
        by, ranks = found_by(found[item_id]) if found and item_id in found else (None, "")
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
                tags=tuple((k, _shown(v), view.also(k, v)) for k, v in listed[:MAX_LIST_CHIPS]),
                found_by=by,
                ranks=ranks,
                taken=taken_of(metadata),
            )
        )
    return out


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:39] + "…"
