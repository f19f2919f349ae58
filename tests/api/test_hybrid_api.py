"""Keyword and hybrid search through the REST API: modes, ranks, the collection's keyword settings,
and the abuse cases (a read key cannot change them; bad input is a problem document)."""

from __future__ import annotations

import json
import uuid

import httpx
import numpy as np
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database

PRODUCTS = {
    "p1": ("Stainless kettle, 1.7 litres", "KT-1700-S"),
    "p2": ("Cast iron pan for the oven", "PN-2600-C"),
    "p3": ("Electric kettle with a glass body", "KT-2200-G"),
    "p4": ("Chef's knife, forged steel", "KN-0210-F"),
}


def _problem(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


def _products(client: httpx.Client, name: str) -> dict[str, list[float]]:
    r = client.post("/v1/collections", json={"name": name, "dimensions": 8, "text_fields": ["sku"]})
    assert r.status_code == 201, r.text
    assert r.json()["text_fields"] == ["sku"] and r.json()["language"] == "simple"
    rng = np.random.default_rng(1)
    vectors = {eid: rng.normal(size=8).tolist() for eid in PRODUCTS}
    items = [
        {"external_id": eid, "text": text, "vector": vectors[eid], "metadata": {"sku": sku, "n": i}}
        for i, (eid, (text, sku)) in enumerate(PRODUCTS.items())
    ]
    r = client.post(f"/v1/collections/{name}/items", json={"items": items})
    assert r.status_code in (200, 201), r.text
    assert all(a["status"] == "ready" for a in r.json()["items"])  # a text with its vector is not embedded
    r = client.get(f"/v1/collections/{name}/items/{r.json()['items'][0]['id']}")
    assert r.json()["text"] == PRODUCTS["p1"][0]
    return vectors


def test_keyword_and_hybrid_modes(client: httpx.Client, collection_name: str) -> None:
    vectors = _products(client, collection_name)
    url = f"/v1/collections/{collection_name}/search"

    r = client.post(url, json={"text": "KT-2200-G", "mode": "keyword", "k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert [h["external_id"] for h in hits] == ["p3"]
    assert hits[0]["ranks"] == {"vector": None, "keyword": 1} and hits[0]["distance"] is None

    r = client.post(url, json={"text": "kettle", "mode": "keyword", "k": 3})
    assert sorted(h["external_id"] for h in r.json()["results"]) == ["p1", "p3"]

    # Hybrid with the client's vector (p4's): both lists show in the ranks.
    r = client.post(url, json={"text": "KN-0210-F", "vector": vectors["p4"], "k": 4})
    hits = r.json()["results"]
    assert hits[0]["external_id"] == "p4" and hits[0]["ranks"] == {"vector": 1, "keyword": 1}
    assert all(h["distance"] is not None for h in hits)

    # A vector search ranks by the vector list alone.
    r = client.post(url, json={"vector": vectors["p2"], "k": 2})
    assert r.json()["results"][0]["ranks"] == {"vector": 1, "keyword": None}

    # Paging and a threshold.
    whole = client.post(url, json={"vector": vectors["p2"], "k": 4, "exact": True}).json()["results"]
    page = client.post(url, json={"vector": vectors["p2"], "k": 2, "offset": 2, "exact": True}).json()["results"]
    assert [h["id"] for h in page] == [h["id"] for h in whole[2:]]
    cut = whole[1]["score"]
    kept = client.post(url, json={"vector": vectors["p2"], "k": 4, "exact": True, "score_threshold": cut}).json()
    assert [h["id"] for h in kept["results"]] == [h["id"] for h in whole if h["score"] >= cut]


def test_a_text_alone_searches_hybrid_with_the_model(client: httpx.Client, collection_name: str) -> None:
    """The server's model (the tiny one) embeds the text; its keywords find the item whatever the
    untrained model makes of it."""
    r = client.post("/v1/collections", json={"name": collection_name})
    assert r.status_code == 201, r.text
    texts = [f"note number {i} about topic-{i}" for i in range(12)]
    r = client.post(
        f"/v1/collections/{collection_name}/items?wait=true",
        json={"items": [{"external_id": f"n{i}", "text": t} for i, t in enumerate(texts)]},
    )
    assert r.status_code in (200, 201), r.text
    r = client.post(f"/v1/collections/{collection_name}/search", json={"text": "topic-7", "k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert hits[0]["external_id"] == "n7" and hits[0]["ranks"]["keyword"] == 1
    assert hits[0]["ranks"]["vector"] is not None  # the model's list ranked it too (it holds every note)


def test_keyword_settings_change_online_and_only_for_admins(
    client: httpx.Client, server, engine: sa.Engine, collection_name: str
) -> None:
    _products(client, collection_name)
    url = f"/v1/collections/{collection_name}"
    _, reader = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=[f"read:{collection_name}"])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {reader}"}, timeout=30) as c:
        _problem(c.patch(url, json={"text_fields": []}), 403)
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        _problem(anonymous.patch(url, json={"text_fields": []}), 401)
    _problem(client.patch(url, json={"language": "klingon"}), 422)
    _problem(client.patch(url, json={"text_fields": ["a"] * 33}), 422)
    _problem(client.patch(url, json={"text_fields": "sku"}), 422)
    _problem(client.patch(url, json={"unknown": 1}), 422)
    _problem(client.patch("/v1/collections/nope_" + uuid.uuid4().hex[:6], json={"text_fields": []}), 404)

    search = f"{url}/search"
    assert [
        h["external_id"] for h in client.post(search, json={"text": "PN-2600-C", "mode": "keyword"}).json()["results"]
    ] == ["p2"]
    r = client.patch(url, json={"text_fields": [], "language": "english"})
    assert r.status_code == 200, r.text
    assert r.json()["text_fields"] == [] and r.json()["language"] == "english"
    assert client.post(search, json={"text": "PN-2600-C", "mode": "keyword"}).json()["results"] == []
    # english stems: "kettles" finds "kettle".
    found = client.post(search, json={"text": "kettles", "mode": "keyword"}).json()["results"]
    assert sorted(h["external_id"] for h in found) == ["p1", "p3"]


def test_bad_searches_are_problem_documents(client: httpx.Client, collection_name: str) -> None:
    _products(client, collection_name)
    url = f"/v1/collections/{collection_name}/search"
    for body in (
        {"text": "x", "mode": "semantic"},
        {"text": "x", "mode": "keyword", "vector": [0.0] * 8},
        {"text": "x", "mode": "keyword", "offset": -1},
        {"text": "x", "mode": "keyword", "k": 10, "offset": 991},
        {"text": "x", "mode": "keyword", "weights": {"vector": 1, "sparse": 1}},
        {"text": "x", "mode": "keyword", "candidates": 0},
        {"text": "x" * 5000, "mode": "keyword"},
        {"text": "x", "mode": "keyword", "score_threshold": "high"},
    ):
        _problem(client.post(url, json=body), 422)
    # Hostile query texts are words, not syntax: none fails.
    for text in ("'; DROP TABLE x; --", "a & | ! ( ) :* <->", "\\", "\u202e\u0000x".replace("\u0000", ""), "🙂" * 50):
        r = client.post(url, json={"text": text, "mode": "keyword"})
        assert r.status_code == 200, (text, r.text)


def test_memstore_search_prints_a_table_and_json(
    client: httpx.Client, server, admin_key: str, collection_name: str, capsys
) -> None:
    from memstore.cli import main

    _products(client, collection_name)
    common = [collection_name, "--url", server.url, "--key", admin_key]
    assert main(["search", *common[:1], "KT-2200-G", *common[1:], "--mode", "keyword"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["#", "score", "vector", "keyword"]
    assert len(out) == 2 and " p3 " in out[1] and out[1].split()[2:4] == ["-", "1"]
    assert main(["search", collection_name, "kettle", "--mode", "keyword", "--json", *common[1:]]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert sorted(h["external_id"] for h in answer["results"]) == ["p1", "p3"]
    assert main(["search", collection_name, "kettle", "--filter", "[1]", *common[1:]]) == 2
    assert "JSON object" in capsys.readouterr().err
    assert main(["search", collection_name, "x", "--mode", "semantic", *common[1:]]) == 2
    assert main(["search", "no_such_" + uuid.uuid4().hex[:6], "x", *common[1:]]) == 2
    assert "404" in capsys.readouterr().err


def test_batches_of_searches_and_vectors_with_the_hits(
    client: httpx.Client, server, engine: sa.Engine, collection_name: str
) -> None:
    vectors = _products(client, collection_name)
    url = f"/v1/collections/{collection_name}/search"
    r = client.post(url, json={"vector": vectors["p2"], "k": 2, "with_vector": True})
    hits = r.json()["results"]
    assert hits[0]["external_id"] == "p2" and np.allclose(hits[0]["vector"], vectors["p2"], atol=1e-6)
    assert "vector" not in client.post(url, json={"vector": vectors["p2"], "k": 2}).json()["results"][0]

    searches = [
        {"text": "KT-2200-G", "mode": "keyword", "k": 3},
        {"vector": vectors["p4"], "k": 1},
        {"text": "kettle", "mode": "keyword", "k": 5, "filter": {"n": {"$lte": 1}}},
    ]
    r = client.post(f"{url}/batch", json={"searches": searches})
    assert r.status_code == 200, r.text
    answers = r.json()["results"]
    assert [[h["external_id"] for h in a] for a in answers] == [["p3"], ["p4"], ["p1"]]
    # Each answer is what the search alone answers.
    for one, answer in zip(searches, answers, strict=True):
        assert client.post(url, json=one).json()["results"] == answer

    # A bad search names its place; limits and keys hold as for one search.
    body = _problem(client.post(f"{url}/batch", json={"searches": [searches[0], {"text": "x", "mode": "odd"}]}), 422)
    assert "searches" in json.dumps(body)
    body = _problem(client.post(f"{url}/batch", json={"searches": [searches[0], {"vector": [1.0, 2.0]}]}), 422)
    assert body["detail"].startswith("searches[1]: ")
    _problem(client.post(f"{url}/batch", json={"searches": []}), 422)
    _problem(client.post(f"{url}/batch", json={"searches": [searches[1]] * 101}), 422)
    _, other = keys.create_key(Database(engine), name=f"o-{uuid.uuid4().hex[:8]}", scopes=["read:someone_else"])
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {other}"}, timeout=30) as c:
        _problem(c.post(f"{url}/batch", json={"searches": [searches[0]]}), 403)


def test_recommend_more_like_these_not_like_those(client: httpx.Client, collection_name: str) -> None:
    """Four clusters on the axes: positives from one, a negative from another; the answer comes from
    the positives' cluster, never holds the examples themselves, and every example form works."""
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
    assert r.status_code == 201, r.text
    rng = np.random.default_rng(5)
    items = []
    for axis in range(4):
        for j in range(6):
            v = np.full(4, 0.05) + rng.normal(scale=0.02, size=4)
            v[axis] = 1.0
            items.append({"external_id": f"a{axis}-{j}", "vector": v.tolist(), "metadata": {"axis": axis}})
    ids = {
        it["external_id"]: it["id"]
        for it in client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).json()["items"]
    }
    url = f"/v1/collections/{collection_name}/recommend"
    r = client.post(url, json={"positive": [ids["a0-0"], ids["a0-1"]], "negative": [ids["a1-0"]], "k": 4})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    assert len(hits) == 4 and all(h["metadata"]["axis"] == 0 for h in hits)
    assert not {ids["a0-0"], ids["a0-1"]} & {h["id"] for h in hits}
    assert [h["ranks"]["vector"] for h in hits] == [1, 2, 3, 4]
    r = client.post(url, json={"positive": [{"vector": [0, 0, 1, 0.1]}], "k": 3, "filter": {"axis": 2}})
    assert [h["metadata"]["axis"] for h in r.json()["results"]] == [2, 2, 2]
    # Bad examples are 4xx problem documents.
    _problem(client.post(url, json={"positive": []}), 422)
    _problem(client.post(url, json={"positive": [{"text": "a", "vector": [1, 0, 0, 0]}]}), 422)
    _problem(client.post(url, json={"positive": [{"vector": [1, 0]}]}), 422)
    _problem(client.post(url, json={"positive": [10**12]}), 404)
    _problem(client.post(url, json={"positive": [1] * 101}), 422)


def test_group_by_answers_the_best_hits_of_each_group(client: httpx.Client, store, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 2})
    assert r.status_code == 201, r.text
    # Albums at growing distance from the query (1, 0); within one, photos a little apart.
    items = [
        {"external_id": f"{album}-{j}", "vector": [1.0, 0.1 * a + 0.01 * j], "metadata": {"album": album}}
        for a, album in enumerate(["paris", "rome", "oslo", "lima"])
        for j in range(4)
    ] + [{"external_id": "loose", "vector": [1.0, 0.0], "metadata": {}}]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    url = f"/v1/collections/{collection_name}/search"
    body = {"vector": [1.0, 0.0], "k": 3, "group_by": "album", "group_size": 2, "exact": True}
    answer = client.post(url, json=body).json()
    assert [g["value"] for g in answer["groups"]] == ["paris", "rome", "oslo"]
    assert [[h["external_id"] for h in g["hits"]] for g in answer["groups"]] == [
        ["paris-0", "paris-1"],
        ["rome-0", "rome-1"],
        ["oslo-0", "oslo-1"],
    ]
    assert [h["external_id"] for h in answer["results"]] == [
        "paris-0",
        "paris-1",
        "rome-0",
        "rome-1",
        "oslo-0",
        "oslo-1",
    ]
    _problem(client.post(url, json={**body, "offset": 2}), 422)
    _problem(client.post(url, json={**body, "group_size": 0}), 422)
    # The Python API groups the same way.
    groups = store.search_groups(
        collection=collection_name, group_by="album", group_size=2, groups=3, vector=[1.0, 0.0], exact=True
    )
    assert [[h.external_id for h in g] for g in groups] == [
        [h["external_id"] for h in g["hits"]] for g in answer["groups"]
    ]


def test_duplicates_come_in_pairs_page_by_page(client: httpx.Client, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 8})
    assert r.status_code == 201, r.text
    rng = np.random.default_rng(9)
    base = rng.normal(size=(40, 8))
    items = [{"external_id": f"u{i}", "vector": v.tolist()} for i, v in enumerate(base)]
    # Three near copies of u3, u10 and u30 (a re-saved photo, a resized one).
    items += [{"external_id": f"copy-of-u{i}", "vector": (base[i] * 1.001 + 1e-4).tolist()} for i in (3, 10, 30)]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    url = f"/v1/collections/{collection_name}/duplicates"
    found, after, pages = [], 0, 0
    while after is not None:
        page = client.post(url, json={"threshold": 0.001, "scan": 15, "after": after}).json()
        found += [(p["a"]["external_id"], p["b"]["external_id"]) for p in page["pairs"]]
        after, pages = page["next"], pages + 1
    assert pages == 3  # 43 items, 15 a page
    assert sorted(found) == [("u10", "copy-of-u10"), ("u3", "copy-of-u3"), ("u30", "copy-of-u30")]
    _problem(client.post(url, json={"threshold": -1}), 422)
    _problem(client.post(url, json={"threshold": 0.1, "scan": 5001}), 422)
    _problem(client.post(url, json={}), 422)


def test_a_text_the_model_cannot_embed_for_the_collection_points_to_keyword_search(
    client: httpx.Client, collection_name: str
) -> None:
    _products(client, collection_name)  # 8 dimensions: not the server's model's 64
    r = client.post(f"/v1/collections/{collection_name}/search", json={"text": "kettle"})
    assert '"mode": "keyword"' in _problem(r, 422)["detail"]
    r = client.post(f"/v1/collections/{collection_name}/search", json={"text": "kettle", "mode": "keyword"})
    assert r.status_code == 200 and r.json()["results"]


def test_group_by_a_list_valued_field_groups_by_each_element(client: httpx.Client, store, collection_name: str) -> None:
    """As a filter's equality matches a list by its elements (and as Qdrant groups an array field):
    an item tagged ["beach", "family"] is among the best of both groups, listed once in ``results``."""
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 2})
    assert r.status_code == 201, r.text
    items = [
        {"external_id": "both", "vector": [1.0, 0.00], "metadata": {"tags": ["beach", "family"]}},
        {"external_id": "beach-1", "vector": [1.0, 0.01], "metadata": {"tags": ["beach"]}},
        {"external_id": "family-1", "vector": [1.0, 0.02], "metadata": {"tags": "family"}},  # a scalar
        {"external_id": "twice", "vector": [1.0, 0.03], "metadata": {"tags": ["city", "city"]}},
        {"external_id": "none", "vector": [1.0, 0.04], "metadata": {"tags": []}},
        {"external_id": "nested", "vector": [1.0, 0.05], "metadata": {"tags": [["a", "b"]]}},
    ]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    url = f"/v1/collections/{collection_name}/search"
    body = {"vector": [1.0, 0.0], "k": 10, "group_by": "tags", "group_size": 2, "exact": True}
    answer = client.post(url, json=body).json()
    assert [(g["value"], [h["external_id"] for h in g["hits"]]) for g in answer["groups"]] == [
        ("beach", ["both", "beach-1"]),
        ("family", ["both", "family-1"]),
        ("city", ["twice"]),
        (["a", "b"], ["nested"]),
    ]
    assert [h["external_id"] for h in answer["results"]] == ["both", "beach-1", "family-1", "twice", "nested"]
    # The filter agrees: the items in the "family" group are the items the equality filter finds.
    found = client.post(url, json={"vector": [1.0, 0.0], "k": 10, "filter": {"tags": "family"}, "exact": True})
    assert [h["external_id"] for h in found.json()["results"]] == ["both", "family-1"]
    # Two groups asked: the first two values, in the order of their best hit.
    two = client.post(url, json={**body, "k": 2}).json()
    assert [g["value"] for g in two["groups"]] == ["beach", "family"]
    groups = store.search_groups(
        collection=collection_name, group_by="tags", group_size=2, groups=2, vector=[1.0, 0.0], exact=True
    )
    assert [(g.value, [h.external_id for h in g]) for g in groups] == [
        ("beach", ["both", "beach-1"]),
        ("family", ["both", "family-1"]),
    ]


def test_a_dotted_key_is_a_nested_field_in_filters_and_group_by(
    client: httpx.Client, store, collection_name: str
) -> None:
    """MongoDB's and Qdrant's dot notation: ``"exif.camera"`` is the field ``camera`` of ``exif``, in a
    filter and in ``group_by``; a key that holds a dot is written with ``\\.``; an empty name is a 422."""
    r = client.post("/v1/collections", json={"name": collection_name, "dimensions": 2})
    assert r.status_code == 201, r.text
    items = [
        {"external_id": "x100", "vector": [1.0, 0.00], "metadata": {"exif": {"camera": "x100", "iso": 800}}},
        {"external_id": "gr", "vector": [1.0, 0.01], "metadata": {"exif": {"camera": "gr", "iso": 200}}},
        {"external_id": "flat", "vector": [1.0, 0.02], "metadata": {"exif.camera": "x100", "exif.iso": 800}},
        {"external_id": "none", "vector": [1.0, 0.03], "metadata": {"exif": "stripped"}},
    ]
    assert client.post(f"/v1/collections/{collection_name}/items", json={"items": items}).status_code == 201
    url = f"/v1/collections/{collection_name}/search"

    def ids(flt: dict) -> list[str]:
        r = client.post(url, json={"vector": [1.0, 0.0], "k": 10, "filter": flt, "exact": True})
        assert r.status_code == 200, r.text
        return [h["external_id"] for h in r.json()["results"]]

    assert ids({"exif.camera": "x100"}) == ids({"exif": {"camera": "x100"}}) == ["x100"]
    assert ids({"exif.iso": {"$gte": 400}}) == ["x100"]
    assert ids({"exif\\.camera": "x100"}) == ["flat"]  # the key that holds a dot
    assert ids({"exif.camera": {"$exists": False}}) == ["flat", "none"]
    body = {"vector": [1.0, 0.0], "k": 10, "group_by": "exif.camera", "exact": True}
    groups = client.post(url, json=body).json()["groups"]
    assert [(g["value"], [h["external_id"] for h in g["hits"]]) for g in groups] == [("x100", ["x100"]), ("gr", ["gr"])]
    flat = client.post(url, json={**body, "group_by": "exif\\.camera"}).json()["groups"]
    assert [g["value"] for g in flat] == ["x100"] and flat[0]["hits"][0]["external_id"] == "flat"
    for bad in ({"filter": {"exif..camera": 1}}, {"filter": {"exif.": 1}}, {"group_by": "exif..camera"}):
        r = client.post(url, json={"vector": [1.0, 0.0], **bad})
        assert r.status_code == 422 and "empty name between dots" in _problem(r, 422)["detail"], r.text
    grouped = store.search_groups(collection=collection_name, group_by="exif.iso", vector=[1.0, 0.0], exact=True)
    assert [g.value for g in grouped] == [800, 200]
