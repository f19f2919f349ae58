"""The one writer of the maintenance history (``memstore_maintenance_actions``): an action is
started with its reason and before-figures, and finished with its outcome and after-figures.

The maintenance worker (``maintenance.history``) and the compact index upkeep
(``maintenance.compact_index``) both record through here; ``maintenance.history`` also reads, and
the web pages read probes and actions through ``recent_probes`` and ``recent_actions`` (the same
named statements, ``sql/history_*.sql``). The pages' "probe now" is a request
(``memstore_maintenance_requests``) that a maintenance worker takes between passes (``take_requests``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from memstore.db import sqlfiles
from memstore.db.core import Database


def start_action(
    conn: psycopg.Connection[Any],
    *,
    collection: str,
    partition_table: str,
    index_name: str | None,
    action: str,
    reason: str,
    before: dict[str, Any],
) -> int:
    row = conn.execute(
        "INSERT INTO memstore_maintenance_actions (collection, partition_table, index_name, action, reason, before) "
        "VALUES (%s, %s, %s, %s, %s, %s) RETURNING id",
        (collection, partition_table, index_name, action, reason, Jsonb(plain(before))),
    ).fetchone()
    assert row is not None
    return int(row[0])


def finish_action(
    conn: psycopg.Connection[Any],
    action_id: int,
    *,
    outcome: str,
    duration_s: float,
    after: dict[str, Any] | None = None,
    error: str | None = None,
) -> None:
    conn.execute(
        "UPDATE memstore_maintenance_actions SET finished_at = now(), duration_s = %s, outcome = %s, "
        "after = %s, error = %s WHERE id = %s",
        (duration_s, outcome, Jsonb(plain(after or {})), error, action_id),
    )


def plain(value: dict[str, Any]) -> dict[str, Any]:
    """Round-trip through JSON so datetimes and numpy numbers become plain JSON values."""
    result: dict[str, Any] = json.loads(json.dumps(value, default=_default))
    return result


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def recent_probes(db: Database, *, collection: str, limit: int = 500) -> list[dict[str, Any]]:
    """A collection's probes, newest first."""
    return _read(db, "history_probes", collection, limit)


def recent_actions(db: Database, *, collection: str, limit: int = 50) -> list[dict[str, Any]]:
    """A collection's maintenance actions, newest first."""
    return _read(db, "history_actions", collection, limit)


def _read(db: Database, statement: str, collection: str, limit: int) -> list[dict[str, Any]]:
    params = {"collection": collection, "since": None, "limit": limit}
    with db.write() as conn:
        return conn.cursor(row_factory=dict_row).execute(sqlfiles.text(statement), params).fetchall()


def request_pass(db: Database, *, collection: str, requested_by: str) -> None:
    """Ask the maintenance worker for a pass now (it probes, and acts where its policy says so)."""
    with db.write() as conn:
        conn.execute(
            "INSERT INTO memstore_maintenance_requests (collection, requested_by) VALUES (%s, %s)",
            (collection, requested_by),
        )


def pending_requests(db: Database) -> dict[str, datetime]:
    """Collections with a request no worker has taken yet, and since when."""
    with db.write() as conn:
        rows = conn.execute(
            "SELECT collection, min(requested_at) FROM memstore_maintenance_requests GROUP BY collection"
        ).fetchall()
    return {str(r[0]): r[1] for r in rows}


def take_requests(conn: psycopg.Connection[Any], collections: list[str] | None) -> list[str]:
    """Take (delete) the requests for these collections (None: every collection); the collections
    asked for. Taking is one statement, so of several workers exactly one runs each request."""
    rows = conn.execute(
        "DELETE FROM memstore_maintenance_requests WHERE %(names)s::text[] IS NULL OR collection = ANY(%(names)s) "
        "RETURNING collection",
        {"names": collections},
    ).fetchall()
    return sorted({str(r[0]) for r in rows})
