"""The maintenance history: every action with its reason, duration, before/after figures and outcome
(``memstore_maintenance_actions``, written through ``memstore.action_log``) and every probe
(``memstore_maintenance_probes``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

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
