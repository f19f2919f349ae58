"""One item's page (``/ui/c/{name}/items/{id}``): its original, metadata, nearest neighbours, and,
for a key that may write, editing its metadata and deleting it. Also its thumbnail and original."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse, Response

from memstore.api.problems import Problem
from memstore.api.routes.items import download_headers, download_name
from memstore.api.runtime import Runtime
from memstore.catalog.collections import Collection
from memstore.errors import InvalidInputError
from memstore.inputs import check_metadata
from memstore.media import thumbnails
from memstore.models import Item
from memstore.queue import jobs
from memstore.settings import get_ui_settings
from memstore.ui import search
from memstore.ui.access import collection_for
from memstore.ui.identity import CSRF_FIELD, Identity, check_csrf_field
from memstore.ui.render import PageRoute, base_path, page

router = APIRouter(prefix="/ui/c/{name}/items", route_class=PageRoute, include_in_schema=False)
ItemId = Annotated[int, Path(ge=1, le=2**63 - 1)]
# Thumbnails are private (behind a session) and change only when the item's content does: kept by
# the browser for a few minutes, then revalidated with their ETag (304s cost no thumbnail bytes).
THUMBNAIL_CACHE = "private, max-age=300"


def _item_context(rt: Runtime, c: Collection, view: search.SearchView, item_id: int) -> dict[str, Any]:
    item = rt.store.get_item(collection=c.name, id=item_id)
    attempts = jobs.attempts_of(rt.db, c, [item.id]) if item.status != "ready" else {}
    neighbours: list[search.Card] = []
    vector = rt.store.vectors(collection=c.name, ids=[item.id]).get(item.id)  # in the active space
    if vector is not None:
        hits = search.nearest(rt, c, vector, k=get_ui_settings().neighbours + 1, chips=(), sample=False)
        rows = [(r.id, r.external_id, r.metadata, r.score) for r in hits if r.id != item.id]
        neighbours = search.cards(rt, c, view, rows[: get_ui_settings().neighbours])
    preview = thumbnails.previews(rt.db, c, [item.id]).get(item.id)
    tries = attempts.get(item.id)
    return {
        "item": item,
        "title": search.title_of(item.external_id, item.metadata),
        "is_image": bool(preview and preview.is_image),
        "error": item.error or (tries[1] if tries else None),
        "attempts": tries[0] if tries else None,
        "neighbours": neighbours,
        "has_vector": vector is not None,  # "More like this" searches by it (a 409 without one)
    }


async def _render(
    request: Request,
    identity: Identity,
    c: Collection,
    item_id: int,
    *,
    status_code: int = 200,
    form_error: str | None = None,
    metadata_text: str | None = None,
) -> Response:
    rt = request.app.state.runtime
    view = search.SearchView(base_path(request), c.name)
    context = await run_in_threadpool(_item_context, rt, c, view, item_id)
    item: Item = context["item"]
    return page(
        request,
        "item.html",
        identity=identity,
        status_code=status_code,
        collection=c,
        view=view,
        can_write=identity.key.allows("write", c.name),
        form_error=form_error,
        metadata_text=metadata_text if metadata_text is not None else _editable(item.metadata),
        **context,
    )


def _editable(metadata: dict[str, Any]) -> str:
    """The metadata as the edit box shows it: indented, every character as itself (not ``\\uXXXX``)."""
    return json.dumps(metadata, indent=2, ensure_ascii=False)


@router.get("/{item_id}")
async def item_page(request: Request, name: str, item_id: ItemId) -> Response:
    _, identity, c = await collection_for(request, name)
    return await _render(request, identity, c, item_id)


@router.post("/{item_id}/metadata")
async def edit_metadata(request: Request, name: str, item_id: ItemId) -> Response:
    rt, identity, c = await collection_for(request, name, "write")  # before the body is read
    # The field may fill the whole body the route takes: metadata within its 64 KiB, pretty-printed
    # (up to 32 levels of indentation) and URL-encoded (%XX: three bytes for one), can be many times
    # that size, and the body limit (MEMSTORE_API_MAX_JSON_BODY_BYTES) already bounds what is read.
    try:
        form = await request.form(max_files=0, max_fields=4, max_part_size=rt.api.max_json_body_bytes)
    except HTTPException as exc:
        if exc.status_code != 400:  # a body over the route's limit (413) is the error page
            raise
        message = f"the form could not be read: {exc.detail}"
        return await _render(request, identity, c, item_id, status_code=422, form_error=message)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    text = form.get("metadata")
    text = text if isinstance(text, str) else ""
    try:
        metadata = json.loads(text)
        if not isinstance(metadata, dict):
            raise InvalidInputError('metadata must be a JSON object: {"key": "value", ...}')
        check_metadata(metadata)
    except (ValueError, RecursionError, InvalidInputError) as exc:
        message = str(exc) if isinstance(exc, InvalidInputError) else f"not valid JSON: {exc}"
        # What was sent, kept for correcting: the body limit already bounds its size.
        return await _render(request, identity, c, item_id, status_code=422, form_error=message, metadata_text=text)
    await run_in_threadpool(lambda: rt.store.update_item(collection=c.name, id=item_id, metadata=metadata))
    return RedirectResponse(f"{base_path(request)}/c/{c.name}/items/{item_id}?notice=saved", status_code=303)


@router.post("/{item_id}/delete")
async def delete_item(request: Request, name: str, item_id: ItemId) -> Response:
    rt, identity, c = await collection_for(request, name, "write")
    form = await request.form(max_files=0, max_fields=4)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    await run_in_threadpool(lambda: rt.store.delete_item(collection=c.name, id=item_id))
    return RedirectResponse(f"{base_path(request)}/c/{c.name}?notice=deleted", status_code=303)


@router.get("/{item_id}/thumbnail")
async def thumbnail(request: Request, name: str, item_id: ItemId) -> Response:
    rt, _, c = await collection_for(request, name)
    data = await run_in_threadpool(thumbnails.read, rt.db, c, item_id)
    if data is None:
        raise Problem("not-found", f"item {item_id} has no thumbnail (not an image, or not ready yet)")
    tag = thumbnails.etag(data)
    headers = {"ETag": tag, "Cache-Control": THUMBNAIL_CACHE}
    if tag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(data, media_type=thumbnails.MEDIA_TYPE, headers=headers)


@router.get("/{item_id}/original")
async def original(request: Request, name: str, item_id: ItemId) -> Response:
    """The stored bytes, with the API's download headers: a sandbox CSP, nosniff, and inline only for
    the image types a browser shows (anything else is a download, never a page of this site)."""
    rt, _, c = await collection_for(request, name)
    found = await run_in_threadpool(lambda: rt.store.get_original(collection=c.name, id=item_id))
    if found.content is not None:
        body, media = found.content, found.content_type or "application/octet-stream"
    elif found.text is not None:
        body, media = found.text.encode(), jobs.TEXT_CONTENT_TYPE
    else:
        raise Problem("not-found", f"item {item_id} was stored as a vector only: there is no original")
    filename = download_name(found.filename or found.external_id, media)
    return Response(body, media_type=media, headers=download_headers(filename, media))
