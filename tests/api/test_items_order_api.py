"""Listing items by date taken over REST: ``GET .../items?order_by=...&order=desc&cursor=...`` and
``POST .../items/list`` with the same in its body, paged by the cursor; and their abuse cases."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database

TAKEN = ["image", "taken_at"]
# external id -> date taken (None: no date); b equals a, e equals d.
DATES: dict[str, Any] = {
    "a": "2024-05-01T10:00:00Z",
    "b": "2024-05-01T12:00:00+02:00",
    "c": "2023-01-01",
    "d": "2025-02-03T04:05:06Z",
    "e": "2025-02-03T04:05:06.000Z",
    "f": None,
    "g": "not a date",
    "h": "2024-05-01T10:00:00Z",
}
NEWEST = ["e", "d", "h", "b", "a", "c", "g", "f"]  # ties by id, in the same direction; undated last
OLDEST = ["c", "a", "b", "h", "d", "e", "f", "g"]


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


def _photos(client: httpx.Client, name: str) -> str:
    assert client.post("/v1/collections", json={"name": name, "dimensions": 2}).status_code == 201
    items = []
    for i, (eid, taken) in enumerate(DATES.items()):
        meta: dict[str, Any] = {"image": {} if taken is None else {"taken_at": taken}, "odd": i % 2 == 1}
        items.append({"external_id": eid, "vector": [1.0, float(i)], "metadata": meta})
    assert client.post(f"/v1/collections/{name}/items", json={"items": items}).status_code == 201
    return f"/v1/collections/{name}/items"


def _ids(page: dict[str, Any]) -> list[str]:
    return [i["external_id"] for i in page["items"]]


def _follow(client: httpx.Client, base: str, params: dict[str, Any]) -> tuple[list[str], int]:
    """Every page of a GET listing, by its ``next`` links; the ids and the number of pages."""
    r = client.get(base, params=params)
    got: list[str] = []
    pages = 0
    while True:
        assert r.status_code == 200, r.text
        page = r.json()
        got += _ids(page)
        pages += 1
        assert page["next_after"] is None
        if page["next"] is None:
            assert page["next_cursor"] is None
            return got, pages
        assert page["next"].startswith(base + "?") and "cursor=" in page["next"]
        r = client.get(page["next"])
        assert pages < 50


def test_get_and_post_list_by_date_taken(client: httpx.Client, collection_name: str) -> None:
    base = _photos(client, collection_name)
    for order, expected in (("desc", NEWEST), ("asc", OLDEST)):
        for limit in (1, 3, 8, 100):
            params = {"order_by": json.dumps(TAKEN), "order": order, "limit": limit}
            got, pages = _follow(client, base, params)
            assert got == expected, (order, limit)
            assert pages == -(-len(DATES) // limit)
            # POST: the same in the body, paged by next_cursor.
            body: dict[str, Any] = {"order_by": TAKEN, "order": order, "limit": limit}
            posted: list[str] = []
            while True:
                r = client.post(f"{base}/list", json=body)
                assert r.status_code == 200, r.text
                page = r.json()
                posted += _ids(page)
                assert page["next"] is None and page["next_after"] is None
                if page["next_cursor"] is None:
                    break
                body["cursor"] = page["next_cursor"]
            assert posted == expected
    # With a filter; the default order is ascending.
    odd = [e for i, e in enumerate(DATES) if i % 2 == 1]
    got, _ = _follow(client, base, {"order_by": json.dumps(TAKEN), "filter": json.dumps({"odd": True}), "limit": 2})
    assert got == [e for e in OLDEST if e in odd]
    r = client.post(f"{base}/list", json={"order_by": TAKEN, "order": "desc", "filter": {"odd": False}})
    assert _ids(r.json()) == [e for e in NEWEST if e not in odd]
    # Without order_by, the id order as before, paged by after.
    r = client.get(base, params={"limit": 3})
    page = r.json()
    assert _ids(page) == list(DATES)[:3] and page["next_after"] is not None and page["next_cursor"] is None
    assert "after=" in page["next"] and "cursor=" not in page["next"]


def test_top_level_keys_and_types(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 2}).status_code == 201
    base = f"/v1/collections/{collection_name}/items"
    rows = {"x": {"n": 10, "k.v": "b"}, "y": {"n": 2, "k.v": "a"}, "z": {"n": "3", "k.v": "c"}}
    items = [{"external_id": e, "vector": [1.0, 0.0], "metadata": m} for e, m in rows.items()]
    assert client.post(base, json={"items": items}).status_code == 201
    r = client.get(base, params={"order_by": "n", "order_type": "number", "order": "desc"})
    assert _ids(r.json()) == ["x", "y", "z"]  # "3" is a string, not a number: last
    # A dotted key is a path, as in filters: "k.v" is v under k (no item has it: all last, by id);
    # a key that holds a dot is escaped, or one key of a JSON list.
    r = client.get(base, params={"order_by": "k.v", "order_type": "keyword"})
    assert _ids(r.json()) == ["x", "y", "z"]
    r = client.get(base, params={"order_by": "k\\.v", "order_type": "keyword"})
    assert _ids(r.json()) == ["y", "x", "z"]
    r = client.get(base, params={"order_by": json.dumps(["k.v"]), "order_type": "keyword", "order": "desc"})
    assert _ids(r.json()) == ["z", "x", "y"]
    r = client.post(f"{base}/list", json={"order_by": "k\\.v", "order_type": "keyword", "limit": 1})
    assert _ids(r.json()) == ["y"] and r.json()["next_cursor"]
    r = client.post(f"{base}/list", json={"order_by": ["k.v"], "order_type": "keyword", "limit": 1})
    assert _ids(r.json()) == ["y"]
    _problem(client.get(base, params={"order_by": "k..v"}), 422)


def test_abuse_of_the_ordered_listing(client: httpx.Client, collection_name: str, server, engine: sa.Engine) -> None:
    base = _photos(client, collection_name)
    first = client.get(base, params={"order_by": json.dumps(TAKEN), "order": "desc", "limit": 2}).json()
    cursor = first["next_cursor"]
    assert cursor
    value, item_id, tag = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))

    def forge(payload: Any) -> str:
        return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")

    forged = [
        "x",
        "!!",
        cursor + "AA",
        forge([value, item_id]),
        forge([value, -1, tag]),
        forge([value, item_id, "beef" * 3]),
        forge(["' OR 1=1 --", item_id, tag]),
        forge([[value], item_id, tag]),
        forge(["9" * 18, item_id, tag]),
        forge(["\ud800", item_id, tag]),
        base64.urlsafe_b64encode(b"\x00\xff" * 10).decode(),
    ]
    for bad in forged:
        params = {"order_by": json.dumps(TAKEN), "order": "desc", "cursor": bad}
        assert "cursor" in _problem(client.get(base, params=params), 422)["detail"]
        body = {"order_by": TAKEN, "order": "desc", "cursor": bad}
        assert "cursor" in _problem(client.post(f"{base}/list", json=body), 422)["detail"]
    # A cursor of another order, or without one; after and cursor do not mix.
    _problem(client.get(base, params={"order_by": json.dumps(TAKEN), "order": "asc", "cursor": cursor}), 422)
    _problem(client.get(base, params={"cursor": cursor}), 422)
    _problem(client.post(f"{base}/list", json={"cursor": cursor}), 422)
    _problem(client.get(base, params={"order_by": json.dumps(TAKEN), "after": 3}), 422)
    _problem(client.get(base, params={"order_by": json.dumps(TAKEN), "cursor": "A" * 9000}), 422)
    # Bad orders.
    for params in (
        {"order_by": "[image"},
        {"order_by": "[]"},
        {"order_by": "[1, 2]"},
        {"order_by": json.dumps(["a"] * 9)},
        {"order_by": "x" * 200},
        {"order_by": '"'},
        {"order_by": json.dumps(TAKEN), "order": "newest"},
        {"order_by": json.dumps(TAKEN), "order_type": "date"},
        {"order_by": json.dumps(TAKEN), "sort": "desc"},  # an unknown parameter
    ):
        _problem(client.get(base, params=params), 422)
    for body in (
        {"order_by": ["image", 5]},
        {"order_by": 5},
        {"order_by": TAKEN, "order": "DESC"},
        {"order_by": TAKEN, "order_type": "date"},
        {"order_by": TAKEN, "cursor": 5},
        {"order_by": TAKEN, "cursor": "A" * 9000},
        {"order_by": TAKEN, "after": 2},
    ):
        _problem(client.post(f"{base}/list", json=body), 422)
    # No key: 401; a key of another collection: 403, whatever the parameters.
    params = {"order_by": json.dumps(TAKEN), "order": "desc", "cursor": cursor, "limit": 2}
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        _problem(anonymous.get(base, params=params), 401)
        _problem(anonymous.post(f"{base}/list", json={"order_by": TAKEN, "cursor": "forged"}), 401)
    _, other = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=["read:someone_else"])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {other}"}, timeout=30) as c:
        _problem(c.get(base, params=params), 403)
        _problem(c.post(f"{base}/list", json={"order_by": TAKEN, "cursor": cursor}), 403)
    # The real cursor still gives the next page.
    r = client.get(base, params=params)
    assert r.status_code == 200 and _ids(r.json()) == NEWEST[2:4]
