"""Embedding spaces through the REST API, on a server whose encoder runs two models: a collection
of the tiny model gets a space of the wide one, filled by the server's own ingest worker; searches
name it with ``using`` until it is activated; and the abuse cases of the new routes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from memstore.access import keys
from memstore.db.core import Database, create_engine
from memstore.settings import Settings
from tests.api.api_helpers import WIDE, LiveServer, start_server, two_model_engine
from tests.databases import scratch_database


@pytest.fixture(scope="module")
def keyed(settings: Settings, server_url: str, tiny_engine: Any) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    """A two-model server with keys on, on a database of its own, and an admin, a writer and a reader key."""
    with (
        two_model_engine(tiny_engine) as engine,
        scratch_database(server_url, "memstore_spaces") as url,
        start_server(settings.model_copy(update={"database_url": url}), backend=engine) as live,
    ):
        db = Database(create_engine(url))
        made = {
            scope: keys.create_key(db, name=f"spaces-{scope}", scopes=[scope])[1]
            for scope in ("admin", "write", "read")
        }
        db.engine.dispose()
        yield live, made


def _client(live: LiveServer, secret: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return httpx.Client(base_url=live.url, headers=headers, timeout=60)


def _wait_ready(client: httpx.Client, path: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = client.get(path)
        assert got.status_code == 200, got.text
        if got.json()["state"] == "ready" or time.monotonic() > deadline:
            return dict(got.json())
        time.sleep(0.2)


def test_a_space_of_another_model_is_filled_searched_and_activated(keyed, collection_name) -> None:
    live, secrets = keyed
    with _client(live, secrets["admin"]) as client:
        assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
        texts = ["a red bicycle", "green tea", "a sailing boat", "mountain snow", "an old map"]
        items = [{"external_id": f"i{i}", "text": t} for i, t in enumerate(texts)]
        r = client.post(f"/v1/collections/{collection_name}/items?wait=true", json={"items": items})
        assert r.status_code == 201, r.text

        made = client.post(f"/v1/collections/{collection_name}/spaces", json={"name": "wide", "model": WIDE})
        assert made.status_code == 202, made.text
        assert made.headers["location"] == f"/v1/collections/{collection_name}/spaces/wide"
        body = made.json()
        assert (body["model"], body["dimensions"], body["state"], body["total"]) == (WIDE, 96, "filling", 5)
        ready = _wait_ready(client, f"/v1/collections/{collection_name}/spaces/wide")
        assert ready["state"] == "ready" and (ready["done"], ready["total"], ready["pending"]) == (5, 5, 0), ready
        listed = client.get(f"/v1/collections/{collection_name}/spaces").json()["spaces"]
        assert [(s["name"], s["active"]) for s in listed] == [("default", True), ("wide", False)]

        # A text query is embedded by the searched space's model.
        hit = client.post(
            f"/v1/collections/{collection_name}/search",
            json={"text": "a sailing boat", "mode": "vector", "using": "wide", "k": 1, "with_vector": True},
        ).json()["results"][0]
        assert hit["external_id"] == "i2" and len(hit["vector"]) == 96
        by_item = client.post(
            f"/v1/collections/{collection_name}/search", json={"item_id": hit["id"], "using": "wide", "k": 1}
        ).json()["results"]
        assert by_item[0]["id"] == hit["id"]
        plain = client.post(
            f"/v1/collections/{collection_name}/search", json={"text": "a sailing boat", "mode": "vector", "k": 1}
        ).json()["results"][0]
        assert plain["external_id"] == "i2"
        wrong = client.post(f"/v1/collections/{collection_name}/search", json={"vector": [0.1] * 64, "using": "wide"})
        assert wrong.status_code == 422 and "96" in wrong.json()["detail"], wrong.text
        unknown = client.post(f"/v1/collections/{collection_name}/search", json={"vector": [0.1] * 64, "using": "v9"})
        assert unknown.status_code == 404 and "has no space 'v9'" in unknown.json()["detail"]

        activated = client.post(f"/v1/collections/{collection_name}/spaces/wide/activate", json={})
        assert activated.status_code == 200 and activated.json()["active"] is True, activated.text
        got = client.get(f"/v1/collections/{collection_name}").json()
        assert (got["active_space"], got["spaces"]) == ("wide", ["default", "wide"])
        # Searches that name no space now use the wide one: 96-d vectors, its model for texts.
        assert client.post(f"/v1/collections/{collection_name}/search", json={"vector": [0.1] * 96}).status_code == 200
        after = client.post(
            f"/v1/collections/{collection_name}/search", json={"text": "green tea", "mode": "vector", "k": 1}
        ).json()["results"][0]
        assert after["external_id"] == "i1"
        # Recommendations take their examples, and item ids, in the active space too.
        liked = client.post(
            f"/v1/collections/{collection_name}/recommend",
            json={"positive": [{"text": "green tea"}, hit["id"]], "k": 2},
        )
        assert liked.status_code == 200, liked.text
        assert {r["external_id"] for r in liked.json()["results"]} <= {"i0", "i1", "i3", "i4"}
        # New items reach the active space too.
        r = client.post(
            f"/v1/collections/{collection_name}/items?wait=true",
            json={"items": [{"external_id": "n", "text": "a violin"}]},
        )
        assert r.status_code == 201
        deadline = time.monotonic() + 60
        while client.get(f"/v1/collections/{collection_name}/spaces/wide").json()["done"] < 6:
            assert time.monotonic() < deadline, "the new item never reached the active space"
            time.sleep(0.1)
        refused = client.delete(f"/v1/collections/{collection_name}/spaces/wide")
        assert refused.status_code == 409 and "activate another space first" in refused.json()["detail"]
        assert client.post(f"/v1/collections/{collection_name}/spaces/default/activate", json={}).status_code == 200
        assert client.delete(f"/v1/collections/{collection_name}/spaces/wide").status_code == 204
        assert client.get(f"/v1/collections/{collection_name}/spaces/wide").status_code == 404


def test_bare_vectors_are_given_through_the_api_before_activation(keyed, collection_name) -> None:
    live, secrets = keyed
    with _client(live, secrets["admin"]) as admin, _client(live, secrets["write"]) as writer:
        assert admin.post("/v1/collections", json={"name": collection_name}).status_code == 201
        r = admin.post(
            f"/v1/collections/{collection_name}/items", json={"items": [{"external_id": "v", "vector": [0.5] * 64}]}
        )
        assert r.status_code == 201, r.text
        assert (
            admin.post(f"/v1/collections/{collection_name}/spaces", json={"name": "wide", "model": WIDE}).status_code
            == 202
        )
        state = _wait_ready(admin, f"/v1/collections/{collection_name}/spaces/wide")
        assert (state["without_original"], state["without_original_ids"]) == (1, ["v"])
        refused = admin.post(f"/v1/collections/{collection_name}/spaces/wide/activate", json={})
        assert refused.status_code == 409 and "bare vectors" in refused.json()["detail"]
        short = writer.put(
            f"/v1/collections/{collection_name}/spaces/wide/vectors", json={"vectors": {"v": [0.5] * 64}}
        )
        assert short.status_code == 422 and "96" in short.json()["detail"]
        nobody = writer.put(
            f"/v1/collections/{collection_name}/spaces/wide/vectors", json={"vectors": {"zz": [0.5] * 96}}
        )
        assert nobody.status_code == 404
        given = writer.put(
            f"/v1/collections/{collection_name}/spaces/wide/vectors", json={"vectors": {"v": [0.5] * 96}}
        )
        assert given.status_code == 200 and given.json()["written"] == 1
        assert admin.post(f"/v1/collections/{collection_name}/spaces/wide/activate", json={}).status_code == 200


def test_abuse_of_the_space_routes(keyed, collection_name) -> None:
    live, secrets = keyed
    base = f"/v1/collections/{collection_name}/spaces"
    with (
        _client(live, secrets["admin"]) as admin,
        _client(live, secrets["read"]) as reader,
        _client(live, None) as anon,
    ):
        assert admin.post("/v1/collections", json={"name": collection_name}).status_code == 201
        # No key: refused before the body is read (a malformed body still answers 401).
        assert anon.post(base, content=b"{not json").status_code == 401
        assert anon.get(base).status_code == 401
        # A reader may look, not create, activate, give vectors or drop.
        assert reader.get(base).status_code == 200
        assert reader.post(base, json={"name": "wide", "model": WIDE}).status_code == 403
        assert reader.post(f"{base}/default/activate", json={}).status_code == 403
        assert reader.put(f"{base}/default/vectors", json={"vectors": {"a": [1.0]}}).status_code == 403
        assert reader.delete(f"{base}/default").status_code == 403
        # Names that could reach SQL or a path are refused; so are unknown models, fields and spaces.
        for bad in ("default", "x; DROP TABLE memstore_spaces", "../etc", "Wide", "a" * 33):
            r = admin.post(base, json={"name": bad, "model": WIDE})
            assert r.status_code == 422, (bad, r.text)
        r = admin.post(base, json={"name": "big", "model": "ViT-H-14"})
        assert r.status_code == 422 and "memstore-tiny, memstore-tiny-wide" in r.json()["detail"]
        assert admin.post(base, json={"name": "wide", "model": WIDE, "dimensions": 5}).status_code == 422
        assert admin.get(f"{base}/nope").status_code == 404
        assert admin.delete(f"{base}/default").status_code == 409
        assert (
            admin.post(
                f"/v1/collections/{collection_name}/search", json={"vector": [1.0] * 64, "using": "Bad;"}
            ).status_code
            == 422
        )
        assert admin.post(base, json={"name": "wide", "model": WIDE}).status_code == 202
        assert admin.post(base, json={"name": "wide", "model": WIDE}).status_code == 409
        too_many = {"vectors": {f"e{i}": [0.0] * 96 for i in range(1001)}}
        assert admin.put(f"{base}/wide/vectors", json=too_many).status_code == 422
        # The space's table name never comes from the request.
        table = admin.get(f"{base}/wide").json()
        assert "table" not in str(table)


def test_the_spaces_command_migrates_a_collection_to_another_model(keyed, collection_name, capsys) -> None:
    from memstore.cli import main

    live, secrets = keyed
    with _client(live, secrets["admin"]) as client:
        assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
        items = [{"external_id": f"i{i}", "text": f"note {i}"} for i in range(12)]
        assert (
            client.post(f"/v1/collections/{collection_name}/items?wait=true", json={"items": items}).status_code == 201
        )
    common = ["-c", collection_name, "--url", live.url, "--key", secrets["admin"]]
    assert main(["spaces", "create", *common, "v2", "--model", WIDE]) == 0
    assert "v2: memstore-tiny-wide, 96-d cosine, filling" in capsys.readouterr().out
    assert main(["spaces", "status", *common, "v2", "--wait", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert (state["state"], state["done"], state["total"]) == ("ready", 12, 12)
    assert main(["spaces", "activate", *common, "v2"]) == 0
    assert "v2 (active)" in capsys.readouterr().out
    assert main(["spaces", "list", *common]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("default: memstore-tiny, 64-d") and listed[1].startswith("v2 (active)")
    assert main(["spaces", "delete", *common, "v2"]) == 2
    assert "activate another space first" in capsys.readouterr().err
    assert main(["spaces", "activate", *common, "default"]) == 0
    assert main(["spaces", "delete", *common, "v2"]) == 0
    assert "space v2 of" in capsys.readouterr().out
    assert main(["spaces", "status", *common, "v2", "--key", "wrong"]) == 2
    assert "401" in capsys.readouterr().err
