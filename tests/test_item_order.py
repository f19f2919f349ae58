"""Listing items in the order of a metadata field (``VectorStore.page_items_ordered``): by date taken,
newest or oldest first, items without one last, keyset pages that cover the set exactly (ties of
equal dates included), filters combined, forged cursors refused, and a typed index serving the order."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg import sql

from memstore.errors import InvalidInputError
from memstore.models import Item, ItemIn
from memstore.search.filter_language import parse_timestamp
from memstore.store import VectorStore

TAKEN = ["image", "taken_at"]

# (external id, metadata): dates in several forms, several equal instants, and items without a date.
ROWS: list[tuple[str, dict[str, Any]]] = [
    ("a", {"image": {"taken_at": "2024-05-01T10:00:00Z"}, "tag": "x"}),
    ("b", {"image": {"taken_at": "2024-05-01T12:00:00+02:00"}, "tag": "y"}),  # the same instant as a
    ("c", {"image": {"taken_at": "2024-05-01"}, "tag": "x"}),
    ("d", {"image": {"taken_at": "2023-12-31T23:59:59.5Z"}, "tag": "y"}),
    ("e", {"image": {"taken_at": "2023-12-31T23:59:59.500000Z"}, "tag": "x"}),  # the same as d
    ("f", {"image": {}, "tag": "x"}),  # no date
    ("g", {"tag": "y"}),  # no image
    ("h", {"image": {"taken_at": "May 1, 2024"}, "tag": "x"}),  # not ISO: no date
    ("i", {"image": {"taken_at": ["2024-01-01"]}, "tag": "y"}),  # a list: no date
    ("j", {"image": {"taken_at": "2024-05-01T10:00:00Z"}, "tag": "x"}),  # a third at that instant
    ("k", {"image": {"taken_at": "0001-01-01T00:30:00+01:00"}, "tag": "y"}),  # before year 1 in UTC
    ("l", {"image": {"taken_at": "9999-12-31T23:00:00-05:00"}, "tag": "x"}),  # after year 9999 in UTC
    ("m", {"image": {"taken_at": "2024-05-01T10:00:00.000001Z"}, "tag": "y"}),  # a microsecond later
    ("n", {"image": {"taken_at": 1714557600}, "tag": "x"}),  # a number: no date
    ("o", {"image": {"taken_at": "1969-07-20T20:17:40Z"}, "tag": "y"}),
]


def instant(meta: dict[str, Any]) -> tuple[int, int, int] | None:
    """The instant as (days, seconds, microseconds) from 1970, beyond datetime's years too."""
    taken = meta.get("image", {}).get("taken_at")
    if not isinstance(taken, str):
        return None
    try:
        at = parse_timestamp(taken)
    except OverflowError:
        at = None
        if taken.startswith("0001-01-01T00:30"):
            return (-719163, -1800, 0)  # half an hour before 0001-01-01 UTC
        if taken.startswith("9999-12-31T23:00"):
            return (2932897, 4 * 3600, 0)  # 04:00 on 10000-01-01 UTC
    if at is None:
        return None
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days, delta.seconds, delta.microseconds)


def as_micros(key: tuple[int, int, int]) -> int:
    return (key[0] * 86400 + key[1]) * 1_000_000 + key[2]


def expected(items: dict[str, int], descending: bool, keep: set[str] | None = None) -> list[str]:
    """External ids in the order the listing must give."""
    metas = dict(ROWS)
    chosen = [e for e in items if keep is None or e in keep]
    dated = [e for e in chosen if instant(metas[e]) is not None]
    undated = [e for e in chosen if instant(metas[e]) is None]
    dated.sort(key=lambda e: (as_micros(instant(metas[e])), items[e]), reverse=descending)  # type: ignore[arg-type]
    undated.sort(key=lambda e: items[e], reverse=descending)
    return dated + undated


@pytest.fixture(params=[1, 3], ids=["plain", "partitioned"])
def photos(request: pytest.FixtureRequest, store: VectorStore, collection_name: str) -> dict[str, int]:
    """The collection of ROWS; its external ids to ids."""
    store.create_collection(name=collection_name, dimensions=4, partitions=request.param)
    rng = np.random.default_rng(0)
    # In an order other than by date, so the id order is not the date order.
    order = [5, 0, 12, 3, 9, 1, 14, 7, 2, 11, 4, 13, 6, 10, 8]
    added = store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=rng.normal(size=4), external_id=ROWS[i][0], metadata=ROWS[i][1]) for i in order],
    )
    return {r.external_id: r.id for r in added}


def all_pages(store: VectorStore, name: str, limit: int, **kwargs: Any) -> list[list[Item]]:
    pages: list[list[Item]] = []
    cursor: str | None = None
    while True:
        items, cursor = store.page_items_ordered(collection=name, limit=limit, after_key=cursor, **kwargs)
        pages.append(items)
        if cursor is None:
            return pages
        assert len(pages) < 100


@pytest.mark.parametrize("descending", [True, False], ids=["newest", "oldest"])
def test_order_by_date_taken_with_undated_last(
    store: VectorStore, collection_name: str, photos: dict[str, int], descending: bool
) -> None:
    items, cursor = store.page_items_ordered(
        collection=collection_name, order_by=TAKEN, descending=descending, limit=100
    )
    assert cursor is None
    assert [i.external_id for i in items] == expected(photos, descending)
    assert [i.external_id for i in items][-5:] == sorted("fghin", key=photos.__getitem__, reverse=descending)
    # page_items and list_items give the same order.
    listed, more = store.page_items(collection=collection_name, order_by=TAKEN, descending=descending)
    assert [i.external_id for i in listed] == [i.external_id for i in items] and not more
    assert store.list_items(collection=collection_name, order_by=TAKEN, descending=descending) == listed


@pytest.mark.parametrize("limit", [1, 2, 3, 4, 7, 14, 15, 16])
@pytest.mark.parametrize("descending", [True, False], ids=["newest", "oldest"])
def test_keyset_pages_cover_the_set_exactly(
    store: VectorStore, collection_name: str, photos: dict[str, int], limit: int, descending: bool
) -> None:
    pages = all_pages(store, collection_name, limit, order_by=TAKEN, descending=descending)
    got = [i.external_id for page in pages for i in page]
    assert got == expected(photos, descending)  # no duplicate, no gap, in order
    assert all(len(page) == limit for page in pages[:-1]) and 1 <= len(pages[-1]) <= limit
    assert len(pages) == -(-len(ROWS) // limit)  # a last page exactly full links to no empty one


def test_filters_combine_with_the_order(store: VectorStore, collection_name: str, photos: dict[str, int]) -> None:
    keep = {e for e, meta in ROWS if meta.get("tag") == "x"}
    for descending in (True, False):
        pages = all_pages(store, collection_name, 2, order_by=TAKEN, descending=descending, filter={"tag": "x"})
        assert [i.external_id for page in pages for i in page] == expected(photos, descending, keep)
    ranged = {"image": {"taken_at": {"$gte": "2024-01-01"}}}
    items, _ = store.page_items_ordered(collection=collection_name, order_by=TAKEN, descending=True, filter=ranged)
    assert [i.external_id for i in items] == [
        e for e in expected(photos, True) if e in set("abcijlm")
    ]  # i: a list with a date
    ready, _ = store.page_items_ordered(collection=collection_name, order_by=TAKEN, status="pending")
    assert ready == []
    one, _ = store.page_items_ordered(collection=collection_name, order_by=TAKEN, external_id="d")
    assert [i.external_id for i in one] == ["d"]


def test_numbers_and_keywords(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=2)
    values: list[Any] = [3, 1.5, Decimal("-2"), "10", 10**30, 0.1, None, "b", "a", "B", 1.5, "é", True]
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=[1.0, 0.0], external_id=f"v{i}", metadata={"v": float(v) if isinstance(v, Decimal) else v})
            for i, v in enumerate(values)
        ],
    )
    numbers = [i.metadata.get("v") for i in all_pages(store, collection_name, 2, order_by="v", order_type="number")[0]]
    by_number = [
        i.metadata["v"]
        for page in all_pages(store, collection_name, 2, order_by="v", order_type="number")
        for i in page
    ]
    assert numbers == [-2.0, 0.1]
    assert by_number[:6] == [-2.0, 0.1, 1.5, 1.5, 3, 10**30]
    by_keyword = [
        i.metadata["v"]
        for page in all_pages(store, collection_name, 3, order_by="v", order_type="keyword", descending=True)
        for i in page
    ]
    assert by_keyword[:5] == ["é", "b", "a", "B", "10"]  # by code point, descending


def test_forged_cursors_are_refused(store: VectorStore, collection_name: str, photos: dict[str, int]) -> None:
    _, cursor = store.page_items_ordered(collection=collection_name, order_by=TAKEN, descending=True, limit=2)
    assert cursor is not None
    value, item_id, tag = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))

    def encode(payload: Any) -> str:
        text = json.dumps(payload, separators=(",", ":"))
        return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    forged = [
        "",
        "!!!",
        "a" * 9000,
        cursor + "=",
        cursor + "A",
        encode([value, item_id]),
        encode([value, item_id, tag, 1]),
        encode({"v": value}),
        encode([value, str(item_id), tag]),
        encode([value, True, tag]),
        encode([value, 0, tag]),
        encode([value, 2**63, tag]),
        encode([value, item_id, "0" * 12]),
        encode(["2024-05-01", item_id, tag]),  # not the cursor's form of a date
        encode([str(10**19), item_id, tag]),
        encode(["9" * 18, item_id, tag]),  # beyond year 9999
        encode(["-" + "9" * 18, item_id, tag]),  # before year 1
        encode([1714557600000000, item_id, tag]),  # a number, not text
        encode(["1714557600000000'; DROP TABLE x; --", item_id, tag]),
        base64.urlsafe_b64encode(b"\xff\xfe").decode().rstrip("="),
        base64.urlsafe_b64encode(b"[" * 5000).decode().rstrip("="),
        json.dumps([value, item_id, tag]),
    ]
    for bad in forged:
        with pytest.raises(InvalidInputError, match="cursor"):
            store.page_items_ordered(collection=collection_name, order_by=TAKEN, descending=True, after_key=bad)
    # A cursor of another order: the other direction, field or type.
    others: list[dict[str, Any]] = [
        {"order_by": TAKEN, "descending": False},
        {"order_by": "taken_at", "descending": True},
        {"order_by": TAKEN, "descending": True, "order_type": "keyword"},
    ]
    for other in others:
        with pytest.raises(InvalidInputError, match="cursor"):
            store.page_items_ordered(collection=collection_name, after_key=cursor, **other)
    # A well-formed cursor the server never handed out pages from where it says: it reads only the
    # items past it.
    made = encode(["0", 1, tag])  # 1970-01-01, id 1: descending, the next are older (and undated)
    items, _ = store.page_items_ordered(collection=collection_name, order_by=TAKEN, descending=True, after_key=made)
    assert {i.external_id for i in items} <= {"o", "k", *"fghin"}
    # after and after_key do not mix; a cursor goes with an order.
    with pytest.raises(InvalidInputError, match="after"):
        store.page_items(collection=collection_name, order_by=TAKEN, after_id=3)
    with pytest.raises(InvalidInputError, match="order_by"):
        store.page_items(collection=collection_name, after_key=cursor)
    for bad_field in ("", [], ["a"] * 9, [1], "a\x00"):
        with pytest.raises(InvalidInputError, match="field"):
            store.page_items_ordered(collection=collection_name, order_by=bad_field)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="type"):
        store.page_items_ordered(collection=collection_name, order_by=TAKEN, order_type="date")
    with pytest.raises(InvalidInputError, match="limit"):
        store.page_items_ordered(collection=collection_name, order_by=TAKEN, limit=0)


def test_a_field_name_with_percent_and_quotes(store: VectorStore, collection_name: str) -> None:
    store.create_collection(name=collection_name, dimensions=2)
    key = "it's 100%"
    store.upsert_items(
        collection=collection_name,
        items=[
            ItemIn(vector=[1.0, 0.0], external_id=f"e{i}", metadata={key: {"%(x)s": f"2024-01-0{i}"}})
            for i in (3, 1, 2)
        ],
    )
    pages = all_pages(store, collection_name, 1, order_by=[key, "%(x)s"], descending=True)
    assert [i.external_id for page in pages for i in page] == ["e3", "e2", "e1"]


# ---- The order served by a typed index -----------------------------------------------------------

MANY = 3000


class _Explaining:
    """A search connection that explains each statement instead of running it (and answers no rows)."""

    def __init__(self, conn: psycopg.Connection[Any], plans: list[dict[str, Any]]) -> None:
        self.conn, self.plans = conn, plans

    def cursor(self, **_: Any) -> _Explaining:
        return self

    def execute(self, query: sql.Composable, params: dict[str, Any]) -> _Explaining:
        row = self.conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) {}").format(query), params).fetchone()
        assert row is not None
        self.plans.append(row[0][0]["Plan"])
        return self

    def fetchall(self) -> list[Any]:
        return []


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def explained(store: VectorStore, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> dict[str, Any]:
    """The plan of the first statement a page runs (the items that have a value)."""
    plans: list[dict[str, Any]] = []

    def run_search(fn: Any) -> Any:
        with store.db.read() as conn:
            return fn(_Explaining(conn, plans))

    monkeypatch.setattr(store.db, "run_search", run_search)
    try:
        store.page_items_ordered(limit=48, **kwargs)
    finally:
        monkeypatch.undo()
    return plans[0]


@pytest.fixture
def many(store: VectorStore) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    c = store.create_collection(name=name, dimensions=2)
    with store.db.write() as conn:
        conn.execute(
            sql.SQL(
                """
                INSERT INTO {} (external_id, metadata)
                SELECT i::text, CASE WHEN mod(i, 10) = 0 THEN jsonb_build_object('tag', 'none')
                    ELSE jsonb_build_object('tag', CASE WHEN mod(i, 2) = 0 THEN 'even' ELSE 'odd' END,
                        'image', jsonb_build_object('taken_at', to_char(
                            timestamp '2020-01-01' + (i / 3) * interval '1 hour', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))
                    END
                FROM generate_series(1, %s) AS i
                """
            ).format(c.table),
            (MANY,),
        )
    yield name
    store.drop_collection(name=name)


@pytest.mark.parametrize("descending", [True, False], ids=["newest", "oldest"])
def test_a_typed_index_serves_the_order(
    store: VectorStore, many: str, monkeypatch: pytest.MonkeyPatch, descending: bool
) -> None:
    index = store.create_metadata_index(collection=many, field=TAKEN, type="timestamp")
    plan = explained(store, monkeypatch, collection=many, order_by=TAKEN, descending=descending)
    scans = [n for n in nodes(plan) if n.get("Index Name") == index.name]
    assert scans, json.dumps(plan)[:2000]
    assert scans[0]["Node Type"] == "Index Scan"
    assert scans[0]["Scan Direction"] == ("Backward" if descending else "Forward")
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes(plan))
    # The pages, with the index, still cover the set exactly, in order.
    seen: list[tuple[int, int]] = []
    for page in all_pages(store, many, 500, order_by=TAKEN, descending=descending):
        seen += [(int(i.external_id), i.id) for i in page]
    assert len(seen) == MANY and len({s[1] for s in seen}) == MANY

    def key(row: tuple[int, int]) -> tuple[int, int]:
        return (row[0] // 3, row[1])

    dated = [s for s in seen if s[0] % 10]
    assert seen[: len(dated)] == dated  # the undated last
    assert dated == sorted(dated, key=key, reverse=descending)
    undated = seen[len(dated) :]
    assert undated == sorted(undated, key=lambda s: s[1], reverse=descending)


def test_a_page_past_a_cursor_uses_the_index_bound(
    store: VectorStore, many: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_metadata_index(collection=many, field=TAKEN, type="timestamp")
    _, cursor = store.page_items_ordered(collection=many, order_by=TAKEN, descending=True, limit=100)
    plan = explained(store, monkeypatch, collection=many, order_by=TAKEN, descending=True, after_key=cursor)
    scans = [n for n in nodes(plan) if n["Node Type"] == "Index Scan"]
    assert scans and scans[0]["Scan Direction"] == "Backward", json.dumps(plan)[:2000]
    assert "memstore_timestamp" in scans[0].get("Index Cond", ""), scans[0]
    # With a filter, still the index's order.
    plan = explained(store, monkeypatch, collection=many, order_by=TAKEN, descending=True, filter={"tag": "odd"})
    assert any(n["Node Type"] == "Index Scan" and n["Scan Direction"] == "Backward" for n in nodes(plan))
