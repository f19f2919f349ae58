"""What clients sending real content found, and what now holds:

- Batches from several clients that name the same external ids go in side by side (no 409).
- A filter's integer of any size compares exactly; one past Python's digits is a 422, not a 500.
- A merge of metadata is held to the stored metadata's limits; the limits count UTF-8 bytes.
- In one batch the last occurrence of an external id wins, a text and a vector alike; a load of
  lines naming one external id twice counts one row.
- ``order=desc`` without ``order_by`` is a 422, not an ascending page.
- A delete by a filter that holds for every item however it is spelt is refused.
- A batch of searches answers the groups of those that ask for them; 1 and 1.0 are one group, and
  a grouped search's flat results are in rank order.
- External ids holding NUL name no item: a lookup or a delete by them answers, not a 422.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.test_errors import problem


def _vector_collection(client: httpx.Client, name: str, dimensions: int = 4) -> str:
    r = client.post("/v1/collections", json={"name": name, "dimensions": dimensions})
    assert r.status_code == 201, r.text
    return f"/v1/collections/{name}"


def test_batches_naming_the_same_ids_in_other_orders_do_not_collide(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    start = threading.Barrier(6)

    def send(worker: int) -> list[int]:
        statuses = []
        start.wait()
        for round_ in range(8):
            # Each batch names ten of the same twenty ids, in an order of its own.
            ids = [(worker * 7 + round_ * 3 + 11 * j) % 20 for j in range(10)]
            items = [{"external_id": f"race{i}", "vector": [1.0, worker, round_, i]} for i in ids]
            statuses.append(client.post(f"{base}/items", json={"items": items}).status_code)
        return statuses

    with ThreadPoolExecutor(6) as pool:
        statuses = [s for got in pool.map(send, range(6)) for s in got]
    assert set(statuses) == {201}, statuses
    assert client.get(base).json()["items"] == 20


def test_filters_compare_integers_of_any_size(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    big = 10**400
    items = [{"external_id": "big", "vector": [1, 0, 0, 0], "metadata": {"n": big * 10}}]
    items.append({"external_id": "small", "vector": [0, 1, 0, 0], "metadata": {"n": 5}})
    assert client.post(f"{base}/items", json={"items": items}).status_code == 201
    for flt, want in (
        ({"n": {"$gt": big}}, ["big"]),
        ({"n": {"$lt": big}}, ["small"]),
        ({"n": {"$in": [big * 10, 7]}}, ["big"]),
        ({"n": {"$ne": big * 10}}, ["small"]),
    ):
        r = client.post(f"{base}/items/list", json={"filter": flt})
        assert r.status_code == 200, r.text
        assert [i["external_id"] for i in r.json()["items"]] == want, flt
        r = client.post(f"{base}/search", json={"vector": [1, 1, 0, 0], "filter": flt, "exact": True})
        assert [h["external_id"] for h in r.json()["results"]] == want, flt
    # Past Python's digits for text, the JSON parsers refuse the body (400, not a 500); the Python
    # API's filter refuses such an integer itself (tests/test_filter_language.py).
    for route, body in (("items/list", "{}"), ("search", '"vector": [1, 0, 0, 0], ')):
        huge = "{" + body.strip("{}") + '"filter": {"n": {"$gt": 1' + "0" * 5000 + "}}}"
        problem(
            client.post(f"{base}/{route}", content=huge, headers={"content-type": "application/json"}),
            400,
            "malformed-request",
        )


def test_a_metadata_merge_is_held_to_the_limits(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    r = client.post(f"{base}/items", json={"items": [{"external_id": "m", "vector": [1, 0, 0, 0], "metadata": {}}]})
    item = f"{base}/items/{r.json()['items'][0]['id']}"
    assert client.patch(item, json={"metadata": {"a": "x" * 40_000}, "merge": True}).status_code == 200
    body = problem(client.patch(item, json={"metadata": {"b": "y" * 40_000}, "merge": True}), 422, "invalid-input")
    assert "merged" in body["detail"] and "65536" in body["detail"]
    assert set(client.get(item).json()["metadata"]) == {"a"}  # nothing written
    assert client.patch(item, json={"metadata": {"b": 1}, "merge": True}).json()["metadata"]["b"] == 1
    problem(client.patch("/v1/collections/nope/items/1", json={"metadata": {"b": 1}, "merge": True}), 404, "not-found")
    missing = client.patch(f"{base}/items/999999", json={"metadata": {"b": 1}, "merge": True})
    problem(missing, 404, "not-found")


def test_metadata_limits_count_utf8_bytes(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    accented = {"s": "é" * 22_528}  # 45 KB as UTF-8; 135 KB written as \\u escapes
    r = client.post(
        f"{base}/items", json={"items": [{"external_id": "e", "vector": [1, 0, 0, 0], "metadata": accented}]}
    )
    assert r.status_code == 201, r.text
    over = {"s": "猫" * 22_000}  # 66 KB as UTF-8
    r = client.post(f"{base}/items", json={"items": [{"external_id": "f", "vector": [1, 0, 0, 0], "metadata": over}]})
    assert "66009 bytes" in problem(r, 422, "invalid-input")["detail"]


def test_the_last_occurrence_wins_across_texts_and_vectors(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
    base = f"/v1/collections/{collection_name}"
    vector = [0.1] * 64
    items = [
        {"external_id": "mix", "text": "text first", "metadata": {"which": "text"}},
        {"external_id": "mix", "vector": vector, "metadata": {"which": "vector"}},
    ]
    r = client.post(f"{base}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    acks = r.json()["items"]
    assert acks[0]["id"] == acks[1]["id"]
    stored = client.get(f"{base}/items/{acks[1]['id']}").json()
    assert stored["metadata"] == {"which": "vector"} and stored["text"] is None
    items.reverse()  # now the text is last: it replaces the vector item, and is embedded
    r = client.post(f"{base}/items?wait=true", json={"items": items})
    assert r.status_code == 201, r.text
    stored = client.get(f"{base}/items/{r.json()['items'][1]['id']}").json()
    assert stored["metadata"] == {"which": "text"} and stored["text"] == "text first"
    assert client.get(base).json()["items"] == 1


def test_a_load_counts_an_id_named_twice_once(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    lines = b'{"external_id": "l7", "vector": [1, 0, 0, 0]}\n{"external_id": "l7", "vector": [0, 1, 0, 0]}\n'
    r = client.post(f"{base}/load", content=lines, headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    assert (r.json()["rows"], r.json()["created"]) == (1, 1)


def test_a_descending_listing_needs_its_field(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    body = problem(client.get(f"{base}/items", params={"order": "desc"}), 422, "invalid-input")
    assert "order_by" in body["detail"]
    problem(client.post(f"{base}/items/list", json={"order": "desc"}), 422, "invalid-input")
    assert client.get(f"{base}/items", params={"order": "asc"}).status_code == 200


def test_a_delete_by_a_filter_that_holds_for_everything_is_refused(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    items = [{"external_id": str(i), "vector": [1, i, 0, 0], "metadata": {"x": i}} for i in range(3)]
    assert client.post(f"{base}/items", json={"items": items}).status_code == 201
    for everything in (
        {"$or": [{}, {"x": 1}]},
        {"$not": {"$not": {}}},
        {"$and": [{}, {"$or": [{"x": 1}, {}]}]},
        {"$or": [{"x": 5}, {"$not": {"$or": [{"x": 1}, {"$not": {}}]}}, {}]},
    ):
        problem(client.post(f"{base}/items/delete", json={"filter": everything}), 422, "invalid-input")
    assert client.get(base).json()["items"] == 3
    # A filter that holds for no item deletes nothing; a real one deletes its items.
    assert client.post(f"{base}/items/delete", json={"filter": {"$not": {}}}).json()["deleted"] == 0
    deleted = client.post(f"{base}/items/delete", json={"filter": {"$or": [{"x": 1}, {"$not": {}}]}})
    assert deleted.json()["deleted"] == 1


def test_batched_searches_answer_their_groups(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name, dimensions=2)
    items = [
        {"external_id": "one", "vector": [1, 0.05], "metadata": {"g": 1}},
        {"external_id": "onef", "vector": [1, 0.1], "metadata": {"g": 1.0}},
        {"external_id": "yes", "vector": [1, 0.2], "metadata": {"g": True}},
        {"external_id": "lst", "vector": [1, 0.6], "metadata": {"g": [1, "a"]}},
    ]
    assert client.post(f"{base}/items", json={"items": items}).status_code == 201
    grouped = {"vector": [1, 0], "k": 10, "group_by": "g", "group_size": 10, "exact": True}
    one = client.post(f"{base}/search", json=grouped).json()
    by_value = {repr(g["value"]): [h["external_id"] for h in g["hits"]] for g in one["groups"]}
    assert by_value == {"1": ["one", "onef", "lst"], "True": ["yes"], "'a'": ["lst"]}
    assert [h["external_id"] for h in one["results"]] == ["one", "onef", "yes", "lst"]  # rank order
    r = client.post(f"{base}/search/batch", json={"searches": [grouped, {"vector": [1, 0], "k": 2}]})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["groups"][0] == one["groups"] and batch["groups"][1] is None
    assert batch["results"][0] == one["results"]
    plain = client.post(f"{base}/search/batch", json={"searches": [{"vector": [1, 0], "k": 2}]}).json()
    assert "groups" not in plain


def test_external_ids_with_nul_name_no_item(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    assert (
        client.post(f"{base}/items", json={"items": [{"external_id": "h", "vector": [1, 0, 0, 0]}]}).status_code == 201
    )
    r = client.post(f"{base}/items/lookup", json={"external_ids": ["h", "a\x00b"]})
    assert r.status_code == 200, r.text
    assert list(r.json()["found"]) == ["h"]
    r = client.post(f"{base}/items/delete", json={"external_ids": ["a\x00b"]})
    assert r.status_code == 200 and r.json()["deleted"] == 0, r.text
    assert client.post(f"{base}/items/delete", json={"external_ids": ["h", "a\x00b"]}).json()["deleted"] == 1


def test_a_hit_links_to_an_original_only_where_there_is_one(client: httpx.Client, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
    base = f"/v1/collections/{collection_name}"
    items = [
        {"external_id": "bare", "vector": [0.1] * 64},
        {"external_id": "noted", "vector": [0.2] * 63 + [0.3], "text": "kettle"},
        {"external_id": "texted", "text": "kettle descaler"},
    ]
    assert client.post(f"{base}/items?wait=true", json={"items": items}).status_code == 201
    searches = {
        "vector": {"vector": [0.1] * 64, "exact": True},
        "hybrid": {"text": "kettle"},
        "keyword": {"text": "kettle", "mode": "keyword"},
    }
    for mode, search in searches.items():
        r = client.post(f"{base}/search", json={**search, "k": 5})
        assert r.status_code == 200, r.text
        urls = {h["external_id"]: h["content_url"] for h in r.json()["results"]}
        assert urls.pop("bare", None) is None, mode
        assert urls and all(u and u.endswith("/content") for u in urls.values()), (mode, urls)
        for url in urls.values():
            assert client.get(url).status_code == 200
    batch = client.post(f"{base}/search/batch", json={"searches": [searches["vector"]]}).json()
    assert {h["external_id"]: h["content_url"] for h in batch["results"][0]}["bare"] is None


def test_a_405_names_every_method_of_the_path(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    r = client.request("DELETE", f"{base}/items/1/content")
    problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "GET, PUT"
    r = client.request("PUT", f"{base}/search/batch")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_what_cannot_apply_is_refused_and_named(client: httpx.Client, collection_name: str) -> None:
    base = _vector_collection(client, collection_name)
    body = problem(client.post(f"{base}/search", json={"vector": [1, 0, 0, 0], "group_size": 3}), 422, "invalid-input")
    assert "group_by" in body["detail"]
    body = problem(client.post(f"{base}/search", json={"vector_b64": "%%%"}), 422, "invalid-input")
    assert body["detail"].startswith("vector_b64 is not valid base64"), body["detail"]


def test_a_download_is_named_for_the_type_it_holds() -> None:
    from memstore.api.routes.items import download_name

    cases = {
        ("png_as.jpg", "image/png"): "png_as.png",  # the stored type is read from the bytes
        ("shot.png", "image/jpeg"): "shot.jpg",
        ("IMG_0042.JPG", "image/jpeg"): "IMG_0042.JPG",
        ("scan.tif", "image/tiff"): "scan.tif",
        ("notes", "text/plain"): "notes.txt",
        ("notes.md", "text/plain"): "notes.md",
        ("folder/a.b.c", "image/png"): "a.b.c",
    }
    assert {k: download_name(*k) for k in cases} == cases


def test_an_uploaded_files_name_is_kept_as_written(client: httpx.Client, collection_name: str) -> None:
    """Browsers and httpx write a quote in a multipart file name as %22 (the HTML form encoding)."""
    from tests.api.api_helpers import make_image

    assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
    names = ['say "hi".png', "100%41 real.png"]
    files = [("files", (name, make_image(i + 1, fmt="PNG"), "image/png")) for i, name in enumerate(names)]
    r = client.post(f"/v1/collections/{collection_name}/items", files=files)
    assert r.status_code in (201, 202), r.text
    stored = [client.get(f"/v1/collections/{collection_name}/items/{a['id']}").json() for a in r.json()["items"]]
    assert [s["metadata"]["filename"] for s in stored] == names
