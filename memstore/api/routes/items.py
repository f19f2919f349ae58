"""/v1/collections/{name}/items: add (JSON or image uploads), get, list, patch, replace, delete, download."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from memstore.access.keys import ApiKey
from memstore.api import bodies
from memstore.api.auth import Key, require, runtime
from memstore.api.ingest import check_encodable, check_text, enqueue, outcome, store_json_items
from memstore.api.problems import ERROR_RESPONSES, Problem
from memstore.api.runtime import Runtime
from memstore.api.schemas import (
    ORDER_CURSOR_MAX,
    ContentIn,
    Counted,
    CountQuery,
    Deleted,
    DeleteRequest,
    ItemOut,
    ItemPage,
    ItemPatch,
    ItemQuery,
    ItemsAck,
    ItemsIn,
    LookupOut,
    LookupRequest,
    OcrOut,
)
from memstore.catalog.collections import Collection, validate_name
from memstore.errors import InvalidInputError
from memstore.inputs import MAX_FILTER_BYTES
from memstore.media import photo_facts
from memstore.models import Item
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem

router = APIRouter(prefix="/v1/collections/{name}/items", tags=["items"], responses=ERROR_RESPONSES)

ItemId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The item's id (as returned when it was added).")]
Wait = Annotated[bool, Query(description="Answer once the vectors are written (201) instead of at once (202).")]

_UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ItemsIn"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "external_id": {"type": "array", "items": {"type": "string"}},
                        "metadata": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["files"],
                },
                "encoding": {"files": {"contentType": "image/*"}},
            },
        },
    }
}
_CONTENT_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ContentIn"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
        },
    }
}


def content_url(name: str, item_id: int) -> str:
    return f"/v1/collections/{name}/items/{item_id}/content"


def item_out(name: str, item: Item, attempts: dict[int, tuple[int, str | None]]) -> ItemOut:
    tries = attempts.get(item.id)
    has_original = item.has_content or item.text is not None
    return ItemOut(
        id=item.id,
        external_id=item.external_id,
        status=item.status,
        metadata=item.metadata,
        error=item.error or (tries[1] if tries and item.status == "pending" else None),
        attempts=tries[0] if tries else None,
        text=item.text,
        content_type=item.content_type,
        content_url=content_url(name, item.id) if has_original else None,
        created_at=item.created_at,
        updated_at=item.updated_at,
        vector=None if item.vector is None else [float(x) for x in item.vector],
        ocr=None
        if item.ocr_status is None
        else OcrOut(status=item.ocr_status, text=item.ocr_text, error=item.ocr_error),  # type: ignore[arg-type]
    )


async def _collection(request: Request, name: str, key: ApiKey, role: str) -> tuple[Runtime, Collection]:
    validate_name(name)
    require(key, role, name)
    rt = runtime(request)
    c = await run_in_threadpool(lambda: rt.store.get_collection(name=name))
    return rt, c


def _json_response(result: Any) -> JSONResponse:
    return JSONResponse(result.body.model_dump(mode="json"), status_code=result.status_code)


@router.post(
    "",
    summary="Add items: JSON texts/vectors, or multipart image files",
    response_model=ItemsAck,
    status_code=202,
    responses={201: {"model": ItemsAck, "description": "Every vector is written"}},
    openapi_extra=_UPLOAD_DOC,
)
async def add_items(request: Request, name: str, key: Key, wait: Wait = False) -> Response:
    """Items are stored (with their originals) before the answer: 202 while vectors are pending, 201 when
    all are written. Re-sending an external_id updates that item; re-sending identical content changes
    nothing. Without an external_id, images and texts get one derived from their content."""
    kind = bodies.body_kind(request, multipart=True)
    rt, c = await _collection(request, name, key, "write")
    if kind == "json":
        body = await bodies.read_json(request, ItemsIn)
        return _json_response(await store_json_items(rt, c, body.items, wait=wait))
    pending = await _uploaded_items(rt, request, c)
    return _json_response(outcome(await enqueue(rt, c, pending, wait=wait)))


async def _uploaded_items(rt: Runtime, request: Request, c: Collection) -> list[PendingItem]:
    form = await bodies.read_form(request, max_files=rt.api.max_files_per_request)
    bodies.refuse_unknown_fields(form, ("files", "external_id", "metadata"))
    files = bodies.uploads(form, "files")
    if not files:
        raise Problem("invalid-input", "no files: upload images in the form field 'files' (curl -F files=@cat.jpg)")
    ids = bodies.text_fields(form, "external_id")
    metas = bodies.json_field(form, "metadata")
    if len(metas) == 1 and isinstance(metas[0], list):
        # One field holding a JSON array: one object per file, in order (-F 'metadata=[{...}, {...}]').
        metas = metas[0]
        if len(metas) != len(files):
            raise Problem(
                "invalid-input",
                f"the metadata array has {len(metas)} objects for {len(files)} files: give one object per file",
            )
    if ids and len(ids) != len(files):
        raise Problem(
            "invalid-input", f"{len(ids)} external_id fields for {len(files)} files: give one per file or none"
        )
    if len(metas) not in (0, 1, len(files)):
        raise Problem(
            "invalid-input", f"{len(metas)} metadata fields for {len(files)} files: give 0, 1 or one per file"
        )
    check_encodable(rt, c)
    pending = []
    for i, upload in enumerate(files):
        filename = bodies.upload_filename(upload)
        data, ctype = await bodies.read_image(upload, f"files[{i}] ({filename})", rt.encoder.image_options)
        meta = metas[0] if len(metas) == 1 else (metas[i] if metas else {})
        if not isinstance(meta, dict):
            raise Problem(
                "invalid-input",
                f"metadata for files[{i}] must be a JSON object (or send one JSON array with an object per file)",
            )
        if filename and "filename" not in meta:
            meta = {**meta, "filename": filename}
        pending.append(
            PendingItem(content=data, content_type=ctype, external_id=ids[i] if ids else None, metadata=meta)
        )
    return pending


@router.get("", summary="List items (keyset paging), optionally by a metadata filter", response_model=ItemPage)
async def list_items(
    request: Request,
    name: str,
    key: Key,
    external_id: Annotated[str | None, Query(max_length=512)] = None,
    status: Annotated[str | None, Query(pattern="^(pending|ready|failed)$")] = None,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="Return items with ids above this.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    filter: Annotated[
        str | None, Query(max_length=MAX_FILTER_BYTES, description="A metadata filter as JSON (docs/search.md).")
    ] = None,
    order_by: Annotated[
        str | None,
        Query(
            max_length=2048,
            description="A metadata field to order by: a key or a dotted path (taken_at, image.taken_at), or as "
            'JSON the list of its keys (["image","taken_at"]) or its name as a JSON string. Items without it '
            "come last.",
        ),
    ] = None,
    order_type: Annotated[
        Literal["timestamp", "number", "keyword"], Query(description="How order_by's field is read.")
    ] = "timestamp",
    order: Annotated[Literal["asc", "desc"], Query(description="The direction of order_by (ties: by id).")] = "asc",
    cursor: Annotated[
        str | None,
        Query(max_length=ORDER_CURSOR_MAX, description="The next_cursor of the previous page of this ordered listing."),
    ] = None,
) -> ItemPage:
    rt, c = await _collection(request, name, key, "read")
    flt = _filter_parameter(filter)
    order_field = _order_by_parameter(order_by)
    page = await _page(
        rt,
        c,
        name,
        after=after,
        limit=limit,
        external_id=external_id,
        status=status,
        flt=flt,
        order=_Order(order_field, order_type, order == "desc", cursor),
    )
    # Relative: the Host header is the client's to choose, so it never goes into a link.
    if page.next_cursor is not None:
        url = request.url.include_query_params(cursor=page.next_cursor)
        page.next = f"{url.path}?{url.query}"
    elif page.next_after is not None:
        url = request.url.include_query_params(after=page.next_after)
        page.next = f"{url.path}?{url.query}"
    return page


@router.post("/list", summary="List items by a metadata filter (keyset paging)", response_model=ItemPage)
async def query_items(request: Request, name: str, body: ItemQuery, key: Key) -> ItemPage:
    rt, c = await _collection(request, name, key, "read")
    return await _page(
        rt,
        c,
        name,
        after=body.after,
        limit=body.limit,
        external_id=None,
        status=body.status,
        flt=body.filter,
        order=_Order(body.order_by, body.order_type, body.order == "desc", body.cursor),
    )


@router.get("/count", summary="Count items, optionally by a metadata filter", response_model=Counted)
async def count_items(
    request: Request,
    name: str,
    key: Key,
    status: Annotated[str | None, Query(pattern="^(pending|ready|failed)$")] = None,
    filter: Annotated[str | None, Query(max_length=MAX_FILTER_BYTES)] = None,
) -> Counted:
    rt, _ = await _collection(request, name, key, "read")
    flt = _filter_parameter(filter)
    n = await rt.off_loop(lambda: rt.store.count_items(collection=name, filter=flt, status=status))
    return Counted(count=n)


@router.post("/count", summary="Count items by a metadata filter", response_model=Counted)
async def count_by_body(request: Request, name: str, body: CountQuery, key: Key) -> Counted:
    rt, _ = await _collection(request, name, key, "read")
    n = await rt.off_loop(lambda: rt.store.count_items(collection=name, filter=body.filter, status=body.status))
    return Counted(count=n)


def _filter_parameter(text: str | None) -> dict[str, Any] | None:
    """The ``filter`` query parameter: a JSON object (its bounds are the filter language's)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidInputError('filter: is not valid JSON; send a JSON object such as {"tags": "cat"}') from None
    if not isinstance(value, dict):
        raise InvalidInputError("filter: must be a JSON object")
    return value


@dataclass(frozen=True)
class _Order:
    """A listing's order: ``field`` None for id order (paged by ``after``)."""

    field: str | list[str] | None
    type: str
    descending: bool
    cursor: str | None

    def __post_init__(self) -> None:
        if self.field is None and self.descending and self.cursor is None:
            # Silently answering in ascending id order would look like the newest-first page asked for.
            raise InvalidInputError("order: desc orders by order_by; without it a listing is in id order, ascending")


def _order_by_parameter(text: str | None) -> str | list[str] | None:
    """The ``order_by`` query parameter: JSON when it starts with ``[`` or ``"`` (the keys to a nested
    field, or a field's name that starts so), else the field's name as it is (a key or a dotted path,
    read by ``metadata_indexes.check_field``)."""
    if text is None or not text.startswith(("[", '"')):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidInputError(
            'order_by: is not valid JSON; send a key (taken_at) or a list of keys (["image","taken_at"])'
        ) from None
    if not isinstance(value, str | list):
        raise InvalidInputError("order_by: must be a key or a JSON list of keys")
    return value


async def _page(
    rt: Runtime,
    c: Collection,
    name: str,
    *,
    after: int,
    limit: int,
    external_id: str | None,
    status: str | None,
    flt: dict[str, Any] | None,
    order: _Order,
) -> ItemPage:
    next_cursor: str | None = None
    if order.field is None and order.cursor is None:
        items, more = await rt.off_loop(
            lambda: rt.store.page_items(
                collection=name, after_id=after, limit=limit, external_id=external_id, status=status, filter=flt
            )
        )
    else:
        if after:
            raise InvalidInputError("after pages the listing in id order; an ordered listing pages by its cursor")
        items, next_cursor = await rt.off_loop(
            lambda: rt.store.page_items_ordered(
                collection=name,
                order_by=order.field,
                order_type=order.type,
                descending=order.descending,
                after_key=order.cursor,
                limit=limit,
                external_id=external_id,
                status=status,
                filter=flt,
            )
        )
        more = False
    unsettled = [i.id for i in items if i.status != "ready"]
    attempts = await run_in_threadpool(jobs.attempts_of, rt.db, c, unsettled) if unsettled else {}
    return ItemPage(
        items=[item_out(name, i, attempts) for i in items],
        next_after=items[-1].id if more else None,
        next_cursor=next_cursor,
    )


@router.post("/lookup", summary="Which of these external ids exist", response_model=LookupOut)
async def lookup(request: Request, name: str, body: LookupRequest, key: Key) -> LookupOut:
    rt, _ = await _collection(request, name, key, "read")
    found = await run_in_threadpool(lambda: rt.store.find_external_ids(collection=name, external_ids=body.external_ids))
    return LookupOut(found=found)


@router.post("/delete", summary="Delete items by ids, external ids or metadata filter", response_model=Deleted)
async def delete_many(request: Request, name: str, body: DeleteRequest, key: Key) -> Deleted:
    rt, _ = await _collection(request, name, key, "write")
    n = await run_in_threadpool(
        lambda: rt.store.delete_items(collection=name, ids=body.ids, external_ids=body.external_ids, filter=body.filter)
    )
    return Deleted(deleted=n)


@router.get("/{item_id}", summary="One item", response_model=ItemOut)
async def get_item(
    request: Request,
    name: str,
    item_id: ItemId,
    key: Key,
    with_vector: Annotated[bool, Query(description="Include the vector.")] = False,
) -> ItemOut:
    rt, c = await _collection(request, name, key, "read")
    item = await run_in_threadpool(lambda: rt.store.get_item(collection=name, id=item_id, with_vector=with_vector))
    attempts = await run_in_threadpool(jobs.attempts_of, rt.db, c, [item.id]) if item.status != "ready" else {}
    return item_out(name, item, attempts)


@router.patch("/{item_id}", summary="Replace or merge metadata, or replace the vector", response_model=ItemOut)
async def patch_item(request: Request, name: str, item_id: ItemId, body: ItemPatch, key: Key) -> ItemOut:
    rt, _ = await _collection(request, name, key, "write")
    item = await run_in_threadpool(
        lambda: rt.store.update_item(
            collection=name, id=item_id, metadata=body.metadata, merge_metadata=body.merge, vector=body.vector
        )
    )
    return item_out(name, item, {})


@router.put(
    "/{item_id}/content",
    summary="Replace the item's text or image (it is embedded again)",
    response_model=ItemsAck,
    status_code=202,
    openapi_extra=_CONTENT_DOC,
)
async def replace_content(request: Request, name: str, item_id: ItemId, key: Key, wait: Wait = False) -> Response:
    kind = bodies.body_kind(request, multipart=True)
    rt, c = await _collection(request, name, key, "write")
    item = await run_in_threadpool(lambda: rt.store.get_item(collection=name, id=item_id))
    check_encodable(rt, c)
    if kind == "json":
        text = (await bodies.read_json(request, ContentIn)).text
        check_text(rt, text, "text")
        new = PendingItem(text=text, external_id=item.external_id, metadata=item.metadata)
    else:
        form = await bodies.read_form(request, max_files=1)
        bodies.refuse_unknown_fields(form, ("file",))
        files = bodies.uploads(form, "file")
        if len(files) != 1:
            raise Problem("invalid-input", "upload exactly one image in the form field 'file'")
        data, ctype = await bodies.read_image(files[0], "file", rt.encoder.image_options)
        new = PendingItem(content=data, content_type=ctype, external_id=item.external_id, metadata=item.metadata)
    # The item keeps its metadata, and an `image` it holds whole: the old picture's facts, or the
    # client's (the new picture's facts merged into them would describe neither picture).
    facts = photo_facts.KEY not in (item.metadata or {})
    return _json_response(outcome(await enqueue(rt, c, [new], wait=wait, facts=facts)))


@router.delete("/{item_id}", status_code=204, summary="Delete one item")
async def delete_item(request: Request, name: str, item_id: ItemId, key: Key) -> Response:
    rt, _ = await _collection(request, name, key, "write")
    await run_in_threadpool(lambda: rt.store.delete_item(collection=name, id=item_id))  # its queue row too
    return Response(status_code=204)


@router.get(
    "/{item_id}/content",
    summary="Download the stored original (image bytes or text)",
    response_class=Response,
    responses={200: {"content": {"image/*": {}, "text/plain": {}}}},
)
async def get_content(request: Request, name: str, item_id: ItemId, key: Key) -> Response:
    rt, _ = await _collection(request, name, key, "read")
    original = await run_in_threadpool(lambda: rt.store.get_original(collection=name, id=item_id))
    if original.content is not None:
        body, media = original.content, original.content_type or "application/octet-stream"
        filename = download_name(original.filename or original.external_id, media)
    elif original.text is not None:
        body, media = original.text.encode(), jobs.TEXT_CONTENT_TYPE
        filename = download_name(original.external_id, media)
    else:
        raise Problem("not-found", f"item {item_id} was stored as a vector only: there is no original to download")
    return Response(body, media_type=media, headers=download_headers(filename, media))


# Shown in the browser; anything else is a download. Stored bytes are the client's: a PNG with HTML
# appended or a text that is a page must never run as this origin's page.
INLINE_TYPES = {"image/jpeg", "image/png", "image/webp", "image/gif"}


_EXTENSIONS = {
    "image/jpeg": ".jpg",
    "image/png": ".png",
    "image/webp": ".webp",
    "image/gif": ".gif",
    "image/bmp": ".bmp",
    "image/tiff": ".tiff",
}


# Extensions that name an image type; a download of another type does not keep one of them.
_SAME_TYPE = {".jpeg": "image/jpeg", ".jpe": "image/jpeg", ".tif": "image/tiff"}


def download_name(name: str, media_type: str) -> str:
    """The name a download is saved under: the uploaded file's name when the metadata kept one, else
    the external id's last path part; with the extension of its type when it has none, or when its
    extension names another image type (PNG bytes uploaded as ``photo.jpg`` save as ``photo.png``:
    the stored type is read from the bytes, and a viewer trusts the extension)."""
    base = name.rsplit("/", 1)[-1] or "original"
    extension = _EXTENSIONS.get(media_type, ".txt" if media_type.startswith("text/") else "")
    stem, dot, given = base.lstrip(".").rpartition(".")
    if dot and stem:
        given = "." + given.lower()
        named = _SAME_TYPE.get(given) or next((t for t, e in _EXTENSIONS.items() if e == given), None)
        if named is None or named == media_type or not extension:
            return base
        return base[: len(base) - len(given)] + extension
    return base + extension if extension else base


def download_headers(name: str, media_type: str) -> dict[str, str]:
    """nosniff, a sandbox CSP and an RFC 6266 Content-Disposition for ``name`` (an ASCII fallback
    plus the UTF-8 ``filename*``)."""
    ascii_name = "".join(ch if ch.isascii() and ch.isprintable() and ch not in '"\\;:' else "_" for ch in name)
    disposition = "inline" if media_type in INLINE_TYPES else "attachment"
    return {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'",
        "Content-Disposition": f"{disposition}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}",
    }
