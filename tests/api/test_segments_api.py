"""write_path "segments" over REST: chosen at create and shown by GET with the graphs and the tail;
POST .../seal puts the tail into a graph (a write key may, a read key and no key may not); hybrid
and filtered searches answer across the graphs and the tail; what segments cannot be is refused."""

from __future__ import annotations

import uuid

import httpx
import numpy as np

from memstore.access import keys
from memstore.db.core import Database


def test_a_segmented_collection_over_rest(client: httpx.Client, server, engine, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8, "write_path": "segments"})
    assert r.status_code == 201, r.text
    assert r.json()["write_path"] == "segments"
    got = client.get(f"/v1/collections/{collection_name}").json()
    assert got["segments"] == {"graphs": [], "tail_rows": 0}
    vectors = np.random.default_rng(5).normal(size=(60, 8)).astype(np.float32)
    items = [
        {"external_id": f"v{i}", "vector": v.tolist(), "text": f"word{i % 3}", "metadata": {"n": i}}
        for i, v in enumerate(vectors)
    ]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items[:40]}).status_code == 201
    url = f"/v1/collections/{collection_name}"
    # A read key may not seal; nor may a request without a key; a writer may.
    db = Database(engine)
    reader_secret = keys.create_key(db, name=f"k-{uuid.uuid4().hex[:8]}", scopes=[f"read:{collection_name}"])[1]
    writer_secret = keys.create_key(db, name=f"k-{uuid.uuid4().hex[:8]}", scopes=[f"write:{collection_name}"])[1]
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert anonymous.post(f"{url}/seal").status_code == 401
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader_secret}"}, timeout=30) as reader:
        assert reader.post(f"{url}/seal").status_code == 403
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {writer_secret}"}, timeout=60) as writer:
        r = writer.post(f"{url}/seal")
    assert r.status_code == 200, r.text
    (done,) = r.json()["done"]
    assert done["action"] == "seal" and done["rows"] == 40 and done["lo"] == 0
    assert client.post(f"{url}/items", json={"items": items[40:]}).status_code == 201
    got = client.get(url).json()
    assert [g["hi"] for g in got["segments"]["graphs"]] == [done["hi"]] and got["segments"]["tail_rows"] == 20
    # Every row is found, from the graph and from the tail.
    for i in (3, 39, 40, 59):
        hits = client.post(f"{url}/search", json={"vector": vectors[i].tolist(), "k": 1}).json()["results"]
        assert hits[0]["external_id"] == f"v{i}"
    filtered = client.post(
        f"{url}/search", json={"vector": vectors[0].tolist(), "k": 4, "filter": {"n": {"$in": [1, 2, 45, 46]}}}
    ).json()["results"]
    assert sorted(h["external_id"] for h in filtered) == ["v1", "v2", "v45", "v46"]
    hybrid = client.post(
        f"{url}/search", json={"vector": vectors[50].tolist(), "text": "word2", "mode": "hybrid", "k": 30}
    )
    assert hybrid.status_code == 200, hybrid.text
    fused = {h["external_id"]: h for h in hybrid.json()["results"]}
    assert fused["v50"]["ranks"]["vector"] == 1  # the nearest, from the tail
    assert {"v2", "v41"} <= {e for e, h in fused.items() if h["ranks"]["keyword"] is not None}  # a graph's, the tail's
    # merge=true: the graph and the tail into one graph.
    r = client.post(f"{url}/seal", params={"merge": "true"})
    assert r.status_code == 200, r.text
    assert [d["action"] for d in r.json()["done"]] == ["seal", "merge"]
    assert len(client.get(url).json()["segments"]["graphs"]) == 1
    # Nothing left to seal: an empty answer, not an error.
    assert client.post(f"{url}/seal").json()["done"] == []


def test_segments_refusals(client: httpx.Client, collection_name: str) -> None:
    for body, status in (
        ({"write_path": "fast"}, 422),
        ({"write_path": "segments", "partitions": 2}, 422),
    ):
        r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8, **body})
        assert r.status_code == status, r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
    r = client.post(f"/v1/collections/{collection_name}/seal")
    assert r.status_code == 422 and "not written as segments" in r.json()["detail"], r.text
    assert client.post("/v1/collections/no_such_collection_here/seal").status_code == 404


def test_texts_embedded_by_the_server_are_sealed_once_ready(client: httpx.Client, collection_name: str) -> None:
    """Texts go through the encoder's queue: the seal takes them once their vectors are in."""
    r = client.post("/v1/collections", json={"name": collection_name, "write_path": "segments"})
    assert r.status_code == 201, r.text
    url = f"/v1/collections/{collection_name}"
    body = {"items": [{"external_id": f"t{i}", "text": f"note number {i}"} for i in range(3)]}
    r = client.post(f"{url}/items", params={"wait": "true"}, json=body)
    assert r.status_code in (200, 201), r.text
    assert {a["status"] for a in r.json()["items"]} == {"ready"}
    (done,) = client.post(f"{url}/seal").json()["done"]
    assert done["rows"] == 3
    hits = client.post(f"{url}/search", json={"text": "note number 2", "mode": "keyword", "k": 1}).json()["results"]
    assert hits[0]["external_id"] == "t2"
