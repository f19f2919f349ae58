"""Who is asking: the session cookie's key (or everyone, as the local admin, with auth off), and the
CSRF token every change must carry.

Cookies are HttpOnly (no script reads them) and SameSite=Strict (no other site's page sends them).
Over plain HTTP (a local server) they are scoped to ``/ui``. Over HTTPS (``scope["scheme"]``, which
behind a proxy comes from its trusted ``X-Forwarded-Proto``) they take ``__Host-`` names: the browser
then keeps them Secure, for this host alone and for the path ``/``, and refuses such a cookie set by
another host of the site or over HTTP (a sibling subdomain cannot plant one); the API ignores them.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool
from starlette.requests import Request, cookie_parser
from starlette.responses import Response

from memstore.access import ui_sessions
from memstore.access.keys import ApiKey
from memstore.api.auth import LOCAL
from memstore.api.problems import Problem
from memstore.api.runtime import Runtime

SESSION_COOKIE = "memstore_session"
SIGNIN_COOKIE = "memstore_signin"  # the sign-in form's own CSRF secret (there is no session yet)
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
COOKIE_PATH = "/ui"


@dataclass(frozen=True)
class Identity:
    key: ApiKey
    csrf: str  # the token forms and scripts send back
    session_token: str | None  # None with auth off

    @property
    def signed_in(self) -> bool:
        return self.session_token is not None


class LocalIdentity:
    """With auth off there is no session, yet a page of another site could still post to this one on
    the user's machine: every change still carries a token, a random one per process."""

    def __init__(self) -> None:
        self.identity = Identity(key=LOCAL, csrf=ui_sessions.csrf_token(secrets.token_urlsafe(32)), session_token=None)


HOST_PREFIX = "__Host-"


def is_https(scope: MutableMapping[str, Any]) -> bool:
    return scope.get("scheme") == "https"


def cookie_name(scope: MutableMapping[str, Any], name: str) -> str:
    """The name a cookie goes by on this request: ``__Host-`` prefixed over HTTPS."""
    return HOST_PREFIX + name if is_https(scope) else name


def cookie_of(scope: MutableMapping[str, Any], name: str) -> str | None:
    """The cookie ``name`` under the name this request's scheme gives it (over HTTPS only the
    ``__Host-`` one counts: a plain one may have been set by another host of the site)."""
    return cookies_of(scope).get(cookie_name(scope, name))


def cookies_of(scope: MutableMapping[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name == b"cookie":
            found.update(cookie_parser(value.decode("latin-1")))
    return found


async def identify(rt: Runtime, scope: MutableMapping[str, Any], local: LocalIdentity) -> Identity | None:
    """The identity of a request from its headers alone (nothing of the body is read)."""
    if rt.api.auth == "off":
        return local.identity
    token = cookie_of(scope, SESSION_COOKIE)
    if not token:
        return None
    session = await run_in_threadpool(ui_sessions.find, rt.db, token)
    if session is None:
        return None
    return Identity(key=session.key, csrf=ui_sessions.csrf_token(token), session_token=token)


def current(request: Request) -> Identity:
    """The identity the gate put on the request (every page but the sign-in page has one)."""
    identity = request.scope.get("state", {}).get("ui_identity")
    if not isinstance(identity, Identity):
        raise Problem("unauthorized", "sign in first")
    return identity


def same_token(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def check_csrf_field(request: Request, identity: Identity, given: Any) -> None:
    """A form's token, unless the gate has already checked the request's header (scripts send that)."""
    if request.scope.get("state", {}).get("csrf_checked"):
        return
    if not same_token(identity.csrf, given if isinstance(given, str) else None):
        raise Problem("forbidden", "the form's security token is missing or stale: reload the page and try again")


def set_cookie(request: Request, response: Response, name: str, value: str, *, max_age: int | None) -> None:
    """``name`` (``SESSION_COOKIE``, ``SIGNIN_COOKIE``) under the name and path the request's scheme
    gives it (see the module)."""
    https = is_https(request.scope)
    response.set_cookie(
        cookie_name(request.scope, name),
        value,
        max_age=max_age,
        path="/" if https else COOKIE_PATH,  # a __Host- cookie must have the path /
        httponly=True,
        samesite="strict",
        secure=https,
    )


def clear_cookie(request: Request, response: Response, name: str) -> None:
    https = is_https(request.scope)
    response.delete_cookie(
        cookie_name(request.scope, name),
        path="/" if https else COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=https,
    )
