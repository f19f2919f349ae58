"""Rendering: the Jinja2 environment, the page helper, and error pages for the page routes.

Autoescaping is on for every template (not only ``.html`` names): metadata, file names, texts and
error details are other people's input, and escaping is what keeps them text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import jinja2
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from memstore.api.middleware import BodyTooLargeError, too_large_detail
from memstore.api.problems import CATALOG, Problem, from_exception
from memstore.ui.identity import Identity, current

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the page (and its test), never renders empty
    trim_blocks=True,
    lstrip_blocks=True,
)
# Messages after a redirect, by code: the query string names one, it never carries the text itself.
NOTICES = {
    "saved": "Metadata saved.",
    "deleted": "The item was deleted.",
    "signed-out": "You are signed out.",
    "probe": "A probe was requested: the maintenance worker takes it on its next pass.",
    "session-ended": "Your session ended: sign in again.",
}


def human_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def short_value(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


ENV.filters["bytes"] = human_bytes
ENV.filters["pretty_json"] = pretty_json
ENV.filters["short"] = short_value


def base_path(request: Request) -> str:
    """Where the pages live, behind a proxy's root path too (links never use the Host header)."""
    return str(request.scope.get("root_path", "")) + "/ui"


def page(
    request: Request,
    template: str,
    *,
    identity: Identity | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    notice = NOTICES.get(request.query_params.get("notice", ""))
    rt = getattr(request.app.state, "runtime", None)
    body = ENV.get_template(template).render(
        ui=base_path(request),
        identity=identity,
        csrf=identity.csrf if identity else "",
        notice=notice,
        encoder_state=rt.encoder.state if rt is not None else "off",
        **context,
    )
    return HTMLResponse(body, status_code=status_code)


def error_page(request: Request, problem: Problem) -> HTMLResponse:
    try:
        identity: Identity | None = current(request)
    except Problem:
        identity = None
    _, title, _ = CATALOG.get(problem.slug, (problem.status, "Error", ""))
    return page(
        request,
        "error.html",
        identity=identity,
        status_code=problem.status,
        title=title,
        detail=problem.detail,
        status=problem.status,
    )


def plain_page(
    root_path: str, *, status: int, title: str, detail: str, link: str | None = None, link_text: str = ""
) -> bytes:
    """An error page for the front (``memstore.ui.gate``), which answers before any route, so without a
    request or a session: no navigation, and ``link`` (an address of these pages) as its way on."""
    extra = {"link": link, "link_text": link_text} if link is not None else {}
    return (
        ENV.get_template("error.html")
        .render(
            ui=root_path + "/ui",
            identity=None,
            csrf="",
            notice=None,
            encoder_state="off",
            title=title,
            detail=detail,
            status=status,
            **extra,
        )
        .encode()
    )


def http_problem(exc: HTTPException) -> Problem:
    """Starlette's own refusals (a body over the route's limit read in chunks, a form it cannot parse)."""
    if isinstance(exc, BodyTooLargeError):
        return Problem("payload-too-large", too_large_detail(exc.limit, exc.kind))
    if exc.status_code == 413:
        slug = "payload-too-large"
    else:
        slug = "malformed-request" if exc.status_code < 500 else "internal-error"
    return Problem(slug, str(exc.detail), status=exc.status_code)


class PageRoute(APIRoute):
    """A route whose errors are pages (the API's mapping of exceptions to statuses, shown as HTML)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                fields = ", ".join(str(e.get("loc", ("?",))[-1]) for e in exc.errors()[:3])
                problem = Problem("not-found", f"no such page: {fields} is not valid here")
                return error_page(request, problem)
            except HTTPException as exc:
                return error_page(request, http_problem(exc))
            except Exception as exc:
                return error_page(request, from_exception(exc))

        return answer
