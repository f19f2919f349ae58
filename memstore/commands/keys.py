"""``memstore keys``: create, list and revoke API keys (the secret is printed once, at creation)."""

from __future__ import annotations

import argparse
import json

import sqlalchemy as sa


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="API keys and their scopes")
    ksub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = ksub.add_parser(
        "create",
        help="create a key and print it (once)",
        description="Scopes: ROLE or ROLE:COLLECTION, ROLE one of read, write, admin (each includes the ones "
        "before it). Without a collection the scope covers every collection.",
    )
    create.add_argument("name", help="a label for the key, unique among active keys")
    create.add_argument(
        "--scope", action="append", required=True, metavar="SCOPE", help="e.g. admin, read:photos (repeatable)"
    )
    create.add_argument("--json", action="store_true", help="print the result as JSON")
    create.set_defaults(func=_create)
    lst = ksub.add_parser("list", help="list keys (never their secrets)")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=_list)
    revoke = ksub.add_parser("revoke", help="revoke a key by name or id")
    revoke.add_argument("key", metavar="NAME_OR_ID")
    revoke.add_argument("--json", action="store_true")
    revoke.set_defaults(func=_revoke)


def _engine() -> sa.Engine:
    from memstore.db import get_engine

    return get_engine()


def _create(args: argparse.Namespace) -> int:
    from memstore.keys import create_key

    key, secret = create_key(_engine(), name=args.name, scopes=args.scope)
    if args.json:
        print(json.dumps({**key.as_dict(), "key": secret}))
    else:
        print(f"created key {key.name!r} (id {key.id}) with scopes {', '.join(str(s) for s in key.scopes)}")
        print(f"\n    {secret}\n")
        print("This is the only time it is shown. Send it as 'Authorization: Bearer KEY'.")
    return 0


def _list(args: argparse.Namespace) -> int:
    from memstore.keys import list_keys

    found = list_keys(_engine(), include_revoked=args.all)
    if args.json:
        print(json.dumps([k.as_dict() for k in found]))
        return 0
    for k in found:
        state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "active"
        used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
        print(f"{k.id:>5}  {k.name:<24} {k.prefix}…  {' '.join(str(s) for s in k.scopes):<30} used {used}  {state}")
    if not found:
        print("no keys; create one with `memstore keys create NAME --scope admin`")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from memstore.keys import revoke_key

    key = revoke_key(_engine(), name_or_id=args.key)
    print(json.dumps(key.as_dict()) if args.json else f"revoked key {key.name!r} (id {key.id})")
    return 0
