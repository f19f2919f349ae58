"""What the in-process API refuses that it once took and misread: a string where a list of names
belongs, vectors too long for float32 distances or made of text, search arguments that a grouped,
keyword or near-duplicate search cannot use, and listings in an order or status that does not exist."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from memstore.errors import InvalidInputError
from memstore.items.vectors import MAX_SQUARED_LENGTH, as_matrix, as_vector
from memstore.models import ItemIn
from memstore.store import VectorStore

DIMS = 8
# The largest value each of DIMS equal values may have and stay within the length limit.
LARGEST = math.sqrt(MAX_SQUARED_LENGTH / DIMS) * 0.999


def _three(store: VectorStore, name: str, metric: str = "cosine") -> list[int]:
    store.create_collection(name=name, dimensions=DIMS, metric=metric)
    rng = np.random.default_rng(4)
    done = store.upsert_items(
        collection=name,
        items=[ItemIn(vector=rng.normal(size=DIMS), external_id=e, metadata={"album": e}) for e in ("1", "2", "12")],
    )
    return [r.id for r in done]


def test_a_string_of_external_ids_names_no_items_letter_by_letter(store: VectorStore, collection_name: str) -> None:
    ids = _three(store, collection_name)
    for ask in ("12", b"12"):
        with pytest.raises(InvalidInputError, match="external_ids must be a list of strings, not a string"):
            store.delete_items(collection=collection_name, external_ids=ask)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="external_ids must be a list of strings, not a string"):
            store.find_external_ids(collection=collection_name, external_ids=ask)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="ids must be a list of integers"):
        store.vectors(collection=collection_name, ids="12")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="ids must be a list of integers"):
        store.delete_items(collection=collection_name, ids="12")  # type: ignore[arg-type]
    assert store.count_items(collection=collection_name) == 3
    assert store.find_external_ids(collection=collection_name, external_ids=["12"]) == {"12": ids[2]}


def test_a_string_of_text_fields_is_not_split_into_letters(store: VectorStore, collection_name: str) -> None:
    with pytest.raises(InvalidInputError, match="text_fields must be a list of metadata field names, not a string"):
        store.create_collection(name=collection_name, dimensions=DIMS, text_fields="sku")
    store.create_collection(name=collection_name, dimensions=DIMS, text_fields=["sku"])
    with pytest.raises(InvalidInputError, match="not a string"):
        store.set_keywords(collection=collection_name, text_fields="sku", grace_s=0)
    assert store.get_collection(name=collection_name).text_fields == ("sku",)


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_a_vector_whose_distances_could_overflow_float32_is_refused(metric: str) -> None:
    with pytest.raises(InvalidInputError, match=r"vector: row 0 has a squared length of 8e\+60; the limit is 1e\+37"):
        as_vector([1e30] * DIMS, dimensions=DIMS, metric=metric)
    with pytest.raises(InvalidInputError, match="row 0 has a squared length"):
        as_vector(np.full(DIMS, 1e19, dtype=np.float32), dimensions=DIMS, metric=metric)
    with pytest.raises(InvalidInputError, match="items: row 1 has a squared length"):
        as_matrix([[1.0] * DIMS, [LARGEST * 2] * DIMS], dimensions=DIMS, where="items", metric=metric)
    assert np.isfinite(as_vector([LARGEST] * DIMS, dimensions=DIMS, metric=metric)).all()
    assert as_vector(np.full(DIMS, LARGEST, dtype=np.float32), dimensions=DIMS, metric=metric)[0] > 0


@pytest.mark.parametrize("metric", ["l2", "inner_product"])
def test_the_longest_vectors_accepted_have_finite_distances_in_postgres(
    store: VectorStore, collection_name: str, metric: str
) -> None:
    """At the limit pgvector's float32 distances are still numbers: the best match is answered and an
    exact search answers every item (an infinite distance would leave the row out)."""
    store.create_collection(name=collection_name, dimensions=DIMS, metric=metric)
    big = np.full(DIMS, LARGEST)
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=big, external_id="big"),
            ItemIn(vector=-big, external_id="opposite"),
            ItemIn(vector=np.eye(DIMS)[0], external_id="small"),
        ],
    )
    with pytest.raises(InvalidInputError, match="squared length"):
        store.upsert_item(collection=collection_name, vector=[1e30] * DIMS, external_id="huge")
    with pytest.raises(InvalidInputError, match="squared length"):
        store.search(collection=collection_name, vector=[1e30] * DIMS, exact=True)
    for query in (big, -big):
        hits = store.search(collection=collection_name, vector=query, k=3, exact=True)
        assert len(hits) == 3 and all(h.distance is not None and math.isfinite(h.distance) for h in hits)
        assert hits[0].external_id == ("big" if query[0] > 0 else "opposite")


@pytest.mark.parametrize(
    "bad, message",
    [
        (["1.5"] * DIMS, "expected real numbers, not strings"),
        ([1.5] * (DIMS - 1) + ["1.5"], "expected real numbers, not strings"),
        ([b"1"] * DIMS, "expected real numbers, not bytes"),
        ([True] * DIMS, "expected real numbers, not booleans"),
        (np.ones(DIMS, dtype=bool), "expected real numbers, not booleans"),
        ([1.5] * (DIMS - 1) + [None], "value 7 of row 0 is not a number: None"),
        ([1.5] * (DIMS - 1) + [object()], "value 7 of row 0 is not a number"),
    ],
)
def test_a_vector_of_text_or_other_non_numbers_is_refused(bad: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        as_vector(bad, dimensions=DIMS)
    with pytest.raises(InvalidInputError, match=message):
        as_matrix([bad], dimensions=DIMS)


@pytest.mark.parametrize(
    "values",
    [
        np.arange(DIMS, dtype=np.float16),
        np.arange(DIMS, dtype=np.float64),
        np.arange(DIMS, dtype=np.int64),
        np.arange(DIMS, dtype=np.uint8),
        list(range(DIMS)),
        [np.float32(i) for i in range(DIMS)],
        [Fraction(i, 1) for i in range(DIMS)],
    ],
)
def test_numbers_of_any_numpy_width_or_python_type_are_taken(values: object) -> None:
    assert as_vector(values, dimensions=DIMS).tolist() == [float(i) for i in range(DIMS)]
    assert as_matrix([values, values], dimensions=DIMS).dtype == np.float32


def test_a_vector_of_text_is_not_stored(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=DIMS)
    with pytest.raises(InvalidInputError, match="strings"):
        store.upsert_item(collection=collection_name, vector=["1.5"] * DIMS, external_id="a")
    assert store.count_items(collection=collection_name) == 0


def test_search_groups_refuses_what_it_cannot_apply(store: VectorStore, collection_name: str) -> None:
    _three(store, collection_name)
    query: dict[str, Any] = {"collection": collection_name, "group_by": "album", "vector": [1.0] * DIMS, "exact": True}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"offset": 1}, "offset pages hits, not groups"),
        ({"k": 3}, "give the number of groups as groups="),
        ({"groups": -1}, "groups must be an integer between 1 and"),
        ({"groups": 0}, "groups must be an integer"),
        ({"groups": 1.5}, "groups must be an integer"),
        ({"groups": True}, "groups must be an integer"),
        ({"group_size": 1.5}, "group_size must be an integer"),
        ({"group_size": 0}, "group_size must be an integer"),
    ]
    for bad, message in cases:
        with pytest.raises(InvalidInputError, match=message):
            store.search_groups(**query, **bad)
    assert len(store.search_groups(**query, groups=2)) == 2


def test_recommend_takes_a_numpy_integer_as_an_item_id(store: VectorStore, collection_name: str) -> None:
    ids = _three(store, collection_name)
    hits = store.recommend(collection=collection_name, positive=[np.int64(ids[0])], negative=[np.int32(ids[1])])
    assert [h.id for h in hits] == [ids[2]]  # the examples are not answered
    assert hits == store.recommend(collection=collection_name, positive=[ids[0]], negative=[ids[1]])


def test_near_duplicates_need_a_distance(store: VectorStore, collection_name: str) -> None:
    _three(store, collection_name, metric="inner_product")
    with pytest.raises(InvalidInputError, match=r"inner_product.*near duplicates need one \(metric cosine or l2\)"):
        store.duplicates(collection=collection_name, threshold=0.1)


def test_a_keyword_search_with_a_vector_is_refused(store: VectorStore, collection_name: str) -> None:
    _three(store, collection_name)
    with pytest.raises(InvalidInputError, match="a keyword search takes no vector"):
        store.search(collection=collection_name, mode="keyword", text="x", vector=[1.0] * DIMS)
    assert store.search(collection=collection_name, mode="keyword", text="x") == []


def test_listings_refuse_an_order_or_status_that_is_not_there(store: VectorStore, collection_name: str) -> None:
    _three(store, collection_name)
    with pytest.raises(InvalidInputError, match="descending orders by order_by"):
        store.list_items(collection=collection_name, descending=True)
    for bogus in ("bogus", "done", "READY"):
        with pytest.raises(InvalidInputError, match="status must be one of pending, ready, failed"):
            store.list_items(collection=collection_name, status=bogus)
        with pytest.raises(InvalidInputError, match="status must be one of"):
            store.count_items(collection=collection_name, status=bogus)
    assert len(store.list_items(collection=collection_name, status="ready")) == 3
    assert store.count_items(collection=collection_name, status="failed") == 0
    ordered = store.list_items(collection=collection_name, order_by="album", order_type="keyword", descending=True)
    assert [i.external_id for i in ordered] == ["2", "12", "1"]
