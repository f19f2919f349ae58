"""``memstore db``: migrations and connection facts, for either database."""

from __future__ import annotations

import argparse
import json

from memstore import migrate
from memstore.db import libpq_url, resolve_database_url


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser("db", help="database migrations and facts")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = dbsub.add_parser("upgrade", help="apply migrations (starts the embedded server when no URL is set)")
    up.add_argument("--revision", default="head")
    up.add_argument("--json", action="store_true", help="print the result as JSON")
    up.set_defaults(func=_upgrade)
    cur = dbsub.add_parser("current", help="print the applied revision")
    cur.add_argument("--json", action="store_true")
    cur.set_defaults(func=_current)
    url = dbsub.add_parser("url", help="print a libpq URL for psql and other tools")
    url.set_defaults(func=_url)


def _upgrade(args: argparse.Namespace) -> int:
    url = resolve_database_url()
    before = migrate.current_revision(url)
    migrate.upgrade(url, args.revision)
    after = migrate.current_revision(url)
    if args.json:
        print(json.dumps({"before": before, "after": after}))
    else:
        print(f"database at revision {after} (was {before})")
    return 0


def _current(args: argparse.Namespace) -> int:
    revision = migrate.current_revision(resolve_database_url())
    print(json.dumps({"revision": revision}) if args.json else revision)
    return 0


def _url(args: argparse.Namespace) -> int:
    print(libpq_url(resolve_database_url()))
    return 0
