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

A collection with OCR on (``memstore.ocr_items``) adds the text read in its images (``ocr_text``) at
weight C, through the five-argument ``memstore_keywords`` (migration 0009); turning OCR on or off
changes the index like any other keyword change.
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
    return keywords_expression(c.language, c.text_fields, ocr=c.ocr)


def keywords_expression(language: str, text_fields: tuple[str, ...] | list[str], *, ocr: bool = False) -> sql.Composed:
    seen = sql.SQL(", ocr_text") if ocr else sql.SQL("")
    return sql.SQL("memstore_keywords(text, metadata, {fields}::text[], {cfg}::regconfig{seen})").format(
        fields=sql.Literal(list(text_fields)), cfg=sql.Literal(language), seen=seen
    )


_IDENTIFIER = re.compile(r"\S*[^\w\s]\S*")


def query(c: Collection, text: str) -> sql.Composed:
    """The tsquery of ``%(text)s`` as a person would type it (quotes, ``or``, ``-word``). A single
    token with punctuation (an identifier: ``SKU-88121-B``, ``shutil.copytree``) also matches as the
    phrase of its parts, which is how the lowest-weight keywords hold it wherever the parser splits
    it differently (``sku-88121-b.jpg`` is one file-name token, ``SKU-88121-B`` three)."""
    typed = sql.SQL("websearch_to_tsquery({cfg}::regconfig, %(text)s)").format(cfg=sql.Literal(c.language))
    if not _IDENTIFIER.fullmatch(text.strip()):
        return typed
    parts = sql.SQL("phraseto_tsquery({cfg}::regconfig, regexp_replace(%(text)s, '[[:punct:]]+', ' ', 'g'))").format(
        cfg=sql.Literal(c.language)
    )
    return sql.SQL("({} || {})").format(typed, parts)


def index_name(c: Collection) -> str:
    return f"{c.table_name}_keywords"


def partition_index_name(c: Collection, i: int) -> str:
    return f"{c.partition_tables()[i]}_keywords"


def next_index_name(c: Collection, i: int | None = None) -> str:
    """The name a changed keyword index is built under before it takes the usual name."""
    return f"memstore_next_kw_c{c.id}" + ("" if i is None else f"_p{i}")


def definition(language: str, text_fields: tuple[str, ...] | list[str], *, ocr: bool = False) -> sql.Composed:
    """The index after its table. ``fastupdate = off``: GIN's default parks new entries in a pending
    list that every search then reads through linearly until a vacuum merges it, so a collection
    searched right after a load runs its keyword matches several times slower; writing the entries
    into the tree at once costs an insert far less than its HNSW insert does."""
    return sql.SQL("USING gin (({})) WITH (fastupdate = off)").format(
        keywords_expression(language, text_fields, ocr=ocr)
    )


def create_statement(c: Collection) -> sql.Composed:
    """The keyword index of a new, empty collection (a plain CREATE INDEX: nothing to lock out; on a
    partitioned table it makes each partition's too)."""
    return sql.SQL("CREATE INDEX {i} ON {t} {d}").format(
        i=sql.Identifier(index_name(c)), t=c.table, d=definition(c.language, c.text_fields, ocr=c.ocr)
    )


def build_index(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Build the collection's keyword index online (an autocommit connection; idempotent)."""
    online_ddl.build_index(
        conn,
        c,
        index_name(c),
        definition(c.language, c.text_fields, ocr=c.ocr),
        partition_name=lambda i: partition_index_name(c, i),
    )


# The registry option that says which keyword setting a change under way is building: read when a
# change stopped half way (a crash, a kill) to finish it or undo it.
PENDING = "keywords_next"


def change(
    conn: psycopg.Connection[Any],
    c: Collection,
    *,
    language: str,
    text_fields: tuple[str, ...],
    record: Callable[[], Collection],
    grace_s: float,
    ocr: bool | None = None,
) -> None:
    """Change what the collection's keyword index holds, online, on an autocommit connection that
    holds the collection's lock: the new index is built concurrently under its own names while
    searches use the old one; ``record()`` then makes searches use the new expression; once every
    process has seen that (``grace_s``, the registry's cache time) the old index is dropped and the
    new one takes the usual names (``promote``). ``ocr``: whether the new index holds the text read in
    images (None: as now)."""
    changed = replace(c, language=language, text_fields=text_fields)
    online_ddl.build_index(
        conn,
        changed,
        next_index_name(c),
        definition(language, text_fields, ocr=c.ocr if ocr is None else ocr),
        partition_name=lambda i: next_index_name(c, i),
    )
    record()
    time.sleep(grace_s)
    promote(conn, c)


def leftovers(conn: psycopg.Connection[Any], c: Collection) -> bool:
    """Whether a change stopped half way left indexes under the names it builds under."""
    names = [next_index_name(c)] + [next_index_name(c, i) for i in range(c.partitions if c.partitions > 1 else 0)]
    return any(online_ddl.index_valid(conn, name) is not None for name in names)


def promote(conn: psycopg.Connection[Any], c: Collection) -> None:
    """The last step of a change, safe to run again after it stopped anywhere: the old index dropped
    (a partitioned one takes its partitions' with it), then the new partitions' indexes and last the
    new parent's take the usual names."""
    if online_ddl.index_valid(conn, next_index_name(c)) is None:
        return
    partitioned = c.partitions > 1
    online_ddl.drop_index(conn, index_name(c), partitioned=partitioned)
    for i in range(c.partitions if partitioned else 0):
        if online_ddl.index_valid(conn, next_index_name(c, i)) is not None:
            online_ddl.rename_index(conn, next_index_name(c, i), partition_index_name(c, i))
    online_ddl.rename_index(conn, next_index_name(c), index_name(c))


def clear(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Undo a change that stopped before it was recorded: its indexes dropped."""
    partitioned = c.partitions > 1
    online_ddl.drop_index(conn, next_index_name(c), partitioned=partitioned)
    for i in range(c.partitions if partitioned else 0):  # built but never attached
        online_ddl.drop_index(conn, next_index_name(c, i), partitioned=False)


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
        # No "%": the names are literals of the search statement, where psycopg reads "%" as a placeholder.
        if not isinstance(name, str) or not name or len(name) > MAX_FIELD_NAME or "\x00" in name or "%" in name:
            raise InvalidInputError(
                f"text_fields[{i}] must be a field name of 1 to {MAX_FIELD_NAME} characters without NUL or %, "
                f"not {name!r:.80}"
            )
        if name in out:
            raise InvalidInputError(f"text_fields names {name!r} twice")
        out.append(name)
    return tuple(out)
