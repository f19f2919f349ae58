"""Fixtures for the encoder tests: a tick-counting fake model and the real tiny model.

No test here touches the network: HF_HUB_OFFLINE is set before anything imports huggingface_hub.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

from tests.encoder.enc_helpers import FakeEncoder


@pytest.fixture
def fake() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture(scope="session")
def tiny():
    """The real memstore-tiny open_clip model (untrained, seed 0), B = 8."""
    from encoder.models import create_encoder

    return create_encoder("memstore-tiny", pretrained=None, batch_size=8)
