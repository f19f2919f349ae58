"""The front of the web pages (``/ui``), a plain ASGI layer like the API's ``AuthGate``.

On the headers alone, before a byte of the body is read: the session (no session: a page is
redirected to the sign-in form, anything else is refused with 401: a page saying so for a form a
browser posts, a problem document for a script's read that asks for JSON), a change coming from another
site (403), and a change's CSRF header when a script sent one (403 when it is wrong; forms carry
theirs in a field the route checks). Every answer under ``/ui`` gets the security headers: a strict
Content-Security-Policy (scripts and styles from this server's files only, so no inline script can
run even if some text slipped through unescaped), no framing, no sniffing, no referrer leaks.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.api import middleware
from memstore.api.problems import MEDIA_TYPE, Problem
from memstore.ui.identity import CSRF_HEADER, SESSION_COOKIE, Identity, cookie_of, same_token
from memstore.ui.render import plain_page
from memstore.ui.signin import is_ui_page

PREFIX = "/ui"
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {b"content-security-policy": CONTENT_SECURITY_POLICY.encode(), **middleware.SECURITY_HEADERS}
SAFE_METHODS = {"GET", "HEAD"}
# Open without a session: the sign-in form, and the styles and scripts every page (that one too) loads.
PUBLIC = ("/ui/signin", "/ui/static/")


def is_ui(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class UiGate:
    def __init__(self, app: ASGIApp, identify: Callable[[Scope], Awaitable[Identity | None]]) -> None:
        self.app = app
        self.identify = identify

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope) if scope["type"] == "http" else ""
        if not is_ui(path):
            await self.app(scope, receive, send)
            return
        send = _with_security_headers(send, static=path.startswith("/ui/static/"))
        method = scope.get("method", "GET")
        if path == PREFIX:
            await _answer(send, 308, b"", location=scope.get("root_path", "") + PREFIX + "/")
            return
        state = scope.setdefault("state", {})
        if path == "/ui/signin" or path.startswith("/ui/static/"):
            await self.app(scope, receive, send)
            return
        identity = await self.identify(scope)
        if identity is None:
            await _refuse_anonymous(scope, send, path, method)
            return
        if method not in SAFE_METHODS:
            headers = dict(scope.get("headers", ()))
            if headers.get(b"sec-fetch-site") == b"cross-site":
                await _answer(send, 403, b"refused: this change came from another site\n")
                return
            sent = headers.get(CSRF_HEADER.encode())
            if sent is not None:
                if not same_token(identity.csrf, sent.decode("latin-1")):
                    await _answer(send, 403, b"the security token is missing or stale: reload the page\n")
                    return
                state["csrf_checked"] = True
        state["ui_identity"] = identity
        if method not in SAFE_METHODS and b"text/html" in _header(scope, b"accept"):
            send = _page_for_too_large(send, scope)
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> bytes:
    return next((value for key, value in scope.get("headers", ()) if key == name), b"")


async def _refuse_anonymous(scope: Scope, send: Send, path: str, method: str) -> None:
    """No session. A cookie the server no longer knows means the session ended (revoked, expired):
    the sign-in page says so, and a form posted meanwhile gets a page leading back to it."""
    root = scope.get("root_path", "")
    ended = cookie_of(scope, SESSION_COOKIE) is not None
    accept = _header(scope, b"accept")
    if method in SAFE_METHODS and (b"text/html" in accept or b"application/json" not in accept):
        target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
        signin = root + "/ui/signin?next=" + quote(target, safe="") + ("&notice=session-ended" if ended else "")
        await _answer(send, 303, b"", location=signin)
    elif method in SAFE_METHODS:
        # A script's fetch: a redirect to the sign-in page would reach it as a page it cannot read.
        problem = Problem("unauthorized", "sign in again: your session is missing, expired or revoked")
        await middleware.send_problem(send, scope, problem)
    elif b"text/html" in accept:
        signin = root + "/ui/signin?next=" + quote(_came_from(scope), safe="") + "&notice=session-ended"
        page = plain_page(
            root,
            status=401,
            title="Session ended",
            detail="Your session is missing, expired or revoked, so this change was not made. "
            "Sign in again, then make it again.",
            link=signin,
            link_text="Sign in again",
        )
        await _answer(send, 401, page, content_type=b"text/html; charset=utf-8")
    else:
        await _answer(send, 401, b"sign in first: your session is missing, expired or revoked\n")


def _came_from(scope: Scope) -> str:
    """The page a form was posted from, to return to after signing in: its Referer when that is a page
    of this site under /ui (same scheme and host, as the browser addressed it); else the collections."""
    home = "/ui/"
    try:
        parts = urlsplit(_header(scope, b"referer").decode("latin-1"))
    except ValueError:
        return home
    host = _header(scope, b"host").decode("latin-1").lower()
    if not host or parts.netloc.lower() != host or parts.scheme != scope.get("scheme", "http"):
        return home
    root = scope.get("root_path", "")
    if not parts.path.startswith(root + "/ui/"):
        return home
    target = parts.path[len(root) :] + ("?" + parts.query if parts.query else "")
    return target if is_ui_page(target) else home


def _page_for_too_large(send: Send, scope: Scope) -> Send:
    """The body limit's refusal of a browser's form (given on its headers, before the route) as a page
    rather than the API's problem document."""
    held: list[Message] = []
    body = bytearray()

    async def wrapped(message: Message) -> None:
        if (
            message["type"] == "http.response.start"
            and message["status"] == 413
            and dict(message.get("headers", ())).get(b"content-type", b"").startswith(MEDIA_TYPE.encode())
        ):
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        body.extend(message.get("body", b""))
        if message.get("more_body"):
            return
        try:
            detail = str(json.loads(body)["detail"])
        except (ValueError, KeyError, TypeError):
            detail = "the request body is over this page's limit"
        page = plain_page(scope.get("root_path", ""), status=413, title="Payload too large", detail=detail)
        kept = [(k, v) for k, v in held[0].get("headers", ()) if k not in (b"content-type", b"content-length")]
        headers: list[Any] = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(page)).encode()),
            *kept,
        ]
        await send({**held[0], "headers": headers})
        await send({"type": "http.response.body", "body": page})

    return wrapped


def _with_security_headers(send: Send, *, static: bool) -> Send:
    # Pages show private data: never stored. Scripts and styles: revalidated (ETag).
    cache = b"no-cache" if static else b"no-store"
    return middleware.with_headers(send, {**SECURITY_HEADERS, b"cache-control": cache})


async def _answer(
    send: Send,
    status: int,
    body: bytes,
    *,
    location: str | None = None,
    content_type: bytes = b"text/plain; charset=utf-8",
) -> None:
    """An answer given before the body was read: the connection is closed, not drained."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if location is not None:
        headers.append((b"location", location.encode("latin-1")))
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
