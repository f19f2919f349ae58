"""The filter language and typed metadata indexes through the REST API, with their abuse cases."""

from __future__ import annotations

import uuid

import httpx
import numpy as np
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database


def _problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


def _photos(client: httpx.Client, name: str, n: int = 60) -> None:
    r = client.post("/v1/collections", json={"name": name, "dimensions": 4})
    assert r.status_code == 201, r.text
    rng = np.random.default_rng(2)
    items = [
        {
            "external_id": f"p{i}",
            "vector": rng.normal(size=4).tolist(),
            "text": f"photo {i}",
            "metadata": {"taken": f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}T10:00:00Z", "iso": 100 * (1 + i % 8)},
        }
        for i in range(n)
    ]
    assert client.post(f"/v1/collections/{name}/items", json={"items": items}).status_code == 201


def test_range_filters_in_every_mode(client: httpx.Client, collection_name: str) -> None:
    _photos(client, collection_name)
    url = f"/v1/collections/{collection_name}/search"
    spring = {"taken": {"$gte": "2024-03-01", "$lt": "2024-06-01"}, "iso": {"$lte": 400}}
    for body in (
        {"vector": [0.1, 0.2, 0.3, 0.4], "k": 50, "filter": spring},
        {"text": "photo", "mode": "keyword", "k": 50, "filter": spring},
        {"text": "photo", "vector": [0.1, 0.2, 0.3, 0.4], "k": 50, "filter": spring},
    ):
        r = client.post(url, json=body)
        assert r.status_code == 200, r.text
        hits = r.json()["results"]
        expected = {
            f"p{i}"
            for i in range(60)
            if 3 <= 1 + i % 12 <= 5 and 100 * (1 + i % 8) <= 400  # March to May, ISO 400 or less
        }
        assert {h["external_id"] for h in hits} == expected, body.get("mode")


def test_a_bad_filter_names_the_offending_part(client: httpx.Client, collection_name: str) -> None:
    _photos(client, collection_name, n=3)
    url = f"/v1/collections/{collection_name}/search"
    for flt, where in (
        ({"iso": {"$between": [1, 2]}}, "filter.iso.$between"),
        ({"iso": {"$gt": {"a": 1}}}, "filter.iso.$gt"),
        ({"iso": {"$in": [1, "a"]}}, "filter.iso.$in"),
        ({"$or": [{"iso": 1}, {"taken": {"$lt": []}}]}, "filter.$or[1].taken.$lt"),
    ):
        body = _problem(client.post(url, json={"vector": [0.1] * 4, "filter": flt}), 422)
        assert where in body["detail"], body["detail"]


def test_typed_indexes_are_made_listed_used_and_dropped(
    client: httpx.Client, server, engine: sa.Engine, collection_name: str
) -> None:
    _photos(client, collection_name)
    url = f"/v1/collections/{collection_name}/indexes"
    r = client.post(url, json={"field": "taken", "type": "timestamp"})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["field"] == "taken" and made["type"] == "timestamp" and made["valid"] is True
    assert client.post(url, json={"field": "iso", "type": "number"}).status_code == 201
    listed = client.get(url).json()["indexes"]
    assert sorted((i["field"], i["type"]) for i in listed) == [("iso", "number"), ("taken", "timestamp")]
    # A field name that looks like SQL is just a name.
    odd = "x'); DROP TABLE memstore_api_keys; --"
    assert client.post(url, json={"field": odd, "type": "keyword"}).status_code == 201
    assert odd in [i["field"] for i in client.get(url).json()["indexes"]]

    # Filters keep answering the same with the indexes in place.
    spring = {"taken": {"$gte": "2024-03-01", "$lt": "2024-06-01"}}
    r = client.post(f"/v1/collections/{collection_name}/search", json={"vector": [0.1] * 4, "k": 60, "filter": spring})
    assert len(r.json()["results"]) == sum(1 for i in range(60) if 3 <= 1 + i % 12 <= 5)

    # Abuse: a read key lists but cannot build or drop; bad input is a 422; unknown names a 404.
    _, reader = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=[f"read:{collection_name}"])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader}"}, timeout=30) as c:
        assert c.get(url).status_code == 200
        _problem(c.post(url, json={"field": "iso", "type": "number"}), 403)
        _problem(c.delete(f"{url}/{made['name']}"), 403)
    _problem(client.post(url, json={"field": "iso", "type": "float"}), 422)
    _problem(client.post(url, json={"field": "", "type": "number"}), 422)
    _problem(client.post(url, json={"field": "x" * 129, "type": "number"}), 422)
    _problem(client.delete(f"{url}/no_such_index"), 404)

    assert client.delete(f"{url}/{made['name']}").status_code == 204
    assert [i["field"] for i in client.get(url).json()["indexes"]].count("taken") == 0


def test_a_nested_field_is_indexed_by_its_path(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 2}).status_code == 201
    items = [
        {
            "external_id": f"p{i}",
            "vector": [1.0, float(i)],
            "metadata": {"image": {"taken_at": f"2024-0{1 + i % 9}-10"}},
        }
        for i in range(18)
    ]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    url = f"/v1/collections/{collection_name}/indexes"
    r = client.post(url, json={"field": ["image", "taken_at"], "type": "timestamp"})
    assert r.status_code == 201, r.text
    assert r.json()["field"] == ["image", "taken_at"] and r.json()["valid"] is True
    assert [i["field"] for i in client.get(url).json()["indexes"]] == [["image", "taken_at"]]
    summer = {"image": {"taken_at": {"$gte": "2024-06-01", "$lt": "2024-09-01"}}}
    count = client.post(f"/v1/collections/{collection_name}/items/count", json={"filter": summer}).json()["count"]
    assert count == sum(1 for i in range(18) if 6 <= 1 + i % 9 <= 8)
    _problem(client.post(url, json={"field": [], "type": "timestamp"}), 422)
    _problem(client.post(url, json={"field": ["a"] * 9, "type": "timestamp"}), 422)
    _problem(client.post(url, json={"field": ["a", 5], "type": "timestamp"}), 422)
