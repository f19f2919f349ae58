"""POST /v1/collections/{name}/search: by text, image, vector or a stored item."""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from encoder.images import ImageOptions
from memstore.access.keys import ApiKey
from memstore.api import bodies
from memstore.api.auth import SECURITY_DOC, key_from_header, require, runtime
from memstore.api.ingest import check_encodable, check_text
from memstore.api.problems import ERROR_RESPONSES, Problem, from_exception, validation_problem
from memstore.api.routes.items import content_url
from memstore.api.runtime import Runtime, embed_query
from memstore.api.schemas import (
    DuplicatesOut,
    DuplicatesRequest,
    Example,
    RecommendRequest,
    SearchBatch,
    SearchBatchOut,
    SearchOut,
    SearchRequest,
    given_vector,
)
from memstore.catalog.collections import validate_name
from memstore.catalog.field_paths import split_names
from memstore.models import SearchResult
from memstore.search.request import SearchQuery, Weights, check_query, group_window, grouped

router = APIRouter(prefix="/v1/collections/{name}", tags=["search"], responses=ERROR_RESPONSES)

_FORM_FIELDS = (
    "text",
    "vector",
    "item_id",
    "mode",
    "k",
    "offset",
    "candidates",
    "weights",
    "score_threshold",
    "filter",
    "ef_search",
    "exact",
)
_JSON_FORM_FIELDS = ("vector", "filter", "weights")
_SEARCH_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SearchRequest"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "image": {"type": "string", "format": "binary"},
                        "text": {"type": "string", "description": "keywords to fuse with the image (hybrid)"},
                        "mode": {"type": "string", "enum": ["vector", "hybrid"]},
                        "k": {"type": "integer", "minimum": 1},
                        "offset": {"type": "integer", "minimum": 0},
                        "candidates": {"type": "integer", "minimum": 1},
                        "weights": {"type": "string", "description": 'a JSON object: {"vector": 1, "keyword": 1}'},
                        "score_threshold": {"type": "number"},
                        "filter": {"type": "string", "description": "a JSON object"},
                        "ef_search": {"type": "integer"},
                        "exact": {"type": "boolean"},
                    },
                    "required": ["image"],
                }
            },
        },
    }
}


def json_image(body: SearchRequest) -> bytes | None:
    """The base64 image of a JSON search, decoded."""
    if body.image is None:
        return None
    return _base64_image(body.image, "image: not valid base64 (or upload the file as multipart)")


def _base64_image(value: str, refusal: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise Problem("invalid-input", refusal) from None


def _embed_query(
    rt: Runtime, how: dict[str, Any], *, label: str, text: str | None = None, image: bytes | None = None
) -> Any:
    """A query's text or image (the field ``label`` names) as the encoder embeds it, at query
    priority, after the same checks as ingest (the text's length; the image's bytes and pixels, with
    a search's lower pixel budget). ``how``: what ``check_encodable`` answered for this collection
    (its model, when the encoder runs several)."""
    backend = rt.encoder.require("search by vector or item_id instead")
    if text is not None:
        check_text(rt, text, label)
        return embed_query(backend, text=text, **how)
    assert image is not None
    data, _ = bodies.check_image(image, label, query_image_options(rt))
    return embed_query(backend, image=data, **how)


async def _parse(request: Request, rt: Runtime) -> tuple[SearchRequest, bytes | None]:
    if bodies.body_kind(request, multipart=True) == "json":
        body = await bodies.read_json(request, SearchRequest)
        return body, json_image(body)
    form = await bodies.read_form(request, max_files=1)
    bodies.refuse_unknown_fields(form, ("image", *_FORM_FIELDS))
    uploads = bodies.uploads(form, "image") if "image" in form else []
    fields: dict[str, Any] = {}
    for name in _FORM_FIELDS:
        values = bodies.text_fields(form, name)
        if values:
            fields[name] = values[-1]
    for name in _JSON_FORM_FIELDS:
        if name in fields:
            fields[name] = bodies.json_field(form, name)[-1]
    try:
        body = SearchRequest.model_validate(fields, strict=False)
    except ValidationError as exc:
        raise validation_problem(list(exc.errors())) from None
    image = None
    if uploads:
        image = await uploads[0].read(rt.encoder.image_options.max_bytes + 1)
    return body, image


def _sources(body: SearchRequest, image: bytes | None) -> str | None:
    """Which of image, vector or item_id gives the query vector (at most one); None: the text does."""
    sources = (("image", image), ("vector", given_vector(body)), ("item_id", body.item_id))
    given = [k for k, v in sources if v is not None]
    if len(given) > 1:
        raise Problem("invalid-input", f"give at most one of image, vector or item_id, not {' and '.join(given)}")
    if not given and body.text is None:
        raise Problem("invalid-input", "give a text, an image, a vector or an item_id")
    return given[0] if given else None


def _mode(body: SearchRequest, source: str | None) -> str:
    """The mode as asked, or by default hybrid when the body has a text, else vector."""
    if body.mode == "keyword":
        if source is not None:
            raise Problem("invalid-input", f"a keyword search takes a text alone, not a {source} too")
        if body.text is None:
            raise Problem("invalid-input", "a keyword search needs a text")
        return "keyword"
    if body.mode == "vector" and source is not None and body.text is not None:
        raise Problem(
            "invalid-input", f"a vector search takes one of text or {source}; ask for mode 'hybrid' to use both"
        )
    if body.mode == "hybrid" and body.text is None:
        raise Problem("invalid-input", "a hybrid search needs a text (its keywords)")
    if body.mode is not None:
        return body.mode
    return "hybrid" if body.text is not None else "vector"


def _query_vector(rt: Runtime, name: str, body: SearchRequest, image: bytes | None, source: str | None) -> Any:
    """The query vector of a vector or hybrid search: given, a stored item's, or embedded."""
    if source == "vector":
        return given_vector(body)
    if source == "item_id":
        assert body.item_id is not None
        item = rt.store.get_item(collection=name, id=body.item_id)
        found = rt.store.vectors(collection=name, ids=[body.item_id], using=body.using).get(body.item_id)
        if found is None:
            raise Problem(
                "conflict",
                f"item {body.item_id} has no vector yet in the space searched (status {item.status}); "
                "search again once it has",
            )
        return found
    purpose = "search with mode 'keyword', or by vector or item_id" if source is None else "search by vector or item_id"
    rt.encoder.require(purpose)
    c = rt.store.get_collection(name=name)
    try:
        how = check_encodable(rt, c, c.space(body.using))
    except Problem as exc:
        if source is None:  # a text alone: its words can still be searched
            exc.detail += '; or search the text\'s words alone with "mode": "keyword"'
        raise
    if source is None:
        return _embed_query(rt, how, label="text", text=body.text)
    return _embed_query(rt, how, label="image", image=image)


def check(body: SearchRequest, mode: str, vector: Any) -> SearchQuery:
    """The search's arguments as the store checks them (bad ones: a 422 naming the argument). A
    grouped search reads the ranked list deeper (``search_query.group_window``) and groups it after."""
    if body.group_by is not None and body.offset:
        raise Problem("invalid-input", "offset pages hits, not groups: leave it out with group_by")
    if body.group_by is None and "group_size" in body.model_fields_set:
        raise Problem("invalid-input", "group_size is the hits of each group: it needs group_by")
    if body.group_by is not None:
        split_names(body.group_by, "group_by")  # a field's name or a dotted path, checked before searching
    return check_query(
        mode=mode,
        vector=vector,
        text=body.text if mode != "vector" else None,
        k=body.k if body.group_by is None else group_window(body.k, body.group_size),
        filter=body.filter,
        offset=body.offset,
        candidates=body.candidates,
        weights=None if body.weights is None else Weights(body.weights.vector, body.weights.keyword),
        score_threshold=body.score_threshold,
        using=body.using,
    )


def query_image_options(rt: Runtime) -> ImageOptions:
    """The ingest limits, with the lower pixel budget of a search (checked on the header, before decoding)."""
    return replace(
        rt.encoder.image_options, max_pixels=min(rt.encoder.image_options.max_pixels, rt.api.max_query_image_pixels)
    )


def _search(rt: Runtime, name: str, body: SearchRequest, image: bytes | None) -> dict[str, Any]:
    source = _sources(body, image)
    mode = _mode(body, source)
    # Every argument but the vector is checked before any time goes into making it (a placeholder
    # stands for it; the store checks the real one against the collection).
    q = check(body, mode, None if mode == "keyword" else [0.0])
    if mode != "keyword":
        q = replace(q, vector=_query_vector(rt, name, body, image, source))
    results = rt.store.run_search(collection=name, query=q, ef_search=body.ef_search, exact=body.exact)
    return _answer(rt, name, results, q.vector if source != "item_id" else None, q.using)


def _answer(
    rt: Runtime, name: str, results: list[SearchResult], query: Any, using: str | None = None
) -> dict[str, Any]:
    """The response body; a share of the query vectors is kept for the recall probes (not item
    searches; the probes measure the default space's index)."""
    if query is not None and rt.sampler.draw():  # the collection looked up for the drawn few only
        c = rt.store.cached_collection(name)
        if c is not None and not c.space(using).side:
            rt.sampler.keep_one(c.id, query)
    return {
        "results": [
            {
                "id": r.id,
                "external_id": r.external_id,
                "score": r.score,
                "distance": r.distance,
                "ranks": r.ranks,
                "metadata": r.metadata,
                "content_url": content_url(name, r.id) if r.has_original else None,
            }
            for r in results
        ]
    }


def _grouped(out: dict[str, Any], field: str, groups: int, size: int) -> dict[str, Any]:
    """The hits of a grouped search as groups, and as the flat list of the hits the groups hold."""
    listed = grouped(out["results"], field, groups, size, metadata=lambda h: h["metadata"])
    kept = {id(h) for g in listed for h in g}  # a hit in several groups (a list) once, in rank order
    return {
        "results": [h for h in out["results"] if id(h) in kept],
        "groups": [{"value": g.value, "hits": list(g)} for g in listed],
    }


def _with_vectors(rt: Runtime, name: str, out: dict[str, Any], using: str | None) -> dict[str, Any]:
    """Each hit's stored vector in the space searched, read in one statement for all of them."""
    vectors = rt.store.vectors(collection=name, ids=[h["id"] for h in out["results"]], using=using)
    for hit in out["results"]:
        found = vectors.get(hit["id"])
        hit["vector"] = None if found is None else found.tolist()
    return out


@router.post(
    "/search",
    openapi_extra={**_SEARCH_DOC, **SECURITY_DOC},
    summary="Nearest items to a text, image, vector or stored item",
    response_model=SearchOut,
)
async def search(request: Request, name: str) -> JSONResponse:
    """By ``text``, ``image`` (base64 in JSON, or a multipart upload), ``vector`` or ``item_id``, and by
    a ``text``'s keywords: ``mode`` ``vector``, ``keyword`` or ``hybrid`` (both lists fused; the default
    when there is a text and a vector can be had for it). ``filter`` keeps items whose metadata
    contains it; ``exact`` brute-forces the true nearest items. Each hit says where each list ranked
    it (``ranks``) and links to its stored original (``content_url``; null for an item stored as a
    bare vector). See docs/search.md."""
    rt = runtime(request)
    authorize(await key_from_header(request), name)
    body, image = await _parse(request, rt)
    return JSONResponse(await execute(rt, name, body, image), media_type="application/json")


def authorize(key: ApiKey, name: str) -> None:
    validate_name(name)
    require(key, "read", name)


async def execute(rt: Runtime, name: str, body: SearchRequest, image: bytes | None) -> dict[str, Any]:
    """The search itself, shared by the route and the JSON fast path (memstore.api.fastpath)."""
    if body.k > rt.api.max_k:
        raise Problem("invalid-input", f"k is {body.k}; the limit is {rt.api.max_k} (MEMSTORE_API_MAX_K)")
    started = time.perf_counter()
    out = None
    # A search that needs no model (a vector given, or keywords alone) stays on the event loop (see
    # memstore.search.runner); one that embeds a text or an image goes to the executor.
    if rt.searcher is not None and image is None and body.item_id is None:
        source = _sources(body, image)
        mode = _mode(body, source)
        if source == "vector" or mode == "keyword":
            q = check(body, mode, given_vector(body) if mode != "keyword" else None)
            results = await rt.searcher.search(collection=name, query=q, ef_search=body.ef_search, exact=body.exact)
            if results is not None:
                out = _answer(rt, name, results, q.vector, q.using)
    if out is None:
        out = await rt.off_loop(_search, rt, name, body, image)
    rt.latency.record(time.perf_counter() - started)
    if body.group_by is not None:
        out = _grouped(out, body.group_by, body.k, body.group_size)
    if body.with_vector and out["results"]:
        out = await rt.off_loop(_with_vectors, rt, name, out, body.using)
    return out


def _example(rt: Runtime, name: str, example: int | Example, where: str) -> Any:
    """An item id as it is; a text or an image embedded by the model of the collection's active space
    (the one a recommendation searches); a vector as given."""
    if isinstance(example, int):
        return example
    given = [k for k in ("text", "image", "vector") if getattr(example, k) is not None]
    if len(given) != 1:
        raise Problem("invalid-input", f"{where}: give exactly one of text, image or vector")
    if example.vector is not None:
        return example.vector
    rt.encoder.require("give item ids or vectors as examples instead")
    c = rt.store.get_collection(name=name)
    how = check_encodable(rt, c, c.space())
    if example.text is not None:
        return _embed_query(rt, how, label=f"{where}.text", text=example.text)
    image = _base64_image(example.image or "", f"{where}.image: not valid base64")
    return _embed_query(rt, how, label=f"{where}.image", image=image)


def _recommend(rt: Runtime, name: str, body: RecommendRequest) -> dict[str, Any]:
    positive = [_example(rt, name, e, f"positive[{i}]") for i, e in enumerate(body.positive)]
    negative = [_example(rt, name, e, f"negative[{i}]") for i, e in enumerate(body.negative)]
    results = rt.store.recommend(
        collection=name,
        positive=positive,
        negative=negative,
        k=body.k,
        filter=body.filter,
        ef_search=body.ef_search,
        exact=body.exact,
    )
    return _answer(rt, name, results, None)


@router.post(
    "/recommend",
    openapi_extra=SECURITY_DOC,
    summary="More like these, not like those",
    response_model=SearchOut,
)
async def recommend(request: Request, name: str) -> JSONResponse:
    """Items like the ``positive`` examples and unlike the ``negative`` ones. An example is a stored
    item's id, or ``{"text": ...}``, ``{"image": base64}`` or ``{"vector": [...]}``. The query is
    ``2 x mean(positive) - mean(negative)`` (each example at unit length in a cosine collection; the
    positives' mean alone without negatives); the example items themselves are left out. ``filter``
    as in a search."""
    rt = runtime(request)
    authorize(await key_from_header(request), name)
    body = await bodies.read_json(request, RecommendRequest)
    if body.k > rt.api.max_k:
        raise Problem("invalid-input", f"k is {body.k}; the limit is {rt.api.max_k} (MEMSTORE_API_MAX_K)")
    out = await rt.off_loop(_recommend, rt, name, body)
    return JSONResponse(out, media_type="application/json")


@router.post(
    "/duplicates",
    openapi_extra=SECURITY_DOC,
    summary="Near-duplicate pairs, a page at a time",
    response_model=DuplicatesOut,
)
async def duplicates(request: Request, name: str) -> JSONResponse:
    """Pairs of items within ``threshold`` of each other: the ``scan`` items after ``after`` (by id)
    are each searched for their ``per_item`` nearest; each pair comes once, closest first. Walk a
    collection by passing the answer's ``next`` as ``after`` until it is null."""
    rt = runtime(request)
    authorize(await key_from_header(request), name)
    body = await bodies.read_json(request, DuplicatesRequest)

    def find() -> dict[str, Any]:
        pairs, after = rt.store.duplicates(
            collection=name, threshold=body.threshold, after_id=body.after, scan=body.scan, per_item=body.per_item
        )
        return {
            "pairs": [
                {
                    "a": {"id": p.a_id, "external_id": p.a_external_id},
                    "b": {"id": p.b_id, "external_id": p.b_external_id},
                    "distance": p.distance,
                }
                for p in pairs
            ],
            "next": after,
        }

    out = await rt.off_loop(find)
    return JSONResponse(out, media_type="application/json")


@router.post(
    "/search/batch",
    openapi_extra=SECURITY_DOC,
    summary="Up to 100 searches in one request",
    response_model=SearchBatchOut,
)
async def search_batch(request: Request, name: str) -> JSONResponse:
    """Each search as ``POST .../search`` takes it (JSON, images as base64), answered in order. The
    searches are checked first and run one after another; a bad one is a 422 naming its place
    (``searches[3]: ...``) and nothing is answered for the others."""
    rt = runtime(request)
    authorize(await key_from_header(request), name)
    batch = await bodies.read_json(request, SearchBatch)
    answers, groups = [], []
    for i, one in enumerate(batch.searches):
        try:
            out = await execute(rt, name, one, json_image(one))
        except Exception as exc:
            problem = from_exception(exc)
            problem.detail = f"searches[{i}]: {problem.detail}"
            raise problem from exc
        answers.append(out["results"])
        groups.append(out.get("groups"))
    body: dict[str, Any] = {"results": answers}
    if any(g is not None for g in groups):
        body["groups"] = groups
    return JSONResponse(body, media_type="application/json")
