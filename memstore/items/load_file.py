"""The bulk-load file format: NDJSON, one item per line.

``{"external_id": "a1", "vector": [0.1, ...], "metadata": {...}, "text": "..."}``: ``external_id`` and
``vector`` (or ``vector_b64``, base64 of its float32 values, little-endian, as the API's bodies take
it) are required (a re-run of the same file updates instead of duplicating), ``metadata`` and
``text`` (stored for keyword search, not embedded) are optional; blank lines are skipped. A file is
checked whole before anything is written (``check``), so a bad line refuses the load with its line
number and nothing half loaded; ``items`` then reads it again lazily for ``VectorStore.bulk_load``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

from memstore.catalog.collections import Collection
from memstore.errors import InvalidInputError
from memstore.inputs import check_external_id, check_item_text, check_metadata
from memstore.items.vectors import as_vector, decode_vector_b64
from memstore.models import ItemIn

FIELDS = frozenset({"external_id", "vector", "vector_b64", "metadata", "text"})


def _item(c: Collection, number: int, line: bytes) -> ItemIn:
    where = f"line {number}"
    try:
        return _checked_item(c, where, line)
    except RecursionError:
        # Nesting deep enough to exhaust the interpreter's stack (in the JSON parser or in a check of
        # the parsed value): the line's fault, not a server error.
        raise InvalidInputError(f"{where}: nested too deeply (metadata takes at most 32 levels)") from None


def _checked_item(c: Collection, where: str, line: bytes) -> ItemIn:
    try:
        obj: Any = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{where}: not a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise InvalidInputError(f"{where}: not a JSON object")
    unknown = set(obj) - FIELDS
    if unknown:
        raise InvalidInputError(f"{where}: unknown fields {sorted(unknown)}; a line has {sorted(FIELDS)}")
    if ("vector" not in obj and "vector_b64" not in obj) or "external_id" not in obj:
        raise InvalidInputError(
            f"{where}: a load needs external_id and vector (or vector_b64) on every line (texts and images "
            "go through POST .../items, where they are embedded)"
        )
    try:
        return ItemIn(
            vector=as_vector(_values(obj, where), dimensions=c.dimensions, metric=c.metric, where=f"{where}: vector"),
            external_id=check_external_id(obj["external_id"]),
            metadata=check_metadata(obj.get("metadata")),
            text=check_item_text(obj.get("text"), f"{where}: text"),
        )
    except InvalidInputError as exc:
        message = str(exc)
        raise InvalidInputError(message if message.startswith(where) else f"{where}: {message}") from None


def _values(obj: dict[str, Any], where: str) -> Any:
    """The line's vector: its numbers, or its ``vector_b64`` decoded."""
    if "vector_b64" not in obj:
        return obj["vector"]
    if "vector" in obj:
        raise InvalidInputError(f"{where}: give vector or vector_b64, not both")
    text = obj["vector_b64"]
    if not isinstance(text, str):
        raise InvalidInputError(f"{where}: vector_b64 must be a string (base64 of float32 values, little-endian)")
    try:
        return decode_vector_b64(text)
    except ValueError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    for number, line in enumerate(stream, start=1):
        if line.strip():
            yield number, line


def check(stream: IO[bytes], c: Collection) -> int:
    """The number of items in ``stream``; raises ``InvalidInputError`` naming the first bad line."""
    count = 0
    for number, line in _lines(stream):
        _item(c, number, line)
        count += 1
    return count


def items(stream: IO[bytes], c: Collection) -> Iterator[ItemIn]:
    """The items of a checked ``stream``, read lazily."""
    for number, line in _lines(stream):
        yield _item(c, number, line)
