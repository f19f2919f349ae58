"""The cursor of an items listing ordered by a metadata field (``VectorStore.page_items_ordered``).

A cursor is the last item's value and id and a tag of the order it belongs to, as JSON in base64url
without padding. It is opaque to clients and checked whole when it comes back: anything but the one
encoding a page hands out, or a cursor of another order, is refused (InvalidInputError), never passed
on to SQL. Values travel as text, exactly: a timestamp as its microseconds from 1970, a number or a
keyword as its text.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from typing import Any

from psycopg import sql

from memstore.catalog.metadata_sql import MAX_KEYWORD_LENGTH
from memstore.errors import InvalidInputError

MAX_CURSOR = 8192  # characters
# Microseconds from 1970 within years 1 to 9999, and a day either side (an offset can move a date
# just beyond them).
_LOWEST_MICROS = -62_135_596_800_000_000 - 86_400_000_000
_HIGHEST_MICROS = 253_402_300_800_000_000 + 86_400_000_000


def tag(path: tuple[str, ...], kind: str, descending: bool) -> str:
    """What a cursor carries of its order, so one of another order is refused."""
    text = json.dumps([list(path), kind, descending], ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def text(kind: str, typed: sql.Composable) -> sql.Composable:
    """The typed value as the cursor keeps it, exactly and whatever the session's settings."""
    if kind == "timestamp":
        return sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint::text").format(typed)
    return sql.SQL("({})::text").format(typed)


def bound(kind: str) -> sql.Composable:
    """The cursor's value (``%(order_value)s``, text) back as the typed value, exactly."""
    if kind == "timestamp":
        # timestamp + interval is plain arithmetic (no time zone's calendar); the seconds part stays
        # below a day, so the double precision of make_interval is exact to the microsecond.
        return sql.SQL(
            "((timestamp '1970-01-01' + make_interval("
            "days => div(%(order_value)s::bigint, 86400000000)::integer, "
            "secs => mod(%(order_value)s::bigint, 86400000000)::float8 / 1000000)) AT TIME ZONE 'UTC')"
        )
    if kind == "number":
        return sql.SQL("%(order_value)s::numeric")
    return sql.SQL("%(order_value)s::text")


def cursor(key: tuple[str | None, int], order_tag: str) -> str:
    """The cursor of the page after the item whose (value, id) is ``key``."""
    encoded = _encode([key[0], key[1], order_tag])
    assert encoded is not None
    return encoded


def _encode(decoded: Any) -> str | None:
    """The one encoding a page hands out (None for what no page could have handed out)."""
    if not isinstance(decoded, list) or len(decoded) != 3:
        return None
    try:
        text = json.dumps(decoded, separators=(",", ":"), ensure_ascii=True)
    except (ValueError, TypeError):
        return None
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def read_cursor(given: Any, kind: str, order_tag: str) -> tuple[str | None, int]:
    """A cursor's (value, id), checked whole: anything but a cursor of this order is refused."""
    refused = InvalidInputError("cursor: not a cursor of this listing's order; start again without one")
    if not isinstance(given, str) or len(given) > MAX_CURSOR or not re.fullmatch(r"[A-Za-z0-9_-]+", given):
        raise refused
    try:
        raw = base64.urlsafe_b64decode(given + "=" * (-len(given) % 4))
        decoded = json.loads(raw.decode("ascii"))
    except (ValueError, RecursionError):
        raise refused from None
    if _encode(decoded) != given:
        raise refused
    value, item_id, its_tag = decoded
    if its_tag != order_tag or type(item_id) is not int or not 1 <= item_id <= 2**63 - 1:
        raise refused
    if value is None:
        return None, item_id
    if not isinstance(value, str):
        raise refused
    if kind == "timestamp":
        if not re.fullmatch(r"-?[0-9]{1,18}", value) or not _LOWEST_MICROS <= int(value) <= _HIGHEST_MICROS:
            raise refused
    elif kind == "number":
        if not re.fullmatch(r"-?[0-9]+(?:\.[0-9]+)?", value):
            raise refused
    elif len(value) > MAX_KEYWORD_LENGTH or "\x00" in value:
        raise refused
    else:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            raise refused from None
    return value, item_id
