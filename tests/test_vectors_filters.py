"""Input checks that run before anything reaches the database."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memstore.errors import DimensionMismatchError, InvalidInputError
from memstore.inputs import MAX_FILTER_DEPTH, check_metadata
from memstore.items.vectors import as_matrix, as_vector
from memstore.search.filter_language import compile_filter


def test_vector_is_float32_and_contiguous() -> None:
    v = as_vector([1, 2, 3], dimensions=3)
    assert v.dtype == np.float32
    assert v.flags["C_CONTIGUOUS"]
    assert v.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], []])
def test_wrong_dimension_count_names_both_numbers(bad: list[float]) -> None:
    with pytest.raises(DimensionMismatchError) as err:
        as_vector(bad, dimensions=3)
    assert f"expected 3 dimensions, not {len(bad)}" in str(err.value)


@pytest.mark.parametrize("value, word", [(math.nan, "NaN"), (math.inf, "infinite"), (-math.inf, "infinite")])
def test_non_finite_values_are_refused(value: float, word: str) -> None:
    with pytest.raises(InvalidInputError, match=word):
        as_vector([0.0, value, 1.0], dimensions=3)


def test_values_beyond_float32_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="float32"):
        as_vector([0.0, 1e39, 1.0], dimensions=3)


def test_ragged_rows_are_refused() -> None:
    with pytest.raises(DimensionMismatchError):
        as_matrix([[1.0, 2.0], [1.0, 2.0, 3.0]], dimensions=2)


@pytest.mark.parametrize("bad", [["a", "b"], [None, 1.0], [[1.0], [2.0]], [1 + 2j, 0]])
def test_non_numbers_are_refused(bad: list[object]) -> None:
    with pytest.raises(InvalidInputError):
        as_vector(bad, dimensions=2)


def test_filter_must_be_object_and_shallow() -> None:
    assert compile_filter({"a": {"b": 1}}).params  # a containment, its value a parameter
    with pytest.raises(InvalidInputError, match="JSON object"):
        compile_filter(["a"])  # type: ignore[arg-type]
    deep: dict[str, object] = {}
    node = deep
    for _ in range(MAX_FILTER_DEPTH + 2):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]
    with pytest.raises(InvalidInputError, match="nested deeper"):
        compile_filter(deep)


def test_metadata_refuses_nan_nul_and_oversize() -> None:
    assert check_metadata(None) == {}
    with pytest.raises(InvalidInputError, match="valid JSON"):
        check_metadata({"x": math.nan})
    with pytest.raises(InvalidInputError, match="NUL"):
        check_metadata({"x": "a\x00b"})
    with pytest.raises(InvalidInputError, match="bytes"):
        check_metadata({"x": "y" * 70_000})


def test_lone_surrogates_are_refused() -> None:
    """Found by the filter fuzzer: PostgreSQL's json parser rejects them, which must not become a 500."""
    with pytest.raises(InvalidInputError, match="Unicode"):
        check_metadata({"\ud800": 1})
    with pytest.raises(InvalidInputError, match="Unicode"):
        compile_filter({"k": "\udfff"})


def test_the_text_backslash_u0000_is_not_a_nul_character() -> None:
    """Found by the filter fuzzer: six characters that spell a NUL escape are text like any other."""
    assert check_metadata({"k": "a\\u0000b", "\\u0000": 1}) == {"k": "a\\u0000b", "\\u0000": 1}
    assert compile_filter({"k": "a\\u0000b"}).params
    with pytest.raises(InvalidInputError, match="NUL"):
        check_metadata({"k": ["fine", {"deep": "a\x00"}]})
