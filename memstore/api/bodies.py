"""Reading request bodies by hand where a route takes JSON or multipart, with clear errors."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from python_multipart.multipart import parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from encoder.errors import DecompressionBombError, ImageRejectedError
from encoder.images import ImageOptions, probe_image
from memstore.api.problems import Problem, validation_problem

M = TypeVar("M", bound=BaseModel)

IMAGE_TYPES = {
    "JPEG": "image/jpeg",
    "MPO": "image/jpeg",
    "PNG": "image/png",
    "WEBP": "image/webp",
    "GIF": "image/gif",
    "BMP": "image/bmp",
    "TIFF": "image/tiff",
}


def body_kind(request: Request, *, multipart: bool) -> str:
    """``json`` or ``multipart``; 415 for anything else."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("application/json", "") or ctype.endswith("+json"):
        return "json"
    if multipart and ctype == "multipart/form-data":
        return "multipart"
    accepted = "application/json or multipart/form-data" if multipart else "application/json"
    raise Problem("unsupported-media-type", f"send {accepted}, not {ctype!r}")


async def read_json(request: Request, model: type[M]) -> M:
    raw = await request.body()
    if not raw.strip():
        raise Problem("malformed-request", "the body is empty; send a JSON object")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_problem(list(exc.errors())) from None


class _InvalidTextError(MultiPartException):
    """A text part that is not valid in its charset."""


class _StrictTextParts(MultiPartParser):
    """Starlette's parser reads a text part that is not valid in its charset, or whose charset it does
    not know, as Latin-1, silently. Here such a part is refused instead: a text field is decoded in
    the charset the request declares (UTF-8 when it declares none; an unknown one is refused before
    parsing, in ``read_form``), strictly. (It uses the parser's
    part state; tests/api/test_hostile_client.py fails if a Starlette upgrade moves it.)"""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode(self._charset)
            except (LookupError, UnicodeDecodeError):
                raise _InvalidTextError(f"form field {part.field_name!r} is not valid {self._charset} text") from None
        super().on_part_end()


def _check_charset(content_type: str) -> None:
    """Starlette reads an unknown charset as Latin-1, silently: refuse it instead."""
    _, params = parse_options_header(content_type)
    declared = params.get(b"charset")
    if declared is None:
        return
    name = declared.decode("latin-1") if isinstance(declared, bytes) else str(declared)
    try:
        codecs.lookup(name)
    except LookupError:
        raise Problem(
            "invalid-input", f"form fields are not valid text: unknown charset {name!r}; send UTF-8"
        ) from None


async def read_form(request: Request, *, max_files: int) -> FormData:
    """The multipart form (what ``request.form()`` does, with the strict text parser), or a problem."""
    _check_charset(request.headers.get("content-type", ""))
    if request._form is None:
        try:
            async with aclosing(request.stream()) as stream:
                parser = _StrictTextParts(request.headers, stream, max_files=max_files, max_fields=max_files * 2 + 16)
                request._form = await parser.parse()
        except _InvalidTextError as exc:
            raise Problem("invalid-input", exc.message) from None
        except MultiPartException as exc:
            detail = exc.message
            if "Too many files" in detail:
                raise Problem(
                    "payload-too-large",
                    f"at most {max_files} files per request (MEMSTORE_API_MAX_FILES_PER_REQUEST); split the upload",
                    limit=max_files,
                ) from None
            raise Problem("malformed-request", f"the multipart body could not be parsed: {detail}") from None
    return request._form


def json_field(form: FormData, name: str) -> list[Any]:
    """Every value of a JSON-valued form field, decoded."""
    out = []
    for i, raw in enumerate(form.getlist(name)):
        if not isinstance(raw, str):
            raise Problem("invalid-input", f"form field {name}[{i}] must be text (JSON), not a file")
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise Problem("invalid-input", f"form field {name}[{i}] is not valid JSON: {exc}") from None
        except RecursionError:
            raise Problem("invalid-input", f"form field {name}[{i}] is nested too deeply") from None
        if _nested_deeper_than(value, MAX_FIELD_DEPTH):
            raise Problem("invalid-input", f"form field {name}[{i}] is nested deeper than {MAX_FIELD_DEPTH} levels")
        out.append(value)
    return out


# Deeper than any filter or metadata may be (their own checks are stricter); refused before they see it.
MAX_FIELD_DEPTH = 64


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Iterative, so that no depth can exhaust the interpreter's stack."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def refuse_unknown_fields(form: FormData, known: Sequence[str]) -> None:
    """A form field the route does not read is refused, as an unknown field of a JSON body is: a
    misspelt or unsupported option would otherwise be dropped without a word."""
    unknown = sorted(set(form.keys()) - set(known))
    if unknown:
        raise Problem(
            "invalid-input",
            f"unknown form fields {unknown}; this form takes {sorted(known)} (other options: send JSON)",
        )


def text_fields(form: FormData, name: str) -> list[str]:
    out = []
    for i, raw in enumerate(form.getlist(name)):
        if not isinstance(raw, str):
            raise Problem("invalid-input", f"form field {name}[{i}] must be text, not a file")
        out.append(raw)
    return out


def uploads(form: FormData, name: str) -> list[UploadFile]:
    files = []
    for i, part in enumerate(form.getlist(name)):
        if not isinstance(part, UploadFile):
            raise Problem("invalid-input", f"form field {name}[{i}] must be a file upload (curl -F {name}=@photo.jpg)")
        files.append(part)
    return files


# What browsers percent-encode in a multipart file name (the WHATWG HTML form encoding): a quote, a
# carriage return, a line feed. Only these three: a real "%41" in a name stays as it is.
_FORM_ESCAPES = {"%22": '"', "%0D": "\r", "%0A": "\n"}


def upload_filename(upload: UploadFile) -> str | None:
    """The name of an uploaded file as its owner wrote it (``say "hi".png``, not ``say %22hi%22.png``)."""
    name = upload.filename
    if not name or "%" not in name:
        return name
    for escaped, char in _FORM_ESCAPES.items():
        name = name.replace(escaped, char).replace(escaped.lower(), char)
    return name


async def read_image(upload: UploadFile, where: str, options: ImageOptions) -> tuple[bytes, str]:
    """The file's bytes and its real content type, after the header checks (nothing decoded yet).
    The checks run in the threadpool: they walk the file's structure, and Pillow parses its header
    in Python, seconds of work for a crafted file, which on the event loop would hold every request."""
    data = await upload.read(options.max_bytes + 1)
    return await run_in_threadpool(check_image, data, where, options)


def check_image(data: bytes, where: str, options: ImageOptions) -> tuple[bytes, str]:
    """Blocking (``probe_image``): call it off the event loop."""
    if len(data) > options.max_bytes:
        raise Problem(
            "payload-too-large",
            f"{where}: over the image limit of {options.max_bytes} bytes (MEMSTORE_ENCODER_MAX_IMAGE_BYTES); "
            "re-encode or downscale it",
            limit=options.max_bytes,
        )
    try:
        probe = probe_image(data, options)
    except DecompressionBombError as exc:
        limit = exc.limit if exc.limit is not None else options.max_pixels
        raise Problem("payload-too-large", f"{where}: {exc}", limit=limit) from None
    except ImageRejectedError as exc:
        raise Problem("image-rejected", f"{where}: {exc}") from None
    return data, IMAGE_TYPES.get(probe.format, "application/octet-stream")
