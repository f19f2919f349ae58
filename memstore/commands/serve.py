"""``memstore serve``: the HTTP API, by default with the encoder and an ingest worker in process."""

from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import TYPE_CHECKING

import click

from encoder.addresses import is_loopback
from encoder.cli_support import EXIT_USAGE, SettingDefault, exit_cleanly_on_sigterm
from memstore.settings import get_settings

if TYPE_CHECKING:
    from memstore.services.workers import ServiceContext

log = logging.getLogger(__name__)


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
        from memstore.db.core import get_database

        # The primary alone (its pool is the API's): maintenance acts on the primary and measures there.
        db = get_database(context.settings, replicas=False)
        worker = MaintenanceWorker(
            db, settings=context.settings, latency_source=context.latency_p99_ms, pace=context.pace
        )
        t = threading.Thread(target=worker.run_forever, args=(context.stop_event,), name="maintenance", daemon=True)
        t.start()
        return t, "running"


@click.command("serve", short_help="run the HTTP API (migrations are applied first)")
@click.option(
    "--host",
    metavar="ADDRESS",
    cls=SettingDefault,
    default=lambda: get_settings().host,
    help="address to listen on (MEMSTORE_HOST)",
)
@click.option(
    "--port",
    metavar="PORT",
    cls=SettingDefault,
    type=int,
    default=lambda: get_settings().port,
    help="port (MEMSTORE_PORT)",
)
@click.option("--no-migrate", is_flag=True, help="do not apply migrations at start")
@click.option("--no-auth", is_flag=True, help="accept requests without API keys (local use only: loopback hosts)")
@click.option("--no-encoder", is_flag=True, help="load no model: vector-only API, no worker")
@click.option("--encoder-url", metavar="URL", help="use the encoder service at URL instead of a local model")
@click.option("--no-worker", is_flag=True, help="run no ingest worker (run `memstore worker` instead)")
@click.option("--workers", type=int, default=1, metavar="N", help="in-process ingest workers")
@click.option("--maintenance", is_flag=True, help="also run the index maintenance worker")
def command(
    host: str,
    port: int,
    no_migrate: bool,
    no_auth: bool,
    no_encoder: bool,
    encoder_url: str | None,
    no_worker: bool,
    workers: int,
    maintenance: bool,
) -> int:
    """Run the REST API. By default the encoder model and one ingest worker run in this process on
    the embedded database; flags turn each part off or point at a remote encoder."""
    # Before the database, the migrations and the model: a taken port would otherwise be found only
    # after all of them.
    refusal = _cannot_listen(host, port)
    if refusal:
        click.echo(f"memstore: {refusal}", err=True)
        return EXIT_USAGE
    from memstore.api.http_limits import run_server
    from memstore.api.runtime import RuntimeOptions
    from memstore.db import migrate
    from memstore.db.core import resolve_database_url
    from memstore.settings import get_api_settings
    from memstore.web import create_app

    api = get_api_settings()
    if no_auth:
        api = api.model_copy(update={"auth": "off"})
    if api.auth == "off" and not is_loopback(host):
        click.echo(
            f"memstore: refusing to serve without API keys on {host}: auth off is for loopback hosts only; "
            "create a key with `memstore keys create NAME --scope admin`",
            err=True,
        )
        return EXIT_USAGE
    if no_encoder and encoder_url:
        click.echo("memstore: --no-encoder and --encoder-url contradict each other", err=True)
        return EXIT_USAGE
    ingest_workers = 0 if no_worker or no_encoder else max(0, workers)
    options = RuntimeOptions(
        encoder="none" if no_encoder else ("remote" if encoder_url else None),
        encoder_url=encoder_url,
        ingest_workers=ingest_workers,
        services=(MaintenanceService(),) if maintenance else (),
    )
    exit_cleanly_on_sigterm()
    url = resolve_database_url()
    if not no_migrate:
        migrate.upgrade(url)
    parts = [
        "auth " + ("OFF (local use)" if api.auth == "off" else "by API key"),
        "encoder " + ("none" if no_encoder else (encoder_url or "in process")),
        f"{ingest_workers} ingest worker(s)",
    ]
    if maintenance:
        parts.append("maintenance")
    # Not yet listening: uvicorn binds after the app's start-up and logs "Uvicorn running on" then.
    click.echo(f"memstore: starting on http://{host}:{port} ({', '.join(parts)}; docs at /docs)")
    # uvicorn on uvloop with the guarded protocol: a bounded request head, a deadline for it, a
    # keep-alive timeout (memstore.api.http_limits; MEMSTORE_API_MAX_HEAD_BYTES and the rest), and
    # the access log as MEMSTORE_API_ACCESS_LOG says (all, sampled or off).
    run_server(create_app(api_settings=api, options=options), api, host=host, port=port, log_level="info")
    return 0


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None. Bound as uvicorn binds it (SO_REUSEADDR, so a
    port left in TIME_WAIT by a previous run counts as free) and closed at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use; choose another with --port (MEMSTORE_PORT)"
            reason = exc.strerror or exc
            return f"cannot listen on {host}:{port} ({reason}); check --host (MEMSTORE_HOST) and --port (MEMSTORE_PORT)"
    return None
