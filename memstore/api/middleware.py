"""Plain ASGI middleware (no BaseHTTPMiddleware: it costs every request a task and a copy)."""

from __future__ import annotations

import json
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstore.api.problems import MEDIA_TYPE


class BodyTooLargeError(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit


def too_large_detail(limit: int) -> str:
    return (
        f"the request body is over the limit of {limit} bytes (MEMSTORE_API_MAX_BODY_BYTES); "
        "send fewer or smaller files per request"
    )


class BodyLimit:
    """413 before reading when Content-Length is over the limit; stop reading once a chunked body is."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await _send_problem(send, scope, 413, "payload-too-large", too_large_detail(self.limit))
                    return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLargeError(self.limit)
            return message

        await self.app(scope, limited, send)


async def _send_problem(send: Send, scope: Scope, status: int, slug: str, detail: str) -> None:
    body = json.dumps(
        {
            "type": f"/problems/{slug}",
            "title": "Payload too large",
            "status": status,
            "detail": detail,
            "instance": scope.get("path", ""),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Metrics:
    """Request counts and latencies per route template (never per raw path: bounded label sets)."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
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
