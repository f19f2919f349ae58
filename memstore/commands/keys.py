"""``memstore keys``: create, list and revoke API keys (the secret is printed once, at creation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from encoder.cli_support import emit, json_option

if TYPE_CHECKING:
    from memstore.access.keys import ApiKey
    from memstore.db.core import Database


@click.group("keys", short_help="API keys and their scopes")
def command() -> None:
    """Create, list and revoke API keys. A key's secret is printed once, when it is created."""


@command.command(short_help="create a key and print it (once)")
@click.argument("name")
@click.option(
    "--scope", "scopes", multiple=True, required=True, metavar="SCOPE", help="e.g. admin, read:photos (repeatable)"
)
@json_option()
def create(name: str, scopes: tuple[str, ...], as_json: bool) -> int:
    """Create a key named NAME (a label, unique among active keys) and print its secret.

    Scopes: ROLE or ROLE:COLLECTION, ROLE one of read, write, admin (each includes the ones before
    it). Without a collection the scope covers every collection.
    """
    from memstore.access.keys import create_key

    key, secret = create_key(_db(), name=name, scopes=list(scopes))
    emit(as_json, {**key.as_dict(), "key": secret}, lambda: _created(key, secret))
    return 0


@command.command("list", short_help="list keys (never their secrets)")
@click.option("--all", "include_revoked", is_flag=True, help="include revoked keys")
@json_option()
def list_command(include_revoked: bool, as_json: bool) -> int:
    """List keys (never their secrets)."""
    from memstore.access.keys import list_keys

    found = list_keys(_db(), include_revoked=include_revoked)
    emit(as_json, [k.as_dict() for k in found], lambda: _table(found))
    return 0


@command.command(short_help="revoke a key by name or id")
@click.argument("key", metavar="NAME_OR_ID")
@json_option()
def revoke(key: str, as_json: bool) -> int:
    """Revoke a key by its name or id."""
    from memstore.access.keys import revoke_key

    revoked = revoke_key(_db(), name_or_id=key)
    emit(as_json, revoked.as_dict(), lambda: f"revoked key {revoked.name!r} (id {revoked.id})")
    return 0


def _db() -> Database:
    from memstore.db.core import get_database

    return get_database(replicas=False)


def _created(key: ApiKey, secret: str) -> str:
    scopes = ", ".join(str(s) for s in key.scopes)
    return (
        f"created key {key.name!r} (id {key.id}) with scopes {scopes}\n\n    {secret}\n\n"
        "This is the only time it is shown. Send it as 'Authorization: Bearer KEY'."
    )


def _table(found: list[ApiKey]) -> str:
    if not found:
        return "no keys; create one with `memstore keys create NAME --scope admin`"
    lines = []
    for k in found:
        state = f"revoked {k.revoked_at:%Y-%m-%d}" if k.revoked_at else "active"
        used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
        lines.append(
            f"{k.id:>5}  {k.name:<24} {k.prefix}…  {' '.join(str(s) for s in k.scopes):<30} used {used}  {state}"
        )
    return "\n".join(lines)
