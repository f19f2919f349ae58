"""/v1/collections: create, list, get (with counts and index size), change keyword search, typed
metadata indexes, delete."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from memstore.api.auth import Key, require, runtime
from memstore.api.problems import ERROR_RESPONSES, Problem
from memstore.api.schemas import (
    CollectionCreate,
    CollectionList,
    CollectionOut,
    CollectionPatch,
    MetadataIndexIn,
    MetadataIndexList,
    MetadataIndexOut,
    SealOut,
    SegmentsOut,
)
from memstore.catalog import ocr_items, segments
from memstore.catalog.collections import Collection, validate_name
from memstore.catalog.metadata_indexes import MetadataIndex
from memstore.models import CollectionStats

router = APIRouter(prefix="/v1/collections", tags=["collections"], responses=ERROR_RESPONSES)


def collection_out(c: Collection, stats: CollectionStats | None = None) -> CollectionOut:
    # The model, size and metric searches use: the active space's (the default one until another is activated).
    active = c.space()
    out = CollectionOut(
        name=c.name,
        dimensions=active.dimensions,
        metric=active.metric,
        model=active.model,
        hnsw_m=c.hnsw_m,
        hnsw_ef_construction=c.hnsw_ef_construction,
        ef_search=c.default_ef_search,
        recall_target=c.recall_target,
        partitions=c.partitions,
        language=c.language,
        text_fields=list(c.text_fields),
        ocr=c.ocr,
        ocr_backfilling=c.ocr and c.options.get(ocr_items.BACKFILL) is not None,
        created_at=c.created_at,
        active_space=c.active_space_name,
        spaces=[s.name for s in c.all_spaces()],
        write_path=segments.SEGMENTS if segments.segmented(c) else segments.GRAPH,
    )
    if stats is not None:
        out.items, out.ready, out.pending, out.failed = stats.items, stats.ready, stats.pending, stats.failed
        out.index_bytes, out.table_bytes = stats.index_bytes, stats.table_bytes
        out.counts_exact = stats.counts_exact
        out.ocr_pending = stats.extra.get("ocr_pending")
        if (graphs := stats.extra.get("segments")) is not None:
            out.segments = SegmentsOut.model_validate(graphs)
    return out


def _dimensions_and_model(request: Request, body: CollectionCreate) -> tuple[int, str | None]:
    """The model's vector size comes from its configuration: a collection can be created while the
    model is still loading. ``model`` may name any model the encoder runs (MEMSTORE_MODELS)."""
    rt = runtime(request)
    running = rt.encoder.model_dimensions(body.model)
    if body.dimensions is None:
        if running is None:
            if rt.encoder.state == "off":
                raise Problem(
                    "invalid-input",
                    "give dimensions: this server runs no encoder to take them from (or start it with one)",
                )
            if body.model is not None and rt.encoder.running_models():
                raise Problem(
                    "invalid-input",
                    f"model {body.model!r} is not one this server runs ({', '.join(rt.encoder.running_models())}); "
                    "name one of those, or give dimensions to store vectors you make yourself",
                )
            rt.encoder.require("or give dimensions explicitly")
        assert running is not None
        return running[1], running[0]
    if body.model and running is not None and body.dimensions != running[1]:
        raise Problem(
            "invalid-input",
            f"model {body.model} makes {running[1]}-dimensional vectors, not {body.dimensions}; "
            "omit dimensions to take the model's",
        )
    return body.dimensions, body.model


@router.post("", status_code=201, summary="Create a collection", response_model=CollectionOut)
async def create_collection(request: Request, body: CollectionCreate, response: Response, key: Key) -> CollectionOut:
    require(key, "admin", body.name)
    dimensions, model = _dimensions_and_model(request, body)
    store = runtime(request).store
    c = await run_in_threadpool(
        lambda: store.create_collection(
            name=body.name,
            dimensions=dimensions,
            metric=body.metric,
            hnsw_m=body.hnsw_m,
            hnsw_ef_construction=body.hnsw_ef_construction,
            ef_search=body.ef_search,
            partitions=body.partitions,
            model=model,
            language=body.language,
            text_fields=body.text_fields,
            ocr=body.ocr,
            recall_target=body.recall_target,
            write_path=body.write_path,
        )
    )
    response.headers["Location"] = f"/v1/collections/{c.name}"
    return collection_out(c)


@router.get("", summary="List the collections this key may read", response_model=CollectionList)
async def list_collections(request: Request, key: Key) -> CollectionList:
    collections = await run_in_threadpool(runtime(request).store.list_collections)
    return CollectionList(collections=[collection_out(c) for c in collections if key.allows("read", c.name)])


@router.get("/{name}", summary="A collection with its item counts and index size", response_model=CollectionOut)
async def get_collection(request: Request, name: str, key: Key) -> CollectionOut:
    validate_name(name)
    require(key, "read", name)
    store = runtime(request).store
    stats = await run_in_threadpool(lambda: store.collection_stats(name=name))
    return collection_out(stats.collection, stats)


@router.patch(
    "/{name}", summary="Change a collection's keyword search, OCR or recall target", response_model=CollectionOut
)
async def patch_collection(request: Request, name: str, body: CollectionPatch, key: Key) -> CollectionOut:
    """``language`` and ``text_fields`` of keyword search, and ``ocr`` (read the text in the images:
    the images already stored are read in the background, ``ocr_pending`` counts those waiting). The
    keyword index is rebuilt online (searches and writes go on; the answer comes once the new index
    serves, which on a large collection takes as long as building a GIN index over it).
    ``recall_target``: the recall@k default searches should reach (null turns it off); the maintenance
    worker's next pass that measures recall sets ``ef_search`` to it."""
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store
    sent = body.model_fields_set
    c = None
    if "recall_target" in sent:
        c = await run_in_threadpool(lambda: store.set_recall_target(collection=name, target=body.recall_target))
    if c is None or sent & {"language", "text_fields", "ocr"}:
        c = await run_in_threadpool(
            lambda: store.set_keywords(
                collection=name, language=body.language, text_fields=body.text_fields, ocr=body.ocr
            )
        )
    return collection_out(c)


def _index_out(i: MetadataIndex) -> MetadataIndexOut:
    return MetadataIndexOut(field=i.field, type=i.type, name=i.name, valid=i.valid, size_bytes=i.size_bytes)


@router.post(
    "/{name}/indexes", status_code=201, summary="Index a metadata field for filters", response_model=MetadataIndexOut
)
async def create_index(request: Request, name: str, body: MetadataIndexIn, key: Key) -> MetadataIndexOut:
    """A B-tree index on a top-level metadata field read as ``number``, ``timestamp`` (ISO 8601) or
    ``keyword`` (a string), built online (``CREATE INDEX CONCURRENTLY``; the answer comes when it is
    built). Range and equality filters on the field then use it (docs/search.md)."""
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store
    made = await run_in_threadpool(
        lambda: store.create_metadata_index(collection=name, field=body.field, type=body.type)
    )
    return _index_out(made)


@router.post("/{name}/seal", summary="Put a segmented collection's tail into a graph now", response_model=SealOut)
async def seal(request: Request, name: str, key: Key, merge: bool = False) -> SealOut:
    """For a collection made with ``write_path: segments``: its tail (the rows no graph holds yet,
    searched exactly) gets a graph now, whatever its size, and the answer comes once it is built. A
    stream's writer calls it at the end, so that every row it sent is searched through a graph.
    ``merge=true``: then merge every graph into one (a build of every row). The background sealer
    does both on its own as the tail fills and when writes pause."""
    validate_name(name)
    require(key, "write", name)
    store = runtime(request).store
    done = await run_in_threadpool(lambda: store.seal(collection=name, merge=merge))
    return SealOut(done=done)


@router.get("/{name}/indexes", summary="The collection's metadata indexes", response_model=MetadataIndexList)
async def list_indexes(request: Request, name: str, key: Key) -> MetadataIndexList:
    validate_name(name)
    require(key, "read", name)
    store = runtime(request).store
    found = await run_in_threadpool(lambda: store.list_metadata_indexes(collection=name))
    return MetadataIndexList(indexes=[_index_out(i) for i in found])


@router.delete("/{name}/indexes/{index}", status_code=204, summary="Drop a metadata index")
async def drop_index(request: Request, name: str, index: str, key: Key) -> Response:
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store
    await run_in_threadpool(lambda: store.drop_metadata_index(collection=name, name=index))
    return Response(status_code=204)


@router.delete("/{name}", status_code=204, summary="Drop a collection and all its items")
async def delete_collection(request: Request, name: str, key: Key) -> Response:
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store
    await run_in_threadpool(lambda: store.drop_collection(name=name))
    return Response(status_code=204)
