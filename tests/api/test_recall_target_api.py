"""recall_target over REST: set at create, changed and turned off by PATCH, shown by GET; refused
out of range (422) and to a read key (403)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from memstore.access import keys
from memstore.db.core import Database


def test_recall_target_create_patch_get(client: httpx.Client, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8, "recall_target": 0.95})
    assert r.status_code == 201, r.text
    assert r.json()["recall_target"] == 0.95 and r.json()["ef_search"] >= 1
    got = client.get(f"/v1/collections/{collection_name}").json()
    assert got["recall_target"] == 0.95 and "ef_search" in got
    r = client.patch(f"/v1/collections/{collection_name}", json={"recall_target": 0.9})
    assert r.status_code == 200, r.text
    assert r.json()["recall_target"] == 0.9
    # A keyword change leaves the target alone.
    r = client.patch(f"/v1/collections/{collection_name}", json={"language": "english"})
    assert r.status_code == 200, r.text
    assert r.json()["recall_target"] == 0.9 and r.json()["language"] == "english"
    listed = {c["name"]: c for c in client.get("/v1/collections").json()["collections"]}
    assert listed[collection_name]["recall_target"] == 0.9
    r = client.patch(f"/v1/collections/{collection_name}", json={"recall_target": None})
    assert r.status_code == 200, r.text
    assert r.json()["recall_target"] is None
    assert client.get(f"/v1/collections/{collection_name}").json()["recall_target"] is None


def test_collections_start_without_a_target(client: httpx.Client, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8})
    assert r.status_code == 201, r.text
    assert r.json()["recall_target"] is None


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.2, "0.9", True])
def test_out_of_range_targets_are_422(client: httpx.Client, collection_name: str, bad: object) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8, "recall_target": bad})
    assert r.status_code == 422, r.text
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
    r = client.patch(f"/v1/collections/{collection_name}", json={"recall_target": bad})
    assert r.status_code == 422, r.text
    assert client.get(f"/v1/collections/{collection_name}").json()["recall_target"] is None


def test_a_read_key_cannot_set_a_target(client: httpx.Client, server, engine, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
    secret = keys.create_key(Database(engine), name=f"k-{uuid.uuid4().hex[:8]}", scopes=[f"read:{collection_name}"])[1]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as reader:
        assert reader.get(f"/v1/collections/{collection_name}").status_code == 200
        r = reader.patch(f"/v1/collections/{collection_name}", json={"recall_target": 0.99})
        assert r.status_code == 403, r.text
    assert client.get(f"/v1/collections/{collection_name}").json()["recall_target"] is None
