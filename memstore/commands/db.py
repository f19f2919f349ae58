"""``memstore db``: migrations and connection facts, for either database."""

from __future__ import annotations

import click

from memstore import migrate
from memstore.cli_support import emit, json_option
from memstore.db import libpq_url, resolve_database_url


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
    migrate.upgrade(url, revision)
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
    """Print a libpq URL for psql and other tools."""
    address = libpq_url(resolve_database_url())
    emit(as_json, {"url": address}, lambda: address)
    return 0
