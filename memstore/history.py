"""The one writer of the maintenance history (``memstore_maintenance_actions``): an action is
started with its reason and before-figures, and finished with its outcome and after-figures.

The maintenance worker (``maintenance.history``) and the compact index upkeep
(``memstore.compact.maintain``) both record through here; ``maintenance.history`` also reads.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb


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
