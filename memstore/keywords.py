"""Keyword search: what a collection's keyword index holds, and how it is built and changed online.

An item's keywords are the words of its text, its original file name (``metadata.filename``) and the
string and number values of the metadata fields its collection lists in ``text_fields``, parsed by
the collection's text-search configuration (``language``: ``simple`` by default, so identifiers and
any language match as written; ``english`` and PostgreSQL's other configurations stem and drop stop
words). ``memstore_keywords(text, metadata, fields, config)`` (migrations 0006) computes them:

- the file name and the listed fields weigh most (A), the text next (B);
- every part of a dotted, dashed or slashed identifier is a keyword too, at the lowest weight (D), so
  ``copytree`` finds ``shutil.copytree`` while ``shutil.copytree`` ranks the item that has exactly
  that identifier first.

The index is a GIN index on that expression, not a stored column: an UPDATE of a stored column would
give every row a new version and a new entry in the HNSW index (the GIN-indexed column makes the
update non-HOT), so building or changing the keywords of a large collection would churn its vector
index like a full re-ingest. An expression index is built ``CONCURRENTLY`` without writing a row.
The query side must spell the expression exactly as the index does (``expression(c)``) for the
planner to use it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

if TYPE_CHECKING:
    from memstore.collections import Collection

from memstore import online_ddl
from memstore.errors import InvalidInputError

DEFAULT_LANGUAGE = "simple"
MAX_TEXT_FIELDS = 32
MAX_FIELD_NAME = 128
_LANGUAGE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def expression(c: Collection) -> sql.Composed:
    """The keywords of a row of ``c``'s table, exactly as its keyword index is defined."""
    return keywords_expression(c.language, c.text_fields)


def keywords_expression(language: str, text_fields: tuple[str, ...] | list[str]) -> sql.Composed:
    return sql.SQL("memstore_keywords(text, metadata, {fields}::text[], {cfg}::regconfig)").format(
        fields=sql.Literal(list(text_fields)), cfg=sql.Literal(language)
    )


def query(c: Collection) -> sql.Composed:
    """The tsquery of ``%(text)s`` as a person would type it (quotes, ``or``, ``-word``)."""
    return sql.SQL("websearch_to_tsquery({cfg}::regconfig, %(text)s)").format(cfg=sql.Literal(c.language))


def index_name(c: Collection) -> str:
    return f"{c.table_name}_keywords"


def partition_index_name(c: Collection, i: int) -> str:
    return f"{c.partition_tables()[i]}_keywords"


def next_index_name(c: Collection, i: int | None = None) -> str:
    """The name a changed keyword index is built under before it takes the usual name."""
    return f"memstore_next_kw_c{c.id}" + ("" if i is None else f"_p{i}")


def definition(language: str, text_fields: tuple[str, ...] | list[str]) -> sql.Composed:
    """The index after its table. ``fastupdate = off``: GIN's default parks new entries in a pending
    list that every search then reads through linearly until a vacuum merges it, so a collection
    searched right after a load runs its keyword matches several times slower; writing the entries
    into the tree at once costs an insert far less than its HNSW insert does."""
    return sql.SQL("USING gin (({})) WITH (fastupdate = off)").format(keywords_expression(language, text_fields))


def create_statement(c: Collection) -> sql.Composed:
    """The keyword index of a new, empty collection (a plain CREATE INDEX: nothing to lock out; on a
    partitioned table it makes each partition's too)."""
    return sql.SQL("CREATE INDEX {i} ON {t} {d}").format(
        i=sql.Identifier(index_name(c)), t=c.table, d=definition(c.language, c.text_fields)
    )


def build_index(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Build the collection's keyword index online (an autocommit connection; idempotent)."""
    online_ddl.build_index(
        conn,
        c,
        index_name(c),
        definition(c.language, c.text_fields),
        partition_name=lambda i: partition_index_name(c, i),
    )


def change(
    conn: psycopg.Connection[Any],
    c: Collection,
    *,
    language: str,
    text_fields: tuple[str, ...],
    record: Callable[[], Collection],
    grace_s: float,
) -> None:
    """Change what the collection's keyword index holds, online, on an autocommit connection that
    holds the collection's lock: the new index is built concurrently under its own names while
    searches use the old one; ``record()`` then makes searches use the new expression; once every
    process has seen that (``grace_s``, the registry's cache time) the old index is dropped and the
    new one takes the usual names."""
    changed = replace(c, language=language, text_fields=text_fields)
    online_ddl.build_index(
        conn,
        changed,
        next_index_name(c),
        definition(language, text_fields),
        partition_name=lambda i: next_index_name(c, i),
    )
    record()
    time.sleep(grace_s)
    partitioned = c.partitions > 1
    online_ddl.drop_index(conn, index_name(c), partitioned=partitioned)
    if partitioned:  # the parent's drop took the attached partitions' indexes with it
        for i in range(c.partitions):
            online_ddl.drop_index(conn, partition_index_name(c, i), partitioned=False)
    online_ddl.rename_index(conn, next_index_name(c), index_name(c))
    for i in range(c.partitions if partitioned else 0):
        online_ddl.rename_index(conn, next_index_name(c, i), partition_index_name(c, i))


def check_language(conn: psycopg.Connection[Any], language: Any) -> str:
    """A text-search configuration this server has (``simple``, ``english``...)."""
    if not isinstance(language, str) or not _LANGUAGE.match(language):
        raise InvalidInputError(f"language must be a text-search configuration name such as 'simple', not {language!r}")
    row = conn.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s", (language,)).fetchone()
    if row is None:
        known = [r[0] for r in conn.execute("SELECT cfgname FROM pg_ts_config ORDER BY cfgname")]
        raise InvalidInputError(
            f"language {language!r} is not a text-search configuration here; one of: {', '.join(known)}"
        )
    return language


def check_text_fields(value: Any) -> tuple[str, ...]:
    """Metadata field names whose values are keywords (at most MAX_TEXT_FIELDS, no duplicates)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidInputError(f"text_fields must be a list of metadata field names, not {type(value).__name__}")
    if len(value) > MAX_TEXT_FIELDS:
        raise InvalidInputError(f"text_fields lists {len(value)} fields; the limit is {MAX_TEXT_FIELDS}")
    out: list[str] = []
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or len(name) > MAX_FIELD_NAME or "\x00" in name:
            raise InvalidInputError(
                f"text_fields[{i}] must be a field name of 1 to {MAX_FIELD_NAME} characters without NUL, "
                f"not {name!r:.80}"
            )
        if name in out:
            raise InvalidInputError(f"text_fields names {name!r} twice")
        out.append(name)
    return tuple(out)
