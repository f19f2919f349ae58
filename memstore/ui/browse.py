"""The collections page (``/ui/``) and a collection's search page (``/ui/c/{name}``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from psycopg.errors import QueryCanceled
from starlette.responses import Response

from encoder.errors import EncoderError
from memstore import action_log
from memstore.api import bodies
from memstore.api.problems import Problem, from_exception
from memstore.api.runtime import Runtime
from memstore.catalog.collections import Collection
from memstore.errors import InvalidInputError, MemstoreError
from memstore.models import CollectionStats, SearchResult
from memstore.settings import get_ui_settings
from memstore.ui import search
from memstore.ui.access import collection_for, runtime
from memstore.ui.identity import CSRF_FIELD, Identity, check_csrf_field, current
from memstore.ui.render import PageRoute, base_path, page

router = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)
BROWSE_PAGE = 48
LOW_RECALL = 0.9


@dataclass(frozen=True)
class Summary:
    """A collection's line on the collections page."""

    collection: Collection
    stats: CollectionStats | None
    health: str
    tone: str  # good, busy, warn or bad: the badge's colour


def health_of(stats: CollectionStats | None, probe: dict[str, Any] | None) -> tuple[str, str]:
    """One word for the badge: failures first, then ingest in progress, then the index's last probe."""
    if stats is None:
        return "unavailable", "bad"
    if stats.failed:
        return f"{stats.failed} failed", "bad"
    if stats.pending:
        return "ingesting", "busy"
    if probe is not None:
        if probe.get("recall") is not None and probe["recall"] < LOW_RECALL:
            return "low recall", "warn"
        if probe.get("recommendation") not in (None, "", "nothing"):
            return f"{probe['recommendation']} due", "warn"
    return "healthy", "good"


def _summaries(rt: Runtime, identity: Identity) -> list[Summary]:
    out = []
    for c in rt.store.list_collections():
        if not identity.key.allows("read", c.name):
            continue
        try:
            stats: CollectionStats | None = rt.store.collection_stats(name=c.name)
            probes = action_log.recent_probes(rt.db, collection=c.name, limit=1)
        except MemstoreError:  # dropped meanwhile
            stats, probes = None, []
        health, tone = health_of(stats, probes[0] if probes else None)
        out.append(Summary(c, stats, health, tone))
    return out


@router.get("/")
async def collections_page(request: Request) -> Response:
    identity = current(request)
    rt = runtime(request)
    summaries = await run_in_threadpool(_summaries, rt, identity)
    return page(request, "collections.html", identity=identity, summaries=summaries)


@router.get("/c/{name}")
async def collection_page(
    request: Request,
    name: str,
    # Unbounded here (the server bounds the request line): the search refuses a long query naming its
    # limit, and the page says what ``like`` takes, where a validation error would be a bare 404.
    q: str = "",
    like: str | None = None,
    f: Annotated[list[str], Query(max_length=32)] = [],  # noqa: B006 (FastAPI copies defaults)
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
    mode: Annotated[str, Query(max_length=16)] = "hybrid",
    sort: Annotated[str, Query(max_length=32)] = "added",
    cursor: Annotated[str | None, Query(max_length=8192)] = None,
) -> Response:
    rt, identity, c = await collection_for(request, name)
    refused = search.ChipErrors()
    chips = tuple(search.parse_chips(f, refused))
    chosen = mode if mode in search.MODES else "hybrid"
    order = sort if sort in search.SORTS else "added"
    like_id = _item_id(like)
    # A typed query replaces "More like this": the search form of a "More like this" page keeps
    # ``like`` (a filter added there narrows the same search), and text typed there is a new search.
    query = q.strip()
    view = search.SearchView(base_path(request), c.name, query, None if query else like_id, chips, chosen, order)
    if sort not in search.SORTS:  # the items in id order, and what the sorts are
        cursor = None
    context = await run_in_threadpool(_search_context, rt, c, view, after, cursor)
    if like is not None and like_id is None and not query and "problem" not in context:  # the items, listed
        context["problem"] = Problem("invalid-input", f"like: an item id (a whole number from 1), not {like[:32]!r}")
    if refused.message and "problem" not in context:
        context["problem"] = Problem("invalid-input", refused.message)
    if mode not in search.MODES and "problem" not in context:
        context["problem"] = Problem("invalid-input", f"mode is one of {', '.join(search.MODES)}, not {mode[:16]!r}")
    if sort not in search.SORTS and "problem" not in context:
        context["problem"] = Problem("invalid-input", f"sort is one of {', '.join(search.SORTS)}, not {sort[:32]!r}")
    return _collection_response(request, identity, c, view, context)


def _item_id(text: str | None) -> int | None:
    """``like``'s item id; None when there is none, or when it is no id (the page says so)."""
    digits = (text or "").strip()
    if not (digits.isascii() and digits.isdigit()):
        return None
    value = int(digits)
    return value if 1 <= value < 2**63 else None


def _collection_response(
    request: Request, identity: Identity, c: Collection, view: search.SearchView, context: dict[str, Any]
) -> Response:
    problem: Problem | None = context.pop("problem", None)
    return page(
        request,
        "collection.html",
        identity=identity,
        status_code=problem.status if problem else 200,
        collection=c,
        view=view,
        modes=search.MODES,
        can_write=identity.key.allows("write", c.name),
        error=problem.detail if problem else None,
        **context,
    )


def _search_context(
    rt: Runtime, c: Collection, view: search.SearchView, after: int, cursor: str | None = None
) -> dict[str, Any]:
    """Results for a typed query or "more like this", else a page of the collection's items (those the
    chips match, when there are chips). A query or a chip the encoder or the store refuses is shown on
    the page, with what to do, not as an error page."""
    k = get_ui_settings().results
    context: dict[str, Any] = {"stats": rt.store.collection_stats(name=c.name), "mode": "browse", "next_url": None}
    found: dict[int, SearchResult] | None = None
    try:
        search.check_chips(view.chips)
        if view.like is not None:
            vector = search.item_vector(rt, c, view.like)
            hits = search.nearest(rt, c, vector, k=k + 1, chips=view.chips, sample=False)
            results = [r for r in hits if r.id != view.like][:k]  # not the item itself
            context["mode"] = "like"
        elif view.query:
            results, context["mode"] = _typed_search(rt, c, view, k)
            context["score_title"] = SCORE_TITLES[context["mode"]]
            if context["mode"] == "text":
                found = {r.id: r for r in results}
        else:
            _browse(rt, c, view, after, cursor, context)
            return context
    except (Problem, MemstoreError, EncoderError, QueryCanceled) as exc:
        context.update(cards=[], problem=from_exception(exc))
        return context
    rows = [(r.id, r.external_id, r.metadata, r.score) for r in results]
    context["cards"] = search.cards(rt, c, view, rows, found=found)
    return context


SCORE_TITLES = {
    "text": "hybrid: the fused rank of the meaning and keyword matches, higher is better",
    "keyword": "keyword rank: higher matches better",
    "vector": "similarity: higher is closer",
}


def _typed_search(rt: Runtime, c: Collection, view: search.SearchView, k: int) -> tuple[list[SearchResult], str]:
    """A typed query in the mode the form asked for: hybrid (or keyword alone where this server cannot
    embed for the collection), vector (refused where it cannot embed) or keyword."""
    if view.mode == "keyword":
        search.check_query_text(rt, view.query)
        return search.nearest(rt, c, None, k=k, chips=view.chips, text=view.query, mode="keyword"), "keyword"
    vector = search.text_vector(rt, c, view.query)
    if view.mode == "vector":
        if vector is None:
            raise Problem(
                "conflict",
                "this server cannot embed a text for this collection's model: search by keyword or hybrid instead",
            )
        return search.nearest(rt, c, vector, k=k, chips=view.chips, text=view.query, mode="vector"), "vector"
    results = search.nearest(rt, c, vector, k=k, chips=view.chips, text=view.query)
    return results, "text" if vector is not None else "keyword"


def _browse(
    rt: Runtime, c: Collection, view: search.SearchView, after: int, cursor: str | None, context: dict[str, Any]
) -> None:
    """A page of the collection's items in id order, or by date taken (``view.sort``, paged by the
    store's cursor; the undated last); with chips, the items they match (the store's filtered
    listing, under the search statement timeout). A cursor the store refuses (forged, or of another
    order) is the page's error, as a refused chip is."""
    flt = search.filter_of(view.chips)
    if flt is not None:
        context["mode"] = "filtered"
    if view.sort == "added":
        if cursor is not None:
            raise InvalidInputError("cursor: pages a listing sorted by date taken; this one is in the order added")
        items, more = rt.store.page_items(collection=c.name, after_id=after, limit=BROWSE_PAGE, filter=flt)
        following = view.url(query="", after=items[-1].id) if more and items else None
    else:
        if after:
            raise InvalidInputError("after: pages the listing in the order added; a sorted one pages by its cursor")
        items, next_cursor = rt.store.page_items_ordered(
            collection=c.name,
            order_by=list(search.TAKEN_FIELD),
            order_type="timestamp",
            descending=view.sort == "taken-desc",
            after_key=cursor,
            limit=BROWSE_PAGE,
            filter=flt,
        )
        following = view.url(query="", cursor=next_cursor) if next_cursor is not None else None
    rows = [(i.id, i.external_id, i.metadata, None) for i in items]
    context["cards"] = search.cards(rt, c, view, rows)
    context["next_url"] = following
    context["paged"] = bool(after or cursor)  # an empty page past the last: "no more", not "none yet"


@router.post("/c/{name}/search/image")
async def image_search(request: Request, name: str) -> Response:
    """Search by an image (dropped, pasted or picked). Scripts get the results grid alone
    (``X-Fragment: 1``) to put in place; a form posted without scripts gets the whole page."""
    rt, identity, c = await collection_for(request, name)  # before the body is read
    form = await bodies.read_form(request, max_files=1)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    images = bodies.uploads(form, "image") if "image" in form else []
    if not images:
        raise Problem("invalid-input", "no image: pick, drop or paste one")
    data = await images[0].read(rt.encoder.image_options.max_bytes + 1)
    view = search.SearchView(
        base_path(request), c.name, chips=tuple(search.parse_chips(request.query_params.getlist("f")))
    )

    def run() -> dict[str, Any]:
        context: dict[str, Any] = {"stats": None, "mode": "image", "next_url": None}
        try:
            vector = search.image_vector(rt, c, data)
            search.check_chips(view.chips)
            results = search.nearest(rt, c, vector, k=get_ui_settings().results, chips=view.chips)
        except (Problem, MemstoreError, EncoderError) as exc:
            context.update(cards=[], problem=from_exception(exc))
            return context
        context["cards"] = search.cards(rt, c, view, [(r.id, r.external_id, r.metadata, r.score) for r in results])
        return context

    context = await run_in_threadpool(run)
    if request.headers.get("x-fragment") == "1":
        problem = context.pop("problem", None)
        return page(
            request,
            "_results.html",
            identity=identity,
            status_code=problem.status if problem else 200,
            view=view,
            error=problem.detail if problem else None,
            **context,
        )
    context["stats"] = await run_in_threadpool(lambda: rt.store.collection_stats(name=c.name))
    return _collection_response(request, identity, c, view, context)
