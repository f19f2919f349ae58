"""Web sessions: an API key exchanged for a random session token, kept server side.

Only a SHA-256 of each token is stored (a copy of the table lets nobody sign in). A session is
valid while it has not expired and its key is not revoked: the look-up joins the key, so revoking
a key ends its sessions at once. The CSRF token of a session is derived from the session token by
another hash, so it needs no column and cannot be computed from the stored hash either.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass

from memstore.access.keys import ApiKey, parse_scope
from memstore.db.core import Database

TOKEN_BYTES = 32
_CSRF_CONTEXT = b"memstore-ui-csrf:"


@dataclass(frozen=True)
class Session:
    id: int
    key: ApiKey


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def csrf_token(token: str) -> str:
    """The CSRF token that goes with a session token (or with any per-process secret)."""
    return base64.urlsafe_b64encode(hashlib.sha256(_CSRF_CONTEXT + token.encode()).digest()).decode().rstrip("=")


def create(db: Database, *, key_id: int, hours: float) -> str:
    """A new session for the key; returns its token (shown once, in the cookie). Expired sessions
    are swept here, so the table stays as small as the number of live sessions."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    with db.write() as conn:
        conn.execute("DELETE FROM memstore_ui_sessions WHERE expires_at < now()")
        conn.execute(
            "INSERT INTO memstore_ui_sessions (token_hash, key_id, expires_at) "
            "VALUES (%s, %s, now() + make_interval(secs => %s))",
            (_digest(token), key_id, hours * 3600.0),
        )
    return token


def find(db: Database, token: str) -> Session | None:
    """The live session of ``token`` with its key, or None (unknown, expired, or its key revoked)."""
    if not token or len(token) > 200:
        return None
    with db.write() as conn:
        row = conn.execute(
            """
            SELECT s.id, k.id, k.name, k.prefix, k.scopes, k.created_at, k.last_used_at
            FROM memstore_ui_sessions s JOIN memstore_api_keys k ON k.id = s.key_id
            WHERE s.token_hash = %s AND s.expires_at > now() AND k.revoked_at IS NULL
            """,
            (_digest(token),),
        ).fetchone()
    if row is None:
        return None
    sid, kid, name, prefix, scopes, created, used = row
    key = ApiKey(int(kid), name, prefix, tuple(parse_scope(s) for s in scopes), created, used)
    return Session(int(sid), key)


def end(db: Database, token: str) -> None:
    """Sign out: the session is deleted (its cookie is worth nothing afterwards)."""
    with db.write() as conn:
        conn.execute("DELETE FROM memstore_ui_sessions WHERE token_hash = %s", (_digest(token),))
