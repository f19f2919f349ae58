"""A plain-ASGI fast path for JSON searches, the hot route.

FastAPI's routing, dependency solving and exception middlewares cost a search request about as much
CPU as the database work on a small machine. JSON search requests are answered here instead, with the
same functions as the documented route (``routes.search``: authorisation, parsing, the search) and the
same problem documents; everything else (multipart searches included) goes on to FastAPI.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.access.keys import ApiKey
from memstore.api import problems, query_names
from memstore.api.middleware import BodyTooLargeError, too_large_detail
from memstore.api.problems import Problem
from memstore.api.rendering import render
from memstore.api.routes.search import authorize, execute, json_image
from memstore.api.runtime import Runtime
from memstore.api.schemas import SearchRequest

_PATH = re.compile(r"^/v1/collections/([^/]+)/search$")
_JSON = (b"application/json", b"")
# Bodies up to this size are parsed on the event loop (a vector query: well under a millisecond);
# larger ones in the executor, so that one client's large body never stalls the others.
INLINE_PARSE_BYTES = 64 * 1024


class _Route:  # what the metrics middleware labels requests with
    path = "/v1/collections/{name}/search"


_ROUTE = _Route()


class SearchFastPath:
    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _PATH.match(route_path(scope)) if scope["type"] == "http" and scope["method"] == "POST" else None
        headers: dict[bytes, bytes] = dict(scope["headers"]) if match else {}
        if match is None or headers.get(b"content-type", b"").split(b";")[0].strip().lower() not in _JSON:
            await self.app(scope, receive, send)
            return
        scope["route"] = _ROUTE
        extra: dict[str, str] = {}
        try:
            payload = render(await self._search(scope, receive, match.group(1)))
            status, media = 200, "application/json"
        except Exception as exc:  # every error becomes a problem document, as on the FastAPI routes
            problem = (
                Problem("payload-too-large", too_large_detail(exc.limit, exc.kind))
                if isinstance(exc, BodyTooLargeError)
                else problems.from_exception(exc)
            )
            payload, status, media, extra = (
                render(problems.problem_body(problem, scope["path"])),
                problem.status,
                problems.MEDIA_TYPE,
                problem.headers,
            )
        response_headers = [(b"content-type", media.encode()), (b"content-length", str(len(payload)).encode())]
        response_headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload})

    async def _search(self, scope: Scope, receive: Receive, name: str) -> dict[str, Any]:
        rt: Runtime = self.fastapi_app.state.runtime
        key = scope.get("state", {}).get("api_key")
        if not isinstance(key, ApiKey):  # the front's AuthGate verifies every /v1 request first
            raise Problem("unauthorized", "no verified API key", headers={"WWW-Authenticate": "Bearer"})
        authorize(key, name)  # before a byte of the body is read
        if scope.get("query_string"):  # the documented route takes none but min_lsn
            query_names.check(
                (k for k, _ in parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)), frozenset()
            )
        raw = await _read_body(receive)
        if len(raw) > INLINE_PARSE_BYTES:  # a large body (a base64 image) is parsed off the event loop
            body = await asyncio.get_running_loop().run_in_executor(rt.executor, parse_search, raw)
        else:
            body = parse_search(raw)
        return await execute(rt, name, body, json_image(body))


def parse_search(raw: bytes) -> SearchRequest:
    if not raw.strip():
        raise Problem("malformed-request", "the body is empty; send a JSON object")
    try:
        return SearchRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise problems.validation_problem(list(exc.errors())) from None


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Problem("malformed-request", "the client went away before sending the whole body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
