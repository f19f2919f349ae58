"""A text sent beside its own vector is stored for keyword search and never embedded: it is bounded
by the store's limit (1,000,000 characters), not the encoder's (MEMSTORE_API_MAX_TEXT_CHARS)."""

from __future__ import annotations

import httpx

from memstore.inputs import MAX_ITEM_TEXT


def test_a_long_text_with_its_own_vector_is_stored_and_found(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 2}).status_code == 201
    items = f"/v1/collections/{collection_name}/items"
    long_text = "opening " + "filler " * 3000 + "closingword"  # about 21,000 characters
    r = client.post(items, json={"items": [{"external_id": "doc", "vector": [1.0, 0.0], "text": long_text}]})
    assert r.status_code == 201, r.text
    hits = client.post(
        f"/v1/collections/{collection_name}/search", json={"mode": "keyword", "text": "closingword"}
    ).json()["results"]
    assert [h["external_id"] for h in hits] == ["doc"]
    # Past the store's limit, or a text without a vector past the encoder's: refused, nothing stored.
    r = client.post(
        items, json={"items": [{"external_id": "huge", "vector": [1.0, 0.0], "text": "x" * (MAX_ITEM_TEXT + 1)}]}
    )
    assert r.status_code in (413, 422), r.text
    r = client.post(items, json={"items": [{"external_id": "embed", "text": long_text}]})
    assert r.status_code == 422 and "MEMSTORE_API_MAX_TEXT_CHARS" in r.json()["detail"]
    assert client.get(f"{items}/count").json() == {"count": 1}
