"""The ``memstore`` command: one click group; each subcommand lives in a module of memstore.commands."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

import click
import psycopg
import sqlalchemy as sa

from encoder.cli_support import CONTEXT_SETTINGS, EXIT_USAGE, run
from memstore.errors import MemstoreError

# Each module defines ``command``: a click command or group, added here under its own name.
COMMAND_MODULES = (
    "memstore.commands.serve",
    "memstore.commands.db",
    "memstore.commands.keys",
    "memstore.commands.worker",
    "memstore.commands.ingest",
    "memstore.commands.load",
    "memstore.commands.search",
    "memstore.commands.spaces",
)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.option("-v", "--verbose", is_flag=True, help="log more")
def cli(verbose: bool) -> None:
    """A multimodal vector memory in PostgreSQL."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )


for _module in COMMAND_MODULES:
    cli.add_command(importlib.import_module(_module).command)


def report_error(exc: Exception) -> int | None:
    """What a user can act on becomes one line and exit code 2; anything else keeps its traceback."""
    if isinstance(exc, MemstoreError):
        click.echo(f"memstore: {exc}", err=True)
        return EXIT_USAGE
    if isinstance(exc, psycopg.OperationalError | sa.exc.OperationalError):
        reason = str(getattr(exc, "orig", None) or exc).strip()
        click.echo(f"memstore: cannot reach the database ({reason}); check MEMSTORE_DATABASE_URL", err=True)
        return EXIT_USAGE
    return None


def main(argv: Sequence[str] | None = None) -> int:
    return run(cli, argv, prog="memstore", on_error=report_error)


if __name__ == "__main__":
    sys.exit(main())
