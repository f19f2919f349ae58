"""The search routes' guard, a plain ASGI layer inside the key check (``AuthGate``):

- **A limit per key**: at most ``per_key`` searches of one key run at once (search, batch, recommend,
  duplicates); the next is answered ``429`` with ``Retry-After`` before its body is read. One key can
  then never hold every search connection (``MEMSTORE_POOL_SIZE``) while other keys wait; with auth
  off there is one identity and no limit.
- **Cancelled when the client goes away**: once the request's body is read, the guard listens on the
  ASGI receive channel for ``http.disconnect`` while the handler runs, and cancels the handler when
  it comes. A search on the event loop's connections (``memstore.search.runner``) is then cancelled in
  PostgreSQL too (psycopg sends a cancel request when its task is cancelled, waits for the statement to
  end, and the connection goes back to the set). A search handed to the executor
  (``Runtime.off_loop``: embedding, compact indexes, replicas) stops being waited for, but its thread
  runs the statement to its end (bounded by the search statement timeout).

The body is never read by the guard: the listener starts only after the handler has read the last
part of it, and a handler that asks for another message afterwards gets the one the listener took.
"""

from __future__ import annotations

import asyncio
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.access.keys import ApiKey
from memstore.api.auth import LOCAL
from memstore.api.middleware import CLIENT_GONE, send_problem
from memstore.api.problems import Problem

SEARCH_ROUTES = re.compile(r"^/v1/collections/[^/]+/(search|search/batch|recommend|duplicates)/?$")
RETRY_AFTER_S = 1


class SearchGuard:
    def __init__(self, app: ASGIApp, per_key: int) -> None:
        self.app = app
        self.per_key = per_key  # 0: no limit
        self.running: dict[int, int] = {}  # key id -> searches running (the event loop's only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not SEARCH_ROUTES.match(route_path(scope)):
            await self.app(scope, receive, send)
            return
        key = scope.get("state", {}).get("api_key")
        key_id = key.id if isinstance(key, ApiKey) and key is not LOCAL and self.per_key else None
        if key_id is not None:
            running = self.running.get(key_id, 0)
            if running >= self.per_key:
                await send_problem(send, scope, self._refusal(key))
                return
            self.running[key_id] = running + 1
        try:
            await run_watched(self.app, scope, receive, send)
        finally:
            if key_id is not None:
                left = self.running[key_id] - 1
                if left:
                    self.running[key_id] = left
                else:
                    del self.running[key_id]

    def _refusal(self, key: ApiKey) -> Problem:
        return Problem(
            "too-many-requests",
            f"key {key.name!r} already runs {self.per_key} searches at once, its limit "
            "(MEMSTORE_API_SEARCHES_PER_KEY): wait for one to finish",
            headers={"Retry-After": str(RETRY_AFTER_S)},
            retry_after=RETRY_AFTER_S,
        )


async def run_watched(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app(scope, receive, send)``, cancelled if the client disconnects after sending its body and
    before the answer is complete. The cancellation ends here: the caller returns normally (there is
    nobody to answer), with ``scope["state"]["client_gone"]`` set."""
    task = asyncio.current_task()
    assert task is not None
    listener: asyncio.Task[Message] | None = None
    done = False  # the answer is complete, or the handler returned: a disconnect now cancels nothing
    gone = False

    async def listen() -> Message:
        nonlocal gone
        message = await receive()
        if message["type"] == "http.disconnect" and not done:
            gone = True
            scope.setdefault("state", {})[CLIENT_GONE] = True
            task.cancel()
        return message

    async def watched_receive() -> Message:
        nonlocal listener
        if listener is not None:  # the body is read: the next message is the listener's
            return await asyncio.shield(listener)
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            listener = asyncio.get_running_loop().create_task(listen())
        return message

    async def watched_send(message: Message) -> None:
        nonlocal done
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done = True
        await send(message)

    try:
        await app(scope, watched_receive, watched_send)
    except asyncio.CancelledError:
        if gone and task.uncancel() == 0:
            return  # the client went away: nothing to answer
        raise
    finally:
        done = True
        if listener is not None and not listener.done():
            listener.cancel()
        if gone and task.cancelling():  # the handler swallowed the cancellation: it is over all the same
            task.uncancel()
