"""End to end over HTTP with the tiny model: ingest images and texts, search each way, filters, idempotency."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from tests.api.api_helpers import make_image, wait_ready


def upload(
    client: httpx.Client, name: str, images: list[bytes], *, wait: bool = False, **form: object
) -> httpx.Response:
    files = [("files", (f"img{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]
    return client.post(f"/v1/collections/{name}/items", params={"wait": wait}, files=files, data=form)


def test_collection_takes_dimensions_from_the_model(client: httpx.Client, collection: str) -> None:
    body = client.get(f"/v1/collections/{collection}").json()
    assert body["dimensions"] == 64 and body["model"] == "memstore-tiny"
    assert body["items"] == 0 and body["pending"] == 0 and body["index_bytes"] > 0
    listed = client.get("/v1/collections").json()["collections"]
    assert collection in [c["name"] for c in listed]


def test_images_are_queued_then_embedded_by_the_worker(client: httpx.Client, collection: str) -> None:
    images = [make_image(i) for i in range(5)]
    r = upload(client, collection, images, metadata='{"kind": "photo"}')
    assert r.status_code == 202, r.text
    items = r.json()["items"]
    assert [i["status"] for i in items] == ["pending"] * 5
    assert all(i["change"] == "created" for i in items)
    stats = wait_ready(client, collection)
    assert stats["ready"] == 5 and stats["pending"] == 0 and stats["failed"] == 0
    item = client.get(f"/v1/collections/{collection}/items/{items[2]['id']}").json()
    # The photo's own facts (memstore.media.photo_facts) join what the client sent.
    assert item["status"] == "ready" and item["metadata"] == {
        "kind": "photo",
        "filename": "img2.jpg",
        "image": {"width": 96, "height": 72},
    }
    original = client.get(item["content_url"])
    assert original.status_code == 200 and original.content == images[2]
    assert original.headers["content-type"] == "image/jpeg"


def test_wait_true_answers_201_with_vectors_written(client: httpx.Client, collection: str) -> None:
    r = upload(client, collection, [make_image(10), make_image(11)], wait=True)
    assert r.status_code == 201, r.text
    assert [i["status"] for i in r.json()["items"]] == ["ready", "ready"]
    item = client.get(
        f"/v1/collections/{collection}/items/{r.json()['items'][0]['id']}", params={"with_vector": True}
    ).json()
    assert len(item["vector"]) == 64


def test_search_by_image_text_vector_and_item(client: httpx.Client, collection: str) -> None:
    images = [make_image(20 + i) for i in range(4)]
    r = upload(client, collection, images, wait=True)
    assert r.status_code == 201
    ids = [i["id"] for i in r.json()["items"]]
    texts = [
        {"external_id": f"t{i}", "text": f"note number {i} about {w}", "metadata": {"tag": w}}
        for i, w in enumerate(["cats", "dogs", "cats"])
    ]
    r = client.post(f"/v1/collections/{collection}/items", params={"wait": True}, json={"items": texts})
    assert r.status_code == 201, r.text
    text_ids = [i["id"] for i in r.json()["items"]]

    # by uploaded image: the same picture is its own nearest neighbour
    r = client.post(
        f"/v1/collections/{collection}/search", files={"image": ("q.jpg", images[1], "image/jpeg")}, data={"k": "3"}
    )
    assert r.status_code == 200, r.text
    top = r.json()["results"][0]
    assert top["id"] == ids[1] and top["score"] == pytest.approx(1.0, abs=1e-4)
    assert top["content_url"].endswith(f"/items/{ids[1]}/content")

    # by base64 image in JSON
    r = client.post(
        f"/v1/collections/{collection}/search", json={"image": base64.b64encode(images[3]).decode(), "k": 2}
    )
    assert r.json()["results"][0]["id"] == ids[3]

    # by text: the stored text itself comes first
    r = client.post(f"/v1/collections/{collection}/search", json={"text": texts[1]["text"], "k": 3})
    assert r.json()["results"][0]["id"] == text_ids[1]

    # by text with a filter: only matching metadata
    r = client.post(
        f"/v1/collections/{collection}/search", json={"text": texts[1]["text"], "k": 10, "filter": {"tag": "cats"}}
    )
    assert sorted(h["id"] for h in r.json()["results"]) == sorted([text_ids[0], text_ids[2]])

    # by stored item, exact and approximate agree on the first hit
    for exact in (False, True):
        r = client.post(f"/v1/collections/{collection}/search", json={"item_id": ids[0], "k": 1, "exact": exact})
        assert r.json()["results"][0]["id"] == ids[0]

    # by vector
    vec = client.get(f"/v1/collections/{collection}/items/{ids[2]}", params={"with_vector": True}).json()["vector"]
    r = client.post(f"/v1/collections/{collection}/search", json={"vector": vec, "k": 1, "ef_search": 40})
    assert r.json()["results"][0]["id"] == ids[2]


def test_resending_is_idempotent(client: httpx.Client, collection: str) -> None:
    images = [make_image(30), make_image(31)]
    first = upload(client, collection, images, wait=True).json()["items"]
    again = upload(client, collection, images).json()["items"]
    assert [a["id"] for a in again] == [f["id"] for f in first]
    assert [a["change"] for a in again] == ["unchanged", "unchanged"]
    assert [a["status"] for a in again] == ["ready", "ready"]
    assert client.get(f"/v1/collections/{collection}").json()["items"] == 2

    body = {"items": [{"external_id": "x", "text": "hello world", "metadata": {"v": 1}}]}
    a = client.post(f"/v1/collections/{collection}/items", params={"wait": True}, json=body).json()["items"][0]
    b = client.post(f"/v1/collections/{collection}/items", json=body).json()["items"][0]
    assert (b["id"], b["change"], b["status"]) == (a["id"], "unchanged", "ready")
    body["items"][0]["metadata"] = {"v": 2}
    c = client.post(f"/v1/collections/{collection}/items", json=body).json()["items"][0]
    assert (c["id"], c["change"], c["status"]) == (a["id"], "metadata", "ready")
    body["items"][0]["text"] = "hello there"
    d = client.post(f"/v1/collections/{collection}/items", json=body)
    assert d.status_code == 202 and d.json()["items"][0]["change"] == "updated"


def test_vectors_are_written_at_once(client: httpx.Client, collection: str) -> None:
    items = [
        {"external_id": f"v{i}", "vector": [float(i == j) for j in range(64)], "metadata": {"i": i}} for i in range(3)
    ]
    r = client.post(f"/v1/collections/{collection}/items", json={"items": items})
    assert r.status_code == 201, r.text
    assert [i["status"] for i in r.json()["items"]] == ["ready"] * 3
    r = client.post(f"/v1/collections/{collection}/search", json={"vector": items[2]["vector"], "k": 1})
    assert r.json()["results"][0]["external_id"] == "v2"
    # a vector-only item has no original to download
    rid = r.json()["results"][0]["id"]
    missing = client.get(f"/v1/collections/{collection}/items/{rid}/content")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


def test_patch_replace_list_and_delete(client: httpx.Client, collection: str) -> None:
    r = client.post(
        f"/v1/collections/{collection}/items",
        params={"wait": True},
        json={"items": [{"external_id": f"e{i}", "text": f"text {i}", "metadata": {"n": i % 2}} for i in range(5)]},
    )
    ids = [i["id"] for i in r.json()["items"]]
    r = client.patch(f"/v1/collections/{collection}/items/{ids[0]}", json={"metadata": {"extra": True}, "merge": True})
    assert r.status_code == 200 and r.json()["metadata"] == {"n": 0, "extra": True}

    old = client.get(f"/v1/collections/{collection}/items/{ids[1]}", params={"with_vector": True}).json()["vector"]
    r = client.put(
        f"/v1/collections/{collection}/items/{ids[1]}/content",
        params={"wait": True},
        json={"text": "a completely different text"},
    )
    assert r.status_code == 201, r.text
    new = client.get(f"/v1/collections/{collection}/items/{ids[1]}", params={"with_vector": True}).json()
    assert new["text"] == "a completely different text" and new["vector"] != old
    assert new["metadata"] == {"n": 1}

    page = client.get(f"/v1/collections/{collection}/items", params={"limit": 2}).json()
    assert [i["id"] for i in page["items"]] == ids[:2] and page["next"]
    page2 = client.get(page["next"]).json()  # a relative link: the client's base URL applies
    assert [i["id"] for i in page2["items"]] == ids[2:4]
    one = client.get(f"/v1/collections/{collection}/items", params={"external_id": "e3"}).json()["items"]
    assert [i["id"] for i in one] == [ids[3]]
    found = client.post(f"/v1/collections/{collection}/items/lookup", json={"external_ids": ["e1", "nope"]}).json()
    assert found == {"found": {"e1": ids[1]}}

    assert client.delete(f"/v1/collections/{collection}/items/{ids[4]}").status_code == 204
    assert client.get(f"/v1/collections/{collection}/items/{ids[4]}").status_code == 404
    r = client.post(f"/v1/collections/{collection}/items/delete", json={"filter": {"n": 1}})
    assert r.json()["deleted"] == 2 and r.json()["lsn"] == r.headers["X-Memstore-LSN"]
    assert client.get(f"/v1/collections/{collection}").json()["items"] == 2
    assert client.delete(f"/v1/collections/{collection}").status_code == 204
    assert client.get(f"/v1/collections/{collection}").status_code == 404


def test_query_samples_and_metrics(client: httpx.Client, collection: str, server, engine) -> None:
    vec = [0.25] * 64
    client.post(f"/v1/collections/{collection}/items", json={"items": [{"external_id": "q", "vector": vec}]})
    for _ in range(3):
        assert client.post(f"/v1/collections/{collection}/search", json={"vector": vec, "k": 1}).status_code == 200
    cid = client.get(f"/v1/collections/{collection}").json()
    deadline = time.monotonic() + 10
    count = 0
    while time.monotonic() < deadline and count < 3:  # the test server samples every query, off the request path
        with engine.connect() as conn:
            count = conn.exec_driver_sql(
                "SELECT count(*) FROM memstore_query_samples s JOIN memstore_collections c ON c.id = s.collection_id "
                "WHERE c.name = %s",
                (cid["name"],),
            ).scalar()
        time.sleep(0.1)
    assert count >= 3
    assert server.runtime.latency.p99_ms() is None or server.runtime.latency.p99_ms() > 0
    text = client.get("/metrics").text
    assert 'memstore_http_requests_total{method="POST",route="/v1/collections/{name}/search",status="200"}' in text
    assert "memstore_ingest_queue_items" in text and "encoder_units_total" in text
    assert "memstore_search_second_walks_total " in text


def test_multipart_metadata_as_one_json_array_with_an_object_per_file(client: httpx.Client, collection: str) -> None:
    files = [("files", (f"p{i}.jpg", make_image(200 + i), "image/jpeg")) for i in range(2)]
    url = f"/v1/collections/{collection}/items"
    r = client.post(url, files=files, data={"metadata": '[{"name": "Tom"}, {"name": "Rex"}]'})
    assert r.status_code == 202, r.text
    ids = [i["id"] for i in r.json()["items"]]
    names = [{k: v for k, v in client.get(f"{url}/{i}").json()["metadata"].items() if k != "image"} for i in ids]
    assert names == [{"name": "Tom", "filename": "p0.jpg"}, {"name": "Rex", "filename": "p1.jpg"}]
    r = client.post(url, files=files, data={"metadata": '[{"name": "only one"}]'})
    assert r.status_code == 422 and "one object per file" in r.json()["detail"]


def test_every_route_renders_json_the_same_way(client: httpx.Client, collection: str) -> None:
    """One rendering (compact, UTF-8) for the search fast path, the FastAPI routes and problem documents."""
    base = f"/v1/collections/{collection}"
    assert client.post(f"{base}/items", json={"items": [{"vector": [0.1] * 64, "metadata": {"é": 1}}]}).is_success
    answers = [
        client.post(f"{base}/search", json={"vector": [0.1] * 64, "k": 1}),
        client.get(f"{base}/items"),
        client.post(f"{base}/search", json={"vector": [0.1] * 3}),  # a problem document from the fast path
        client.get(f"{base}/items/999999999"),  # one from FastAPI
    ]
    for r in answers:
        assert '": ' not in r.text and '", "' not in r.text, r.text[:200]
    assert "é" in answers[0].text


def test_a_form_field_the_route_does_not_read_is_refused(client: httpx.Client, collection: str) -> None:
    """As an unknown field of a JSON body: a misspelt or JSON-only option is not dropped in silence,
    and nothing is written."""
    image = make_image(40)
    r = client.post(
        f"/v1/collections/{collection}/items", files={"files": ("a.png", image, "image/png")}, data={"metdata": "{}"}
    )
    assert r.status_code == 422, r.text
    assert "unknown form fields ['metdata']" in r.json()["detail"]
    assert client.get(f"/v1/collections/{collection}").json()["items"] == 0
    r = client.post(
        f"/v1/collections/{collection}/search",
        files={"image": ("q.png", image, "image/png")},
        data={"k": "3", "group_by": "tag"},  # a JSON-only option
    )
    assert r.status_code == 422 and "unknown form fields ['group_by']" in r.json()["detail"], r.text
    r = upload(client, collection, [image], wait=True)
    item = r.json()["items"][0]["id"]
    r = client.put(
        f"/v1/collections/{collection}/items/{item}/content",
        files={"file": ("b.png", make_image(41), "image/png")},
        data={"note": "x"},
    )
    assert r.status_code == 422 and "unknown form fields ['note']" in r.json()["detail"], r.text
    ok = client.post(
        f"/v1/collections/{collection}/search", files={"image": ("q.png", image, "image/png")}, data={"k": "1"}
    )
    assert ok.status_code == 200 and ok.json()["results"][0]["id"] == item
