"""Listing and counting items by a metadata filter (``GET/POST .../items``, ``.../items/count``), and
unknown query parameters refused on every route, with their abuse cases."""

from __future__ import annotations

import json
import uuid

import httpx
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database


def _problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


def _notes(client: httpx.Client, name: str) -> dict[str, dict]:
    r = client.post("/v1/collections", json={"name": name, "dimensions": 2})
    assert r.status_code == 201, r.text
    metadata = {
        "a": {"tags": ["pets", "holiday"], "n": 1},
        "b": {"tags": ["money"], "n": 2},
        "c": {"tags": "pets", "n": 3},
        "d": {"n": 4},
        "e": {"tags": [], "n": 5},
    }
    items = [{"external_id": k, "vector": [1.0, float(i)], "metadata": m} for i, (k, m) in enumerate(metadata.items())]
    assert client.post(f"/v1/collections/{name}/items", json={"items": items}).status_code == 201
    return metadata


def _ids(page: dict) -> list[str]:
    return [i["external_id"] for i in page["items"]]


def test_items_are_listed_and_counted_by_filter(client: httpx.Client, collection_name: str) -> None:
    _notes(client, collection_name)
    base = f"/v1/collections/{collection_name}/items"
    cases = [
        ({"tags": "pets"}, ["a", "c"]),
        ({"tags": {"$in": ["pets", "money"]}}, ["a", "b", "c"]),
        ({"tags": {"$nin": ["money"]}}, ["a", "c", "d", "e"]),
        ({"n": {"$gte": 2, "$lt": 5}}, ["b", "c", "d"]),
        ({"$or": [{"tags": "holiday"}, {"n": 4}]}, ["a", "d"]),
    ]
    for flt, expected in cases:
        r = client.get(base, params={"filter": json.dumps(flt)})
        assert r.status_code == 200, r.text
        assert _ids(r.json()) == expected, flt
        r = client.post(f"{base}/list", json={"filter": flt})
        assert r.status_code == 200, r.text
        assert _ids(r.json()) == expected, flt
        assert client.get(f"{base}/count", params={"filter": json.dumps(flt)}).json() == {"count": len(expected)}
        assert client.post(f"{base}/count", json={"filter": flt}).json() == {"count": len(expected)}
    assert client.get(f"{base}/count").json() == {"count": 5}


def test_a_filtered_listing_pages_by_keyset(client: httpx.Client, collection_name: str) -> None:
    _notes(client, collection_name)
    base = f"/v1/collections/{collection_name}/items"
    flt = {"n": {"$gte": 1}}
    seen: list[str] = []
    r = client.get(base, params={"filter": json.dumps(flt), "limit": 2})
    while True:
        page = r.json()
        seen += _ids(page)
        if page["next"] is None:
            assert page["next_after"] is None
            break
        assert page["next"].startswith(f"{base}?") and "filter=" in page["next"]
        r = client.get(page["next"])
    assert seen == ["a", "b", "c", "d", "e"]
    after, posted = 0, []
    while True:
        page = client.post(f"{base}/list", json={"filter": flt, "limit": 2, "after": after}).json()
        posted += _ids(page)
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert posted == seen


def test_bad_filters_and_unknown_parameters_are_refused(
    client: httpx.Client, collection_name: str, server, engine: sa.Engine
) -> None:
    _notes(client, collection_name)
    base = f"/v1/collections/{collection_name}/items"
    assert "not valid JSON" in _problem(client.get(base, params={"filter": "{tags"}), 422)["detail"]
    assert "JSON object" in _problem(client.get(base, params={"filter": "[1]"}), 422)["detail"]
    _problem(client.get(base, params={"filter": "[" * 5000 + "]" * 5000}), 422)
    _problem(client.get(base, params={"filter": json.dumps({"n": {"$gte": "2024/05/01"}})}), 422)
    _problem(client.post(f"{base}/count", json={"filter": {"n": {"$between": [1, 2]}}}), 422)
    # A parameter the route does not take is named, never ignored (the listing once ignored ?filter=).
    detail = _problem(client.get(base, params={"filtr": json.dumps({"tags": "pets"})}), 422)["detail"]
    assert "'filtr'" in detail and "filter" in detail
    _problem(client.get("/v1/collections", params={"limt": "5"}), 422)
    search = f"/v1/collections/{collection_name}/search"
    assert "'k'" in _problem(client.post(search, params={"k": "5"}, json={"vector": [1.0, 0.0]}), 422)["detail"]
    assert client.post(search, json={"vector": [1.0, 0.0], "k": 2}).status_code == 200
    assert client.get(base, params={"limit": 2}).status_code == 200  # declared parameters still pass

    # Abuse: no key is a 401 whatever the parameters; a key of another collection is a 403.
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        _problem(anonymous.get(base, params={"filter": json.dumps({"tags": "pets"})}), 401)
        _problem(anonymous.get(base, params={"bogus": "1"}), 401)
    _, other = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=["read:someone_else"])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {other}"}, timeout=30) as c:
        _problem(c.get(f"{base}/count"), 403)
        _problem(c.post(f"{base}/list", json={"filter": {"tags": "pets"}}), 403)


def test_the_models_the_server_runs_are_listed_for_a_key(client: httpx.Client, server) -> None:
    r = client.get("/v1/models")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["state"] == "ready"
    assert body["data"] and all(m["id"] and m["dimensions"] > 0 for m in body["data"])
    _problem(client.get("/v1/models", params={"all": "1"}), 422)
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        _problem(anonymous.get("/v1/models"), 401)
