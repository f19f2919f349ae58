"""Uploads from the collection page: one file per request (so each has its own progress bar), stored
through the durable queue like the API's uploads, then followed to ready or failed.

Answers are JSON for the page's script; errors are the API's problem documents, whose ``detail``
the script shows as text.
"""

from __future__ import annotations

import codecs
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.responses import JSONResponse

from memstore.api import bodies
from memstore.api.ingest import check_encodable, check_text, enqueue
from memstore.api.problems import Problem
from memstore.api.runtime import Runtime
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.ui.access import collection_for
from memstore.ui.identity import CSRF_FIELD, check_csrf_field

router = APIRouter(prefix="/ui/c/{name}", include_in_schema=False)
TEXT_SUFFIXES = (".txt", ".md")
MAX_STATUS_IDS = 500
MAX_PATH_CHARS = 1000


@router.post("/upload")
async def upload(request: Request, name: str) -> JSONResponse:
    """One file: an image, or a ``.txt``/``.md`` text. Its folder path (a dropped folder) goes into the
    metadata as ``path``, its name as ``filename``; the external id is the content's hash, so dropping
    the same files again stores nothing twice."""
    rt, identity, c = await collection_for(request, name, "write")  # before the body is read
    form = await bodies.read_form(request, max_files=1)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    files = bodies.uploads(form, "file") if "file" in form else []
    if len(files) != 1:
        raise Problem("invalid-input", "send exactly one file in the form field 'file'")
    path = form.get("path")
    check_encodable(rt, c)
    pending = await _pending_item(rt, files[0], path if isinstance(path, str) else None)
    [ack] = await enqueue(rt, c, [pending], wait=False)
    return JSONResponse({"id": ack.id, "external_id": ack.external_id, "status": ack.status, "change": ack.change})


async def _pending_item(rt: Runtime, upload: UploadFile, path: str | None) -> PendingItem:
    # As written: browsers send a quote, CR and LF in a file's name as %22, %0D and %0A.
    filename = (bodies.upload_filename(upload) or "").rsplit("/", 1)[-1][:MAX_PATH_CHARS] or "unnamed"
    metadata: dict[str, Any] = {"filename": filename}
    if path and "/" in path:
        metadata["path"] = path[:MAX_PATH_CHARS]
    is_text = filename.lower().endswith(TEXT_SUFFIXES) or (upload.content_type or "").startswith("text/plain")
    if not is_text:
        data, ctype = await bodies.read_image(upload, filename, rt.encoder.image_options)
        return PendingItem(content=data, content_type=ctype, metadata=metadata)
    limit = rt.api.max_text_chars
    raw = await upload.read(limit * 4 + 1)  # UTF-8 takes at most 4 bytes a character
    cut = len(raw) > limit * 4
    try:
        # A file read only in part may end inside a character: the decoder keeps those bytes back.
        text = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
    except UnicodeDecodeError:
        raise Problem("invalid-input", f"{filename}: not UTF-8 text") from None
    if cut:
        raise Problem(
            "invalid-input",
            f"{filename} has more than {limit} characters; the limit is {limit} (MEMSTORE_API_MAX_TEXT_CHARS)",
            limit=limit,
        )
    check_text(rt, text, filename)
    return PendingItem(text=text, metadata=metadata)


@router.get("/status")
async def statuses(
    request: Request, name: str, ids: Annotated[str, Query(max_length=MAX_STATUS_IDS * 21)] = ""
) -> JSONResponse:
    """Where uploaded items stand: ``pending``, ``ready`` or ``failed`` with the reason (an item
    deleted meanwhile is absent)."""
    rt, _, c = await collection_for(request, name)
    try:
        wanted = sorted({int(part) for part in ids.split(",") if part.strip()})
    except ValueError:
        raise Problem("invalid-input", "ids: a comma-separated list of item ids") from None
    if len(wanted) > MAX_STATUS_IDS:
        raise Problem("invalid-input", f"at most {MAX_STATUS_IDS} ids at a time")
    if any(not 1 <= i < 2**63 for i in wanted):
        raise Problem("invalid-input", "ids are positive 64-bit integers")
    found = await run_in_threadpool(jobs.statuses, rt.db, c, wanted) if wanted else {}
    items = {str(i): {"status": status, "error": error} for i, (status, error) in found.items()}
    return JSONResponse({"items": items})
