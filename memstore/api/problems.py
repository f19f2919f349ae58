"""RFC 9457 problem details: every error the API answers is ``application/problem+json``.

``type`` is a path on this server (``/problems/<slug>``) that explains the problem; ``detail`` says
what to fix. The store's and the encoder's own exceptions are mapped here and nowhere else.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import psycopg
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from encoder import errors as enc
from memstore import errors

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"

# slug: (status, title, what it means and what to do)
CATALOG: dict[str, tuple[int, str, str]] = {
    "malformed-request": (400, "Malformed request", "The body could not be parsed: send valid JSON or multipart."),
    "unauthorized": (
        401,
        "Unauthorized",
        "Send a key as 'Authorization: Bearer KEY'; create one with `memstore keys create NAME --scope admin`.",
    ),
    "forbidden": (403, "Forbidden", "The key is valid but its scopes do not cover this collection and action."),
    "not-found": (404, "Not found", "No such route, collection or item."),
    "method-not-allowed": (405, "Method not allowed", "The route exists but not with this HTTP method."),
    "conflict": (409, "Conflict", "The request collides with the current state (a name in use, an item not ready)."),
    "payload-too-large": (413, "Payload too large", "The body, a file or a list is over a documented limit."),
    "unsupported-media-type": (
        415,
        "Unsupported media type",
        "Send application/json, or multipart/form-data where the route takes uploads.",
    ),
    "invalid-input": (422, "Invalid input", "A field is missing, of the wrong type or out of range."),
    "image-rejected": (422, "Image rejected", "The image is corrupt, of an unsupported format or too large."),
    "ingest-failed": (422, "Ingest failed", "The items were stored but could not be embedded; see each item's error."),
    "too-many-requests": (
        429,
        "Too many requests",
        "The encoder's queue is full, or the key runs as many searches at once as it may: retry after "
        "Retry-After seconds.",
    ),
    "internal-error": (500, "Internal error", "A bug: the server logged it. Please report it."),
    "service-unavailable": (
        503,
        "Service unavailable",
        "A part this request needs (database, encoder) is down or not running here.",
    ),
    "timeout": (504, "Timeout", "The work did not finish in time; it may still complete (items stay queued)."),
}


class Problem(Exception):
    """Raise anywhere in a route to answer with a problem document."""

    def __init__(
        self,
        slug: str,
        detail: str,
        *,
        status: int | None = None,
        headers: dict[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail)
        self.slug = slug
        self.status = status or CATALOG[slug][0]
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions


def problem_body(problem: Problem, instance: str | None) -> dict[str, Any]:
    _, title, _ = CATALOG.get(problem.slug, (problem.status, "Error", ""))
    body: dict[str, Any] = {
        "type": f"/problems/{problem.slug}",
        "title": title,
        "status": problem.status,
        "detail": problem.detail,
    }
    if instance is not None:
        body["instance"] = instance
    body.update(problem.extensions)
    return body


def problem_response(request: Request | None, problem: Problem) -> JSONResponse:
    body = problem_body(problem, None if request is None else request.url.path)
    return JSONResponse(body, status_code=problem.status, headers=problem.headers, media_type=MEDIA_TYPE)


def _loc(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def validation_problem(errs: list[Any]) -> Problem:
    # A model's own check (one that reads several fields, as vector_b64's) has no field: its message
    # names what it is about. Pydantic puts "Value error, " before a ValueError's message.
    items = [
        {"field": _loc(e.get("loc", ())), "message": str(e.get("msg", "")).removeprefix("Value error, ")}
        for e in errs[:20]
    ]
    if any(e.get("type") in ("json_invalid", "json_type") for e in errs):
        first = errs[0]
        return Problem("malformed-request", f"the body is not valid JSON: {first.get('ctx', {}).get('error', '')}")
    detail = "; ".join(f"{i['field']}: {i['message']}" if i["field"] else i["message"] for i in items[:5])
    return Problem("invalid-input", detail or "invalid request", errors=items)


def from_exception(exc: BaseException) -> Problem:
    """The problem an exception is answered with (unexpected ones are logged and become a 500)."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, errors.NotFoundError):
        return Problem("not-found", str(exc))
    if isinstance(exc, errors.ConflictError):
        return Problem("conflict", str(exc))
    if isinstance(exc, errors.InvalidInputError):
        return Problem("invalid-input", str(exc))
    if isinstance(exc, errors.EncoderUnavailableError):
        headers = {} if exc.retry_after is None else {"Retry-After": str(round(exc.retry_after))}
        return Problem("service-unavailable", str(exc), headers=headers)
    if isinstance(exc, errors.DatabaseUnavailableError):
        return Problem("service-unavailable", str(exc))
    if isinstance(exc, enc.QueueFullError):
        retry = max(1, round(exc.retry_after + 0.49))
        return Problem("too-many-requests", str(exc), headers={"Retry-After": str(retry)}, retry_after=exc.retry_after)
    if isinstance(exc, enc.RequestTooLargeError):
        return Problem("payload-too-large", str(exc))
    if isinstance(exc, enc.ImageRejectedError):
        return Problem("image-rejected", str(exc))
    if isinstance(exc, enc.DecodeUnavailableError):  # the decoder's trouble, not the image's
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
        return Problem("service-unavailable", str(exc), headers=headers, retry_after=exc.retry_after)
    if isinstance(exc, enc.EncoderUnreachableError | enc.EncoderNoAnswerError):
        return Problem("service-unavailable", f"{exc}; retry shortly", headers={"Retry-After": "5"})
    if isinstance(exc, enc.RequestCancelledError):
        # Stuck, stopping or busy past a query's wait: the same request may well succeed shortly.
        return Problem("service-unavailable", f"the encoder did not answer: {exc}", headers={"Retry-After": "5"})
    if isinstance(
        exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure
    ):  # a deadlock or serialization failure
        return Problem(
            "conflict",
            "a concurrent change to the same items collided with this one, which was not applied; retry it",
            headers={"Retry-After": "1"},
        )
    # Before OperationalError: both are subclasses of it.
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        return Problem("timeout", "the database did not answer in time; retry shortly")
    if isinstance(exc, psycopg.OperationalError | sqlalchemy.exc.OperationalError | sqlalchemy.exc.TimeoutError):
        return Problem("service-unavailable", "the database is unreachable or overloaded; retry shortly")
    if isinstance(exc, psycopg.DataError):  # a value PostgreSQL cannot take (out of range, bad encoding)
        return Problem("invalid-input", f"the database refused a value: {str(exc).splitlines()[0]}")
    if isinstance(exc, psycopg.IntegrityError):
        return Problem("conflict", f"the change collides with existing data: {str(exc).splitlines()[0]}")
    log.exception("unhandled error", exc_info=exc)
    return Problem("internal-error", f"unexpected {type(exc).__name__}; the server log has the details")


_HTTP_SLUGS = {
    400: "malformed-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
    415: "unsupported-media-type",
    422: "invalid-input",
}


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route takes on this path. Starlette's 405 names the methods of the first
    route whose path matched (a path with a GET and a PUT route answered a DELETE with ``Allow: PUT``).
    Each method is tried through the routes' own ``matches`` (included routers answer it too)."""
    routes = request.app.router.routes
    return [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]


def install(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, from_exception(exc))

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(request, validation_problem(list(exc.errors())))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        slug = _HTTP_SLUGS.get(exc.status_code, "malformed-request" if exc.status_code < 500 else "internal-error")
        detail = str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}; the routes are listed at /docs"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
            allowed = allowed_methods(request)
            if allowed:
                headers["Allow"] = ", ".join(allowed)
        return problem_response(request, Problem(slug, detail, status=exc.status_code, headers=headers))

    # Class-specific handlers answer inside the app; only truly unexpected errors reach the
    # catch-all (Starlette's outermost middleware), which answers 500 and logs the traceback.
    for known in (Problem, errors.MemstoreError, enc.EncoderError, psycopg.Error, sqlalchemy.exc.SQLAlchemyError):
        app.add_exception_handler(known, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_problem)

    @app.get("/problems/{slug}", tags=["operations"], summary="Explain a problem type", include_in_schema=False)
    async def explain(slug: str) -> PlainTextResponse:
        if slug not in CATALOG:
            raise Problem("not-found", f"no problem type {slug!r}; known: {', '.join(CATALOG)}")
        status, title, text = CATALOG[slug]
        return PlainTextResponse(f"{status} {title}\n\n{text}\n")


def problem_schema() -> dict[str, Any]:
    """The OpenAPI description of a problem document (for the ``responses`` of each route)."""
    return {
        "description": "An RFC 9457 problem document",
        "content": {
            MEDIA_TYPE: {
                "schema": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "instance": {"type": "string"},
                    },
                    "required": ["type", "title", "status", "detail"],
                },
                "example": json.loads(
                    '{"type": "/problems/invalid-input", "title": "Invalid input", "status": 422, '
                    '"detail": "vector: expected 512 dimensions, not 3", "instance": "/v1/collections/photos/items"}'
                ),
            }
        },
    }


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: problem_schema() for code in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
}
