"""Signing in (an API key exchanged for a session cookie) and out."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse, Response

from memstore import ui_sessions
from memstore.api.problems import Problem
from memstore.ui.access import runtime
from memstore.ui.identity import (
    CSRF_FIELD,
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    check_csrf_field,
    clear_cookie,
    current,
    same_token,
    set_cookie,
)
from memstore.ui.render import PageRoute, base_path, page
from memstore.ui.settings import ui_settings

router = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)
SIGNIN_COOKIE_S = 3600


def safe_next(request: Request, value: str | None) -> str:
    """Where to go after signing in: a page of this UI only (never another site: no open redirect)."""
    home = base_path(request) + "/"
    if not value or not value.startswith("/ui/") or value.startswith("//") or "\\" in value:
        return home
    return str(request.scope.get("root_path", "")) + value


def _signin_form(request: Request, *, next_page: str, error: str | None = None, status_code: int = 200) -> Response:
    secret = secrets.token_urlsafe(32)
    response = page(
        request,
        "signin.html",
        identity=None,
        status_code=status_code,
        signin_csrf=ui_sessions.csrf_token(secret),
        next_page=next_page,
        error=error,
    )
    set_cookie(request, response, SIGNIN_COOKIE, secret, max_age=SIGNIN_COOKIE_S)
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
    secret = request.cookies.get(SIGNIN_COOKIE)
    if not secret:  # checked before the body is read
        raise Problem("forbidden", "the sign-in form expired or came from elsewhere: open it again and retry")
    form = await request.form(max_files=0, max_fields=8)
    key, csrf, next_page = (_field(form.get(name)) for name in ("key", CSRF_FIELD, "next"))
    if not same_token(ui_sessions.csrf_token(secret), csrf):
        # Login CSRF: another site's page cannot sign this browser in under its own key.
        raise Problem("forbidden", "the sign-in form expired or came from elsewhere: open it again and retry")
    found = await run_in_threadpool(rt.verifier.verify, key.strip()) if key.strip() else None
    if found is None:
        return _signin_form(request, next_page=next_page, error="That key is unknown or revoked.", status_code=401)
    hours = ui_settings().session_hours
    token = await run_in_threadpool(lambda: ui_sessions.create(rt.engine, key_id=found.id, hours=hours))
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
        await run_in_threadpool(ui_sessions.end, runtime(request).engine, identity.session_token)
    response = RedirectResponse(base_path(request) + "/signin?notice=signed-out", status_code=303)
    clear_cookie(request, response, SESSION_COOKIE)
    return response
