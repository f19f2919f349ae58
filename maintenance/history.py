"""The maintenance history: every action with its reason, duration, before/after figures and outcome
(``memstore_maintenance_actions``, written through ``memstore.action_log``) and every probe
(``memstore_maintenance_probes``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from maintenance.targets import Target
from memstore import action_log as core_history
from memstore.db import sqlfiles


def start_action(
    conn: psycopg.Connection[Any], target: Target, action: str, reason: str, before: dict[str, Any]
) -> int:
    return core_history.start_action(
        conn,
        collection=target.collection.name,
        partition_table=target.table,
        index_name=target.index,
        action=action,
        reason=reason,
        before=before,
    )


finish_action = core_history.finish_action


def record_follow_up(conn: psycopg.Connection[Any], action_id: int, follow_up: dict[str, Any]) -> None:
    """Add the outcome of what followed a finished action (a rebuild's VACUUM) to its row. One that
    was done moves the row's finished_at to its end: the probes trust the counters a clean recorded
    only while no VACUUM ran after it (``maintenance.probes``), and this one is the worker's own."""
    conn.execute(
        "UPDATE memstore_maintenance_actions SET after = coalesce(after, '{}'::jsonb) || %s, "
        "finished_at = CASE WHEN %s THEN now() ELSE finished_at END WHERE id = %s",
        (Jsonb({"follow_up": core_history.plain(follow_up)}), follow_up.get("outcome") == "ok", action_id),
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
