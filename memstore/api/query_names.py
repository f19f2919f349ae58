"""Query parameters a route does not know are refused, not ignored.

A misspelt or unsupported parameter (``GET .../items?filter=...`` before listings took a filter,
``?limt=5``) used to be dropped silently, so the client got an answer to another question than the
one it asked. Every ``/v1`` route refuses a parameter it does not declare with a 422 that names it
and the ones the route takes. ``min_lsn`` (read-your-writes, ``memstore.api.consistency``) is taken
by every route.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import Request
from fastapi.dependencies.models import Dependant

from memstore.api.consistency import MIN_LSN_PARAMETER
from memstore.errors import InvalidInputError

EVERYWHERE = frozenset({MIN_LSN_PARAMETER})
_known: dict[int, frozenset[str]] = {}


def check(given: Iterable[str], allowed: frozenset[str]) -> None:
    unknown = sorted({name for name in given if name not in allowed and name not in EVERYWHERE})
    if unknown:
        takes = ", ".join(sorted(allowed | EVERYWHERE))
        raise InvalidInputError(
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))[:300]}; "
            f"this route takes: {takes}"
        )


def _declared(dependant: Dependant) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _declared(sub)
    return names


async def known_query_names(request: Request) -> None:
    """A router dependency: the request's query parameters are ones its route declares."""
    if not request.url.query:
        return
    route: Any = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    allowed = _known.get(id(route))
    if allowed is None:
        allowed = _known[id(route)] = frozenset(_declared(dependant))
    check(request.query_params.keys(), allowed)
