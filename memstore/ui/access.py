"""What a page may show: the identity's scopes on a collection, checked before anything is read."""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request

from memstore.api.auth import require
from memstore.api.runtime import Runtime
from memstore.catalog.collections import Collection, validate_name
from memstore.ui.identity import Identity, current


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def collection_for(request: Request, name: str, role: str = "read") -> tuple[Runtime, Identity, Collection]:
    """The collection, once the identity may ``role`` it (403 otherwise, before the collection is read:
    a key for one collection learns nothing of another's existence beyond its name being refused)."""
    identity = current(request)
    validate_name(name)
    require(identity.key, role, name)
    rt = runtime(request)
    collection = await run_in_threadpool(lambda: rt.store.get_collection(name=name))
    return rt, identity, collection
