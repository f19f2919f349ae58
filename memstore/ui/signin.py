"""Signing in (an API key exchanged for a session cookie) and out."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from urllib.parse import unquote

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from memstore.access import ui_sessions
from memstore.api.problems import Problem
from memstore.settings import get_ui_settings
from memstore.ui.access import runtime
from memstore.ui.identity import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    check_csrf_field,
    clear_cookie,
    cookie_of,
    current,
    same_token,
    set_cookie,
)
from memstore.ui.render import PageRoute, base_path, page

router = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)
SIGNIN_COOKIE_S = 3600


def safe_next(request: Request, value: str | None) -> str:
    """Where to go after signing in: a page of this UI only (never another site: no open redirect)."""
    home = base_path(request) + "/"
    if value is None or not is_ui_page(value):
        return home
    return str(request.scope.get("root_path", "")) + value


def is_ui_page(value: str) -> bool:
    """Whether ``value`` is a path under ``/ui/`` as a browser resolves it: a plain absolute path
    (no scheme, host or backslash; no control characters or spaces, which browsers strip or read as
    separators) whose segments hold no dot segment, written plainly or percent-encoded (``..``,
    ``%2e%2e``, ``.%2E``): ``/ui/../docs`` would leave the web pages."""
    if len(value) > 2000 or not value.startswith("/ui/"):
        return False
    if any(ch <= " " or ch == "\x7f" or ch == "\\" for ch in value):
        return False
    path = value.split("?", 1)[0].split("#", 1)[0]
    decoded = unquote(path)
    if "\\" in decoded or "//" in decoded or any(ch < " " for ch in decoded):
        return False
    segments = [unquote(segment) for segment in path.split("/")]
    return all(segment not in (".", "..") for segment in segments)


# Signs the sign-in form's pre-session when MEMSTORE_API_SIGNING_KEY is unset (then a form opened on
# one process of several behind a balancer is refused by another: set the key there).
_PROCESS_KEY = secrets.token_bytes(32)


def _server_key(request: Request) -> bytes:
    configured = runtime(request).api.signing_key
    return configured.get_secret_value().encode() if configured is not None else _PROCESS_KEY


def _mac(key: bytes, *parts: str) -> str:
    digest = hmac.new(key, "\x00".join(parts).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def issue_presession(key: bytes, now: float) -> tuple[str, str]:
    """A pre-session for the sign-in form: the cookie's value (a random nonce and an expiry, signed with
    the server's key: a client cannot choose one) and the form's CSRF token (bound to that nonce)."""
    nonce = secrets.token_urlsafe(24)
    expires = str(int(now) + SIGNIN_COOKIE_S)
    return f"{nonce}.{expires}.{_mac(key, 'signin', nonce, expires)}", _mac(key, "signin-csrf", nonce)


def presession_csrf(key: bytes, value: str, now: float) -> str | None:
    """The CSRF token that goes with the pre-session cookie ``value``; None unless the server issued
    it (its signature) and it has not expired."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    nonce, expires, signature = parts
    if not same_token(_mac(key, "signin", nonce, expires), signature) or int(expires) < now:
        return None
    return _mac(key, "signin-csrf", nonce)


def _signin_form(request: Request, *, next_page: str, error: str | None = None, status_code: int = 200) -> Response:
    cookie, csrf = issue_presession(_server_key(request), time.time())
    response = page(
        request,
        "signin.html",
        identity=None,
        status_code=status_code,
        signin_csrf=csrf,
        next_page=next_page,
        error=error,
    )
    set_cookie(request, response, SIGNIN_COOKIE, cookie, max_age=SIGNIN_COOKIE_S)
    return response


@router.get("/signin")
async def signin_form(request: Request, next: str | None = None) -> Response:
    if runtime(request).api.auth == "off":
        return RedirectResponse(safe_next(request, next), status_code=303)
    return _signin_form(request, next_page=next or "")


@router.post("/signin")
async def signin(request: Request) -> Response:
    rt = runtime(request)
    if rt.api.auth == "off":
        return RedirectResponse(base_path(request) + "/", status_code=303)
    cookie = cookie_of(request.scope, SIGNIN_COOKIE)
    expected = presession_csrf(_server_key(request), cookie, time.time()) if cookie else None
    if expected is None:  # checked before the body is read
        raise Problem("forbidden", "the sign-in form expired or came from elsewhere: open it again and retry")
    form = await request.form(max_files=0, max_fields=8)
    key, csrf, next_page = (_field(form.get(name)) for name in ("key", CSRF_FIELD, "next"))
    if not same_token(expected, csrf):
        # Login CSRF: another site's page cannot sign this browser in under its own key.
        raise Problem("forbidden", "the sign-in form expired or came from elsewhere: open it again and retry")
    found = await run_in_threadpool(rt.verifier.verify, key.strip()) if key.strip() else None
    if found is None:
        return _signin_form(request, next_page=next_page, error="That key is unknown or revoked.", status_code=401)
    hours = get_ui_settings().session_hours
    token = await run_in_threadpool(lambda: ui_sessions.create(rt.db, key_id=found.id, hours=hours))
    response = RedirectResponse(safe_next(request, next_page), status_code=303)
    set_cookie(request, response, SESSION_COOKIE, token, max_age=int(hours * 3600))
    clear_cookie(request, response, SIGNIN_COOKIE)
    return response


def _field(value: object, limit: int = 2000) -> str:
    return value[:limit] if isinstance(value, str) else ""


@router.post("/signout")
async def signout(request: Request) -> Response:
    identity = current(request)
    form = await request.form(max_files=0, max_fields=4)
    check_csrf_field(request, identity, form.get(CSRF_FIELD))
    if identity.session_token is not None:
        await run_in_threadpool(ui_sessions.end, runtime(request).db, identity.session_token)
    response = RedirectResponse(base_path(request) + "/signin?notice=signed-out", status_code=303)
    clear_cookie(request, response, SESSION_COOKIE)
    return response
