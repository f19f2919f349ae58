"""Keyword search: what a collection's keyword index holds, and how it is kept, searched and changed.

An item's keywords are the words of its text, its original file name (``metadata.filename``) and the
string and number values of the metadata fields its collection lists in ``text_fields`` (a key, or a
dotted path to a nested field as a filter names it: ``image.camera``), parsed by
the collection's text-search configuration (``language``: ``simple`` by default, so identifiers and
any language match as written; ``english`` and PostgreSQL's other configurations stem and drop stop
words). ``memstore_keywords(text, metadata, fields, config)`` (migrations 0006 and 0011) computes them:

- the file name and the listed fields weigh most (A), the text next (B);
- every part of a dotted, dashed or slashed identifier is a keyword too, at the lowest weight (D), so
  ``copytree`` finds ``shutil.copytree`` while ``shutil.copytree`` ranks the item that has exactly
  that identifier first.

Where they are kept: each row's tsvector is stored once, when the row is written, in a side table of
its collection (``memstore_kw_c<id>_v<version>``: id, words; a GIN index on words), so neither the
match nor ``ts_rank_cd`` parses a text again at search time. Parsing at search time cost a search
about 1 ms for every 6,000 characters of every match (2,000 such texts: 1.6 s; from the stored
tsvector: milliseconds). Statement-level triggers on the collection's table keep the side table in
step with every write path (inserts, upserts, COPY-fed loads, OCR text, deletes) in one set-based
statement per write (migration 0012's ``memstore_keywords_sync``); a row with nothing to parse has no
side row. The table is a side table, not a column of the item table, so that neither writing the
keywords nor changing them touches the item rows: an UPDATE of a GIN-indexed column of the item table
is never HOT and would give the row a new entry in the HNSW graph (a keyword change of a large
collection would churn its vector index like a full re-ingest).

A change of language, fields or OCR builds the next version beside the current one (its triggers
first, then the rows copied in batches, then its GIN index built concurrently), records the new
setting and version in the registry in one transaction (searches use it from then), and drops the
old version once every process has seen the registry's change. A change stopped half way leaves a
version the registry does not name; the next change drops it first (``drop_other_versions``).

A collection with OCR on (``memstore.catalog.ocr_items``) adds the text read in its images (``ocr_text``) at
weight C, through the five-argument ``memstore_keywords`` (migration 0009).

Ranking is bounded: a query whose words are in more than RANK_LIMIT items (after the filter) ranks
the first RANK_LIMIT the index finds, so a word in every item of a large collection costs a bounded
amount; the search statement's timeout bounds the rest (``MEMSTORE_SEARCH_TIMEOUT_MS``).
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from memstore.catalog.collections import Collection
from memstore.catalog.field_paths import split_names
from memstore.db import online_ddl
from memstore.errors import InvalidInputError

DEFAULT_LANGUAGE = "simple"
MAX_TEXT_FIELDS = 32
MAX_FIELD_NAME = 128
_LANGUAGE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


# The most matches one keyword search ranks (see the module's docstring).
RANK_LIMIT = 10_000
# The registry option naming the version of the side table searches read (1 when absent).
VERSION = "keywords_version"
# The registry option that says which keyword setting a change under way is building.
PENDING = "keywords_next"
BATCH = 2_000  # rows copied into a new version per statement


def version(c: Collection) -> int:
    return int(c.options.get(VERSION, 1))


def table_name(c: Collection, at: int | None = None) -> str:
    """The side table of version ``at`` (the collection's current one by default)."""
    return f"memstore_kw_c{c.id}_v{version(c) if at is None else at}"


def index_name(c: Collection, at: int | None = None) -> str:
    return f"{table_name(c, at)}_words"


def table(c: Collection) -> sql.Identifier:
    """The side table searches read."""
    return sql.Identifier(table_name(c))


def expression(language: str, text_fields: tuple[str, ...] | list[str], *, ocr: bool = False) -> sql.Composed:
    """The keywords of a row of a collection's table (unqualified columns), as its side table holds them."""
    seen = sql.SQL(", ocr_text") if ocr else sql.SQL("")
    return sql.SQL("memstore_keywords(text, metadata, {fields}::text[], {cfg}::regconfig{seen})").format(
        fields=sql.Literal([function_field(f) for f in text_fields]), cfg=sql.Literal(language), seen=seen
    )


def function_field(name: str) -> str:
    """A listed field as ``memstore_keywords`` reads it (revision 0015): a key as it is; a path
    (``image.camera``, ``field_paths.split_names``) as the JSON array of its keys, and so a key that
    starts with "[" too, which the function would otherwise try to read as one."""
    names = split_names(name, "text_fields")
    if len(names) == 1 and not names[0].startswith("["):
        return names[0]
    return json.dumps(list(names), ensure_ascii=False)


_IDENTIFIER = re.compile(r"\S*[^\w\s]\S*")
# A word websearch_to_tsquery reads as excluded: "-" at the start of the text or after a space.
_EXCLUSION = re.compile(r"(?:^|\s)-")


def query(c: Collection, text: str) -> sql.Composed:
    """The tsquery of ``%(text)s`` as a person would type it (quotes, ``or``, ``-word``), in the
    Unicode form the stored keywords are in (``%(text_nfkc)s``, ``query_params``; migration 0016). A
    single token with punctuation (an identifier: ``SKU-88121-B``, ``shutil.copytree``) also matches
    as the phrase of its parts, which is how the lowest-weight keywords hold it wherever the parser
    splits it differently (``sku-88121-b.jpg`` is one file-name token, ``SKU-88121-B`` three). A text
    whose form differs also matches as typed: the rows stored before keywords were normalised.

    Neither alternative is added to a text that excludes a word (``plan -draft``): OR-ed with a query
    that does not exclude it (the identifier's phrase of ``-draft`` is ``draft`` itself; the typed form
    of ``-ＳＫＵ`` excludes a word no stored keyword holds), it would let back in the very rows the
    exclusion keeps out."""
    cfg = sql.Literal(c.language)
    typed = sql.SQL("websearch_to_tsquery({cfg}::regconfig, %(text_nfkc)s)").format(cfg=cfg)
    if _EXCLUSION.search(text):
        return typed
    if normal_form(text) != text:
        typed = sql.SQL("({} || websearch_to_tsquery({cfg}::regconfig, %(text)s))").format(typed, cfg=cfg)
    if not _IDENTIFIER.fullmatch(text.strip()):
        return typed
    parts = sql.SQL(
        "phraseto_tsquery({cfg}::regconfig, regexp_replace(%(text_nfkc)s, '[[:punct:]]+', ' ', 'g'))"
    ).format(cfg=cfg)
    return sql.SQL("({} || {})").format(typed, parts)


def normal_form(text: str) -> str:
    """The Unicode form keywords are kept in: NFKC (``é`` one code point, ``ﬁ`` two letters)."""
    return unicodedata.normalize("NFKC", text)


def query_params(text: str) -> dict[str, str]:
    """The parameters ``query`` names."""
    return {"text": text, "text_nfkc": normal_form(text)}


def _index_definition(name: str, side: str, *, concurrently: bool) -> sql.Composed:
    """The GIN index on a side table. ``fastupdate = off``: GIN's default parks new entries in a
    pending list that every search then reads through linearly until a vacuum merges it, so a
    collection searched right after a load runs its keyword matches several times slower; writing the
    entries into the tree at once costs an insert far less than its HNSW insert does."""
    return sql.SQL("CREATE INDEX {c}IF NOT EXISTS {i} ON {t} USING gin (words) WITH (fastupdate = off)").format(
        c=sql.SQL("CONCURRENTLY " if concurrently else ""), i=sql.Identifier(name), t=sql.Identifier(side)
    )


def _trigger_names(at: int) -> dict[str, str]:
    return {event: f"memstore_kw_v{at}_{event.lower()}" for event in ("INSERT", "UPDATE", "DELETE")}


def _statements(
    c: Collection, at: int, language: str, text_fields: tuple[str, ...] | list[str], ocr: bool, *, index: bool
) -> list[sql.Composed]:
    """Version ``at``'s side table and the triggers that keep it (and its index when ``index``)."""
    side = table_name(c, at)
    out = [
        sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigint PRIMARY KEY, words tsvector NOT NULL)").format(
            sql.Identifier(side)
        )
    ]
    if index:
        out.append(_index_definition(index_name(c, at), side, concurrently=False))
    fields = "{" + ",".join(_array_item(function_field(f)) for f in text_fields) + "}"
    args = sql.SQL(", ").join(sql.Literal(v) for v in (side, language, fields, "ocr" if ocr else ""))
    for event, name in _trigger_names(at).items():
        rows = "OLD TABLE AS old_rows" if event == "DELETE" else "NEW TABLE AS new_rows"
        if event == "UPDATE":
            rows = "OLD TABLE AS old_rows NEW TABLE AS new_rows"
        out.append(
            sql.SQL(
                "CREATE OR REPLACE TRIGGER {n} AFTER {e} ON {t} REFERENCING {rows} FOR EACH STATEMENT "
                "EXECUTE FUNCTION memstore_keywords_sync({args})"
            ).format(n=sql.Identifier(name), e=sql.SQL(event), t=c.table, rows=sql.SQL(rows), args=args)
        )
    return out


def _array_item(name: str) -> str:
    """A field name as an element of a text[] literal (quoted, its quotes and backslashes escaped)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def create_statements(c: Collection) -> list[sql.Composed]:
    """The keyword side table of a new, empty collection, its index and its triggers."""
    return _statements(c, version(c), c.language, c.text_fields, c.ocr, index=True)


def drop_statements(conn: psycopg.Connection[Any], c: Collection) -> list[sql.Composed]:
    """Every version's side table, as the catalog lists them (the triggers go with the collection's
    table)."""
    return [sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)) for name in _versions(c, conn)]


def _versions(c: Collection, conn: psycopg.Connection[Any]) -> list[str]:
    """The collection's side tables, the current version's and any a stopped change left."""
    rows = conn.execute(
        "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname ~ %s ORDER BY relname",
        (f"^memstore_kw_c{c.id}_v[0-9]+$",),
    ).fetchall()
    return [r[0] for r in rows]


def change(
    conn: psycopg.Connection[Any],
    c: Collection,
    *,
    language: str,
    text_fields: tuple[str, ...],
    record: Callable[[int], Collection],
    grace_s: float,
    ocr: bool | None = None,
) -> None:
    """Change what the collection's keywords hold, online, on an autocommit connection that holds the
    collection's lock (see the module's docstring). ``record(next_version)`` records the new setting
    and version in one transaction; ``ocr``: whether the new keywords hold the text read in images
    (None: as now)."""
    reads = c.ocr if ocr is None else ocr
    at = max([version(c), *(_version_of(name) for name in _versions(c, conn))]) + 1
    for statement in _statements(c, at, language, text_fields, reads, index=False):
        online_ddl.execute(conn, statement)
    _fill(conn, c, at, expression(language, text_fields, ocr=reads))
    online_ddl.execute(conn, _index_definition(index_name(c, at), table_name(c, at), concurrently=True))
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table_name(c, at))))
    changed = record(at)
    time.sleep(grace_s)
    drop_other_versions(conn, changed)


def _version_of(name: str) -> int:
    return int(name.rsplit("_v", 1)[1])


def _fill(conn: psycopg.Connection[Any], c: Collection, at: int, words: sql.Composable) -> None:
    """Copy every row's keywords into version ``at``, in batches by id (autocommit: each batch its own
    transaction, so no long snapshot holds back vacuum). Rows written meanwhile are the triggers' to
    keep: a batch never overwrites a row they wrote (ON CONFLICT DO NOTHING), and what a batch copied
    of a row deleted meanwhile is swept at the end."""
    side = sql.Identifier(table_name(c, at))
    copy = sql.SQL(
        "WITH b AS MATERIALIZED (SELECT id, {w} AS words FROM {t} WHERE id > %s ORDER BY id LIMIT %s), "
        "i AS (INSERT INTO {s} (id, words) SELECT id, words FROM b WHERE words <> ''::tsvector "
        "ON CONFLICT (id) DO NOTHING) SELECT max(id) FROM b"
    ).format(w=words, t=c.table, s=side)
    last = 0
    while True:
        row = conn.execute(copy, (last, BATCH)).fetchone()
        if row is None or row[0] is None:
            break
        last = row[0]
    conn.execute(
        sql.SQL("DELETE FROM {s} k WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE id = k.id)").format(s=side, t=c.table)
    )


def drop_other_versions(conn: psycopg.Connection[Any], c: Collection) -> None:
    """Drop every version but the one the registry names (the old one after a change is recorded,
    or the new one a change left unrecorded): their triggers first (short locks, under online_ddl's
    lock timeout), then their tables. Safe to run again after it stopped anywhere."""
    for name in _versions(c, conn):
        if name == table_name(c):
            continue
        for trigger in _trigger_names(_version_of(name)).values():
            online_ddl.execute(
                conn, sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), c.table)
            )
        online_ddl.execute(conn, sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


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
    if isinstance(value, str | bytes):
        raise InvalidInputError("text_fields must be a list of metadata field names, not a string")
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
        split_names(name, f"text_fields[{i}]")  # a dotted name is a path, as in a filter
        if name in out:
            raise InvalidInputError(f"text_fields names {name!r} twice")
        out.append(name)
    return tuple(out)
