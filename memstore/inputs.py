"""What callers send besides vectors, checked before it reaches SQL: metadata, items' texts and
external ids, and the limits filters share (filters themselves: ``memstore.search.filter_language``)."""

from __future__ import annotations

import json
from typing import Any

from memstore.errors import InvalidInputError

MAX_EXTERNAL_ID_LENGTH = 512
# The most results one search returns (offset + k: see memstore.search.request).
MAX_K = 1000
MAX_FILTER_DEPTH = 8
MAX_FILTER_BYTES = 16_384
MAX_METADATA_BYTES = 65_536
MAX_METADATA_DEPTH = 32
# A stored text's keywords are parsed on every write and at every keyword match it ranks in.
MAX_ITEM_TEXT = 1_000_000


def _depth(value: Any, level: int = 0, limit: int = MAX_FILTER_DEPTH) -> int:
    if level > limit:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1, limit) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1, limit) for v in value), default=level + 1)
    return level


def check_external_id(value: Any) -> str:
    """A non-empty string of at most MAX_EXTERNAL_ID_LENGTH characters without NUL."""
    if not isinstance(value, str) or not value or len(value) > MAX_EXTERNAL_ID_LENGTH or "\x00" in value:
        raise InvalidInputError(
            f"external_id must be a non-empty string of at most {MAX_EXTERNAL_ID_LENGTH} characters "
            f"without NUL, not {value!r:.80}"
        )
    return value


def check_item_text(value: Any, where: str) -> str | None:
    """None, or a stored item's text: a string without NUL (PostgreSQL's text cannot hold one) of at
    most MAX_ITEM_TEXT characters."""
    if value is None:
        return None
    if not isinstance(value, str) or "\x00" in value:
        raise InvalidInputError(f"{where} must be a string without NUL characters")
    if len(value) > MAX_ITEM_TEXT:
        raise InvalidInputError(f"{where} has {len(value)} characters; the limit is {MAX_ITEM_TEXT}")
    return value


def check_metadata(value: Any) -> dict[str, Any]:
    """A JSON object of at most MAX_METADATA_BYTES; None means empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"metadata must be a JSON object, not {type(value).__name__}")
    if _depth(value, limit=MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
        raise InvalidInputError(f"metadata is nested deeper than {MAX_METADATA_DEPTH} levels")
    encoded = _encode(value, "metadata")
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidInputError(f"metadata is {len(encoded)} bytes; the limit is {MAX_METADATA_BYTES}")
    return value


def _encode(value: Any, where: str) -> bytes:
    """``value`` as UTF-8 JSON: its size is what PostgreSQL stores, so a text in any script has the
    same room as ASCII (an escaped form would count an accented letter as 6 bytes, an emoji as 12)."""
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"{where} contains text that is not valid Unicode (a lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInputError(f"{where} is nested too deeply") from None
    if has_nul(value):
        raise InvalidInputError(f"{where} may not contain NUL characters (PostgreSQL's jsonb refuses them)")
    return encoded


def has_nul(value: Any) -> bool:
    """Whether a NUL character is in any key or string of ``value`` (the text ``\\u0000``, six
    characters, is not one; its JSON holds the same escape, so the JSON cannot be searched for it)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False
