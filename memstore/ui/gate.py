"""The front of the web pages (``/ui``), a plain ASGI layer like the API's ``AuthGate``.

On the headers alone, before a byte of the body is read: the session (no session: a page is
redirected to the sign-in form, anything else is refused with 401), a change coming from another
site (403), and a change's CSRF header when a script sent one (403 when it is wrong; forms carry
theirs in a field the route checks). Every answer under ``/ui`` gets the security headers: a strict
Content-Security-Policy (scripts and styles from this server's files only, so no inline script can
run even if some text slipped through unescaped), no framing, no sniffing, no referrer leaks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import quote

from starlette.types import ASGIApp, Receive, Scope, Send

from encoder.addresses import route_path
from memstore.api import middleware
from memstore.ui.identity import CSRF_HEADER, Identity, same_token

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
            if method in SAFE_METHODS:
                target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
                signin = scope.get("root_path", "") + "/ui/signin?next=" + quote(target, safe="")
                await _answer(send, 303, b"", location=signin)
            else:
                await _answer(send, 401, b"sign in first: your session is missing, expired or revoked\n")
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
        await self.app(scope, receive, send)


def _with_security_headers(send: Send, *, static: bool) -> Send:
    # Pages show private data: never stored. Scripts and styles: revalidated (ETag).
    cache = b"no-cache" if static else b"no-store"
    return middleware.with_headers(send, {**SECURITY_HEADERS, b"cache-control": cache})


async def _answer(send: Send, status: int, body: bytes, *, location: str | None = None) -> None:
    """An answer given before the body was read: the connection is closed, not drained."""
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    if location is not None:
        headers.append((b"location", location.encode("latin-1")))
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
