"""The REST API's application: ``build_app(settings)`` assembles routes, errors, limits and the runtime.

The served application is ``memstore.web.create_app``: this, with the web pages installed in it.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Receive, Scope, Send

from encoder.gc_freeze import freeze_startup
from memstore.access.keys import ApiKey, KeyVerifier
from memstore.api import problems
from memstore.api.auth import authenticate_runtime, key_from_header
from memstore.api.consistency import ReadYourWrites
from memstore.api.fastpath import SearchFastPath
from memstore.api.middleware import (
    AccessLog,
    AuthGate,
    BodyLimit,
    BodyTooLargeError,
    DocsHeaders,
    Metrics,
    too_large_detail,
)
from memstore.api.query_names import known_query_names
from memstore.api.routes import collections, items, load, search, spaces
from memstore.api.runtime import Runtime, RuntimeOptions
from memstore.api.search_guard import SearchGuard
from memstore.db import migrate, online_ddl
from memstore.db.core import get_database
from memstore.queue import jobs
from memstore.search.runner import AsyncSearcher
from memstore.services.query_sampler import QuerySampler
from memstore.settings import ApiSettings, IngestSettings, Settings, get_api_settings, get_ingest_settings, get_settings
from memstore.spaces.model_choice import models_of
from memstore.store import VectorStore

DESCRIPTION = """
A multimodal vector memory in PostgreSQL. Create a collection, add texts, images or vectors, search
by text, image, vector or a stored item. Every error is an RFC 9457 problem document whose `type`
links to an explanation. Authenticate with `Authorization: Bearer KEY`.
"""


def build_app(
    settings: Settings | None = None,
    *,
    api_settings: ApiSettings | None = None,
    ingest_settings: IngestSettings | None = None,
    options: RuntimeOptions | None = None,
    pages: Callable[[FastAPI, ASGIApp], ASGIApp] | None = None,
) -> FastAPI:
    """The API. ``pages(app, inner)`` installs other routes behind their own gate (the web pages,
    ``memstore.ui.install``) and returns ``inner`` behind that gate; None: the API alone."""
    settings = settings or get_settings()
    api = api_settings or get_api_settings()
    ingest = ingest_settings or get_ingest_settings()
    opts = options or RuntimeOptions()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        database = await run_in_threadpool(get_database, settings)
        rt = Runtime(
            settings=settings,
            api=api,
            ingest=ingest,
            db=database,
            store=VectorStore(database, settings=settings),
            verifier=KeyVerifier(database, ttl=api.key_cache_s),
            sampler=QuerySampler(database, api.query_sample_rate),
        )
        loop = asyncio.get_running_loop()
        rt.searcher = AsyncSearcher(
            rt.store,
            max_connections=settings.pool_size,
            run_blocking=lambda fn: loop.run_in_executor(rt.executor, fn),
        )
        app.state.runtime = rt
        try:
            rt.start(opts)
            freeze_startup("the API started", enabled=settings.gc_freeze)
            yield
        finally:
            await rt.searcher.close()
            await run_in_threadpool(rt.close)

    app = MemstoreAPI(
        title="memstore", version="0.1.0", description=DESCRIPTION, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    problems.install(app)
    serve_docs_locally(app)

    async def on_too_large(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, BodyTooLargeError)
        detail = too_large_detail(exc.limit, exc.kind)
        return problems.problem_response(request, problems.Problem("payload-too-large", detail))

    app.add_exception_handler(BodyTooLargeError, on_too_large)
    registry = CollectorRegistry()
    queue_figures = QueueFigures(api.metrics_cache_s)
    registry.register(_QueueCollector(app, queue_figures))
    registry.register(_ReplicaCollector(app))
    registry.register(_SearchCollector(app))
    registry.register(_ForegroundCollector(app))

    async def authenticate(secret: str | None) -> ApiKey:
        return await authenticate_runtime(app.state.runtime, secret)

    # The key first (a stranger learns nothing, not even the limits), then the route's body limit.
    # Searches: at most so many per key at once, and cancelled when their client goes away.
    per_key = api.searches_per_key if api.searches_per_key is not None else max(1, settings.pool_size // 2)
    limited = BodyLimit(SearchGuard(SearchFastPath(app.dispatch, fastapi_app=app), per_key), api)
    # Write answers carry their WAL position; reads given one see those writes (memstore.api.consistency).
    consistent = ReadYourWrites(limited, lambda: app.state.runtime.store.db)
    # The web pages (/ui) check their session cookie in their own gate, also before any body.
    gated = AuthGate(consistent if pages is None else pages(app, consistent), authenticate)
    access = AccessLog(api.access_log_every) if api.access_log == "sampled" else None
    app.front = Metrics(DocsHeaders(gated, lambda: str(app.state.docs_policy)), registry=registry, access=access)
    # Routes are matched in order: the hot path (search) first.
    # Every /v1 route refuses query parameters it does not declare (memstore.api.query_names).
    for router in (search.router, collections.router, items.router, load.router, spaces.router):
        app.include_router(router, dependencies=[Depends(known_query_names)])

    @app.get(
        "/v1/models",
        tags=["operations"],
        summary="The models this server's encoder runs (any valid key)",
        dependencies=[Depends(known_query_names)],
    )
    async def models() -> dict[str, Any]:
        """Every model the encoder runs or is loading, the default first: what a collection or a space
        may be created with (``"model"``), with what its vectors depend on once it is loaded."""
        host = app.state.runtime.encoder
        data: list[dict[str, Any]] = []
        if host.backend is not None:
            data = [{"id": name, **info.as_dict()} for name, info in models_of(host.backend).items()]
        else:
            for name in host.running_models():
                known = host.model_dimensions(name)
                data.append({"id": name, "dimensions": None if known is None else known[1]})
        return {"object": "list", "state": host.state, "data": data}

    @app.get("/health", tags=["operations"], summary="Liveness; with a key: database, encoder and workers")
    async def health(request: Request) -> JSONResponse:
        """``status`` is ``ok``, ``starting`` (serving, while the encoder loads its model; 200),
        ``degraded`` (serving, but a part failed: ``reasons`` says which; 200) or ``unavailable``
        (the database is unreachable; 503). Versions, the model, the queue and
        the workers are shown to a valid key of any scope only (or to everyone with
        MEMSTORE_API_HEALTH_DETAIL=public): they map the deployment for an attacker."""
        rt: Runtime = app.state.runtime
        detailed = rt.api.health_detail == "public"
        if not detailed:
            try:
                await key_from_header(request)
                detailed = True
            except Exception:  # no key, a bad one, or no database to verify it in: liveness only
                pass
        body = await run_in_threadpool(_health, rt, detailed)
        return JSONResponse(body, status_code=503 if body["status"] == "unavailable" else 200)

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        """The bare address opens the web pages (which ask for a key when there is no session). The
        target is relative, so that it holds behind a proxy serving memstore under a path."""
        return RedirectResponse("ui/", status_code=307)

    @app.get("/metrics", tags=["operations"], summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        """Needs no key. The queue's figures are read from the database at most once every
        MEMSTORE_API_METRICS_CACHE_S (5 s), off the event loop, one reading at a time; everything
        else is this process's own counters."""
        rt: Runtime = app.state.runtime
        await queue_figures.refresh(rt)
        text = generate_latest(registry)
        engine_metrics = getattr(rt.encoder.backend, "metrics", None)
        if engine_metrics is not None and hasattr(engine_metrics, "registry"):
            text += generate_latest(engine_metrics.registry)
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    return app


DOCS_ASSETS = "/docs/assets"


def serve_docs_locally(app: FastAPI) -> None:
    """/docs with Swagger UI from the swagger-ui-bundle package, not a CDN: it works on an offline
    machine, and an admin page runs no third-party script. (ReDoc has no such package: not served.)"""
    from swagger_ui_bundle import swagger_ui_path

    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")
    page = get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json",
        title=f"{app.title} API",
        swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        # No badge image from validator.swagger.io: the page loads nothing from another site.
        swagger_ui_parameters={"validatorUrl": None},
    )
    html = bytes(page.body)
    app.state.docs_policy = docs_policy(html)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(html)


def docs_policy(html: bytes) -> str:
    """The Content-Security-Policy of /docs: its scripts, styles and images from this server only, and
    its one inline script (Swagger UI's start) by its hash, so no other inline script can run."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"
        for script in re.findall(rb"<script>(.*?)</script>", html, flags=re.DOTALL)
    )
    return (
        f"default-src 'none'; script-src 'self' {hashes}; style-src 'self'; img-src 'self' data:; "
        "font-src 'self'; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    )


class MemstoreAPI(FastAPI):
    """FastAPI behind a short front of plain ASGI layers: body limit, metrics, the search fast path.

    The front runs before Starlette's own middleware stack (error pages, exception handlers,
    routing), so JSON searches, the hot route, skip it entirely; every other request passes
    through the front and then into FastAPI as usual.
    """

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await (self.front or self.dispatch)(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


class _RuntimeCollector(Collector):
    """A collector of the app's runtime state, read at scrape time; nothing before the runtime exists."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Any:
        rt: Runtime | None = getattr(self.app.state, "runtime", None)
        return iter(()) if rt is None else self.families(rt)

    def families(self, rt: Runtime) -> Iterator[Metric]:
        raise NotImplementedError


class QueueFigures:
    """The ingest queue's depth as /metrics shows it: read at most once every ``ttl_s`` (a GROUP BY
    over the queue; /metrics needs no key, so its callers must not be able to make the database or
    the event loop do it at will), in the executor, one reading at a time (concurrent scrapes wait for
    the reading in progress and share it)."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.depth: dict[str, int] | None = None  # None: not read yet, or the last reading failed
        self.read_at = -float("inf")
        self.readings = 0
        self._lock: asyncio.Lock | None = None

    async def refresh(self, rt: Runtime) -> None:
        if time.monotonic() - self.read_at < self.ttl_s:
            return
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self.read_at < self.ttl_s:
                return  # read meanwhile, by the scrape this one waited for
            try:
                self.depth = await rt.off_loop(jobs.queue_depth, rt.db)
            except Exception:
                self.depth = None
            self.readings += 1
            self.read_at = time.monotonic()


class _QueueCollector(_RuntimeCollector):
    """The ingest queue's depth, as last read (``QueueFigures``): nothing is read at scrape time."""

    def __init__(self, app: FastAPI, figures: QueueFigures) -> None:
        super().__init__(app)
        self.figures = figures

    def families(self, rt: Runtime) -> Iterator[Metric]:
        depth = self.figures.depth
        if depth is None:
            return
        family = GaugeMetricFamily("memstore_ingest_queue_items", "Queued items by status", labels=["status"])
        for status, n in depth.items():
            family.add_metric([status], n)
        yield family


class _SearchCollector(_RuntimeCollector):
    """How many searches needed a second walk of the graph (``VectorStore.second_walks``): no label,
    so /metrics, which needs no key, names no collection."""

    def families(self, rt: Runtime) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "memstore_search_second_walks",
            "Searches run a second time with pgvector's iterative scan because one walk of the graph came back "
            "short (rows deleted or replaced since the last vacuum, or fewer rows than asked)",
            value=rt.store.second_walks,
        )


class _ForegroundCollector(_RuntimeCollector):
    """The foreground controller (``memstore.services.foreground``): the share of capacity background
    work may use, its back-offs and the search p99 it steers by."""

    def families(self, rt: Runtime) -> Iterator[Metric]:
        state = rt.foreground.state()
        yield GaugeMetricFamily(
            "memstore_background_share",
            "Share of the process's capacity background work (ingest, re-embedding, OCR, photo facts) may use now",
            value=state["background_share"],
        )
        yield CounterMetricFamily(
            "memstore_background_backoffs",
            "Times background work was cut back because search p99 exceeded its target",
            value=state["backoffs"],
        )
        for name, key, what in (
            ("memstore_foreground_search_p99_seconds", "search_p99_ms", "Search p99 over the controller's last window"),
            ("memstore_foreground_target_p99_seconds", "target_p99_ms", "The search p99 the controller steers by"),
        ):
            value = state[key]
            yield GaugeMetricFamily(name, what, value=float("nan") if value is None else value / 1000.0)
        waiting = GaugeMetricFamily("memstore_background_units", "Units of background work", labels=["state"])
        waiting.add_metric(["running"], state["units_running"])
        waiting.add_metric(["waiting"], state["units_waiting"])
        waiting.add_metric(["unpaced"], state["unpaced_running"])  # maintenance statements under way
        yield waiting


class _ReplicaCollector(_RuntimeCollector):
    """Each read replica's state as its last probe found it (no query at scrape time). A replica is
    labelled by its place in MEMSTORE_READ_DATABASE_URLS (0, 1, ...): /metrics needs no key, so
    it names no host."""

    def families(self, rt: Runtime) -> Iterator[Metric]:
        if not rt.store.db.replicas:
            return
        db = rt.store.db
        healthy = GaugeMetricFamily(
            "memstore_replica_healthy",
            "1 when the read replica serves reads, 0 when it is taken out",
            labels=["replica"],
        )
        lag = GaugeMetricFamily(
            "memstore_replica_lag_seconds",
            "How far the read replica's replay is behind (last probe)",
            labels=["replica"],
        )
        reads = CounterMetricFamily("memstore_replica_reads", "Reads served by the read replica", labels=["replica"])
        conflicts = CounterMetricFamily(
            "memstore_replica_conflicts",
            "Reads the read replica cancelled for a recovery conflict (each run again on the primary)",
            labels=["replica"],
        )
        for i, replica in enumerate(db.replicas):
            healthy.add_metric([str(i)], 1.0 if replica.healthy else 0.0)
            lag.add_metric([str(i)], float("nan") if replica.lag_s is None else replica.lag_s)
            reads.add_metric([str(i)], replica.reads)
            conflicts.add_metric([str(i)], replica.conflicts)
        yield healthy
        yield lag
        yield reads
        yield conflicts
        yield CounterMetricFamily(
            "memstore_primary_reads",
            "Reads served by the primary although read replicas are configured",
            value=db.primary_reads,
        )


def _health(rt: Runtime, detailed: bool) -> dict[str, Any]:
    """Status and reasons for everyone; with ``detailed``, what runs (the queue is read only then).

    The status is the worst that holds: ``unavailable`` (no database), ``degraded`` (a part failed),
    ``starting`` (the model still loads), ``ok``."""
    reasons: list[str] = []  # short and fixed: shown to everyone, so no error text, path or version
    body: dict[str, Any] = {"status": "ok", "reasons": reasons, "auth": rt.api.auth}
    unavailable = degraded = False
    try:
        body["database"] = migrate.database_facts(rt.db)
        if detailed:
            body["queue"] = jobs.queue_depth(rt.db)
    except Exception as exc:
        unavailable = True
        body["database"] = {"error": str(exc)}
        reasons.append("the database is unreachable")
    encoder, state = rt.encoder, rt.encoder.state  # read once: the loading thread may change it meanwhile
    body["encoder"] = {"state": state}
    if state == "loading":
        # Not "ok": a client that waits for "ok" before its first text search would get a 503.
        reasons.append("the encoder is still loading its model: text and image items and searches wait for it")
    if state == "failed":
        degraded = True
        reasons.append("the encoder failed to start: text and image items and searches are refused")
    backend = encoder.backend
    if backend is not None:
        body["encoder"].update(backend.info.as_dict())
    elif encoder.error:
        body["encoder"]["error"] = encoder.error
    replicas = rt.store.db.states()
    if replicas and not any(r["healthy"] for r in replicas):
        degraded = True
        reasons.append("no read replica is serving: reads go to the primary")
    body["status"] = (
        "unavailable" if unavailable else "degraded" if degraded else "starting" if state == "loading" else "ok"
    )
    if not detailed:
        return {"status": body["status"], "reasons": reasons}
    if replicas:
        body["replicas"] = replicas
    body["workers"] = {
        "ingest": len(rt.workers.threads),  # running: in-process workers start once the encoder is ready
        "ingest_configured": rt.workers.configured,
        "alive": sum(t.is_alive() for t in rt.threads()),
        "maintenance": rt.notes.get("maintenance", "off"),
    }
    # the parallel workers a seal, merge or rebuild starting at a full share takes (the share scales them)
    body["foreground"] = rt.foreground.state() | {
        "background_build_workers": online_ddl.background_build_workers(rt.store.settings)
    }
    body["gc"] = {"frozen_objects": gc.get_freeze_count()}  # start-up objects kept out (encoder.gc_freeze)
    return body
