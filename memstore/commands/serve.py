"""``memstore serve``: the HTTP API on the configured (by default embedded) database."""

from __future__ import annotations

import argparse

from memstore.settings import get_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    settings = get_settings()
    serve = sub.add_parser("serve", help="run the HTTP API (migrations are applied first)")
    serve.add_argument("--host", default=settings.host, help="address to listen on (default %(default)s)")
    serve.add_argument("--port", type=int, default=settings.port, help="port (default %(default)s)")
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")
    serve.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from memstore import migrate
    from memstore.api.app import create_app
    from memstore.db import resolve_database_url
    from memstore.embedded import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    url = resolve_database_url()
    if not args.no_migrate:
        migrate.upgrade(url)
    print(f"memstore: serving on http://{args.host}:{args.port} (docs at /docs)", flush=True)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="info")
    return 0
