"""Typed metadata indexes: B-tree expression indexes on one metadata field of a collection.

An index of type ``number``, ``timestamp`` or ``keyword`` on field ``f`` is built on exactly the
expression the filter compiler writes its comparisons on (``memstore.search.filter_language``)::

    number     memstore_number(metadata -> 'f')
    timestamp  memstore_timestamp(metadata -> 'f')
    keyword    (memstore_keyword(metadata -> 'f') COLLATE "C")

so the planner can answer ``{"f": {"$gte": ...}}``, ``$eq`` and ``$in`` of that type through it. A
field inside an object is named by its path, ``["image", "taken_at"]`` (``metadata -> 'image' ->
'taken_at'``), which is what a filter ``{"image": {"taken_at": {"$gte": ...}}}`` compares on. The
functions return NULL for values of another type and never raise (migration 0005): an odd row can
never make a write fail.

Builds are online (``memstore.db.online_ddl``): ``CREATE INDEX CONCURRENTLY``, or for a partitioned
collection the parent's index ``ON ONLY`` and each partition's built concurrently and attached. The
table is analysed afterwards, because the planner's estimate of how many rows a range keeps comes from
the statistics ANALYZE gathers on the index's expression; without them it guesses. An invalid index
left by an interrupted build is listed as such and built again by the next ``create``. Dropping is
``DROP INDEX CONCURRENTLY``, except the parent index of a partitioned collection, which PostgreSQL
can only drop under a short lock (bounded by online_ddl's lock_timeout).

Names are derived from the collection's id, the type and the field (hashed unless short and plain),
under the ``memstore_`` prefix that no collection table has, and always within PostgreSQL's 63 bytes.
The index's own expression is what ``list`` reads the field back from.

Every function takes an autocommit connection from the caller (``memstore.db.core.dedicated_connection``)
and holds the index's advisory lock while it works, so two builds or drops of one index never race.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import psycopg
from psycopg import sql

from memstore.catalog.collections import Collection
from memstore.catalog.field_paths import split_names
from memstore.catalog.metadata_sql import is_list, typed_expression
from memstore.db import locks, online_ddl
from memstore.errors import ConflictError, InvalidInputError

IndexType = Literal["number", "timestamp", "keyword"]
INDEX_TYPES: tuple[IndexType, ...] = ("number", "timestamp", "keyword")
MAX_FIELD_LENGTH = 128

_TYPE_CODES: dict[str, str] = {"number": "num", "timestamp": "ts", "keyword": "kw"}
_FUNCTIONS: dict[str, IndexType] = {
    "memstore_number": "number",
    "memstore_timestamp": "timestamp",
    "memstore_keyword": "keyword",
}
# A field that can stand in the index's name as it is; any other is hashed.
_PLAIN_FIELD = re.compile(r"[a-z0-9][a-z0-9_]{0,19}")
# The first column of a typed index as pg_get_indexdef prints it (standard_conforming_strings on):
# the function, then the path, each key as a quoted literal (``_printed`` writes it the same way).
_DEFINITION = re.compile(r"(memstore_[a-z]+)\((.*)\)", re.DOTALL)
_KEY = re.compile(r"'((?:[^']|'')*)'::text")
MAX_PATH = 8  # keys in a nested field's path

# A field: a top-level key, or the path of keys to a nested one.
FieldName = str | tuple[str, ...] | builtins.list[str]


@dataclass(frozen=True)
class MetadataIndex:
    field: str | builtins.list[str]  # a top-level key, or the path to a nested field
    type: IndexType
    name: str  # the index on the collection's table (its parent's, for a partitioned collection)
    valid: bool  # usable: built, and for a partitioned collection every partition's attached
    size_bytes: int  # on disk, every partition's together


def check_field(value: Any) -> tuple[str, ...]:
    """A field as its path: a string, a key or a dotted path as a filter names one
    (``field_paths.split_names``: ``image.taken_at``, ``price\\.usd``), or a list of the keys down to
    a nested field; 1 to MAX_PATH non-empty keys of at most MAX_FIELD_LENGTH characters without NUL."""
    if isinstance(value, str):
        if len(value) > MAX_PATH * (2 * MAX_FIELD_LENGTH + 1):  # longer than any path, escaped: not split
            raise InvalidInputError(f"field must be a metadata key or a path of at most {MAX_PATH} keys")
        value = split_names(value, "field")
    keys = value
    if not isinstance(keys, builtins.list | tuple) or not 1 <= len(keys) <= MAX_PATH:
        raise InvalidInputError(
            f"field must be a metadata key, or a list of 1 to {MAX_PATH} keys to a nested one, not {value!r:.80}"
        )
    for key in keys:
        if not isinstance(key, str) or not key or len(key) > MAX_FIELD_LENGTH or "\x00" in key:
            raise InvalidInputError(
                f"field must be made of non-empty strings of at most {MAX_FIELD_LENGTH} characters without NUL, "
                f"not {key!r:.80}"
            )
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInputError("field contains text that is not valid Unicode (a lone surrogate)") from None
    return tuple(keys)


def _shown(path: tuple[str, ...]) -> str | builtins.list[str]:
    """A path as the API shows it: a top-level key as itself when a string of it names it (no dot, no
    escape), any other as its list of keys."""
    return path[0] if len(path) == 1 and _reads_as_itself(path[0]) else builtins.list(path)


def _reads_as_itself(key: str) -> bool:
    try:
        return split_names(key) == (key,)
    except InvalidInputError:  # "a.", ".a": names with an empty part
        return False


def _printed(path: tuple[str, ...]) -> str:
    """``metadata -> 'a' -> 'b'`` as pg_get_indexdef prints it."""
    text = "metadata"
    for key in path:
        text = f"({text} -> '{key.replace(chr(39), chr(39) * 2)}'::text)"
    return text


def _value(path: tuple[str, ...]) -> sql.Composed:
    out: sql.Composable = sql.SQL("metadata")
    for key in path:
        out = sql.SQL("{} -> {}").format(out, sql.Literal(key))
    return sql.Composed([out])


def check_type(value: Any) -> IndexType:
    if value not in INDEX_TYPES:
        raise InvalidInputError(f"type must be one of {', '.join(INDEX_TYPES)}, not {value!r:.40}")
    return cast(IndexType, value)


def index_name(c: Collection, field: FieldName, type: IndexType, partition: int | None = None) -> str:
    """The index's name on the collection's table, or on its partition ``partition``. Distinct for
    every (collection, field, type, partition): after ``c<id>_`` comes the type code for the parent
    and ``p<n>_`` for a partition; a plain field starts with a letter or digit, a hashed one with "_"."""
    return _name(c, field, _TYPE_CODES[type], partition)


def _name(c: Collection, field: FieldName, code: str, partition: int | None) -> str:
    path = (field,) if isinstance(field, str) else tuple(field)
    if len(path) == 1:
        plain = _PLAIN_FIELD.fullmatch(path[0])
        slug = path[0] if plain else "_" + hashlib.sha256(path[0].encode("utf-8")).hexdigest()[:16]
    else:  # a nested field: always hashed (its path as JSON), so no key can pass for another path
        slug = "_" + hashlib.sha256(json.dumps(builtins.list(path)).encode("utf-8")).hexdigest()[:16]
    owner = f"c{c.id}" if partition is None else f"c{c.id}_p{partition}"
    name = f"memstore_mx_{owner}_{code}_{slug}"
    assert len(name.encode()) <= 63, name
    return name


def lists_index_name(c: Collection, field: FieldName, partition: int | None = None) -> str:
    """The partial index beside a field's typed indexes: the rows whose field is a list."""
    return _name(c, field, "ls", partition)


def create(conn: psycopg.Connection[Any], c: Collection, field: FieldName, type: str) -> MetadataIndex:
    """Build the index (or finish an interrupted build), and the field's lists index if it has none,
    and analyse the table; the index as listed. Returns at once when both exist and are valid.

    The lists index holds only the rows whose field is a JSON array (none, for a field that is never
    a list): a typed comparison's list branch (``filter_language``: an element meets it) is guarded
    by its predicate, so a range on a sparse field is two small index scans, not a table scan."""
    field, kind = check_field(field), check_type(type)
    name = index_name(c, field, kind)
    lists = lists_index_name(c, field)
    definition = sql.SQL("USING btree (({}))").format(typed_expression(kind, tuple(sql.Literal(k) for k in field)))
    lists_definition = sql.SQL("USING btree ((1)) WHERE {}").format(is_list(_value(field)))
    with _working_on(conn, name):
        already = _find(conn, c, name)
        if already is not None and already.valid and online_ddl.index_valid(conn, lists):
            return already
        online_ddl.build_index(
            conn, c, name, definition, partition_name=lambda i: index_name(c, field, kind, partition=i)
        )
        online_ddl.build_index(
            conn, c, lists, lists_definition, partition_name=lambda i: lists_index_name(c, field, partition=i)
        )
        online_ddl.execute(conn, sql.SQL("ANALYZE {}").format(c.table))
        built = _find(conn, c, name)
    assert built is not None
    return built


def list(conn: psycopg.Connection[Any], c: Collection) -> builtins.list[MetadataIndex]:
    """The collection's typed metadata indexes, by name; invalid ones (an interrupted build) too."""
    return [index for index in _read(conn, c) if index is not None]


def drop(conn: psycopg.Connection[Any], c: Collection, field: FieldName, type: str) -> bool:
    """Drop the index (and what an interrupted build left on the partitions); False when there was
    none."""
    field, kind = check_field(field), check_type(type)
    name = index_name(c, field, kind)
    with _working_on(conn, name):
        existed = online_ddl.index_valid(conn, name) is not None
        _drop(conn, c, name, lambda i: index_name(c, field, kind, partition=i))
        if not any(index.field == _shown(field) for index in list(conn, c)):  # the field's last typed index
            _drop(conn, c, lists_index_name(c, field), lambda i: lists_index_name(c, field, partition=i))
    return existed


def _drop(conn: psycopg.Connection[Any], c: Collection, name: str, partition_name: Callable[[int], str]) -> None:
    online_ddl.drop_index(conn, name, partitioned=c.partitions > 1)
    if c.partitions > 1:
        # Attached partition indexes went with the parent's; unattached ones are left over.
        for i in range(c.partitions):
            online_ddl.drop_index(conn, partition_name(i), partitioned=False)


@contextmanager
def _working_on(conn: psycopg.Connection[Any], name: str) -> Iterator[None]:
    """The index's advisory lock and online_ddl's lock_timeout for the block, on the caller's
    autocommit connection (the timeout reset afterwards)."""
    if not conn.autocommit:
        raise ValueError("typed metadata indexes are built and dropped on an autocommit connection")

    def busy() -> ConflictError:
        return ConflictError(f"index {name} is being built or dropped")

    with locks.session_lock(conn, locks.index_key(name), busy=busy):
        online_ddl.set_lock_timeout(conn)
        try:
            yield
        finally:
            if not conn.closed and not conn.broken:
                conn.execute("RESET lock_timeout")


def _find(conn: psycopg.Connection[Any], c: Collection, name: str) -> MetadataIndex | None:
    return next((index for index in _read(conn, c) if index is not None and index.name == name), None)


def _read(conn: psycopg.Connection[Any], c: Collection) -> builtins.list[MetadataIndex | None]:
    """Every index on the table under this collection's typed-index prefix; None for one whose
    definition is not what its name says (not ours)."""
    rows = conn.execute(
        """
        SELECT i.relname, pg_get_indexdef(x.indexrelid, 1, false),
               coalesce((SELECT bool_and(y.indisvalid) FROM pg_partition_tree(x.indexrelid) AS t
                         JOIN pg_index AS y ON y.indexrelid = t.relid), x.indisvalid),
               coalesce((SELECT sum(pg_relation_size(t.relid)) FROM pg_partition_tree(x.indexrelid) AS t),
                        pg_relation_size(x.indexrelid))
        FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid
        WHERE x.indrelid = to_regclass(%s) AND starts_with(i.relname, %s)
        ORDER BY i.relname
        """,
        (c.table.as_string(conn), f"memstore_mx_c{c.id}_"),
    ).fetchall()
    return [_entry(c, name, definition, valid, size) for name, definition, valid, size in rows]


def _entry(c: Collection, name: str, definition: str, valid: bool, size: int) -> MetadataIndex | None:
    match = _DEFINITION.fullmatch(definition)
    kind = _FUNCTIONS.get(match.group(1)) if match else None
    if match is None or kind is None:
        return None
    path = tuple(key.replace("''", "'") for key in _KEY.findall(match.group(2)))
    if not path or _printed(path) != match.group(2) or index_name(c, path, kind) != name:
        return None
    return MetadataIndex(field=_shown(path), type=kind, name=name, valid=bool(valid), size_bytes=int(size))
