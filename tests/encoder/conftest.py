"""Fixtures for the encoder tests: a tick-counting fake model and the real tiny model.

No test here touches the network: HF_HUB_OFFLINE is set before anything imports huggingface_hub.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from tests.encoder.enc_helpers import FakeEncoder


@pytest.fixture
def fake() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture
def held_decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The engine's decodes wait until the event is set (set at the end in any case): images stay
    admitted and undecoded for as long as a test needs them to."""
    from encoder import engine as engine_module

    gate = threading.Event()
    real = engine_module.load_views

    def held(*args, **kwargs):
        assert gate.wait(30), "the test never let the decodes run"
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "load_views", held)
    yield gate
    gate.set()


@pytest.fixture(scope="session")
def tiny():
    """The real memstore-tiny open_clip model (untrained, seed 0), B = 8."""
    from encoder.models import create_encoder

    return create_encoder("memstore-tiny", pretrained=None, batch_size=8)
