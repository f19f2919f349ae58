"""Read-your-writes across replicas, as a plain ASGI layer of the API's front.

Every successful write answer of ``/v1`` carries ``X-Memstore-LSN``: the primary's WAL position once
the write is done (``Database.current_lsn``). A read that passes it back (header
``X-Memstore-Min-LSN`` or query parameter ``min_lsn``) is served by a replica that has replayed it,
or by the primary (``Database.reading_after``). Without replicas every read is on the primary and
sees every write: the position is still checked and still answered, so clients need not know.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.api.middleware import send_problem
from memstore.api.problems import Problem
from memstore.db import Database, parse_lsn
from memstore.errors import InvalidInputError

log = logging.getLogger(__name__)

LSN_HEADER = "x-memstore-lsn"
MIN_LSN_HEADER = "x-memstore-min-lsn"
MIN_LSN_PARAMETER = "min_lsn"
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# POST routes that only read: their answers carry no position.
_READ_POSTS = re.compile(r"^/v1/collections/[^/]+/(search|search/batch|recommend|duplicates|items/lookup)/?$")


def is_write(scope: Scope) -> bool:
    path = route_path(scope)
    return scope.get("method") in _WRITE_METHODS and path.startswith("/v1/") and not _READ_POSTS.match(path)


def requested_floor(scope: Scope) -> str | None:
    """The ``min_lsn`` a request passes (header first, then the query string), unchecked."""
    for name, value in scope.get("headers", ()):
        if name == MIN_LSN_HEADER.encode():
            return value.decode("latin-1")
    query = scope.get("query_string", b"")
    if MIN_LSN_PARAMETER.encode() in query:
        values = parse_qs(query.decode("latin-1")).get(MIN_LSN_PARAMETER)
        if values:
            return values[0]
    return None


class ReadYourWrites:
    """Sets a read's floor for the request's context; adds the position to a write's answer."""

    def __init__(self, app: ASGIApp, database: Callable[[], Database]) -> None:
        self.app = app
        self.database = database

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        db = self.database()
        try:
            floor = requested_floor(scope)
            lsn = None if floor is None else parse_lsn(floor)
        except InvalidInputError as exc:
            await send_problem(send, scope, Problem("invalid-input", str(exc)))
            return
        writing = is_write(scope)

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start" and writing and 200 <= int(message["status"]) < 300:
                try:
                    position = await run_in_threadpool(db.current_lsn)
                except Exception as exc:  # the write is done; only its position is unknown
                    log.warning("the write's WAL position could not be read: %s", exc)
                else:
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), (LSN_HEADER.encode(), position.encode())],
                    }
            await send(message)

        with db.reading_after(lsn):
            await self.app(scope, receive, stamped if writing else send)
