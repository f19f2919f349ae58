"""The SQL expressions a metadata path is read through.

Typed comparisons in filters (``memstore.search.filter_language``) and the typed metadata indexes
(``memstore.catalog.metadata_indexes``) are written on the same expressions, because the planner uses
an expression index only for the identical expression: one owner here keeps the two from drifting.
"""

from __future__ import annotations

from typing import Literal

from psycopg import sql

TypedKind = Literal["number", "timestamp", "keyword"]
# memstore_keyword's limit (migration 0005): a longer string would not fit in a B-tree entry.
MAX_KEYWORD_LENGTH = 512


def json_value(fields: tuple[sql.Composable, ...]) -> sql.Composable:
    """``metadata -> f1 -> f2 ...``: the jsonb at a path (each field an already-composed literal or
    parameter)."""
    value: sql.Composable = sql.SQL("metadata")
    for name in fields:
        value = sql.SQL("{} -> {}").format(value, name)
    return value


def typed_value(kind: TypedKind, value: sql.Composable) -> sql.Composed:
    """A jsonb ``value`` as the SQL type ``kind`` (NULL where it is not of that type)."""
    if kind == "number":
        return sql.SQL("memstore_number({})").format(value)
    if kind == "timestamp":
        return sql.SQL("memstore_timestamp({})").format(value)
    return sql.SQL('(memstore_keyword({}) COLLATE "C")').format(value)


def typed_expression(kind: TypedKind, fields: tuple[sql.Composable, ...]) -> sql.Composed:
    """``metadata -> f1 -> f2 ...`` as the SQL type ``kind``: what typed comparisons are written on and
    typed metadata indexes are built on."""
    return typed_value(kind, json_value(fields))


def is_list(value: sql.Composable) -> sql.Composed:
    """``value`` is a JSON array: the typed comparisons' guard of their list branch, and the predicate
    of the partial index that serves it."""
    return sql.SQL("jsonb_typeof({}) = 'array'").format(value)
