"""Bearer keys and scopes: 401 without a valid key, 403 outside its scopes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memstore.access.keys import ALL, ApiKey, Scope
from memstore.api.problems import Problem
from memstore.api.runtime import Runtime

bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `memstore keys create NAME --scope ROLE[:COLLECTION]`.",
)
# The identity of every request when auth is off (MEMSTORE_API_AUTH=off / serve --no-auth).
LOCAL = ApiKey(id=0, name="local (auth off)", prefix="", scopes=(Scope("admin", ALL),))


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def current_key(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
) -> ApiKey:
    """The key the front's AuthGate verified before the body was read (every /v1 route), else checked
    here. ``credentials`` documents the scheme in the OpenAPI schema; the header is read as it is."""
    return await key_from_header(request)


async def key_from_header(request: Request) -> ApiKey:
    """The same check without FastAPI's dependency machinery (for the search route, the hot path)."""
    verified = getattr(request.state, "api_key", None)
    if isinstance(verified, ApiKey):
        return verified
    return await authenticate(request, bearer_secret(request.headers.get("authorization", "")))


def bearer_secret(header: str) -> str | None:
    scheme, _, secret = header.partition(" ")
    return secret.strip() if scheme.lower() == "bearer" and secret.strip() else None


# For routes that call key_from_header: documents the same security requirement as Key.
SECURITY_DOC: dict[str, Any] = {"security": [{"HTTPBearer": []}]}


async def authenticate(request: Request, secret: str | None) -> ApiKey:
    return await authenticate_runtime(runtime(request), secret)


async def authenticate_runtime(rt: Runtime, secret: str | None) -> ApiKey:
    if rt.api.auth == "off":
        return LOCAL
    if secret is None:
        raise Problem(
            "unauthorized",
            "no API key: send 'Authorization: Bearer KEY' (create one with `memstore keys create NAME --scope admin`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    known, key = rt.verifier.cached(secret)
    if not known:
        key = await run_in_threadpool(rt.verifier.verify, secret)
    if key is None:
        raise Problem(
            "unauthorized",
            "the API key is unknown or revoked",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return key


Key = Annotated[ApiKey, Depends(current_key)]


def require(key: ApiKey, role: str, collection: str | None) -> None:
    """403 unless ``key`` has ``role`` on ``collection`` (None: on every collection)."""
    if not key.allows(role, collection):
        where = f"collection {collection!r}" if collection else "all collections"
        have = ", ".join(str(s) for s in key.scopes) or "none"
        raise Problem(
            "forbidden",
            f"key {key.name!r} needs {role} on {where}; its scopes are: {have}",
            required=f"{role}:{collection or ALL}",
        )
