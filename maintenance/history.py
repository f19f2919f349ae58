"""The maintenance history: every action with its reason, duration, before/after figures and outcome
(``memstore_maintenance_actions``) and every probe (``memstore_maintenance_probes``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from maintenance import sqlfiles
from maintenance.targets import Target


def start_action(
    conn: psycopg.Connection[Any], target: Target, action: str, reason: str, before: dict[str, Any]
) -> int:
    row = conn.execute(
        sqlfiles.text("action_start"),
        {
            "collection": target.collection.name,
            "partition_table": target.table,
            "index_name": target.index,
            "action": action,
            "reason": reason,
            "before": Jsonb(_plain(before)),
        },
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
        sqlfiles.text("action_finish"),
        {
            "id": action_id,
            "outcome": outcome,
            "duration_s": duration_s,
            "after": Jsonb(_plain(after or {})),
            "error": error,
        },
    )


def list_actions(
    conn: psycopg.Connection[Any], *, collection: str | None = None, since: datetime | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    params = {"collection": collection, "since": since, "limit": limit}
    return conn.cursor(row_factory=dict_row).execute(sqlfiles.text("history_actions"), params).fetchall()


def list_probes(
    conn: psycopg.Connection[Any], *, collection: str | None = None, since: datetime | None = None, limit: int = 1000
) -> list[dict[str, Any]]:
    params = {"collection": collection, "since": since, "limit": limit}
    return conn.cursor(row_factory=dict_row).execute(sqlfiles.text("history_probes"), params).fetchall()


def _plain(value: dict[str, Any]) -> dict[str, Any]:
    """Round-trip through JSON so datetimes and numpy numbers become plain JSON values."""
    result: dict[str, Any] = json.loads(json.dumps(value, default=_default))
    return result


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if hasattr(value, "item"):
        return value.item()
    return str(value)
