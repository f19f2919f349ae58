"""The web pages of ``memstore serve``, under ``/ui``: collections, search, items, uploads and the
maintenance history, rendered on the server (Jinja2) with a few small script modules, all served by
this package (no CDN, no build step).

``install(app, inner)`` adds the routes and the static files to the app and returns ``inner`` behind
the pages' gate (``memstore.ui.gate``), which the app puts in its plain-ASGI front.

May import: encoder, memstore.access, memstore.action_log, memstore.api, memstore.catalog, memstore.errors,
memstore.inputs, memstore.items, memstore.media, memstore.models, memstore.queue, memstore.search,
memstore.settings, memstore.spaces, memstore.store.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import ASGIApp, Scope

from memstore.api.problems import Problem
from memstore.ui import browse, items, maintenance_page, signin, uploads
from memstore.ui.gate import UiGate
from memstore.ui.identity import Identity, LocalIdentity, identify
from memstore.ui.render import HERE, PageRoute

STATIC = "/ui/static"


def install(app: FastAPI, inner: ASGIApp) -> ASGIApp:
    app.mount(STATIC, StaticFiles(directory=str(HERE / "static")), name="ui-static")
    for module in (signin, browse, items, uploads, maintenance_page):
        app.include_router(module.router)
    app.include_router(_not_found)
    local = LocalIdentity()

    async def who(scope: Scope) -> Identity | None:
        return await identify(app.state.runtime, scope, local)

    return UiGate(inner, who)


# Last: any other /ui address is a page saying so, not the API's JSON 404.
_not_found = APIRouter(prefix="/ui", route_class=PageRoute, include_in_schema=False)


@_not_found.api_route("/{rest:path}", methods=["GET", "HEAD", "POST"])
async def not_found(request: Request, rest: str) -> Response:
    raise Problem("not-found", "there is no such page")


__all__ = ["install"]
