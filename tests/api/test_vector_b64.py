"""Binary vectors in requests: ``vector_b64``, base64 of float32 values (little-endian), in search
bodies and in items, answering exactly what the same vector as JSON numbers answers."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np

from memstore.api.schemas import ItemBody, SearchRequest, given_vector


def _b64(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


def _problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


def test_a_base64_vector_is_the_same_vector(client: httpx.Client, server, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(40, 8)).astype(np.float32)
    items = [{"external_id": f"v{i}", "vector_b64": _b64(v)} for i, v in enumerate(vectors[:20])]
    items += [{"external_id": f"v{i}", "vector": v.tolist()} for i, v in enumerate(vectors[20:], start=20)]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    stored = client.get(f"/v1/collections/{collection_name}/items/1", params={"with_vector": "true"}).json()
    np.testing.assert_array_equal(np.asarray(stored["vector"], dtype=np.float32), vectors[0])  # bit for bit

    url = f"/v1/collections/{collection_name}/search"
    query = rng.normal(size=8).astype(np.float32)
    as_json = client.post(url, json={"vector": query.tolist(), "k": 10, "exact": True}).json()["results"]
    as_b64 = client.post(url, json={"vector_b64": _b64(query), "k": 10, "exact": True}).json()["results"]
    assert [h["external_id"] for h in as_b64] == [h["external_id"] for h in as_json]
    assert [h["distance"] for h in as_b64] == [h["distance"] for h in as_json]
    hybrid = client.post(url, json={"vector_b64": _b64(query), "text": "anything", "mode": "hybrid", "k": 5})
    assert hybrid.status_code == 200, hybrid.text

    # Abuse: not base64, not whole float32 values, both forms, the wrong size, NaN, too long.
    assert "base64" in _problem(client.post(url, json={"vector_b64": "not base64!"}), 422)["detail"]
    assert "float32" in _problem(client.post(url, json={"vector_b64": "AAA="}), 422)["detail"]
    _problem(client.post(url, json={"vector_b64": _b64(query), "vector": query.tolist()}), 422)
    _problem(client.post(url, json={"vector_b64": _b64(query[:5])}), 422)
    _problem(client.post(url, json={"vector_b64": _b64(np.full(8, np.nan))}), 422)
    _problem(client.post(url, json={"vector_b64": "A" * 100_000}), 422)
    bad_item = {"items": [{"external_id": "x", "vector_b64": "@@"}]}
    _problem(client.post(f"/v1/collections/{collection_name}/items", json=bad_item), 422)
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        _problem(anonymous.post(url, json={"vector_b64": _b64(query)}), 401)


def test_a_base64_vector_decodes_to_its_float32_values_without_python_floats() -> None:
    vector = np.random.default_rng(5).normal(size=768).astype(np.float32)
    vector[:3] = (np.finfo(np.float32).tiny, -0.0, 1e-38)  # values a float round trip might move
    body = SearchRequest.model_validate_json(json.dumps({"vector_b64": _b64(vector)}))
    given = given_vector(body)
    assert isinstance(given, np.ndarray) and given.dtype == np.float32 and given.flags.writeable
    assert given.tobytes() == vector.astype("<f4").tobytes()  # bit for bit
    assert body.vector is None and body.vector_b64 is None
    item = ItemBody.model_validate({"vector_b64": _b64(vector[:8])})
    assert np.array_equal(given_vector(item), vector[:8])
    assert given_vector(ItemBody.model_validate({"vector": [1.0, 2.0]})) == [1.0, 2.0]  # JSON numbers stay as sent
    big_endian = base64.b64encode(vector[:4].astype(">f4").tobytes()).decode()
    assert not np.array_equal(given_vector(SearchRequest.model_validate({"vector_b64": big_endian})), vector[:4])
