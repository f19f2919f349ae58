"""/v1/collections/{name}/spaces: a collection's embedding spaces (``memstore.spaces.lifecycle``): create one
(filled in the background from the stored originals), follow its progress, activate it, give the
vectors of items stored without an original, drop one."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from memstore.api.auth import Key, require, runtime
from memstore.api.problems import ERROR_RESPONSES, Problem
from memstore.api.schemas import SpaceActivate, SpaceCreate, SpaceList, SpaceOut, SpaceVectors, SpaceVectorsOut
from memstore.catalog.collections import validate_name, validate_space_name
from memstore.spaces import lifecycle
from memstore.spaces.model_choice import models_of

router = APIRouter(prefix="/v1/collections/{name}/spaces", tags=["spaces"], responses=ERROR_RESPONSES)


def space_out(p: lifecycle.Progress) -> SpaceOut:
    return SpaceOut(**p.as_dict())


@router.post("", status_code=202, summary="Create an embedding space and fill it", response_model=SpaceOut)
async def create_space(request: Request, name: str, body: SpaceCreate, response: Response, key: Key) -> SpaceOut:
    """A new space of the collection for ``model`` (one this server's encoder runs). Its vectors are
    made in the background from every stored original, through the ingest queue at the bulk
    priority, while searches and writes go on; follow it at ``GET .../spaces/{space}``. Its index is
    built once it is filled (state ``ready``); then ``POST .../activate`` makes searches use it."""
    validate_name(name)
    require(key, "admin", name)
    validate_space_name(body.name)
    rt = runtime(request)
    running = rt.encoder.model_dimensions(body.model)
    if running is None:
        models = rt.encoder.running_models()
        raise Problem(
            "invalid-input",
            f"model {body.model!r} is not one this server runs ({', '.join(models) or 'no encoder'}): "
            "a space is filled by the ingest workers with a model of MEMSTORE_MODELS",
        )
    info = models_of(rt.encoder.backend).get(body.model) if rt.encoder.backend is not None else None
    store = rt.store

    def create() -> lifecycle.Progress:
        store.create_space(
            collection=name,
            name=body.name,
            model=running[0],
            dimensions=running[1],
            pretrained=info.pretrained if info is not None else None,
            metric=body.metric,
            hnsw_m=body.hnsw_m,
            hnsw_ef_construction=body.hnsw_ef_construction,
            ef_search=body.ef_search,
        )
        return store.space_progress(collection=name, name=body.name)

    made = await run_in_threadpool(create)
    response.headers["Location"] = f"/v1/collections/{name}/spaces/{body.name}"
    return space_out(made)


@router.get("", summary="The collection's embedding spaces and how far each is filled", response_model=SpaceList)
async def list_spaces(request: Request, name: str, key: Key) -> SpaceList:
    validate_name(name)
    require(key, "read", name)
    store = runtime(request).store

    def every() -> list[lifecycle.Progress]:
        c = store.get_collection(name=name, fresh=True)
        return [store.space_progress(collection=name, name=s.name) for s in c.all_spaces()]

    return SpaceList(spaces=[space_out(p) for p in await run_in_threadpool(every)])


@router.get("/{space}", summary="One space: done, total, rate and time left", response_model=SpaceOut)
async def get_space(request: Request, name: str, space: str, key: Key) -> SpaceOut:
    validate_name(name)
    require(key, "read", name)
    store = runtime(request).store
    return space_out(await run_in_threadpool(lambda: store.space_progress(collection=name, name=space)))


@router.post("/{space}/activate", summary="Make searches use this space", response_model=SpaceOut)
async def activate_space(request: Request, name: str, space: str, body: SpaceActivate, key: Key) -> SpaceOut:
    """Searches that name no space use this one from now on (this server at once, other API
    processes within 5 seconds). Refused (409) while the space is filling, or while items stored as
    bare vectors have none in it, unless ``force``."""
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store

    def activate() -> lifecycle.Progress:
        store.activate_space(collection=name, name=space, force=body.force)
        return store.space_progress(collection=name, name=space)

    return space_out(await run_in_threadpool(activate))


@router.put("/{space}/vectors", summary="Give items' vectors in this space", response_model=SpaceVectorsOut)
async def put_vectors(request: Request, name: str, space: str, body: SpaceVectors, key: Key) -> SpaceVectorsOut:
    """The vectors of items in this space by external id: what items stored without an original
    (bare vectors) need, since no worker can make theirs. At most 1,000 per request."""
    validate_name(name)
    require(key, "write", name)
    store = runtime(request).store
    written = await run_in_threadpool(
        lambda: store.put_space_vectors(collection=name, name=space, vectors=body.vectors)
    )
    return SpaceVectorsOut(written=written)


@router.delete("/{space}", status_code=204, summary="Drop a space, its vectors and its index")
async def delete_space(request: Request, name: str, space: str, key: Key) -> Response:
    """Online: a short lock on the space's own table. The active space cannot be dropped (activate
    another first), nor ``default`` (the collection's own vectors)."""
    validate_name(name)
    require(key, "admin", name)
    store = runtime(request).store
    await run_in_threadpool(lambda: store.delete_space(collection=name, name=space))
    return Response(status_code=204)
