"""The filter language's array semantics (MongoDB's and Qdrant's) against a pure-Python evaluator.

The evaluator below is written from the language's documentation (``memstore/search/filter_language.py``),
not from the SQL it compiles to: a scalar condition on a list holds when an element meets it, each
operator of a field's object on its own (``{"$gt": 1, "$lt": 5}`` on a list: some element above 1,
some element below 5); ``$ne`` and ``$nin`` are their negations (so a missing field meets them). A
property test generates filters of every operator over a few hundred items whose metadata mixes
scalars, lists and missing fields, and compares the rows the database selects with the evaluator's.
"""

from __future__ import annotations

import calendar
import json
import random
import uuid
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from memstore.catalog import metadata_indexes
from memstore.catalog.collections import Collection
from memstore.catalog.metadata_sql import MAX_KEYWORD_LENGTH
from memstore.db.core import dedicated_connection
from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.search.filter_language import compile_filter, looks_like_date
from memstore.settings import Settings
from memstore.store import VectorStore

# ---------------------------------------------------------------------- the evaluator

MISSING = object()


def lookup(metadata: dict[str, Any], fields: tuple[str, ...]) -> Any:
    """The value at ``fields``; MISSING when a parent is missing or not an object."""
    value: Any = metadata
    for name in fields:
        if not isinstance(value, dict) or name not in value:
            return MISSING
        value = value[name]
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def as_decimal(value: Any) -> Decimal:
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def scalar_equal(a: Any, b: Any) -> bool:
    """JSON equality of two scalars: numbers by value, other types only with their own type."""
    if is_number(a) and is_number(b):
        return as_decimal(a) == as_decimal(b)
    if is_number(a) or is_number(b):
        return False
    return type(a) is type(b) and a == b


def json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(json_equal, a, b))
    return not isinstance(b, dict | list) and scalar_equal(a, b)


def contains(a: Any, b: Any) -> bool:
    """JSON containment below the top level: the structures must match."""
    if isinstance(b, dict):
        return isinstance(a, dict) and all(k in a and contains(a[k], v) for k, v in b.items())
    if isinstance(b, list):
        return isinstance(a, list) and all(any(contains(x, e) for x in a) for e in b)
    return not isinstance(a, dict | list) and scalar_equal(a, b)


def _digits(text: str, start: int, count: int) -> bool:
    part = text[start : start + count]
    return len(part) == count and all("0" <= ch <= "9" for ch in part)


def instant(text: str) -> int | None:
    """Microseconds from 0001-01-01 UTC of an ISO 8601 string of the documented grammar, read
    position by position (the module and the SQL function use patterns)."""
    if not (_digits(text, 0, 4) and text[4:5] == "-" and _digits(text, 5, 2) and text[7:8] == "-"):
        return None
    if not _digits(text, 8, 2):
        return None
    year, month, day = int(text[0:4]), int(text[5:7]), int(text[8:10])
    hour = minute = second = micro = offset = 0
    rest = text[10:]
    if rest:
        if rest[0] not in "Tt " or not (_digits(rest, 1, 2) and rest[3:4] == ":" and _digits(rest, 4, 2)):
            return None
        hour, minute, rest = int(rest[1:3]), int(rest[4:6]), rest[6:]
        if rest.startswith(":"):
            if not _digits(rest, 1, 2):
                return None
            second, rest = int(rest[1:3]), rest[3:]
            if rest.startswith("."):
                end = 1
                while end < len(rest) and "0" <= rest[end] <= "9":
                    end += 1
                if not 1 <= end - 1 <= 6:
                    return None
                micro, rest = int(rest[1:end].ljust(6, "0")), rest[end:]
        if rest in ("Z", "z"):
            rest = ""
        if rest:
            sign, body = rest[0], rest[1:]
            if sign not in "+-":
                return None
            if len(body) == 2 and _digits(body, 0, 2):
                off_h, off_m = int(body), 0
            elif len(body) == 4 and _digits(body, 0, 4):
                off_h, off_m = int(body[:2]), int(body[2:])
            elif len(body) == 5 and body[2] == ":" and _digits(body, 0, 2) and _digits(body, 3, 2):
                off_h, off_m = int(body[:2]), int(body[3:])
            else:
                return None
            if off_h > 23 or off_m > 59:
                return None
            offset = (off_h * 60 + off_m) * (1 if sign == "+" else -1)
    if year < 1 or not 1 <= month <= 12 or not 1 <= day <= calendar.monthrange(year, month)[1]:
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    seconds = date(year, month, day).toordinal() * 86400 + hour * 3600 + minute * 60 + second - offset * 60
    return seconds * 1_000_000 + micro


def operand_kind(value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        return "json"
    if is_number(value):
        return "number"
    return "keyword" if instant(value) is None else "timestamp"


def typed(actual: Any, kind: str) -> Any:
    """One value (never a list) as the operand's type, or MISSING when it is not one."""
    if kind == "number":
        return as_decimal(actual) if is_number(actual) else MISSING
    if kind == "timestamp":
        moment = instant(actual) if isinstance(actual, str) else None
        return MISSING if moment is None else moment
    if isinstance(actual, str) and len(actual) <= MAX_KEYWORD_LENGTH:
        return actual
    return MISSING


def operand_value(operand: Any, kind: str) -> Any:
    return {"number": as_decimal, "timestamp": instant}.get(kind, lambda v: v)(operand)


def candidates(actual: Any) -> list[Any]:
    """What a scalar condition is tried on: the value itself and, for a list, each element."""
    if actual is MISSING:
        return []
    return [actual, *actual] if isinstance(actual, list) else [actual]


def one_equal(value: Any, operand: Any) -> bool:
    kind = operand_kind(operand)
    if kind == "json":
        return json_equal(value, operand)
    if kind == "keyword":
        return isinstance(value, str) and value == operand  # exact, whatever the length
    moment = typed(value, kind)
    return moment is not MISSING and moment == operand_value(operand, kind)


def equal(actual: Any, operand: Any) -> bool:
    return any(one_equal(value, operand) for value in candidates(actual))


RANGES = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def in_range(actual: Any, op: str, operand: Any) -> bool:
    kind = operand_kind(operand)
    bound = operand_value(operand, kind)
    for value in candidates(actual):
        moment = MISSING if isinstance(value, list) else typed(value, kind)
        if moment is not MISSING and RANGES[op](moment, bound):
            return True
    return False


def operators_hold(actual: Any, ops: dict[str, Any]) -> bool:
    """Each operator of the object on its own, all of them holding."""
    for op, operand in ops.items():
        if op == "$eq":
            ok = equal(actual, operand)
        elif op == "$ne":
            ok = not equal(actual, operand)
        elif op in RANGES:
            ok = in_range(actual, op, operand)
        elif op == "$in":
            ok = any(equal(actual, v) for v in operand)
        elif op == "$nin":
            ok = not any(equal(actual, v) for v in operand)
        elif op == "$exists":
            ok = (actual is not MISSING) == operand
        elif op in ("$contains", "$all"):
            ok = actual is not MISSING and contains(actual, operand if isinstance(operand, list) else [operand])
        elif op == "$size":
            ok = isinstance(actual, list) and len(actual) == operand
        elif op == "$not":
            ok = not operators_hold(actual, operand)
        else:
            raise AssertionError(op)
        if not ok:
            return False
    return True


def names(key: str) -> tuple[str, ...]:
    """A filter key's names, as docs/search.md says: a dot separates nested fields, a backslash
    makes the next character (a dot, a backslash or a $) part of the name."""
    out, current, i = [], "", 0
    while i < len(key):
        if key[i] == "\\" and i + 1 < len(key) and key[i + 1] in ".\\$":
            current, i = current + key[i + 1], i + 2
        elif key[i] == ".":
            out, current, i = [*out, current], "", i + 1
        else:
            current, i = current + key[i], i + 1
    return (*out, current)


def field_holds(metadata: dict[str, Any], fields: tuple[str, ...], value: Any) -> bool:
    if isinstance(value, dict) and value and all(k.startswith("$") for k in value):
        return operators_hold(lookup(metadata, fields), value)
    if isinstance(value, dict) and value:
        return all(field_holds(metadata, (*fields, *names(k)), v) for k, v in value.items())
    actual = lookup(metadata, fields)
    if isinstance(value, dict | list):  # arrays and objects: containment
        return actual is not MISSING and contains(actual, value)
    return any(not isinstance(v, dict | list) and scalar_equal(v, value) for v in candidates(actual))


def matches(flt: dict[str, Any], metadata: dict[str, Any]) -> bool:
    for key, value in flt.items():
        if key == "$and":
            ok = all(matches(f, metadata) for f in value)
        elif key == "$or":
            ok = any(matches(f, metadata) for f in value)
        elif key == "$not":
            ok = not matches(value, metadata)
        else:
            ok = field_holds(metadata, names(key), value)
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------- items

NUMBERS = [-2, 0, 1, 1.0, 1.5, 3, 10, 100, 12345678901234567890]
DATES = [
    "2024-05-01",
    "2024-05-01T00:00:00Z",
    "2024-05-01T02:00+02:00",
    "2024-04-30T23:59:59.5Z",
    "2023-12-31",
    "2024-06-15T12:00:00-04:00",
    "2024-02-29t08:00",
]
STRINGS = ["", "a", "b", "B", "pets", "holiday", "money", "é", "10", "2024", "z" * (MAX_KEYWORD_LENGTH + 1)]
NOT_ISO = ["2024-5-1", "05/01/2024", "2023-02-29"]  # stored strings that are not dates
ATOMS = [True, False, None]
SCALARS = NUMBERS + DATES + STRINGS + NOT_ISO + ATOMS
OWN: dict[str, list[Any]] = {"n": NUMBERS, "d": DATES, "s": STRINGS, "tags": STRINGS[:8], "b": ATOMS, "m": SCALARS}
ITEMS = 300


def item_value(rng: random.Random, own: list[Any]) -> Any:
    """A field's value: its own kind of scalar, another scalar, a list of them (mixed now and then,
    with an odd nested list or object), or absent (MISSING)."""
    roll = rng.random()
    if roll < 0.15:
        return MISSING
    if roll < 0.45:
        return rng.choice(own)
    if roll < 0.55:
        return rng.choice(SCALARS)
    pool = own if rng.random() < 0.7 else SCALARS
    values: list[Any] = [rng.choice(pool) for _ in range(rng.choice([0, 1, 2, 2, 3, 4]))]
    if rng.random() < 0.08:
        values.append(rng.choice([[1, 2], ["pets"], {"x": 1}, []]))
    return values


def make_items(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    for _ in range(ITEMS):
        metadata: dict[str, Any] = {}
        for name, own in OWN.items():
            value = item_value(rng, own)
            if value is not MISSING:
                metadata[name] = value
        roll = rng.random()
        if roll < 0.6:
            nested = {name: item_value(rng, own) for name, own in (("x", NUMBERS), ("y", STRINGS[:8] + DATES[:3]))}
            metadata["o"] = {k: v for k, v in nested.items() if v is not MISSING}
        elif roll < 0.7:
            metadata["o"] = [{"x": rng.choice(NUMBERS)}]  # a list of objects: o.x is missing
        elif roll < 0.8:
            metadata["o"] = rng.choice(SCALARS)
        if rng.random() < 0.5:  # a key holding a dot: one name, not a path
            metadata["k.v"] = rng.choice(NUMBERS)
        if rng.random() < 0.5:  # a key starting with $: a field, written "\$ref" in a filter
            metadata["$ref"] = rng.choice(NUMBERS)
        items.append(metadata)
    return items


# ---------------------------------------------------------------------- filters

KEYWORD_OPERANDS = [s for s in STRINGS if len(s) <= MAX_KEYWORD_LENGTH]  # a longer range operand is refused
TYPED = {
    "number": st.sampled_from(NUMBERS),
    "timestamp": st.sampled_from(DATES),
    "keyword": st.sampled_from(KEYWORD_OPERANDS),
}
FIELDS: dict[tuple[str, ...], str | None] = {
    ("n",): "number",
    ("d",): "timestamp",
    ("s",): "keyword",
    ("tags",): "keyword",
    ("b",): None,
    ("m",): None,
    ("o", "x"): "number",
    ("o", "y"): "keyword",
    ("o",): None,
    ("k.v",): "number",
    ("$ref",): "number",
    ("missing",): None,
}
ANY_SCALAR = st.sampled_from(SCALARS)
PLAIN: dict[tuple[str, ...], st.SearchStrategy[Any]] = {("b",): st.sampled_from(ATOMS)}
SMALL_LISTS = st.lists(st.sampled_from(NUMBERS[:4] + STRINGS[:7] + [None, True]), max_size=2)
OPERATORS = ["$gt", "$gte", "$lt", "$lte"] * 2 + ["$eq", "$ne", "$in", "$nin"] * 2
OPERATORS += ["$exists", "$contains", "$all", "$size", "$not"]


@st.composite
def in_operands(draw: st.DrawFn, kind: str) -> list[Any]:
    pools = [TYPED[kind], TYPED[kind], TYPED["number"], TYPED["timestamp"], TYPED["keyword"]]
    pools += [st.sampled_from(ATOMS), st.one_of(st.sampled_from(ATOMS), SMALL_LISTS)]
    return draw(st.lists(draw(st.sampled_from(pools)), max_size=3))


@st.composite
def operator_objects(draw: st.DrawFn, kind: str | None, depth: int = 0) -> dict[str, Any]:
    if kind is None or draw(st.integers(0, 4)) == 4:
        kind = draw(st.sampled_from(sorted(TYPED)))
    own = TYPED[kind]
    ops: dict[str, Any] = {}
    size = draw(st.sampled_from([1, 1, 1, 2, 2, 3]))
    for op in draw(st.lists(st.sampled_from(OPERATORS), min_size=size, max_size=size, unique=True)):
        if op in ("$eq", "$ne"):
            ops[op] = draw(st.one_of(own, own, ANY_SCALAR, SMALL_LISTS, st.just({"x": 1})))
        elif op in RANGES:
            ops[op] = draw(own)
        elif op in ("$in", "$nin"):
            ops[op] = draw(in_operands(kind))
        elif op == "$exists":
            ops[op] = draw(st.booleans())
        elif op == "$contains":
            ops[op] = draw(st.one_of(st.sampled_from(STRINGS[:8] + NUMBERS[:4]), SMALL_LISTS))
        elif op == "$all":
            ops[op] = draw(st.lists(st.sampled_from(STRINGS[:8] + NUMBERS[:4]), min_size=1, max_size=2))
        elif op == "$size":
            ops[op] = draw(st.integers(0, 3))
        elif depth == 0:
            ops[op] = draw(operator_objects(kind, depth=1))
    return ops or {"$exists": True}


def escaped(name: str) -> str:
    """``name`` written as one name of a filter key (its backslashes, dots and a leading $ escaped)."""
    written = name.replace("\\", "\\\\").replace(".", "\\.")
    return "\\" + written if written.startswith("$") else written


def set_field(target: dict[str, Any], fields: tuple[str, ...], value: Any, *, dotted: bool = False) -> None:
    """``value`` under ``fields`` in a filter: as nested objects, or (``dotted``) under one key that
    is the path (``"o.x"``)."""
    keys = [escaped(name) for name in fields]
    if dotted:
        keys = [".".join(keys)]
    for name in keys[:-1]:
        child = target.get(name)
        if not isinstance(child, dict) or not child or any(k.startswith("$") for k in child):
            child = target[name] = {}
        target = child
    target[keys[-1]] = value


@st.composite
def field_filters(draw: st.DrawFn) -> dict[str, Any]:
    flt: dict[str, Any] = {}
    for _ in range(draw(st.sampled_from([1, 1, 1, 2]))):
        fields = draw(st.sampled_from(sorted(FIELDS)))
        kind = FIELDS[fields]
        if draw(st.integers(0, 3)):
            value = draw(operator_objects(kind))
        else:  # a plain value
            own = TYPED[kind] if kind else PLAIN.get(fields, ANY_SCALAR)
            value = draw(st.one_of(own, own, ANY_SCALAR, SMALL_LISTS, st.just({})))
        set_field(flt, fields, value, dotted=len(fields) > 1 and draw(st.booleans()))
    return flt


def filters(depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    if depth == 2:
        return field_filters()
    inner = filters(depth + 1)
    return st.one_of(
        field_filters(),
        field_filters(),
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda f: {"$not": f}, inner),
        st.builds(lambda f, g: {**f, "$or": [g]}, field_filters(), inner),
    )


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def module_store(engine: sa.Engine, settings: Settings) -> VectorStore:
    return VectorStore(engine, settings=settings)


@pytest.fixture(scope="module")
def conn(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    with dedicated_connection(engine, application_name="test-filter-oracle") as c:
        yield c


class Table:
    def __init__(self, collection: Collection, items: list[dict[str, Any]]) -> None:
        self.collection = collection
        self.items = items

    def __repr__(self) -> str:  # Hypothesis prints the arguments of a failing example
        return f"Table({len(self.items)} items)"


def insert(conn: psycopg.Connection[Any], c: Collection, items: list[dict[str, Any]]) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} (external_id, metadata) SELECT * FROM unnest(%s::text[], %s::jsonb[])").format(c.table),
        ([str(i) for i in range(len(items))], [Jsonb(m) for m in items]),
    )


@pytest.fixture(scope="module")
def table(module_store: VectorStore, conn: psycopg.Connection[Any]) -> Iterator[Table]:
    c = module_store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2)
    items = make_items(seed=20240501)
    insert(conn, c, items)
    yield Table(c, items)
    module_store.drop_collection(name=c.name)


def selected(conn: psycopg.Connection[Any], c: Collection, flt: dict[str, Any]) -> set[str]:
    compiled = compile_filter(flt)
    query = sql.SQL("SELECT external_id FROM {} WHERE {}").format(c.table, compiled.where)
    return {row[0] for row in conn.execute(query, compiled.params)}


def expected(items: list[dict[str, Any]], flt: dict[str, Any]) -> set[str]:
    return {str(i) for i, metadata in enumerate(items) if matches(flt, metadata)}


# ---------------------------------------------------------------------- the property


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
@given(flt=filters())
def test_the_database_selects_exactly_what_the_evaluator_selects(
    conn: psycopg.Connection[Any], table: Table, flt: dict[str, Any]
) -> None:
    assert selected(conn, table.collection, flt) == expected(table.items, flt), json.dumps(flt)


def test_the_generated_items_mix_scalars_lists_and_missing_fields() -> None:
    items = make_items(seed=20240501)
    for name in OWN:
        values = [item.get(name, MISSING) for item in items]
        assert sum(v is MISSING for v in values) > 20
        assert sum(isinstance(v, list) for v in values) > 40
        assert sum(v is not MISSING and not isinstance(v, list) for v in values) > 60


# ---------------------------------------------------------------------- the reported cases, and each rule by example

ITEMS_BY_NAME: dict[str, dict[str, Any]] = {
    "both": {"tags": ["pets", "holiday"], "n": [1, 7], "d": ["2023-01-01", "2024-05-01T10:00Z"]},
    "money": {"tags": ["money"], "n": 5, "d": "2024-05-01"},
    "pets": {"tags": "pets", "n": [0, 10], "d": ["2024-05-02"]},
    "empty": {"tags": [], "n": [], "d": []},
    "nested": {"tags": [["pets"], {"x": "pets"}], "n": ["5", True], "d": "May 1, 2024"},
    "none": {},
}
EVERY = set(ITEMS_BY_NAME)
CASES: list[tuple[dict[str, Any], set[str]]] = [
    # What was reported: a plain value, $eq and $in on a list field, and $nin.
    ({"tags": "pets"}, {"both", "pets"}),
    ({"tags": {"$eq": "pets"}}, {"both", "pets"}),
    ({"tags": {"$in": ["pets"]}}, {"both", "pets"}),
    ({"tags": {"$nin": ["money"]}}, EVERY - {"money"}),
    ({"$or": [{"tags": "pets"}, {"tags": "money"}]}, {"both", "pets", "money"}),
    ({"$not": {"tags": "pets"}}, EVERY - {"both", "pets"}),
    # $ne and $nin: no element equal, and a missing field.
    ({"tags": {"$ne": "pets"}}, EVERY - {"both", "pets"}),
    ({"tags": {"$nin": ["pets", "holiday"]}}, EVERY - {"both", "pets"}),
    # A list operand of $eq: the whole field, or an element equal to it.
    ({"tags": {"$eq": ["money"]}}, {"money"}),
    ({"tags": {"$eq": ["pets"]}}, {"nested"}),
    ({"tags": {"$eq": {"x": "pets"}}}, {"nested"}),
    ({"tags": {"$eq": []}}, {"empty"}),
    # Plain arrays keep containment.
    ({"tags": ["pets"]}, {"both"}),
    ({"tags": ["pets", "holiday"]}, {"both"}),
    # Ranges: an element in range; several bounds each met by some element (MongoDB's rule).
    ({"n": {"$gt": 6}}, {"both", "pets"}),
    ({"n": {"$gt": 1, "$lt": 5}}, {"both", "pets"}),  # [1, 7]: 7 > 1, 1 < 5; [0, 10] likewise
    ({"n": {"$gte": 5, "$lte": 5}}, {"money", "both", "pets"}),  # 7 >= 5 and 1 <= 5: not one element
    ({"n": {"$not": {"$lt": 5}}, "$and": [{"n": {"$not": {"$gt": 5}}}]}, {"money", "empty", "nested", "none"}),
    ({"n": {"$not": {"$gt": 6}}}, EVERY - {"both", "pets"}),
    ({"n": {"$in": [10, 3]}}, {"pets"}),
    ({"n": {"$eq": 5}}, {"money"}),  # "5" is not a number
    ({"d": {"$gte": "2024-05-01", "$lt": "2024-05-02"}}, {"both", "money"}),
    ({"d": {"$eq": "2024-05-01T10:00:00+00:00"}}, {"both"}),  # one instant, two spellings
    ({"d": {"$in": ["2024-05-02T00:00Z"]}}, {"pets"}),
    ({"d": {"$lt": "2023-06-01"}}, {"both"}),
    # $size and $all.
    ({"n": {"$size": 2}}, {"both", "pets", "nested"}),
    ({"tags": {"$size": 0}}, {"empty"}),
    ({"tags": {"$all": ["pets", "holiday"]}}, {"both"}),
    ({"tags": {"$all": ["pets"]}}, {"both"}),
    # $exists is about the key, whatever its value.
    ({"tags": {"$exists": False}}, {"none"}),
]


@pytest.fixture(scope="module")
def named(module_store: VectorStore, conn: psycopg.Connection[Any]) -> Iterator[Collection]:
    c = module_store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2)
    insert(conn, c, list(ITEMS_BY_NAME.values()))
    yield c
    module_store.drop_collection(name=c.name)


@pytest.mark.parametrize("flt, want", CASES, ids=[json.dumps(f) for f, _ in CASES])
def test_each_rule_on_chosen_items(
    conn: psycopg.Connection[Any], named: Collection, flt: dict[str, Any], want: set[str]
) -> None:
    names = list(ITEMS_BY_NAME)
    assert {names[int(i)] for i in selected(conn, named, flt)} == want
    assert {name for name, metadata in ITEMS_BY_NAME.items() if matches(flt, metadata)} == want


def test_the_reported_cases_through_search(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=2)
    try:
        store.upsert_items(
            collection=collection_name,
            items=[
                ItemIn(
                    vector=np.array([1.0, 0.0], dtype=np.float32),
                    external_id="a",
                    metadata={"tags": ["pets", "holiday"]},
                ),
                ItemIn(vector=np.array([0.0, 1.0], dtype=np.float32), external_id="b", metadata={"tags": ["money"]}),
                ItemIn(vector=np.array([1.0, 1.0], dtype=np.float32), external_id="c", metadata={}),
            ],
        )

        def found(flt: dict[str, Any]) -> set[str]:
            hits = store.search(
                collection=collection_name, vector=np.array([1.0, 0.5], dtype=np.float32), k=10, filter=flt
            )
            return {h.external_id for h in hits}

        assert found({"tags": "pets"}) == {"a"}
        assert found({"tags": {"$eq": "pets"}}) == {"a"}
        assert found({"tags": {"$in": ["pets"]}}) == {"a"}
        assert found({"tags": {"$nin": ["money"]}}) == {"a", "c"}
        assert found({"$or": [{"tags": "pets"}, {"tags": {"$in": ["money"]}}]}) == {"a", "b"}
    finally:
        store.drop_collection(name=collection_name)


# ---------------------------------------------------------------------- dates that are not ISO 8601


@pytest.mark.parametrize(
    "operand",
    [
        "2024/05/01",
        "05/01/2024",
        "01.05.2024",
        "2024-5-1",
        "May 1, 2024",
        "1 May 2024",
        "2024-05",
        "05/01/24",
        "2023-02-29",
        "2024-05-01T10",
        "2024-05-01 10:00:00 UTC",
        "Sept 5 2024",
        " 2024-05-01",
    ],
)
def test_a_range_on_a_date_that_is_not_iso_8601_is_refused(operand: str) -> None:
    assert looks_like_date(operand)
    with pytest.raises(InvalidInputError) as err:
        compile_filter({"taken": {"$gte": operand}})
    message = str(err.value)
    assert message.startswith("filter.taken.$gte: ") and "looks like a date" in message
    assert "YYYY-MM-DD" in message and "THH:MM[:SS[.ffffff]]" in message and "+HH:MM" in message


@pytest.mark.parametrize("operand", ["May", "march", "2024", "1.2.3", "v1.2", "sku-00012", "abc", "10", "mayday 2024"])
def test_a_range_on_a_plain_word_compares_strings(operand: str) -> None:
    assert not looks_like_date(operand)
    assert compile_filter({"sku": {"$lt": operand}}).params


def test_equality_with_a_date_that_is_not_iso_8601_is_exact() -> None:
    """Only ranges refuse: ``$eq`` and ``$in`` compare such a string as it is written."""
    assert compile_filter({"d": {"$eq": "05/01/2024"}}).params
    assert compile_filter({"d": {"$in": ["May 1, 2024"]}}).params


@pytest.mark.parametrize(
    "flt, words",
    [
        ({"n": {"$size": -1}}, "filter.n.$size: $size takes a whole number"),
        ({"n": {"$size": 1.5}}, "filter.n.$size: $size takes a whole number"),
        ({"n": {"$size": True}}, "filter.n.$size: $size takes a whole number"),
        ({"n": {"$all": []}}, "filter.n.$all: takes a non-empty array"),
        ({"n": {"$all": "a"}}, "filter.n.$all: takes a JSON array"),
    ],
)
def test_size_and_all_check_their_operands(flt: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInputError, match=words.replace("$", r"\$").replace(".", r"\.")):
        compile_filter(flt)


# ---------------------------------------------------------------------- the indexes still serve


def plan(conn: psycopg.Connection[Any], c: Collection, flt: dict[str, Any]) -> str:
    compiled = compile_filter(flt)
    query = sql.SQL("EXPLAIN (FORMAT JSON) SELECT id FROM {} WHERE {}").format(c.table, compiled.where)
    row = conn.execute(query, compiled.params).fetchone()
    assert row is not None
    return json.dumps(row[0])


def test_element_conditions_keep_the_indexes(module_store: VectorStore, conn: psycopg.Connection[Any]) -> None:
    """4,000 items, one in a hundred with lists: equality through the GIN index on metadata, a range
    through the typed index (its own range) and the field's lists index (the rows holding a list),
    without the planner being pushed."""
    c = module_store.create_collection(name=f"t_{uuid.uuid4().hex[:12]}", dimensions=2)
    try:
        conn.execute(
            sql.SQL(
                """
                INSERT INTO {} (external_id, metadata)
                SELECT i::text, jsonb_build_object(
                    'price', CASE WHEN i % 100 = 0 THEN to_jsonb(ARRAY[i, i + 5000]) ELSE to_jsonb(i) END,
                    'tags', CASE WHEN i % 2 = 0 THEN to_jsonb(ARRAY['t' || i % 500, 'x'])
                                 ELSE to_jsonb('t' || i % 500) END)
                FROM generate_series(0, 3999) AS i
                """
            ).format(c.table)
        )
        metadata_indexes.create(conn, c, "price", "number")  # analyses the table
        gin = f'"Index Name": "{c.table_name}_metadata"'
        typed = f'"Index Name": "{metadata_indexes.index_name(c, "price", "number")}"'
        for flt in ({"tags": "t7"}, {"tags": {"$eq": "t7"}}, {"tags": {"$in": ["t7", "t8"]}}, {"price": 12}):
            assert gin in plan(conn, c, flt), flt
        ranged = plan(conn, c, {"price": {"$gte": 1000, "$lt": 1020}})
        lists = f'"Index Name": "{metadata_indexes.lists_index_name(c, "price")}"'
        assert typed in ranged and lists in ranged and '"Node Type": "BitmapOr"' in ranged, ranged
        assert gin not in ranged
        # Answers included: 1000 to 1019, and the lists [i, i + 5000] with i < 1020 (one bound each).
        got = selected(conn, c, {"price": {"$gte": 1000, "$lt": 1020}})
        assert got == {str(i) for i in range(1000, 1020)} | {str(i) for i in range(0, 1020, 100)}
    finally:
        module_store.drop_collection(name=c.name)
