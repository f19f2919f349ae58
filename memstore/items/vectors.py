"""The one place where caller-supplied vectors are checked and converted."""

from __future__ import annotations

import base64
import binascii
import numbers
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt

from memstore.errors import DimensionMismatchError, InvalidInputError

FloatMatrix = npt.NDArray[np.float32]


def decode_vector_b64(text: str) -> FloatMatrix:
    """``vector_b64``'s values (base64 of float32s, little-endian, as OpenAI's ``encoding_format:
    "base64"``) as a float32 array, no Python float made; ValueError for text that is not base64 of
    whole float32s. Its length and values are checked where every vector is (``as_vector``)."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("vector_b64 is not valid base64") from None
    if not raw or len(raw) % 4:
        raise ValueError(
            f"vector_b64 holds {len(raw)} bytes: a whole number of float32 values (4 bytes each) is needed"
        )
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)  # a copy in the machine's byte order


def as_vector(values: Any, *, dimensions: int, where: str = "vector", metric: str | None = None) -> FloatMatrix:
    """A finite float32 vector of exactly ``dimensions`` numbers, no longer than ``MAX_SQUARED_LENGTH``
    allows, or InvalidInputError. With ``metric`` "cosine", a vector without a direction (zero length)
    is refused too (see ``check_lengths``)."""
    # The common cases on the search path, a float32 array (the encoder, numpy) or a list of numbers
    # (a JSON body), pass with one sum of squares in float64 (which cannot overflow) for every
    # check: well inside float32's range it means each value is finite and the vector has a length
    # in float32 too. Anything else (a NaN, an infinity, a zero, tiny or huge vector, a malformed
    # list) takes the full checks, which say what is wrong. An array passes without a copy.
    if isinstance(values, np.ndarray) and values.shape == (dimensions,) and values.dtype == np.float32:
        if _plainly_finite(values.astype(np.float64)):
            return values
        if np.isfinite(values).all():
            check_sizes(values[None, :], where=where)
            if metric == "cosine":
                check_lengths(values[None, :], where=where)
            return values
    elif type(values) is list and len(values) == dimensions:
        # The type numpy infers, not a conversion to float: float64 would read "1.5" as a number.
        try:
            wide = np.array(values)
        except (TypeError, ValueError):
            pass
        else:
            if wide.shape == (dimensions,) and wide.dtype.kind in _REAL_KINDS:
                wide = wide.astype(np.float64, copy=False)
                if _plainly_finite(wide):
                    return wide.astype(np.float32)
    return as_matrix([values], dimensions=dimensions, where=where, metric=metric)[0]


# A float64 sum of squares between these bounds is one that float32 also holds: neither 0 (the
# smallest bound, spread over any number of dimensions, still leaves a square far above float32's
# smallest) nor an overflow, in any summation order; and the upper one is below MAX_SQUARED_LENGTH.
_SAFE_SQUARES = (1e-30, 1e36)

# pgvector computes every distance in float32 (at most 3.4e38). Two vectors whose squared lengths
# are at most 1e37 have |a - b|^2 <= (|a| + |b|)^2 <= 4e37 and |a . b| <= |a| |b| <= 1e37, and so
# does every partial sum on the way (Cauchy-Schwarz on a prefix): each l2, inner-product and
# cosine distance between them is finite. Beyond it an l2 or inner-product distance may be
# infinite, and a search cannot rank an infinite distance (``request.results`` leaves it out).
MAX_SQUARED_LENGTH = 1e37

_REAL_KINDS = "fiu"  # numpy's dtype kinds of real numbers: floats, signed and unsigned integers
_NOT_NUMBERS = {"U": "strings", "S": "bytes", "b": "booleans", "c": "complex numbers"}


def _plainly_finite(wide: npt.NDArray[np.float64]) -> bool:
    return bool(_SAFE_SQUARES[0] < float(np.dot(wide, wide)) < _SAFE_SQUARES[1])


def check_lengths(matrix: FloatMatrix, *, where: str) -> None:
    """Refuse rows whose cosine distance is undefined. pgvector sums the squares in float32: a row whose
    sum is 0 (all zeros, or values so small that their squares underflow) or overflows to infinity gets
    a NaN distance to every query, which no ranking can place."""
    with np.errstate(over="ignore", under="ignore"):
        squares = np.einsum("ij,ij->i", matrix, matrix, dtype=np.float32)
    bad = ~np.isfinite(squares) | (squares <= 0)
    if bad.any():
        row = int(np.argmax(bad))
        what = "zero length" if squares[row] == 0 else "a length too large for float32"
        raise InvalidInputError(
            f"{where}: row {row} has {what}; a cosine collection cannot compare it with anything "
            "(its distance is undefined): send a vector with a direction, or use metric l2 or inner_product"
        )


def check_sizes(matrix: FloatMatrix, *, where: str) -> None:
    """Refuse rows longer than ``MAX_SQUARED_LENGTH`` allows, whatever the metric: their distances to
    other vectors may overflow float32."""
    with np.errstate(over="ignore"):
        squares = np.einsum("ij,ij->i", matrix, matrix)  # in float32 as pgvector sums; an overflow is too long
    too_long = ~(squares <= MAX_SQUARED_LENGTH)
    if too_long.any():
        row = int(np.argmax(too_long))
        wide = matrix[row].astype(np.float64)
        raise InvalidInputError(
            f"{where}: row {row} has a squared length of {float(np.dot(wide, wide)):.3g}; the limit is "
            f"{MAX_SQUARED_LENGTH:.0e} (beyond it a distance can overflow float32): scale the vector down"
        )


def _numbers_of(matrix: npt.NDArray[Any], *, where: str) -> npt.NDArray[np.float64]:
    """An object array (numbers numpy has no dtype for, such as Fractions or Decimals, or values mixed
    with None) as float64, once each element is known to be a real number."""
    for (row, col), value in np.ndenumerate(matrix):
        if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real | Decimal):
            raise InvalidInputError(f"{where}: value {col} of row {row} is not a number: {value!r:.40}")
    try:
        return matrix.astype(np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"{where}: expected real numbers ({exc})") from None


def as_matrix(
    rows: Sequence[Any] | np.ndarray, *, dimensions: int, where: str = "vector", metric: str | None = None
) -> FloatMatrix:
    """Stack ``rows`` into an (n, dimensions) float32 matrix, refusing ragged, non-numeric, non-finite or
    too long input (``check_sizes``; and, with ``metric`` "cosine", rows of zero length)."""
    if isinstance(rows, np.ndarray):
        matrix = rows
    else:
        for i, row in enumerate(rows):
            if isinstance(row, str | bytes) or not hasattr(row, "__len__"):
                raise InvalidInputError(f"{where}: row {i} is not a list of {dimensions} numbers")
            if len(row) != dimensions:
                raise DimensionMismatchError(expected=dimensions, got=len(row), where=where)
        try:
            matrix = np.asarray(rows)  # as numpy reads them: a conversion to float would take strings
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{where}: expected lists of {dimensions} numbers ({exc})") from None
    if matrix.ndim != 2:
        raise InvalidInputError(f"{where}: expected a list of vectors of {dimensions} numbers each")
    if matrix.shape[1] != dimensions:
        raise DimensionMismatchError(expected=dimensions, got=int(matrix.shape[1]), where=where)
    if matrix.dtype.kind == "O":
        matrix = _numbers_of(matrix, where=where)
    elif matrix.dtype.kind not in _REAL_KINDS:
        raise InvalidInputError(
            f"{where}: expected real numbers, not {_NOT_NUMBERS.get(matrix.dtype.kind, matrix.dtype)}"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        out = matrix.astype(np.float32, copy=False)
    finite = np.isfinite(out)
    if not finite.all():
        row, col = (int(v) for v in np.argwhere(~finite)[0])
        original = matrix[row, col]
        reason = "NaN" if np.isnan(original) else "infinite" if np.isinf(original) else "out of float32 range"
        raise InvalidInputError(f"{where}: value {col} of row {row} is {reason}; vectors must be finite")
    check_sizes(out, where=where)
    if metric == "cosine":
        check_lengths(out, where=where)
    return np.ascontiguousarray(out)
