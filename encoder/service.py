"""The encoder HTTP service: OpenAI-shaped /v1/embeddings, /health and Prometheus /metrics.

Errors are RFC 9457 problem details (application/problem+json) whose `type` URNs the remote
client maps back to the encoder's exceptions.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .addresses import route_path
from .engine import EmbeddingEngine
from .errors import (
    DecodeUnavailableError,
    DecompressionBombError,
    ImageRejectedError,
    QueueFullError,
    RequestCancelledError,
    RequestTooLargeError,
)
from .tenancy import TENANT
from .types import ImageEmbedding, Priority

PROBLEM = "urn:memstore:encoder:problem:"
_STATUS = {  # exception -> (status, problem type suffix, title); most specific first
    QueueFullError: (429, "queue-full", "Encoder queue full"),
    DecompressionBombError: (413, "decompression-bomb", "Image too costly to decode"),
    RequestTooLargeError: (413, "request-too-large", "Request too large"),
    ImageRejectedError: (422, "image-rejected", "Image rejected"),
    RequestCancelledError: (503, "cancelled", "Request cancelled"),
    DecodeUnavailableError: (503, "decode-unavailable", "Image decoder unavailable"),
}


class EmbeddingRequest(BaseModel):
    input: str | list[str] = Field(description="a text, or a list; images as base64 or data: URLs")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    modality: Literal["text", "image"] = "text"  # Infinity-style switch between the two towers
    priority: Literal["query", "sync_ingest", "background"] = "query"
    deadline_ms: float | None = Field(default=None, gt=0)
    return_tiles: bool = False  # images: also return per-tile vectors, boxes and weights
    dimensions: int | None = None
    # OpenAI's end-user id; here the tenant the images are decoded for (encoder.tenancy), which the
    # remote client sends, so one tenant's slow images queue behind its own here as in process.
    user: str | None = Field(default=None, max_length=256)


def problem(
    status: int, kind: str, title: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body = {"type": PROBLEM + kind, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers, media_type="application/problem+json")


def decode_image_input(value: str, index: int) -> bytes:
    """base64 or a data: URL -> bytes; http(s) URLs are refused (the service fetches nothing)."""
    text = value.strip()
    if text.startswith(("http://", "https://")):
        raise ImageRejectedError(
            f"input[{index}] is a URL; this service fetches nothing: send the image bytes as base64 or a data: URL"
        )
    if text.startswith("data:"):
        header, sep, payload = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ImageRejectedError(f"input[{index}] must be a base64 data: URL (data:image/png;base64,...)")
        text = payload
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ImageRejectedError(f"input[{index}] is neither a data: URL nor valid base64 image data") from None


def _encode(vector: np.ndarray, fmt: str) -> list[float] | str:
    if fmt == "base64":  # what the openai client decodes: little-endian float32
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


def _tiles_payload(e: ImageEmbedding, fmt: str) -> dict[str, Any]:
    return {
        "grid": list(e.grid),
        "global_embedding": _encode(e.global_vector, fmt),
        "embeddings": [_encode(t, fmt) for t in e.tiles],
        "boxes": [list(b) for b in e.boxes],
        "weights": e.weights,
    }


async def _await(fut: Future[Any], request: Request) -> Any:
    """Wait for the engine; a client that goes away cancels the request (its tiles are dropped)."""
    waiter = asyncio.wrap_future(fut)
    while True:
        done, _ = await asyncio.wait({waiter}, timeout=0.5)
        if done:
            return waiter.result()
        if await request.is_disconnected():
            fut.cancel()
            raise RequestCancelledError("client disconnected")


class _BodyTooLarge(StarletteHTTPException):
    """Raised while a route reads a body over the limit; an HTTPException, so FastAPI's body
    reader passes it on as a 413 instead of calling it a parse error (400)."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class Gate:
    """Before a byte of a /v1 body is read: one bearer key (when the service has one, compared in
    constant time) and the body limit (Content-Length, then counted while reading)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app, self.api_key, self.limit = app, api_key, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers", ())
        auth = [v for k, v in headers if k == b"authorization"]
        if self.api_key is not None:
            expected = b"Bearer " + self.api_key.encode()
            if len(auth) != 1 or not hmac.compare_digest(auth[0], expected):
                await _refuse(send, 401, "unauthorized", "Unauthorized", "send 'Authorization: Bearer KEY' "
                              "with the service's MEMSTORE_ENCODER_API_KEY")  # fmt: skip
                return
        for k, v in headers:
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                await _refuse(send, 413, "request-too-large", "Request too large", self._too_large())
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _BodyTooLarge(self._too_large())
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> str:
        return f"the body is over {self.limit} bytes (MEMSTORE_ENCODER_MAX_BODY_BYTES); send fewer or smaller inputs"


async def _refuse(send: Send, status: int, kind: str, title: str, detail: str) -> None:
    body = json.dumps({"type": PROBLEM + kind, "title": title, "status": status, "detail": detail}).encode()
    headers = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    headers.append((b"connection", b"close"))  # the body was not read: the connection cannot be reused
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(
    engine: EmbeddingEngine, *, own_engine: bool = False, api_key: str | None = None, max_body_bytes: int | None = None
) -> FastAPI:
    """The service around a (started or not) engine; `own_engine` stops it at shutdown. ``api_key``:
    the bearer key every /v1 request must carry (None: none asked)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        if own_engine:
            engine.stop()

    # No /docs: Swagger UI would come from a CDN; the API is documented in docs/encoder.md.
    app = FastAPI(title="memstore encoder", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    info = engine.info

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        return problem(422, "invalid-request", "Invalid request", detail or "invalid request body", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return problem(413, "request-too-large", "Request too large", str(exc.detail))
        return problem(exc.status_code, "http", str(exc.detail), str(exc.detail))

    for cls, (status, kind, title) in _STATUS.items():

        def handler(
            request: Request, exc: Exception, status: int = status, kind: str = kind, title: str = title
        ) -> JSONResponse:
            headers, extra = None, {}
            if isinstance(exc, QueueFullError | DecodeUnavailableError):
                headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
                extra = {"retry_after": exc.retry_after}
            return problem(status, kind, title, str(exc), headers, **extra)

        app.add_exception_handler(cls, handler)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        served = engine.infos
        if body.model is not None and body.model not in served:
            return problem(
                404,
                "model-not-found",
                "Model not served",
                f"model {body.model!r} is not served here; this service serves {', '.join(map(repr, served))} "
                "(MEMSTORE_MODELS)",
            )
        model = info if body.model is None else served[body.model]
        if body.dimensions is not None and body.dimensions != model.dimensions:
            return problem(
                422,
                "invalid-request",
                "Unsupported dimensions",
                f"{model.model} returns {model.dimensions} dimensions; omit `dimensions` or set it to "
                f"{model.dimensions}",
            )
        items = [body.input] if isinstance(body.input, str) else body.input
        if not items:
            return problem(422, "invalid-request", "Empty input", "`input` must hold at least one item")
        priority = Priority.parse(body.priority)
        deadline_s = None if body.deadline_ms is None else body.deadline_ms / 1000.0
        tenant = body.user or ""

        def submit_images() -> Future[Any]:
            # Up to the body limit of base64 (64 MiB) decoded here, in the threadpool: on the event
            # loop it held every other request (and /health) for the whole decode.
            blobs = [decode_image_input(v, i) for i, v in enumerate(items)]
            token = TENANT.set(tenant)  # read by the engine in this thread, as it submits
            try:
                return engine.submit_images(
                    blobs, priority=priority, deadline_s=deadline_s, return_tiles=True, model=model.model
                )
            finally:
                TENANT.reset(token)

        # Submission tokenises or reads image headers: off the event loop, like any blocking call.
        if body.modality == "text":
            fut = await run_in_threadpool(
                engine.submit_texts, items, priority=priority, deadline_s=deadline_s, model=model.model
            )
        else:
            fut = await run_in_threadpool(submit_images)
        result = await _await(fut, request)
        data: list[dict[str, Any]] = []
        units = len(items)
        for i in range(len(items)):
            entry: dict[str, Any] = {"object": "embedding", "index": i}
            if body.modality == "image":
                emb: ImageEmbedding = result[i]
                entry["embedding"] = _encode(emb.vector, body.encoding_format)
                units += len(emb.tiles)
                if body.return_tiles:
                    entry["tiles"] = _tiles_payload(emb, body.encoding_format)
            else:
                entry["embedding"] = _encode(result[i], body.encoding_format)
            data.append(entry)
        # usage counts model units (texts, global views, tiles): what a request costs here
        return {
            "object": "list",
            "data": data,
            "model": model.model,
            "usage": {"prompt_tokens": units, "total_tokens": units},
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        """Every model served, the default first, with what stored vectors depend on."""
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "owned_by": "memstore", **i.as_dict()}
                for name, i in engine.infos.items()
            ],
        }

    @app.get("/health")
    async def health() -> JSONResponse:
        stats = engine.stats()
        status = "ok" if stats["running"] else "stopped"
        body = {"status": status, **info.as_dict(), "models": [i.as_dict() for i in engine.infos.values()], **stats}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    limit = max_body_bytes if max_body_bytes is not None else engine.settings.max_body_bytes
    app.add_middleware(Gate, api_key=api_key, max_body_bytes=limit)
    return app
