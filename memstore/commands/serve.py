"""``memstore serve``: the HTTP API, by default with the encoder and an ingest worker in process."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from typing import TYPE_CHECKING

from encoder.addresses import is_loopback
from memstore.settings import get_settings

if TYPE_CHECKING:
    from memstore.services.workers import ServiceContext

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    settings = get_settings()
    serve = sub.add_parser(
        "serve",
        help="run the HTTP API (migrations are applied first)",
        description="Run the REST API. By default the encoder model and one ingest worker run in this process "
        "on the embedded database; flags turn each part off or point at a remote encoder.",
    )
    serve.add_argument("--host", default=settings.host, help="address to listen on (default %(default)s)")
    serve.add_argument("--port", type=int, default=settings.port, help="port (default %(default)s)")
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    serve.add_argument(
        "--no-auth", action="store_true", help="accept requests without API keys (local use only: loopback hosts)"
    )
    serve.add_argument("--no-encoder", action="store_true", help="load no model: vector-only API, no worker")
    serve.add_argument("--encoder-url", metavar="URL", help="use the encoder service at URL instead of a local model")
    serve.add_argument("--no-worker", action="store_true", help="run no ingest worker (run `memstore worker` instead)")
    serve.add_argument("--workers", type=int, default=1, metavar="N", help="in-process ingest workers (default 1)")
    serve.add_argument("--maintenance", action="store_true", help="also run the index maintenance worker")
    serve.set_defaults(func=_serve)


class MaintenanceService:
    """The index maintenance worker as a thread of the API process (``serve --maintenance``). Composed
    here, in the command, so that ``memstore.api`` never imports ``maintenance``."""

    name = "maintenance"

    def start(self, context: ServiceContext) -> tuple[threading.Thread | None, str]:
        try:
            from maintenance.worker import MaintenanceWorker
        except ImportError as exc:
            log.warning("--maintenance: maintenance.worker is not installed here (%s); running without it", exc)
            return None, f"unavailable: {exc}"
        worker = MaintenanceWorker(context.engine, settings=context.settings, latency_source=context.latency_p99_ms)
        t = threading.Thread(target=worker.run_forever, args=(context.stop_event,), name="maintenance", daemon=True)
        t.start()
        return t, "running"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from memstore import migrate
    from memstore.api.app import create_app
    from memstore.api.runtime import RuntimeOptions
    from memstore.api.settings import ApiSettings
    from memstore.db import resolve_database_url
    from memstore.embedded import exit_cleanly_on_sigterm

    api = ApiSettings()
    if args.no_auth:
        api = api.model_copy(update={"auth": "off"})
    if api.auth == "off" and not is_loopback(args.host):
        print(
            f"memstore: refusing to serve without API keys on {args.host}: auth off is for loopback hosts only; "
            "create a key with `memstore keys create NAME --scope admin`",
            file=sys.stderr,
        )
        return 2
    if args.no_encoder and args.encoder_url:
        print("memstore: --no-encoder and --encoder-url contradict each other", file=sys.stderr)
        return 2
    workers = 0 if args.no_worker or args.no_encoder else max(0, args.workers)
    options = RuntimeOptions(
        encoder="none" if args.no_encoder else ("remote" if args.encoder_url else None),
        encoder_url=args.encoder_url,
        ingest_workers=workers,
        services=(MaintenanceService(),) if args.maintenance else (),
    )
    exit_cleanly_on_sigterm()
    url = resolve_database_url()
    if not args.no_migrate:
        migrate.upgrade(url)
    parts = [
        "auth " + ("OFF (local use)" if api.auth == "off" else "by API key"),
        "encoder " + ("none" if args.no_encoder else (args.encoder_url or "in process")),
        f"{workers} ingest worker(s)",
    ]
    if args.maintenance:
        parts.append("maintenance")
    print(f"memstore: serving on http://{args.host}:{args.port} ({', '.join(parts)}; docs at /docs)", flush=True)
    uvicorn.run(create_app(api_settings=api, options=options), host=args.host, port=args.port, log_level="info")
    return 0
