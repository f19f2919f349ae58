"""A collection, read through the API, names the model, vector size and metric of its active space:
after a space of another model is activated, GET /v1/collections/{name} (and the listing) say so, and
activating the default space again brings its own back."""

from __future__ import annotations

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
def two_models(settings: Settings, server_url: str, tiny_engine: Any) -> Iterator[tuple[LiveServer, str]]:
    """A server whose encoder runs the tiny model and the wide one, on a database of its own, and an admin key."""
    with (
        two_model_engine(tiny_engine) as engine,
        scratch_database(server_url, "memstore_active_space") as url,
        start_server(settings.model_copy(update={"database_url": url}), backend=engine) as live,
    ):
        db = Database(create_engine(url))
        secret = keys.create_key(db, name="active-space-admin", scopes=["admin"])[1]
        db.engine.dispose()
        yield live, secret


def _wait_ready(client: httpx.Client, path: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while client.get(path).json()["state"] != "ready":
        assert time.monotonic() < deadline, client.get(path).text
        time.sleep(0.2)


def test_the_collection_names_its_active_space_model_and_dimensions(two_models, collection_name) -> None:
    live, secret = two_models
    with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
        assert client.post("/v1/collections", json={"name": collection_name}).status_code == 201
        base = f"/v1/collections/{collection_name}"
        items = [{"external_id": f"i{i}", "text": t} for i, t in enumerate(["a red bicycle", "green tea"])]
        assert client.post(f"{base}/items?wait=true", json={"items": items}).status_code == 201
        before = client.get(base).json()
        assert (before["model"], before["dimensions"], before["active_space"]) == ("memstore-tiny", 64, "default")

        made = client.post(f"{base}/spaces", json={"name": "wide", "model": WIDE})
        assert made.status_code == 202, made.text
        _wait_ready(client, f"{base}/spaces/wide")
        # Made, not active: the collection still names the default space's model.
        assert (client.get(base).json()["model"], client.get(base).json()["dimensions"]) == ("memstore-tiny", 64)

        assert client.post(f"{base}/spaces/wide/activate", json={}).status_code == 200
        after = client.get(base).json()
        assert (after["model"], after["dimensions"], after["active_space"]) == (WIDE, 96, "wide")
        assert after["metric"] == before["metric"]
        listed = {c["name"]: c for c in client.get("/v1/collections").json()["collections"]}
        assert (listed[collection_name]["model"], listed[collection_name]["dimensions"]) == (WIDE, 96)
        # A text query is embedded by the model the collection names.
        hit = client.post(f"{base}/search", json={"text": "green tea", "mode": "vector", "k": 1, "with_vector": True})
        assert len(hit.json()["results"][0]["vector"]) == after["dimensions"]

        assert client.post(f"{base}/spaces/default/activate", json={}).status_code == 200
        again = client.get(base).json()
        assert (again["model"], again["dimensions"], again["active_space"]) == ("memstore-tiny", 64, "default")
