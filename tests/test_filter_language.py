"""The filter language: compiled SQL against the pure-Python evaluator of ``tests.test_filter_oracle``
on real collection tables, exactly on small generated tables and through typed indexes on a larger one;
bad filters name their path."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog import metadata_indexes
from memstore.catalog.collections import Collection
from memstore.db.core import dedicated_connection
from memstore.errors import InvalidInputError
from memstore.search.filter_language import (
    MAX_FILTER_CLAUSES,
    MAX_FILTER_DEPTH,
    MAX_KEYWORD_LENGTH,
    compile_filter,
    parse_timestamp,
)
from memstore.settings import Settings
from memstore.store import VectorStore
from tests.test_filter_oracle import RANGES, instant, matches

# ---------------------------------------------------------------------- generated metadata and filters


def date_text(day: str, hour: int | None, seconds: str, separator: str, offset: str) -> str:
    return day if hour is None else f"{day}{separator}{hour:02d}:00{seconds}{offset}"


NUMBERS = st.sampled_from([-3, -1.5, 0, 1, 1.0, 2, 2.5, 10, 100, 1e3, 0.1, 12345678901234567890])
DATES = st.builds(
    date_text,
    day=st.sampled_from(["2024-05-01", "2024-04-30", "2023-12-31", "2024-02-29"]),
    hour=st.sampled_from([None, 0, 2, 20, 23]),
    seconds=st.sampled_from(["", ":00", ":30.5", ":59.999999"]),
    separator=st.sampled_from(["T", " ", "t"]),
    offset=st.sampled_from(["", "Z", "z", "+02:00", "-0400", "+05", "-00:30"]),
)
NOT_DATES = st.sampled_from(
    ["2023-02-29", "2024-05-01T24:00", "2024-5-1", "05/01/2024", "2024-05-01T10:00+24:00", "2024-05-01T10"]
)
STRINGS = st.sampled_from(["", "a", "ab", "b", "B", "é", "z", "10", "😀", "a'b", "%s", "2024"])
LONG_STRINGS = st.sampled_from(["a" * (MAX_KEYWORD_LENGTH + 1), "b" * MAX_KEYWORD_LENGTH])
ATOMS = st.one_of(st.booleans(), st.none())
SCALARS = st.one_of(NUMBERS, DATES, NOT_DATES, STRINGS, ATOMS)

# What a row's fields hold: mostly their own type, sometimes another (or a near-miss date).
ROW_VALUES = {
    "price": st.one_of(NUMBERS, NUMBERS, NUMBERS, STRINGS, ATOMS),
    "taken": st.one_of(DATES, DATES, DATES, NOT_DATES, NUMBERS),
    "sku": st.one_of(STRINGS, STRINGS, STRINGS, LONG_STRINGS, DATES, NUMBERS),
    "tags": st.one_of(st.lists(st.one_of(STRINGS, NUMBERS), max_size=4), STRINGS),
    "exif": st.one_of(
        st.fixed_dictionaries({"iso": NUMBERS, "make": STRINGS, "taken": DATES}),
        st.fixed_dictionaries({}, optional={"iso": NUMBERS, "make": STRINGS, "taken": DATES}),
        STRINGS,
        st.lists(NUMBERS, max_size=2),
    ),
    "flag": ATOMS,
}


@st.composite
def generated_metadata(draw: st.DrawFn) -> dict[str, Any]:
    """A row's metadata: each field present six times in seven."""
    return {key: draw(values) for key, values in ROW_VALUES.items() if draw(st.integers(0, 6)) < 6}


# Each field with the type its values mostly have (None: no type of its own).
FIELD_KINDS: dict[tuple[str, ...], str | None] = {
    ("price",): "number",
    ("taken",): "timestamp",
    ("sku",): "keyword",
    ("exif", "iso"): "number",
    ("exif", "taken"): "timestamp",
    ("exif", "make"): "keyword",
    ("tags",): None,
    ("flag",): None,
    ("exif",): None,
    ("missing",): None,
    ("exif", "missing", "deeper"): None,
}
# Typed fields thrice as often: most filters should keep some rows and drop others.
FIELDS = st.sampled_from([f for f, kind in FIELD_KINDS.items() for _ in range(3 if kind else 1)])
TYPED_OPERANDS = {"number": NUMBERS, "timestamp": DATES, "keyword": STRINGS}
# Comparisons weigh most: their edges (equal values, other types, missing fields) are where bugs hide.
OPERATORS = st.sampled_from(
    ["$gt", "$gte", "$lt", "$lte"] * 2 + ["$eq", "$ne", "$in", "$nin", "$exists", "$contains", "$not"]
)


@st.composite
def operator_objects(draw: st.DrawFn, kind: str | None, depth: int = 0) -> dict[str, Any]:
    """One to three operators; comparisons mostly of the field's own type, so that they match some rows."""
    # Hypothesis leans to the first choices (0 here): they keep the field's own type.
    if kind is None or draw(st.integers(0, 4)) == 4:
        kind = draw(st.sampled_from(sorted(TYPED_OPERANDS)))
    typed = TYPED_OPERANDS[kind]
    ops: dict[str, Any] = {}
    size = draw(st.sampled_from([1, 1, 1, 1, 2, 3]))
    for op in draw(st.lists(OPERATORS, min_size=size, max_size=size, unique=True)):
        if op in ("$eq", "$ne"):
            ops[op] = draw(st.one_of(typed, typed, SCALARS, st.lists(STRINGS, max_size=2)))
        elif op in RANGES:
            ops[op] = draw(typed)
        elif op in ("$in", "$nin"):
            values = draw(st.sampled_from([typed, typed, NUMBERS, DATES, STRINGS, ATOMS]))
            ops[op] = draw(st.lists(values, max_size=3))
        elif op == "$exists":
            ops[op] = draw(st.booleans())
        elif op == "$contains":
            ops[op] = draw(st.one_of(STRINGS, NUMBERS, st.lists(st.one_of(STRINGS, NUMBERS), max_size=2)))
        elif depth == 0:
            ops[op] = draw(operator_objects(kind, depth=1))
    return ops or {"$exists": True}


def set_field(target: dict[str, Any], fields: tuple[str, ...], value: Any) -> None:
    """Put ``value`` at ``fields``; a clash with an operator object or a plain value replaces it."""
    for name in fields[:-1]:
        child = target.get(name)
        if not isinstance(child, dict) or not child or any(k.startswith("$") for k in child):
            child = target[name] = {}
        target = child
    target[fields[-1]] = value


@st.composite
def field_filters(draw: st.DrawFn) -> dict[str, Any]:
    flt: dict[str, Any] = {}
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 2]))):
        fields = draw(FIELDS)
        kind = FIELD_KINDS[fields]
        if draw(st.integers(0, 3)):
            value = draw(operator_objects(kind))
        else:
            natural = TYPED_OPERANDS[kind] if kind else SCALARS
            lists = st.lists(st.one_of(STRINGS, NUMBERS), max_size=2)
            objects = st.fixed_dictionaries({}, optional={"iso": NUMBERS})
            value = draw(st.one_of(natural, natural, SCALARS, lists, objects))
        set_field(flt, fields, value)
    return flt


def generated_filters(depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Fields and up to two levels of logical operators (deeper ones, with a nested path and a
    nested $not, would pass MAX_FILTER_DEPTH)."""
    if depth == 2:
        return field_filters()
    inner = generated_filters(depth + 1)
    return st.one_of(
        field_filters(),
        field_filters(),
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda f: {"$not": f}, inner),
        st.builds(lambda f, g: {**f, "$or": [g]}, field_filters(), inner),
    )


FILTERS = generated_filters()


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def module_store(engine: sa.Engine, settings: Settings) -> VectorStore:
    return VectorStore(engine, settings=settings)


@pytest.fixture(scope="module")
def conn(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    with dedicated_connection(engine, application_name="test-filter-language") as c:
        yield c


@pytest.fixture(scope="module")
def small_collection(module_store: VectorStore) -> Collection:
    return module_store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2)


def insert(conn: psycopg.Connection[Any], c: Collection, rows: list[dict[str, Any]]) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} (external_id, metadata) SELECT * FROM unnest(%s::text[], %s::jsonb[])").format(c.table),
        ([str(i) for i in range(len(rows))], [Jsonb(m) for m in rows]),
    )


def matching(conn: psycopg.Connection[Any], c: Collection, flt: dict[str, Any]) -> set[str]:
    compiled = compile_filter(flt)
    query = sql.SQL("SELECT external_id FROM {} WHERE {}").format(c.table, compiled.where)
    return {row[0] for row in conn.execute(query, compiled.params)}


# ---------------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(generated_metadata(), min_size=30, max_size=60), filters=st.lists(FILTERS, min_size=1, max_size=6))
def test_compiled_filters_select_exactly_the_rows_the_oracle_selects(
    conn: psycopg.Connection[Any], small_collection: Collection, rows: list[dict[str, Any]], filters: list[Any]
) -> None:
    with conn.transaction(force_rollback=True):
        insert(conn, small_collection, rows)
        for flt in filters:
            expected = {str(i) for i, metadata in enumerate(rows) if matches(flt, metadata)}
            assert matching(conn, small_collection, flt) == expected, json.dumps(flt)


TIMESTAMP_TEXT = st.one_of(
    DATES,
    NOT_DATES,
    st.builds(
        lambda y, mo, d, h, mi, s, frac, off: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{off}",
        st.integers(0, 9999),
        st.integers(0, 13),
        st.integers(0, 32),
        st.integers(0, 25),
        st.integers(0, 61),
        st.integers(0, 61),
        st.sampled_from(["", ".5", ".123456", ".1234567", "."]),
        st.sampled_from(["", "Z", "+23:59", "-23:59", "+24:00", "+05:60", "+0530", "+5", "-00"]),
    ),
    st.text(alphabet="0123456789-:T.Z+ ", max_size=30),
    st.text(max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(TIMESTAMP_TEXT, min_size=1, max_size=20))
def test_memstore_timestamp_reads_iso_8601_as_the_oracle_does_whatever_the_session_settings(
    conn: psycopg.Connection[Any], texts: list[str]
) -> None:
    texts = [t.replace("\x00", "") for t in texts]
    epoch = date(1970, 1, 1).toordinal() * 86400 * 1_000_000
    with conn.transaction(force_rollback=True):
        # An offset of 12:45 and day-first dates: neither may change what a stored string means.
        conn.execute("SET LOCAL TimeZone = 'Pacific/Chatham'")
        conn.execute("SET LOCAL DateStyle = 'SQL, DMY'")
        rows = conn.execute(
            "SELECT (extract(epoch FROM memstore_timestamp(to_jsonb(t))) * 1000000)::numeric "
            "FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n",
            (texts,),
        ).fetchall()
    got = [None if r[0] is None else int(r[0]) + epoch for r in rows]
    assert got == [instant(t) for t in texts]


def test_typed_functions_return_null_for_values_of_another_type(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        """
        SELECT memstore_number('"5"'), memstore_number('true'), memstore_number('5.50'),
               memstore_keyword('5'), memstore_keyword('"abc"'), memstore_keyword(to_jsonb(repeat('x', 513))),
               memstore_timestamp('20240501'), memstore_timestamp('{"a": 1}'), memstore_timestamp(NULL)
        """
    ).fetchone()
    assert row == (None, None, Decimal("5.50"), None, "abc", None, None, None, None)


ROWS: dict[str, dict[str, Any]] = {
    "one": {"price": 1, "taken": "2024-05-01", "sku": "a", "tags": ["cat", "dog"], "exif": {"iso": 100, "make": "C"}},
    "one_float": {"price": 1.0, "taken": "2024-05-01T02:00:00+02:00", "sku": "B", "tags": ["cat"]},
    "tenth": {"price": 0.1, "taken": "2024-04-30T23:59:59.999999Z", "sku": "é", "exif": {"iso": 400}},
    "text": {"price": "10", "taken": "yesterday", "sku": 5, "tags": "cat", "exif": "none"},
    "null": {"price": None, "sku": "b" * MAX_KEYWORD_LENGTH, "flag": True},
    "long": {"sku": "a" * (MAX_KEYWORD_LENGTH + 1), "flag": False, "exif.iso": 100},
    "empty": {},
}
EVERY = set(ROWS)
CASES: list[tuple[dict[str, Any], set[str]]] = [
    ({"price": {"$gte": 1}}, {"one", "one_float"}),
    ({"price": {"$gt": 1}}, set()),
    ({"price": {"$eq": 0.1}}, {"tenth"}),
    ({"price": {"$lt": 1}}, {"tenth"}),
    ({"price": {"$lt": "2"}}, {"text"}),  # a string operand compares strings: "10" < "2"
    ({"price": {"$gte": "2024-01-01"}}, set()),
    ({"price": {"$ne": 1}}, EVERY - {"one", "one_float"}),
    ({"price": {"$in": []}}, set()),
    ({"price": {"$nin": []}}, EVERY),
    ({"price": {"$nin": [1, 0.1]}}, {"text", "null", "long", "empty"}),
    ({"price": {"$exists": True}}, {"one", "one_float", "tenth", "text", "null"}),
    ({"price": {"$exists": False}}, {"long", "empty"}),
    ({"price": {"$eq": None}}, {"null"}),
    ({"price": None}, {"null"}),
    ({"taken": {"$eq": "2024-05-01T00:00Z"}}, {"one", "one_float"}),  # one instant, two spellings
    ({"taken": "2024-05-01"}, {"one"}),  # a plain value is contained as it is written
    ({"taken": {"$lt": "2024-05-01"}}, {"tenth"}),
    ({"taken": {"$gte": "2024-04-30T23:59:59.999999Z", "$lte": "2024-05-01"}}, {"one", "one_float", "tenth"}),
    ({"sku": {"$lt": "a"}}, {"one_float"}),  # by code point: "B" < "a"
    ({"sku": {"$gte": "a"}}, {"one", "tenth", "null"}),  # a string over the limit is not compared
    ({"sku": {"$eq": 5}}, {"text"}),
    ({"tags": {"$contains": "cat"}}, {"one", "one_float"}),
    ({"tags": {"$contains": ["cat", "dog"]}}, {"one"}),
    ({"tags": "cat"}, {"one", "one_float", "text"}),  # equal, or a list holding it
    ({"tags": ["cat"]}, {"one", "one_float"}),
    ({"tags": {"$eq": ["cat"]}}, {"one_float"}),
    ({"exif": {"iso": {"$gt": 100}}}, {"tenth"}),
    ({"exif": {"iso": {"$gte": 100}, "make": "C"}}, {"one"}),
    ({"exif": {"iso": {"$exists": False}}}, EVERY - {"one", "tenth"}),
    # Dot notation is the nested form (MongoDB's and Qdrant's); "\\." is a dot inside a name.
    ({"exif.iso": {"$gt": 100}}, {"tenth"}),
    ({"exif.iso": 100}, {"one"}),
    ({"exif.iso": {"$gte": 100}, "exif.make": "C"}, {"one"}),
    ({"exif.iso": {"$exists": False}}, EVERY - {"one", "tenth"}),
    ({"exif.iso": {"$gte": 100}, "exif": {"make": "C"}}, {"one"}),
    ({"exif": {"iso": [100]}, "exif.iso": [400]}, set()),  # two clauses on one field: both hold
    ({"exif\\.iso": 100}, {"long"}),
    ({"exif\\.iso": {"$exists": True}}, {"long"}),
    ({"$or": [{"price": {"$lt": 1}}, {"sku": {"$eq": 5}}]}, {"tenth", "text"}),
    ({"$not": {"price": {"$gte": 1}}}, EVERY - {"one", "one_float"}),
    ({"price": {"$not": {"$gte": 1}}}, EVERY - {"one", "one_float"}),
    ({"flag": {"$exists": True}, "$and": [{"flag": {"$ne": True}}]}, {"long"}),
]


@pytest.mark.parametrize("flt, expected", CASES, ids=[json.dumps(f, ensure_ascii=False) for f, _ in CASES])
def test_the_documented_meaning_on_chosen_rows(
    conn: psycopg.Connection[Any], small_collection: Collection, flt: dict[str, Any], expected: set[str]
) -> None:
    names = list(ROWS)
    with conn.transaction(force_rollback=True):
        insert(conn, small_collection, list(ROWS.values()))
        got = {names[int(i)] for i in matching(conn, small_collection, flt)}
    assert got == expected
    assert {name for name, metadata in ROWS.items() if matches(flt, metadata)} == expected


@settings(max_examples=300, deadline=None)
@given(text=TIMESTAMP_TEXT)
def test_date_operands_are_read_as_the_oracle_reads_them(text: str) -> None:
    expected = instant(text)
    try:
        parsed = parse_timestamp(text)
    except OverflowError:
        # Only an offset across the first or last instant a Python datetime holds.
        assert expected is not None
        assert not date.min.toordinal() * 86400 * 10**6 <= expected < (date.max.toordinal() + 1) * 86400 * 10**6
        return
    if expected is None:
        assert parsed is None
    else:
        assert parsed is not None
        assert parsed.utcoffset() == timedelta(0)
        since_start = parsed.replace(tzinfo=None) - datetime(1, 1, 1)
        assert since_start // timedelta(microseconds=1) + 86400 * 10**6 == expected


# ---------------------------------------------------------------------- the same answers through typed indexes


@dataclass(repr=False)  # Hypothesis prints the arguments of a failing example: not 3,000 rows
class IndexedTable:
    collection: Collection
    rows: list[dict[str, Any]]


@pytest.fixture(scope="module")
def indexed_table(module_store: VectorStore, conn: psycopg.Connection[Any]) -> IndexedTable:
    """3,000 rows, mostly typed as the indexes expect, some not; typed indexes on price, taken, sku."""
    rng = random.Random(7)
    c = module_store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2, partitions=2)
    rows: list[dict[str, Any]] = []
    for i in range(3000):
        metadata: dict[str, Any] = {}
        if rng.random() < 0.95:
            metadata["price"] = rng.choice([i, i / 4, str(i), True]) if rng.random() < 0.05 else i % 500
        if rng.random() < 0.95:
            offset = rng.choice(["Z", "+02:00", ""])
            metadata["taken"] = f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T{i % 24:02d}:00{offset}"
        if rng.random() < 0.95:
            metadata["sku"] = rng.choice([f"sku{i % 700:04d}", f"SKU{i}", i])
        rows.append(metadata)
    insert(conn, c, rows)
    for field, kind in (("price", "number"), ("taken", "timestamp"), ("sku", "keyword")):
        metadata_indexes.create(conn, c, field, kind)
    return IndexedTable(c, rows)


INDEXED_OPERANDS = {
    "price": st.one_of(st.integers(-5, 505), st.sampled_from([0.5, 99.75, 250.0])),
    "taken": st.builds(
        lambda mo, d, h, off: f"2024-{mo:02d}-{d:02d}T{h:02d}:30{off}",
        st.integers(1, 12),
        st.integers(1, 28),
        st.integers(0, 23),
        st.sampled_from(["", "Z", "-03:00"]),
    ),
    "sku": st.builds(lambda n, p: f"{p}{n:04d}", st.integers(0, 800), st.sampled_from(["sku", "SKU", "s"])),
}


@st.composite
def indexed_filters(draw: st.DrawFn) -> dict[str, Any]:
    field = draw(st.sampled_from(sorted(INDEXED_OPERANDS)))
    operand = INDEXED_OPERANDS[field]
    ops = draw(st.lists(st.sampled_from(["$gt", "$gte", "$lt", "$lte", "$eq", "$in"]), min_size=1, max_size=2))
    flt = {op: (draw(st.lists(operand, max_size=4)) if op == "$in" else draw(operand)) for op in ops}
    return {field: flt}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flt=indexed_filters())
def test_filters_through_typed_indexes_select_what_the_oracle_selects(
    conn: psycopg.Connection[Any], indexed_table: IndexedTable, flt: dict[str, Any]
) -> None:
    c, rows = indexed_table.collection, indexed_table.rows
    compiled = compile_filter(flt)
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")  # the index, wherever it can answer
        got = matching(conn, c, flt)
        explain = sql.SQL("EXPLAIN (FORMAT JSON) SELECT id FROM {} WHERE {}").format(c.table, compiled.where)
        plan = json.dumps(conn.execute(explain, compiled.params).fetchall())
    assert got == {str(i) for i, metadata in enumerate(rows) if matches(flt, metadata)}
    if '"One-Time Filter": "false"' not in plan:  # unless the planner proved that nothing matches
        # Ranges and dates through the typed index; numbers and strings compared for equality
        # through the GIN index on metadata (a partition's, here).
        assert '"Index Name": "memstore_mx_' in plan or '_metadata_idx"' in plan, plan


# ---------------------------------------------------------------------- what the compiler emits


def test_plain_arrays_and_objects_of_one_object_fold_into_one_containment() -> None:
    """Plain scalars are one ``metadata @> ANY(...)`` each: the value, or a list holding it."""
    compiled = compile_filter({"a": 1, "b": {"c": "x", "d": {"$gt": 5}}, "tags": ["cat"], "e": {}})
    containments = [v for v in compiled.params.values() if isinstance(v, Jsonb)]
    assert len(containments) == 1
    assert containments[0].obj == {"tags": ["cat"], "e": {}}
    alternatives = [[j.obj for j in v] for v in compiled.params.values() if isinstance(v, list)]
    assert alternatives == [[{"a": 1}, {"a": [1]}], [{"b": {"c": "x"}}, {"b": {"c": ["x"]}}]]


def test_values_are_parameters_and_names_are_quoted(
    conn: psycopg.Connection[Any], small_collection: Collection
) -> None:
    hostile_field = "x'); DROP TABLE memstore_collections; --"
    hostile_value = "'; DROP TABLE memstore_collections; --"
    flt = {hostile_field: {"$gt": 1}, "sku": {"$eq": hostile_value}, "50%": {"$lt": "%s"}}
    compiled = compile_filter(flt)
    assert all(name.startswith("f_") for name in compiled.params)
    assert hostile_value not in compiled.where.as_string(conn)
    rows = [{hostile_field: 2, "sku": hostile_value, "50%": "%"}, {hostile_field: 0, "sku": hostile_value}]
    with conn.transaction(force_rollback=True):
        insert(conn, small_collection, rows)
        assert matching(conn, small_collection, flt) == {"0"}
    assert conn.execute("SELECT count(*) FROM memstore_collections").fetchone() is not None


# ---------------------------------------------------------------------- bad filters


def _nested_not(levels: int) -> dict[str, Any]:
    flt: dict[str, Any] = {"a": 1}
    for _ in range(levels):
        flt = {"$not": flt}
    return flt


@pytest.mark.parametrize(
    "flt, path, words",
    [
        ({"price": {"$foo": 1}}, "filter.price.$foo", "unknown operator"),
        ({"price": {"$gt": {"a": 1}}}, "filter.price.$gt", "not an object"),
        ({"price": {"$lte": True}}, "filter.price.$lte", "not a boolean"),
        ({"exif": {"iso": {"$gt": [1]}}}, "filter.exif.iso.$gt", "not an array"),
        ({"price": {"$in": [1, "a"]}}, "filter.price.$in[1]", "share one type"),
        ({"taken": {"$in": ["2024-05-01", "May"]}}, "filter.taken.$in[1]", "share one type"),
        ({"price": {"$gte": 1, "$lt": "2024-01-01"}}, "filter.price.$lt", "compares a date"),
        ({"price": {"$gt": 1, "currency": "eur"}}, "filter.price", "mixes operators"),
        ({"price": {"$exists": "yes"}}, "filter.price.$exists", "true or false"),
        ({"price": {"$in": 5}}, "filter.price.$in", "JSON array"),
        ({"price": {"$not": 5}}, "filter.price.$not", "object of operators"),
        ({"price": {"$and": [{"$gt": 1}]}}, "filter.price.$and", "combines filters"),
        ({"$gt": 5}, "filter.$gt", "applies to a field"),
        ({"$nor": []}, "filter.$nor", "unknown operator"),
        ({"$or": []}, "filter.$or", "non-empty"),
        ({"$or": [{"a": 1}, 5]}, "filter.$or[1]", "must be a JSON object"),
        ({"a.b": {"$bad": 1}}, "filter.a.b.$bad", "unknown operator"),
        ({"a\\.b": {"$bad": 1}}, 'filter["a.b"].$bad', "unknown operator"),
        ({"a..b": 1}, 'filter["a..b"]', "empty name between dots"),
        ({"a.": 1}, 'filter["a."]', "empty name between dots"),
        ({"a.$gt": 1}, 'filter["a.$gt"]', "starting with $"),
        ({"price": {"$gt": float("nan")}}, "filter.price.$gt", "not a JSON number"),
        ({"taken": {"$gte": "0001-01-01T00:00+01:00"}}, "filter.taken.$gte", "out of the years"),
        ({"sku": {"$gt": "x" * (MAX_KEYWORD_LENGTH + 1)}}, "filter.sku.$gt", "compared up to"),
        ({"price": {"$in": list(range(600))}}, "filter.price.$in", "the limit is"),
        (_nested_not(MAX_FILTER_DEPTH), "filter" + ".$not" * MAX_FILTER_DEPTH, "deeper than"),
        ({"a": {"$eq": [[[[[[[[[1]]]]]]]]]}}, "filter.a.$eq", "deeper than"),
        ({"$and": [{"a": {"$gt": i}} for i in range(MAX_FILTER_CLAUSES + 1)]}, "filter.$and[64].a.$gt", "conditions"),
        ({"a": "x" * 20_000}, "filter", "bytes"),
        ({"a": "x\x00"}, "filter", "NUL"),
    ],
)
def test_a_bad_filter_is_refused_naming_the_path_of_the_offending_part(
    flt: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(InvalidInputError) as err:
        compile_filter(flt)
    message = str(err.value)
    assert message.startswith(f"{path}:") or message.startswith(f"{path} "), message
    assert words in message


def test_a_filter_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"^filter: a filter must be a JSON object, not an array"):
        compile_filter([{"a": 1}])  # type: ignore[arg-type]


def test_nesting_up_to_the_limit_is_accepted() -> None:
    assert compile_filter(_nested_not(MAX_FILTER_DEPTH - 1)).params


def test_keys_are_split_within_the_filter_s_size_before_it_is_encoded() -> None:
    """A hostile filter of huge or numberless dotted and escaped keys is refused once its keys pass
    the filter's size limit: each key is split in time linear in it, so the work stays bounded."""
    from memstore.inputs import MAX_FILTER_BYTES

    for flt in (
        {"\\a" * MAX_FILTER_BYTES: 1},
        {"a." * MAX_FILTER_BYTES + "a": 1},
        {f"k{i}\\.x": 1 for i in range(MAX_FILTER_BYTES // 4)},
        {"a": {f"k{i}.x": [i] for i in range(MAX_FILTER_BYTES // 4)}},
    ):
        with pytest.raises(InvalidInputError, match=f"the limit of a filter|more than {MAX_FILTER_CLAUSES} conditions"):
            compile_filter(flt)
    # dotted siblings fold into one containment, as their nested form does: no clause limit reached
    many = {f"exif.k{i}": [i] for i in range(MAX_FILTER_CLAUSES + 10)}
    folded = compile_filter(many)
    assert len(folded.params) == 1 and next(iter(folded.params.values())).obj == {
        "exif": {f"k{i}": [i] for i in range(MAX_FILTER_CLAUSES + 10)}
    }


def test_constants_fold_so_a_filter_for_everything_compiles_to_true() -> None:
    for everything in ({}, {"$or": [{}, {"x": 1}]}, {"$not": {"$not": {}}}, {"$and": [{}, {"$or": [{"y": 2}, {}]}]}):
        assert compile_filter(everything).where.as_string() == "TRUE", everything
    assert compile_filter({"$not": {}}).where.as_string() == "FALSE"
    assert (
        compile_filter({"$or": [{"x": 1}, {"$not": {}}]}).where.as_string()
        == compile_filter({"x": 1}).where.as_string()
    )
    assert compile_filter({"x": {"$in": []}}).where.as_string() == "FALSE"
    assert compile_filter({"$not": {"x": {"$in": []}}}).where.as_string() == "TRUE"


def test_integers_past_pythons_digits_for_text_are_refused() -> None:
    assert compile_filter({"n": {"$gt": 10**4000}}).params  # exact, as numeric
    with pytest.raises(InvalidInputError, match="digits"):
        compile_filter({"n": {"$gt": 10**5000}})
