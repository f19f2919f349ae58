"""Property-based fuzzing of metadata and filters: any JSON either works or is refused with InvalidInputError.

Where it works, a filtered exact search returns exactly the items whose metadata contains the filter
by PostgreSQL's jsonb containment rules, re-implemented here in Python as the oracle.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.store import VectorStore

# jsonb refuses NUL characters; the refusal itself is covered by the hostile inputs below.
texts = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
# MEMSTORE_FUZZ_EXAMPLES=5000 pytest tests/reliability/test_filter_fuzz.py runs them longer.
EXAMPLES = int(os.environ.get("MEMSTORE_FUZZ_EXAMPLES", "60"))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=4)
# Filters of plain JSON: a key that starts with "$" is an operator of the filter language
# (memstore.search.filter_language, checked against its own oracle in tests/test_filter_language.py);
# a dot or a backslash in a key writes a path (tests/test_filter_oracle.py checks those).
field_names = texts.filter(lambda t: not t.startswith("$") and "." not in t and "\\" not in t)
plain_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(field_names, children, max_size=3),
    max_leaves=12,
)
plain_filters = st.dictionaries(field_names, plain_values, max_size=4)
# Hostile shapes too: non-objects, NaN, deep nesting, NUL characters.
hostile = st.one_of(
    json_values,
    st.floats(allow_nan=True),
    st.text().map(lambda t: {"k": t + "\x00"}),
    st.integers(1, 60).map(lambda depth: _nest(depth)),
)


def _nest(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    root = node
    for _ in range(depth):
        node["x"] = {}
        node = node["x"]
    return root


def same_json(a: Any, b: Any) -> bool:
    """Equality as JSON means it: numbers by decimal value (jsonb keeps 6.787814095474969e+16 as the
    integer it denotes, which a Python float cannot hold exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if (
        isinstance(a, int | float)
        and isinstance(b, int | float)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
    ):
        return Decimal(repr(a)) == Decimal(repr(b))
    return _equal(a, b)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def contains(doc: Any, flt: Any, top: bool = True) -> bool:
    """jsonb @>: objects by key, arrays by element (any order), scalars by value; a top-level array
    also contains a bare scalar."""
    if isinstance(flt, dict):
        return isinstance(doc, dict) and all(k in doc and contains(doc[k], v, False) for k, v in flt.items())
    if isinstance(flt, list):
        if not isinstance(doc, list):
            return False
        return all(any(contains(d, f, False) for d in doc) for f in flt)
    if isinstance(doc, list) and top:
        return any(_equal(d, flt) for d in doc if not isinstance(d, dict | list))
    return not isinstance(doc, dict | list) and _equal(doc, flt)


@pytest.fixture(scope="module")
def fuzz_collection(engine: Any, settings: Any) -> tuple[VectorStore, str]:
    store = VectorStore(engine, settings=settings)
    name = f"fz_{uuid.uuid4().hex[:10]}"
    store.create_collection(name=name, dimensions=2)
    return store, name


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metas=st.lists(json_objects, min_size=1, max_size=6), flt=plain_filters)
def test_filters_match_jsonb_containment(fuzz_collection: tuple[VectorStore, str], metas: list[Any], flt: Any) -> None:
    store, name = fuzz_collection
    batch = uuid.uuid4().hex
    store.upsert_items(
        collection=name,
        items=[ItemIn(vector=[1.0, float(i)], external_id=f"{batch}-{i}", metadata=m) for i, m in enumerate(metas)],
    )
    try:
        results = store.search(collection=name, vector=[1.0, 0.0], k=1000, filter=flt, exact=True)
    finally:
        store.delete_items(collection=name, external_ids=[f"{batch}-{i}" for i in range(len(metas))])
    got = {r.external_id for r in results if r.external_id.startswith(batch)}
    expected = {f"{batch}-{i}" for i, m in enumerate(metas) if contains(m, flt)}
    assert got == expected


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=hostile)
def test_any_input_is_stored_searched_or_refused_cleanly(fuzz_collection: tuple[VectorStore, str], value: Any) -> None:
    store, name = fuzz_collection
    eid = uuid.uuid4().hex
    try:
        store.upsert_item(collection=name, vector=[0.5, 0.5], external_id=eid, metadata=value)
    except InvalidInputError:
        assert store.list_items(collection=name, external_id=eid) == []
    else:
        assert same_json(store.get_item(collection=name, external_id=eid).metadata, {} if value is None else value)
        store.delete_item(collection=name, external_id=eid)
    with contextlib.suppress(InvalidInputError):
        store.search(collection=name, vector=[0.5, 0.5], k=5, filter=value)
