"""Read-your-writes across replicas, as a plain ASGI layer of the API's front.

Every successful write answer of ``/v1`` carries ``X-Memstore-LSN``: the primary's WAL position once
the write is done (``Database.current_lsn``), and, when its body is a JSON object, the same as the
field ``lsn``. A read that passes it back (header
``X-Memstore-Min-LSN`` or query parameter ``min_lsn``) is served by a replica that has replayed it,
or by the primary (``Database.reading_after``). Without replicas every read is on the primary and
sees every write: the position is still checked (malformed, repeated or ahead of the primary's WAL:
a 422) and still answered, so clients need not know.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.api.middleware import send_problem
from memstore.api.problems import Problem
from memstore.db.core import Database, format_lsn, parse_lsn
from memstore.errors import InvalidInputError

log = logging.getLogger(__name__)

LSN_HEADER = "x-memstore-lsn"
MIN_LSN_HEADER = "x-memstore-min-lsn"
MIN_LSN_PARAMETER = "min_lsn"
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# POST routes that only read: their answers carry no position.
_READ_POSTS = re.compile(
    r"^/v1/collections/[^/]+/(search|search/batch|recommend|duplicates|items/lookup|items/list|items/count)/?$"
)


def is_write(scope: Scope) -> bool:
    path = route_path(scope)
    return scope.get("method") in _WRITE_METHODS and path.startswith("/v1/") and not _READ_POSTS.match(path)


def requested_floor(scope: Scope) -> str | None:
    """The ``min_lsn`` a request passes (header first, then the query string), its format unchecked.
    A repeated header or parameter is refused (``InvalidInputError``): proxies and frameworks
    disagree on which of several counts, so none is guessed."""
    values = [value for name, value in scope.get("headers", ()) if name == _MIN_LSN_HEADER_BYTES]
    if len(values) > 1:
        raise InvalidInputError(f"{len(values)} X-Memstore-Min-LSN headers; send one")
    if values:
        return values[0].decode("latin-1")
    query = scope.get("query_string", b"")
    if MIN_LSN_PARAMETER.encode() in query:
        found = parse_qs(query.decode("latin-1"), keep_blank_values=True).get(MIN_LSN_PARAMETER)
        if found and len(found) > 1:
            raise InvalidInputError(f"{len(found)} min_lsn parameters; send one")
        if found:
            return found[0]
    return None


_MIN_LSN_HEADER_BYTES = MIN_LSN_HEADER.encode()


class ReadYourWrites:
    """Sets a read's floor for the request's context; adds the position to a write's answer."""

    def __init__(self, app: ASGIApp, database: Callable[[], Database]) -> None:
        self.app = app
        self.database = database
        # The highest WAL position the primary is known to have reached: a floor at or below it is
        # valid without asking the database again.
        self.reached = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not route_path(scope).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        db = self.database()
        try:
            floor = requested_floor(scope)
            lsn = None if floor is None else parse_lsn(floor)
            if lsn is not None and lsn > self.reached and not db.replicas:
                # With replicas, Database.reading_after refuses a future position itself (when a read
                # would wait on it); without, nothing would: the primary is asked here.
                await self._refuse_future(db, lsn)
        except InvalidInputError as exc:
            await send_problem(send, scope, Problem("invalid-input", str(exc)))
            return
        writing = is_write(scope)

        with db.reading_after(lsn):
            await self.app(scope, receive, _Stamper(send, db, self) if writing else send)

    async def _refuse_future(self, db: Database, lsn: int) -> None:
        now = parse_lsn(await run_in_threadpool(db.current_lsn))
        self.reached = max(self.reached, now)
        if lsn > now:
            raise InvalidInputError(
                f"min_lsn {format_lsn(lsn)} is ahead of the database's WAL (now at {format_lsn(now)}): "
                "pass the X-Memstore-LSN a write answered with"
            )


class _Stamper:
    """The ``send`` of a write: its successful answer gets the position as a header and, when the
    body is a JSON object, as its ``lsn`` field (the body is held until complete: write answers are
    small)."""

    def __init__(self, send: Send, db: Database, front: ReadYourWrites) -> None:
        self.send = send
        self.db = db
        self.front = front
        self.start: Message | None = None
        self.position: str | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if not 200 <= int(message["status"]) < 300:
                await self.send(message)
                return
            try:
                self.position = await run_in_threadpool(self.db.current_lsn)
                self.front.reached = max(self.front.reached, parse_lsn(self.position))
            except Exception as exc:  # the write is done; only its position is unknown
                log.warning("the write's WAL position could not be read: %s", exc)
                await self.send(message)
                return
            headers = [*message.get("headers", []), (LSN_HEADER.encode(), self.position.encode())]
            message = {**message, "headers": headers}
            if _header(headers, b"content-type").startswith("application/json"):
                self.start = message  # sent with the body, once its length is known
                return
            await self.send(message)
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = _with_position(b"".join(self.chunks), self.position or "")
        headers = [(k, v) for k, v in self.start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    return next((v.decode("latin-1").lower() for k, v in headers if k.lower() == name), "")


def _with_position(body: bytes, position: str) -> bytes:
    """A JSON object's body with ``"lsn": position`` added (anything else as it is)."""
    try:
        document = json.loads(body)
    except ValueError:
        return body
    if not isinstance(document, dict):
        return body
    document["lsn"] = position
    # As the API's JSONResponse writes it.
    return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
