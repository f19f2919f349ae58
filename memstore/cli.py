"""The ``memstore`` command: ``serve``, ``db``, and the subcommands of memstore.commands.*."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

import psycopg
import sqlalchemy as sa

from memstore.errors import MemstoreError

# Each module defines register(subparsers) and gives its parsers a ``func(args) -> int``.
COMMAND_MODULES = (
    "memstore.commands.serve",
    "memstore.commands.db",
    "memstore.commands.keys",
    "memstore.commands.worker",
    "memstore.commands.ingest",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memstore", description="A multimodal vector memory in PostgreSQL.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    try:
        code: int = args.func(args)
    except MemstoreError as exc:
        print(f"memstore: {exc}", file=sys.stderr)
        return 2
    except (psycopg.OperationalError, sa.exc.OperationalError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip()
        print(f"memstore: cannot reach the database ({reason}); check MEMSTORE_DATABASE_URL", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
