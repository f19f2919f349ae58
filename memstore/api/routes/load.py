"""POST /v1/collections/{name}/load: many vectors at index-build speed (``memstore.items.bulk_load``).

The body is NDJSON (``memstore.items.load_file``), streamed to a temporary file under the route's own body
limit (``MEMSTORE_API_MAX_LOAD_BODY_BYTES``), checked whole, then loaded; the answer comes once every
item is searchable through the index. A bad line refuses the load before anything is written.
"""

from __future__ import annotations

import tempfile

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from memstore.api.auth import Key, require, runtime
from memstore.api.problems import ERROR_RESPONSES, Problem
from memstore.catalog.collections import validate_name
from memstore.items import load_file

router = APIRouter(prefix="/v1/collections/{name}/load", tags=["items"], responses=ERROR_RESPONSES)

MEDIA_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")
SPOOL_IN_MEMORY = 8 * 1024 * 1024  # larger bodies go to disk


class LoadOut(BaseModel):
    rows: int = Field(
        description="Rows written (created + updated + unchanged; lines of a batch naming one external id: one row)."
    )
    created: int
    updated: int
    unchanged: int
    deferred_index: bool = Field(description="Loaded without the HNSW index, which was then built afresh.")
    load_s: float
    build_s: float


_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-ndjson": {
                "schema": {"type": "string"},
                "example": '{"external_id": "a1", "vector": [0.1, 0.2, 0.3], "metadata": {"src": "x"}}\n',
            }
        },
    }
}


@router.post("", summary="Load many vectors (NDJSON) at index-build speed", response_model=LoadOut, openapi_extra=_DOC)
async def load(request: Request, name: str, key: Key) -> LoadOut:
    """One item per line: ``external_id`` and ``vector`` required, ``metadata`` and ``text`` optional.
    A load large against the collection goes in without the HNSW index and builds it afterwards
    (searches meanwhile are exact); a smaller one goes into the live index on several connections.
    Answers once every item is searchable."""
    validate_name(name)
    require(key, "write", name)
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in MEDIA_TYPES:
        raise Problem(
            "unsupported-media-type",
            f"a load is NDJSON: send Content-Type: application/x-ndjson (one JSON item per line), not {media!r:.60}",
        )
    rt = runtime(request)
    c = await run_in_threadpool(lambda: rt.store.get_collection(name=name))
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY, mode="w+b") as spool:
        async for chunk in request.stream():  # the body limit is enforced while it is read (BodyLimit)
            spool.write(chunk)  # memory, then the page cache: no wait worth a thread

        def run() -> LoadOut:
            spool.seek(0)
            total = load_file.check(spool, c)
            if total == 0:
                raise Problem("malformed-request", "the body holds no items; send one JSON item per line")
            spool.seek(0)
            result = rt.store.bulk_load(collection=name, items=load_file.items(spool, c), total=total)
            return LoadOut(
                rows=result.rows,
                created=result.created,
                updated=result.updated,
                unchanged=result.unchanged,
                deferred_index=result.deferred_index,
                load_s=round(result.load_s, 3),
                build_s=round(result.build_s, 3),
            )

        return await run_in_threadpool(run)
