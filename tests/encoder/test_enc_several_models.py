"""Several models in one engine (MEMSTORE_MODELS): a request names its model, a tick runs one model,
and the priority classes hold across models."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from encoder.client import RemoteEncoder
from encoder.engine import EmbeddingEngine
from encoder.errors import UnknownModelError
from encoder.service import create_app
from encoder.settings import EncoderSettings
from encoder.types import Priority
from tests.encoder.enc_helpers import FakeEncoder, make_image, settings_for


def _fake(name: str, dims: int) -> FakeEncoder:
    fake = FakeEncoder(dims=dims)
    fake.info = replace(fake.info, model=name)
    return fake


def test_a_request_gets_the_vectors_of_the_model_it_names() -> None:
    a, b = _fake("fake-a", 8), _fake("fake-b", 12)
    engine = EmbeddingEngine([a, b], settings_for())
    fut_default = engine.submit_texts(["one", "two"])
    fut_b = engine.submit_texts(["three"], model="fake-b")
    while engine.tick() is not None:
        pass
    assert fut_default.result(0).shape == (2, 8) and fut_b.result(0).shape == (1, 12)
    assert np.allclose(fut_b.result(0)[0], b.text_vector("three"))
    assert list(engine.infos) == ["fake-a", "fake-b"] and engine.info.model == "fake-a"
    with pytest.raises(UnknownModelError, match="fake-a, fake-b"):
        engine.submit_texts(["x"], model="nope")
    assert engine.submit_images([], model="fake-b").result(0).shape == (0, 12)


def test_a_tick_runs_one_model_and_queries_go_first_across_models() -> None:
    a, b = _fake("fake-a", 8), _fake("fake-b", 12)
    engine = EmbeddingEngine([a, b], settings_for(batch_size=8))
    background = engine.submit_texts([f"bulk {i}" for i in range(20)], priority=Priority.BACKGROUND, model="fake-b")
    query = engine.submit_texts(["find me"], priority=Priority.QUERY)
    reports = []
    while (report := engine.tick()) is not None:
        reports.append(report)
    assert reports[0].model == "fake-a" and query.done() and reports[0].units == 1
    assert [r.model for r in reports[1:]] == ["fake-b"] * 3  # 20 units, B = 8
    assert a.units == 1 and b.units == 20  # each model ran exactly its own requests
    assert background.result(0).shape == (20, 12)


def test_models_are_named_once_and_share_the_batch_size() -> None:
    with pytest.raises(ValueError, match="twice"):
        EmbeddingEngine([_fake("same", 8), _fake("same", 8)], settings_for())
    with pytest.raises(ValueError, match="batch_size"):
        EmbeddingEngine([_fake("a", 8), replace_batch(_fake("b", 8), 4)], settings_for())


def replace_batch(fake: FakeEncoder, batch_size: int) -> FakeEncoder:
    fake.batch_size = batch_size
    return fake


def test_memstore_models_lists_the_extra_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_MODEL", "memstore-tiny")
    monkeypatch.delenv("MEMSTORE_PRETRAINED", raising=False)
    monkeypatch.setenv("MEMSTORE_MODELS", " memstore-tiny-wide , ViT-B-32=none, RN50=openai")
    s = EncoderSettings(_env_file=None)
    assert s.all_models() == [
        ("memstore-tiny", None),
        ("memstore-tiny-wide", None),
        ("ViT-B-32", None),
        ("RN50", "openai"),
    ]
    monkeypatch.setenv("MEMSTORE_MODELS", "memstore-tiny")
    with pytest.raises(ValueError, match="twice"):
        EncoderSettings(_env_file=None)
    monkeypatch.delenv("MEMSTORE_MODELS")
    assert EncoderSettings(_env_file=None).all_models() == [("memstore-tiny", None)]


@pytest.fixture(scope="module")
def two_real_models(tiny):
    """The two offline configurations: memstore-tiny (64-d) and memstore-tiny-wide (96-d, 48 px)."""
    from encoder.models import create_encoder

    wide = create_encoder("memstore-tiny-wide", pretrained=None, batch_size=8)
    with EmbeddingEngine([tiny, wide], settings_for(preprocess_workers=1, max_tiles=16)) as engine:
        yield engine


def test_the_service_serves_both_real_models_by_name(two_real_models: EmbeddingEngine) -> None:
    engine = two_real_models
    png = make_image(120, 90, seed=3)
    with TestClient(create_app(engine)) as client:
        listed = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["dimensions"]) for m in listed] == [("memstore-tiny", 64), ("memstore-tiny-wide", 96)]
        r = client.post("/v1/embeddings", json={"input": ["a cat"], "model": "memstore-tiny-wide"})
        assert r.status_code == 200 and r.json()["model"] == "memstore-tiny-wide"
        assert len(r.json()["data"][0]["embedding"]) == 96
        r = client.post("/v1/embeddings", json={"input": ["a cat"], "model": "ViT-L-14"})
        assert r.status_code == 404 and "memstore-tiny-wide" in r.json()["detail"]
        remote = RemoteEncoder("http://testserver", client=client)
        assert list(remote.infos) == ["memstore-tiny", "memstore-tiny-wide"]
        wide_text = remote.embed_texts(["a cat"], model="memstore-tiny-wide")
        assert np.array_equal(wide_text, engine.embed_texts(["a cat"], model="memstore-tiny-wide"))
        wide_image = remote.embed_images([png], model="memstore-tiny-wide")
        assert wide_image.shape == (1, 96)  # type: ignore[union-attr]
        assert remote.embed_images([png]).shape == (1, 64)  # type: ignore[union-attr]
        assert remote.embed_texts([], model="memstore-tiny-wide").shape == (0, 96)
        with pytest.raises(UnknownModelError):
            remote.embed_texts(["x"], model="ViT-L-14")
        health = client.get("/health").json()
        assert [m["model"] for m in health["models"]] == ["memstore-tiny", "memstore-tiny-wide"]


def test_the_two_offline_models_differ() -> None:
    from encoder.models import model_dimensions

    assert (model_dimensions("memstore-tiny"), model_dimensions("memstore-tiny-wide")) == (64, 96)
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
