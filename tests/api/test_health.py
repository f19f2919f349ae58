"""/health for a new user's first hour: a failed encoder makes the service "degraded" (with the reason
and the offline command in the log), and collections can be made while a model still loads."""

from __future__ import annotations

import logging
import threading

import httpx
import pytest

from memstore.api.runtime import RuntimeOptions
from memstore.errors import EncoderUnavailableError
from memstore.services.encoder_host import EncoderChoice, EncoderHost, open_backend
from memstore.settings import ApiSettings
from memstore.web import create_app
from tests.api.api_helpers import LiveServer


def test_an_encoder_without_weights_makes_health_degraded_and_logs_the_offline_command(
    settings, monkeypatch, tmp_path, caplog
) -> None:
    monkeypatch.setenv("MEMSTORE_MODEL", "ViT-B-32")
    monkeypatch.delenv("MEMSTORE_PRETRAINED", raising=False)
    monkeypatch.setenv("MEMSTORE_ENCODER_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    app = create_app(settings, api_settings=ApiSettings(auth="off"), options=RuntimeOptions(encoder="local"))
    with caplog.at_level(logging.ERROR), LiveServer(app) as live:
        host = live.runtime.encoder
        for _ in range(600):
            if host.state != "loading":
                break
            threading.Event().wait(0.1)
        body = httpx.get(f"{live.url}/health").json()
    assert host.state == "failed"
    assert body["status"] == "degraded"
    assert any("encoder failed to start" in r for r in body["reasons"])
    assert "WeightsNotFoundError" in body["encoder"]["error"]
    assert "MEMSTORE_MODEL=memstore-tiny MEMSTORE_PRETRAINED=none make run" in caplog.text


def test_health_says_starting_while_the_model_loads(settings, monkeypatch) -> None:
    """A client that waits for "ok" before its first text search must not get "ok" and then a 503;
    a failed part still reads "degraded" while the model loads (the worst state wins)."""
    app = create_app(settings, api_settings=ApiSettings(auth="off"), options=RuntimeOptions(encoder="none"))
    with LiveServer(app) as live:
        host = live.runtime.encoder
        host.state, host.model = "loading", "memstore-tiny"  # held here: a real load ends when it pleases
        starting = httpx.get(f"{live.url}/health")
        db = live.runtime.store.db
        monkeypatch.setattr(db, "states", lambda: [{"url": "standby", "healthy": False}])
        no_replica = httpx.get(f"{live.url}/health").json()
        monkeypatch.undo()
        host.state, host.model = "off", None
        after = httpx.get(f"{live.url}/health").json()
    assert starting.status_code == 200 and starting.json()["status"] == "starting"
    assert any("still loading" in r for r in starting.json()["reasons"])
    assert no_replica["status"] == "degraded" and len(no_replica["reasons"]) == 2
    assert after["status"] == "ok" and after["reasons"] == []


def test_a_loading_model_already_knows_its_dimensions() -> None:
    host = EncoderHost(threading.Event())
    host.state, host.model = "loading", "memstore-tiny"
    assert host.model_dimensions() == ("memstore-tiny", 64)
    with pytest.raises(EncoderUnavailableError) as exc:
        host.require("search by vector instead")
    assert exc.value.retry_after == 5 and "still loading" in str(exc.value)


def test_the_local_encoder_leaves_a_core_free_on_cpu(monkeypatch) -> None:
    """The engine serve and worker load takes cores - 1 torch threads on CPU, as the encoder service
    does; MEMSTORE_ENCODER_TORCH_THREADS overrides it."""
    import os

    import torch

    from encoder.settings import encoder_settings

    monkeypatch.setenv("MEMSTORE_MODEL", "memstore-tiny")
    monkeypatch.setenv("MEMSTORE_PRETRAINED", "none")
    monkeypatch.setenv("MEMSTORE_ENCODER_DEVICE", "cpu")
    monkeypatch.delenv("MEMSTORE_ENCODER_URL", raising=False)
    monkeypatch.delenv("MEMSTORE_ENCODER_TORCH_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        backend, close = open_backend(EncoderChoice(mode="local"))
        close()
        assert backend is not None and torch.get_num_threads() == max(1, (os.cpu_count() or 2) - 1)
        monkeypatch.setenv("MEMSTORE_ENCODER_TORCH_THREADS", "3")
        encoder_settings.cache_clear()  # a process reads its settings once; this one changed them
        _, close = open_backend(EncoderChoice(mode="local"))
        close()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)  # the setting is the process's: leave it as the other tests had it


def test_health_shows_configured_and_running_ingest_workers(settings) -> None:
    """In-process workers start once the encoder is ready: /health says how many were asked for and
    how many run, so a failed encoder does not read as "no workers configured"."""
    options = RuntimeOptions(encoder="remote", encoder_url="http://127.0.0.1:9", ingest_workers=2)  # nobody there
    app = create_app(settings, api_settings=ApiSettings(auth="off"), options=options)
    with LiveServer(app) as live:
        for _ in range(300):
            if live.runtime.encoder.state != "loading":
                break
            threading.Event().wait(0.1)
        body = httpx.get(f"{live.url}/health").json()
    assert body["status"] == "degraded" and body["encoder"]["state"] == "failed"
    assert body["workers"]["ingest"] == 0 and body["workers"]["ingest_configured"] == 2
