"""API keys: random secrets shown once, stored as SHA-256 hashes, with scopes per collection.

A scope is ``ROLE`` or ``ROLE:COLLECTION``; roles are ordered ``read < write < admin`` and a scope
without a collection (or with ``*``) covers every collection. ``admin`` on a collection may also
create and drop it; listing collections shows those a key may read.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from memstore.catalog.collections import NAME_PATTERN
from memstore.db.core import Database
from memstore.errors import ConflictError, InvalidInputError, NotFoundError

ROLES = ("read", "write", "admin")
KEY_PREFIX = "msk_"
ALL = "*"


@dataclass(frozen=True)
class Scope:
    role: str
    collection: str = ALL

    def __str__(self) -> str:
        return self.role if self.collection == ALL else f"{self.role}:{self.collection}"

    def covers(self, role: str, collection: str | None) -> bool:
        if ROLES.index(self.role) < ROLES.index(role):
            return False
        return self.collection == ALL or self.collection == collection


def parse_scope(text: str) -> Scope:
    role, _, collection = text.strip().partition(":")
    collection = collection or ALL
    if role not in ROLES:
        raise InvalidInputError(f"scope {text!r}: the role must be one of {', '.join(ROLES)}")
    if collection != ALL and not NAME_PATTERN.fullmatch(collection):
        raise InvalidInputError(f"scope {text!r}: {collection!r} is not a valid collection name (or *)")
    return Scope(role, collection)


@dataclass(frozen=True)
class ApiKey:
    id: int
    name: str
    prefix: str
    scopes: tuple[Scope, ...]
    created_at: datetime | None = None
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    def allows(self, role: str, collection: str | None = None) -> bool:
        """``collection`` None asks for the role on every collection (e.g. creating any)."""
        if collection is None:
            return any(s.covers(role, None) and s.collection == ALL for s in self.scopes)
        return any(s.covers(role, collection) for s in self.scopes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "scopes": [str(s) for s in self.scopes],
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "last_used_at": self.last_used_at.isoformat() if self.last_used_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


def hash_key(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _row_to_key(row: tuple[Any, ...]) -> ApiKey:
    rid, name, prefix, scopes, created, used, revoked = row
    return ApiKey(int(rid), name, prefix, tuple(parse_scope(s) for s in scopes), created, used, revoked)


_COLUMNS = "id, name, prefix, scopes, created_at, last_used_at, revoked_at"


def create_key(db: Database, *, name: str, scopes: list[str]) -> tuple[ApiKey, str]:
    """A new key; the secret is returned here and never again."""
    if not name or len(name) > 100 or not name.isprintable():
        raise InvalidInputError("a key name is 1 to 100 printable characters")
    if not scopes:
        raise InvalidInputError("give at least one scope, e.g. --scope admin or --scope read:photos")
    parsed = [parse_scope(s) for s in scopes]
    secret = KEY_PREFIX + secrets.token_urlsafe(24)
    with db.write() as conn:
        if conn.execute("SELECT 1 FROM memstore_api_keys WHERE name = %s AND revoked_at IS NULL", (name,)).fetchone():
            raise ConflictError(f"an active key named {name!r} exists; revoke it first or pick another name")
        row = conn.execute(
            f"INSERT INTO memstore_api_keys (name, prefix, key_hash, scopes) VALUES (%s, %s, %s, %s) "
            f"RETURNING {_COLUMNS}",
            (name, secret[:10], hash_key(secret), Jsonb([str(s) for s in parsed])),
        ).fetchone()
    assert row is not None
    return _row_to_key(row), secret


def list_keys(db: Database, *, include_revoked: bool = False) -> list[ApiKey]:
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    with db.write() as conn:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM memstore_api_keys{where} ORDER BY id").fetchall()
    return [_row_to_key(r) for r in rows]


def revoke_key(db: Database, *, name_or_id: str) -> ApiKey:
    clause, value = ("id = %s", int(name_or_id)) if name_or_id.isdigit() else ("name = %s", name_or_id)
    with db.write() as conn:
        row = conn.execute(
            f"UPDATE memstore_api_keys SET revoked_at = now() WHERE {clause} AND revoked_at IS NULL "
            f"RETURNING {_COLUMNS}",
            (value,),
        ).fetchone()
    if row is None:
        raise NotFoundError(f"no active key {name_or_id!r}")
    return _row_to_key(row)


class KeyVerifier:
    """Look keys up by hash, caching answers for ``ttl`` seconds (a revocation takes that long to bite)."""

    def __init__(self, db: Database, *, ttl: float = 5.0) -> None:
        self.db = db
        self.ttl = ttl
        self._cache: dict[bytes, tuple[float, ApiKey | None]] = {}
        self._lock = threading.Lock()

    def cached(self, secret: str) -> tuple[bool, ApiKey | None]:
        """(True, answer) when the cache can answer without the database."""
        if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
            return True, None
        with self._lock:
            hit = self._cache.get(hash_key(secret))
        if hit and time.monotonic() - hit[0] < self.ttl:
            return True, hit[1]
        return False, None

    def verify(self, secret: str) -> ApiKey | None:
        known, key = self.cached(secret)
        if known:
            return key
        digest = hash_key(secret)
        now = time.monotonic()
        with self.db.write() as conn:
            row = conn.execute(
                f"UPDATE memstore_api_keys SET last_used_at = now() WHERE key_hash = %s AND revoked_at IS NULL "
                f"RETURNING {_COLUMNS}",
                (digest,),
            ).fetchone()
        key = _row_to_key(row) if row else None
        with self._lock:
            if len(self._cache) > 10_000:  # unknown keys are cached too: bound the memory
                self._cache.clear()
            self._cache[digest] = (now, key)
        return key
