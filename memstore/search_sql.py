"""The search statement and its settings: one builder for the store, the async path, the compact
search and the recall probes.

A search is a settings statement (transaction-local, or session-level on the connections that run
nothing but searches) and then the statement itself. Every settings statement sets the same eight
knobs, so that one search's settings never carry over into the next on the same connection, and no
caller builds SQL by concatenation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql

_KNOBS = (
    "hnsw.ef_search",
    "hnsw.iterative_scan",
    "hnsw.max_scan_tuples",
    "enable_indexscan",
    "enable_seqscan",
    "enable_mergejoin",
    "enable_hashjoin",
    "jit",
)
_TEMPLATE = "SELECT " + ", ".join(f"set_config('{knob}', %s, {{local}})" for knob in _KNOBS)
SETTINGS_SQL = _TEMPLATE.format(local="true")
# The same settings for the whole session: only for connections that run nothing but searches, and
# that know which settings they hold (memstore.async_search's pool).
SESSION_SETTINGS_SQL = _TEMPLATE.format(local="false")
OPERATORS = ("<=>", "<->", "<#>")


@dataclass(frozen=True)
class SearchSettings:
    """What one search runs under.

    ``exact``: no index scans, so the planner can only answer ORDER BY distance by brute force (the
    ground truth). ``index_only``: no sequential scans either, so the statement reads the index even
    where the planner would price a scan of a small table lower (the recall probes measure the graph;
    a compact search must not evaluate its cast on every row). ``nested_loops``: no merge or hash
    joins (the low-rank search's join must be driven by the side table's index scan).
    """

    ef_search: int
    exact: bool
    max_scan_tuples: int
    index_only: bool = False
    nested_loops: bool = False

    def values(self) -> tuple[str, ...]:
        """The values of SETTINGS_SQL's parameters, in order (also the key of what a connection holds)."""
        return (
            str(self.ef_search),
            "off" if self.exact else "relaxed_order",
            str(self.max_scan_tuples),
            "off" if self.exact else "on",
            "off" if self.index_only and not self.exact else "on",
            "off" if self.nested_loops else "on",
            "off" if self.nested_loops else "on",
            "off",  # JIT pays off for long analytic queries; for millisecond searches it only adds latency
        )


def search_statement(table: str, operator: str, *, filtered: bool, exact: bool, ids_only: bool = False) -> sql.Composed:
    """The ``%(k)s`` nearest rows of ``table`` (a collection or one partition) to ``%(q)s``, nearest
    first, among those whose metadata contains ``%(f)s`` when ``filtered``. The MATERIALIZED CTE
    restores strict order after a relaxed iterative scan. ``ids_only``: id and distance alone (what
    the recall probes compare)."""
    if operator not in OPERATORS:
        raise ValueError(f"unknown distance operator {operator!r}")
    return _statement(table, operator, filtered, exact, ids_only)


@lru_cache(maxsize=1024)
def _statement(table: str, operator: str, filtered: bool, exact: bool, ids_only: bool) -> sql.Composed:
    op = sql.SQL(operator)
    columns = sql.SQL("id" if ids_only else "id, external_id, metadata")
    where = sql.SQL("WHERE embedding IS NOT NULL") + (sql.SQL(" AND metadata @> %(f)s") if filtered else sql.SQL(""))
    inner = sql.SQL(
        "SELECT {columns}, embedding {op} %(q)s AS distance FROM {t} {where} ORDER BY embedding {op} %(q)s LIMIT %(k)s"
    ).format(columns=columns, op=op, t=sql.Identifier(table), where=where)
    if exact:
        return inner
    return sql.SQL("WITH c AS MATERIALIZED ({inner}) SELECT {columns}, distance FROM c ORDER BY distance").format(
        inner=inner, columns=columns
    )


def run_search(
    conn: psycopg.Connection[Any], settings: SearchSettings, statement: sql.Composed, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """The transaction-local settings, then the search."""
    with conn.cursor() as cur:
        apply(cur, settings)
        cur.execute(statement, params)
        return cur.fetchall()


def apply(cur: psycopg.Cursor[Any], settings: SearchSettings) -> None:
    """Transaction-local settings on ``cur``'s connection (for callers that run several searches)."""
    cur.execute(SETTINGS_SQL, settings.values())


def exact_within_statement(table: str, operator: str, queries: int) -> sql.Composed:
    """The exact distances from every row of ``table`` to ``queries`` query vectors (``%(q0)s``...)
    in one scan, keeping the rows within some query's bound (``%(b0)s``...: the distance of the
    index's k-th answer to it; those k rows exist, so the true k nearest lie within it too).
    ``vector(embedding, %(dims)s, true)`` detoasts each stored vector once for all the queries, not
    once per distance (a 1024-d vector lives out of line)."""
    if operator not in OPERATORS:
        raise ValueError(f"unknown distance operator {operator!r}")
    distances = sql.SQL(", ").join(
        sql.SQL("e {} {}").format(sql.SQL(operator), sql.Placeholder(f"q{j}")) for j in range(queries)
    )
    within = sql.SQL(" OR ").join(
        sql.SQL("d[{}] <= {}").format(sql.Literal(j + 1), sql.Placeholder(f"b{j}")) for j in range(queries)
    )
    return sql.SQL(
        "SELECT id, d FROM (SELECT id, ARRAY[{distances}] AS d FROM (SELECT id, vector(embedding, %(dims)s, true) AS e "
        "FROM {t} WHERE embedding IS NOT NULL OFFSET 0) AS t OFFSET 0) AS s WHERE {within}"
    ).format(distances=distances, t=sql.Identifier(table), within=within)
