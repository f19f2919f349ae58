"""A server whose encoder runs two models (MEMSTORE_MODELS): each collection is filled and searched
by its own model, and a model that does not run here is refused with the ones that do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from memstore.settings import Settings
from tests.api.api_helpers import WIDE, LiveServer, start_server, two_model_engine
from tests.databases import scratch_database


@pytest.fixture(scope="module")
def two_model_server(settings: Settings, server_url: str, tiny_engine: Any) -> Iterator[LiveServer]:
    """On a database of its own: the shared one's workers run the tiny model alone, and would hand
    this server's wide items back (to a worker that runs the model) rather than embed them."""
    with (
        two_model_engine(tiny_engine) as engine,
        scratch_database(server_url, "memstore_models") as url,
        start_server(settings.model_copy(update={"database_url": url}), backend=engine, auth="off") as live,
    ):
        yield live


def test_each_collection_is_filled_and_searched_by_its_own_model(
    two_model_server: LiveServer, collection_name: str
) -> None:
    with httpx.Client(base_url=two_model_server.url, timeout=60) as client:
        wide = client.post("/v1/collections", json={"name": f"{collection_name}_w", "model": WIDE})
        assert wide.status_code == 201, wide.text
        assert (wide.json()["model"], wide.json()["dimensions"]) == (WIDE, 96)
        plain = client.post("/v1/collections", json={"name": f"{collection_name}_p"})
        assert (plain.json()["model"], plain.json()["dimensions"]) == ("memstore-tiny", 64)
        for name in (f"{collection_name}_w", f"{collection_name}_p"):
            r = client.post(
                f"/v1/collections/{name}/items?wait=true",
                json={"items": [{"external_id": "a", "text": "a red bicycle"}, {"external_id": "b", "text": "tea"}]},
            )
            assert r.status_code == 201, r.text
            found = client.post(f"/v1/collections/{name}/search", json={"text": "a red bicycle", "mode": "vector"})
            assert found.status_code == 200, found.text
            assert found.json()["results"][0]["external_id"] == "a"
        vectors = [
            client.post(f"/v1/collections/{name}/items/lookup", json={"external_ids": ["a"]}).json()["found"]["a"]
            for name in (f"{collection_name}_w", f"{collection_name}_p")
        ]
        lengths = [
            len(client.get(f"/v1/collections/{name}/items/{vid}?with_vector=true").json()["vector"])
            for name, vid in zip((f"{collection_name}_w", f"{collection_name}_p"), vectors, strict=True)
        ]
        assert lengths == [96, 64]


def test_a_model_that_does_not_run_here_is_refused_with_those_that_do(
    two_model_server: LiveServer, collection_name: str
) -> None:
    with httpx.Client(base_url=two_model_server.url, timeout=60) as client:
        r = client.post("/v1/collections", json={"name": collection_name, "model": "ViT-H-14"})
        assert r.status_code == 422
        assert "memstore-tiny, memstore-tiny-wide" in r.json()["detail"]
        r = client.post("/v1/collections", json={"name": collection_name, "model": WIDE, "dimensions": 64})
        assert r.status_code == 422 and "96-dimensional" in r.json()["detail"]
        # A collection recorded with a model this server does not run takes vectors, not texts.
        r = client.post("/v1/collections", json={"name": collection_name, "model": "ViT-H-14", "dimensions": 8})
        assert r.status_code == 201, r.text
        r = client.post(f"/v1/collections/{collection_name}/items", json={"items": [{"text": "hello"}]})
        assert r.status_code == 422 and "add it to MEMSTORE_MODELS" in r.json()["detail"]
