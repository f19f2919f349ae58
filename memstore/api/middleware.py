"""Plain ASGI middleware (no BaseHTTPMiddleware: it costs every request a task and a copy).

The API's front, outermost first: ``Metrics``, ``AuthGate`` (the key, before a byte is read),
``BodyLimit`` (a per-route size cap, before a byte is read), then the search fast path and FastAPI.
A request without a valid key is refused on its headers alone, so no unauthenticated client can make
the server read, buffer or parse a body.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encoder.addresses import route_path
from encoder.tenancy import TENANT
from memstore.api.auth import bearer_secret
from memstore.api.problems import MEDIA_TYPE, Problem, from_exception, problem_body
from memstore.api.rendering import render
from memstore.settings import ApiSettings

# Routes that take uploads (new items; an item's new image); every other route takes small JSON only.
_ITEMS_UPLOAD = re.compile(r"^/v1/collections/[^/]+/items/?$")
_CONTENT_UPLOAD = re.compile(r"^/v1/collections/[^/]+/items/[^/]+/content/?$")
_LOAD = re.compile(r"^/v1/collections/[^/]+/load/?$")
_SEARCH = re.compile(r"^/v1/collections/[^/]+/(search|search/batch|recommend)/?$")
# The web pages' upload (one file) and search by image (memstore.ui) take the same limits.
_UI_UPLOAD = re.compile(r"^/ui/c/[^/]+/upload/?$")
_UI_SEARCH = re.compile(r"^/ui/c/[^/]+/search/image/?$")


class BodyTooLargeError(HTTPException):
    """Raised while a body over the limit is read. An HTTPException, so that FastAPI's body reader
    passes it on (a 413) instead of calling it a parse error (400)."""

    def __init__(self, limit: int, kind: str) -> None:
        super().__init__(413, f"the request body is over {limit} bytes")
        self.limit = limit
        self.kind = kind


_LIMIT_SETTINGS = {
    "upload": "MEMSTORE_API_MAX_BODY_BYTES",
    "load": "MEMSTORE_API_MAX_LOAD_BODY_BYTES",
    "search": "MEMSTORE_API_MAX_SEARCH_BODY_BYTES",
    "json": "MEMSTORE_API_MAX_JSON_BODY_BYTES",
}


def too_large_detail(limit: int, kind: str) -> str:
    return f"the request body is over the limit of {limit} bytes for this route ({_LIMIT_SETTINGS[kind]}); " + (
        "send fewer or smaller items per request" if kind == "upload" else "send a smaller body"
    )


def body_kind(scope: Scope) -> str:
    """Which body limit a request falls under: ``upload``, ``load``, ``search`` or ``json``."""
    path, method = route_path(scope), scope.get("method")
    if (method == "POST" and (_ITEMS_UPLOAD.match(path) or _UI_UPLOAD.match(path))) or (
        method == "PUT" and _CONTENT_UPLOAD.match(path)
    ):
        return "upload"
    if method == "POST" and _LOAD.match(path):
        return "load"
    if _SEARCH.match(path) or _UI_SEARCH.match(path):
        return "search"
    return "json"


class BodyLimit:
    """413 before reading when Content-Length is over the route's limit; stop reading once a chunked
    body is (the same 413, whether the body declared its length or not)."""

    def __init__(self, app: ASGIApp, api: ApiSettings) -> None:
        self.app = app
        self.limits = {
            "upload": api.max_body_bytes,
            "load": api.max_load_body_bytes,
            "search": api.max_search_body_bytes,
            "json": api.max_json_body_bytes,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = body_kind(scope)
        limit = self.limits[kind]
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await send_problem(send, scope, Problem("payload-too-large", too_large_detail(limit, kind)))
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLargeError(limit, kind)
            return message

        await self.app(scope, limited, send)


async def send_problem(send: Send, scope: Scope, problem: Problem) -> None:
    """Answer with a problem document from a plain ASGI layer, before the body was read: so the
    connection is closed (reusing it, the server would have to drain the body first)."""
    body = render(problem_body(problem, scope.get("path", "")))
    headers = [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in problem.headers.items()]
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": problem.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _scheme_problem(authorization_sent: bool) -> Problem:
    """A key sent the wrong way: say so, rather than that no key was sent."""
    where = "the Authorization header has no 'Bearer' scheme" if authorization_sent else "X-API-Key is not read"
    return Problem(
        "unauthorized",
        f"{where}: send the key as 'Authorization: Bearer KEY'",
        headers={"WWW-Authenticate": "Bearer"},
    )


class AuthGate:
    """The key of every ``/v1`` request, checked on its headers before the body is read.

    The verified key travels in ``scope["state"]["api_key"]`` (``request.state.api_key``), where the
    routes' ``Key`` dependency and the search fast path take it from. Two ``Authorization`` headers
    are refused (400): proxies and frameworks disagree on which one counts.
    """

    def __init__(self, app: ASGIApp, authenticate: Callable[[str | None], Any]) -> None:
        self.app = app
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        if len(values) > 1:
            await send_problem(
                send, scope, Problem("malformed-request", "more than one Authorization header; send exactly one")
            )
            return
        path = route_path(scope)
        if not path.startswith("/v1/") and path != "/v1":
            await self.app(scope, receive, send)
            return
        secret = bearer_secret(values[0].decode("latin-1")) if values else None
        try:
            key = await self.authenticate(secret)
        except Exception as exc:
            problem = from_exception(exc)
            if secret is None and (values or any(k == b"x-api-key" for k, _ in scope.get("headers", ()))):
                problem = _scheme_problem(bool(values))  # a key was sent, the wrong way
            await send_problem(send, scope, problem)
            return
        scope.setdefault("state", {})["api_key"] = key
        # The key is its requests' tenant of the encoder's image decoding (encoder.tenancy): the
        # context variable travels into the threads the request's work runs in.
        TENANT.set(f"key:{key.id}")
        await self.app(scope, receive, send)


# scope["state"] flag: the handler was cancelled because its client went away (memstore.api.search_guard).
CLIENT_GONE = "client_gone"


class AccessLog:
    """Access lines written by the front instead of by the HTTP server
    (``MEMSTORE_API_ACCESS_LOG=sampled``): every answer of 400 or more, and of the others the first
    and then one in ``every`` (0: none of them). The lines read as uvicorn's own (the same arguments,
    through the ``access`` handler of ``memstore.api.http_limits.logging_config``), on the logger
    ``memstore.access``.

    uvicorn's access log builds a log record and writes a line for each request: about a tenth of a
    vector search's CPU in the API process. A request this one does not write costs a counter."""

    logger = logging.getLogger("memstore.access")

    def __init__(self, every: int) -> None:
        self.every = every
        self._left = 1  # the first answer has its line: the log shows the server at work from the start

    def record(self, scope: Scope, status: int) -> None:
        if status < 400:
            if self.every <= 0:
                return
            self._left -= 1
            if self._left > 0:
                return
            self._left = self.every
        if not self.logger.isEnabledFor(logging.INFO):
            return
        client = scope.get("client")
        query = scope.get("query_string", b"")
        path = scope.get("root_path", "") + scope.get("path", "")
        self.logger.info(
            '%s - "%s %s HTTP/%s" %d',
            f"{client[0]}:{client[1]}" if client else "-",
            scope.get("method", ""),
            f"{path}?{query.decode('ascii', 'replace')}" if query else path,
            scope.get("http_version", "1.1"),
            status,
        )


class Metrics:
    """Request counts and latencies per route template (never per raw path: bounded label sets), and
    the sampled access log when there is one."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry, access: AccessLog | None = None) -> None:
        self.app = app
        self.access = access
        self.requests = Counter(
            "memstore_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry
        )
        self.latency = Histogram(
            "memstore_http_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording)
        finally:
            if status == 500 and scope.get("state", {}).get(CLIENT_GONE):
                status = 499  # no answer: the client went away and its search was cancelled (nginx's code)
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            key = (scope.get("method", ""), template, status)
            children = self._children.get(key)
            if children is None:  # labels() takes a lock and builds a key: once per label set
                children = self._children[key] = (
                    self.requests.labels(key[0], template, str(status)),
                    self.latency.labels(key[0], template),
                )
            children[0].inc()
            children[1].observe(time.perf_counter() - started)
            if self.access is not None:
                self.access.record(scope, status)


# What every page and document this server renders carries beside its own CSP: no framing
# (clickjacking), no content sniffing, no referrer leaks.
SECURITY_HEADERS = {
    b"x-content-type-options": b"nosniff",
    b"x-frame-options": b"DENY",
    b"referrer-policy": b"same-origin",
    b"cross-origin-opener-policy": b"same-origin",
}


def with_headers(send: Send, headers: dict[bytes, bytes]) -> Send:
    """``send`` adding each of ``headers`` that the answer does not set itself."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            given = list(message.get("headers", []))
            present = {name.lower() for name, _ in given}
            given += [(name, value) for name, value in headers.items() if name not in present]
            message = {**message, "headers": given}
        await send(message)

    return sending


# The API's own documents: the Swagger page, its files, the schema (and /redoc, which answers 404).
_DOCS_PATHS = ("/docs", "/openapi.json", "/redoc")
_DOCUMENT_POLICY = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; sandbox"


class DocsHeaders:
    """Security headers on ``/docs`` (with ``page_policy``, its CSP), its assets, ``/openapi.json`` and
    ``/redoc``: no framing (clickjacking the "Try it out" buttons), no content sniffing, no
    referrer leaks. Other paths pass untouched."""

    def __init__(self, app: ASGIApp, page_policy: Callable[[], str]) -> None:
        self.app = app
        self.page_policy = page_policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(_DOCS_PATHS):
            await self.app(scope, receive, send)
            return
        policy = self.page_policy().encode() if path in ("/docs", "/docs/") else _DOCUMENT_POLICY
        await self.app(scope, receive, with_headers(send, {b"content-security-policy": policy, **SECURITY_HEADERS}))
