"""Named SQL statements live in the top-level ``sql/*.sql`` (installed as the package
``memstore_sql``), loaded by name (never glued from strings): maintenance's probes and history
reads, and the web pages' history reads.

Files with ``{table}``/``{op}`` placeholders are composed with psycopg's ``sql`` module, so identifiers
are always quoted correctly.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from psycopg import sql

SQL_DIR = Path(str(files("memstore_sql")))


@cache
def text(name: str) -> str:
    """The text of ``sql/<name>.sql``."""
    return (SQL_DIR / f"{name}.sql").read_text(encoding="utf-8")


def query(name: str) -> sql.SQL:
    return sql.SQL(text(name))


def composed(name: str, *, table: str, op: str | None = None, **fragments: sql.Composable) -> sql.Composed:
    """``sql/<name>.sql`` with ``{table}`` quoted as an identifier, ``{op}`` a known distance operator and
    any other placeholder filled by an already composed fragment."""
    parts: dict[str, sql.Composable] = {"table": sql.Identifier(table), **fragments}
    if op is not None:
        parts["op"] = operator(op)
    return sql.SQL(text(name)).format(**parts)


def operator(op: str) -> sql.SQL:
    """A distance operator for a statement, checked against pgvector's three."""
    if op not in ("<=>", "<->", "<#>"):
        raise ValueError(f"unknown distance operator {op!r}")
    return sql.SQL(op)
