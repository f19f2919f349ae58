"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from memstore.db import get_engine, raw_connection
from memstore.migrate import VERSION_TABLE
from memstore.settings import Settings, get_settings
from memstore.store import VectorStore


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await run_in_threadpool(get_engine, settings)
        app.state.engine = engine
        app.state.store = VectorStore(engine, settings=settings)
        yield
        engine.dispose()

    app = FastAPI(title="memstore", version="0.1.0", lifespan=lifespan)

    @app.get("/health", tags=["operations"])
    async def health() -> JSONResponse:
        body = await run_in_threadpool(_database_health, app)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    return app


def _database_health(app: FastAPI) -> dict[str, Any]:
    try:
        with raw_connection(app.state.engine) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), "
                "(SELECT extversion FROM pg_extension WHERE extname = 'vector'), "
                f"(SELECT version_num FROM {VERSION_TABLE})"
            ).fetchone()
        assert row is not None
    except Exception as exc:
        return {"status": "unavailable", "database": {"error": str(exc)}}
    return {
        "status": "ok",
        "database": {"server_version": row[0], "pgvector": row[1], "revision": row[2]},
    }
