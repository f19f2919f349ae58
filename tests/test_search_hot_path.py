"""The shortcuts every search takes give the answers of the long ways they skip: a query vector's
one-step check (array or list) against the full checks, the jsonb decoder against ``json.loads``,
and ``SearchResult``'s constructor against a frozen dataclass's."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from memstore.db.core import load_json
from memstore.errors import InvalidInputError
from memstore.items.vectors import as_matrix, as_vector
from memstore.models import SearchResult

DIMS = 16


def _full_checks(values: object, metric: str) -> np.ndarray | str:
    """What the long way answers: the vector, or the refusal's message."""
    try:
        return as_matrix([values], dimensions=DIMS, metric=metric)[0]  # type: ignore[list-item]
    except InvalidInputError as exc:
        return str(exc)


def _one_step(values: object, metric: str) -> np.ndarray | str:
    try:
        return as_vector(values, dimensions=DIMS, metric=metric)
    except InvalidInputError as exc:
        return str(exc)


def _cases() -> list[object]:
    rng = np.random.default_rng(5)
    plain = rng.normal(size=DIMS).astype(np.float32)
    cases: list[object] = [plain, plain.tolist(), (plain * 1e-20).tolist(), [int(x * 10) for x in plain]]
    for special in (0.0, np.nan, np.inf, -np.inf, 1e-30, 1e19, 1e30, 3e38, 1e39):
        for where in (slice(0, 1), slice(None)):
            v = plain.astype(np.float64)
            v[where] = special
            with np.errstate(over="ignore"):  # 1e39 is beyond float32: the array case holds infinity
                cases += [v.tolist(), v.astype(np.float32)]
    cases += [["1.5"] * DIMS, [None] * DIMS, [[1.0]] * DIMS, [True] * DIMS, "x" * DIMS, plain.tolist()[:-1]]
    return cases


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize("case", range(len(_cases())))
def test_a_query_vector_s_one_step_check_answers_as_the_full_checks(case: int, metric: str) -> None:
    values = _cases()[case]
    with np.errstate(all="ignore"):
        expected = _full_checks(values, metric)
        got = _one_step(values, metric)
    if isinstance(expected, str):
        assert got == expected
    else:
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (DIMS,)
        assert np.array_equal(got, expected)


@pytest.mark.parametrize(
    "text",
    ["{}", "[]", "null", '{"a": 1}', '{"k": "\u00e9t\u00e9 \u2603", "n": [1, 2.5, -3e-7, true, null], "o": {"x": {}}}'],
)
def test_json_values_decode_as_json_loads_does(text: str) -> None:
    data = text.encode()
    assert load_json(data) == json.loads(data)
    assert load_json(text) == json.loads(text)


def test_an_empty_object_is_a_new_dict_each_time() -> None:
    first = load_json(b"{}")
    first["changed"] = True
    assert load_json(b"{}") == {}


def test_a_search_result_is_the_frozen_dataclass_it_declares() -> None:
    hit = SearchResult(3, "x", 0.25, 0.75, {"a": 1}, 2)
    assert (hit.id, hit.external_id, hit.distance, hit.score, hit.metadata) == (3, "x", 0.25, 0.75, {"a": 1})
    assert (hit.vector_rank, hit.keyword_rank) == (2, None)
    assert hit == SearchResult(id=3, external_id="x", distance=0.25, score=0.75, metadata={"a": 1}, vector_rank=2)
    assert dataclasses.asdict(hit)["keyword_rank"] is None
    assert dataclasses.replace(hit, vector_rank=9).vector_rank == 9 and hit.vector_rank == 2
    assert pickle.loads(pickle.dumps(hit)) == hit
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.score = 1.0  # type: ignore[misc]
    assert hit.ranks == {"vector": 2, "keyword": None}
