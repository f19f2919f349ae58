"""Decode once per ingest: an image embedded by the encoder in this process is decoded one time, and
its thumbnail is made from that decode, unless that decode (sized for the views alone) is smaller
than the thumbnail; the vector is the one the same image gets on its own; a decode-time bomb is still
refused before any decode."""

from __future__ import annotations

import hashlib
import io
import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from PIL import Image

import encoder.images
from bench.cost import scan_bomb
from memstore.db.core import Database
from memstore.media import thumbnails
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker
from tests.api.api_helpers import FakeBackend, make_image


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Decodes by the digest of the bytes decoded, counted at ``encoder.images._decode``, where
    every decode under the budget runs (in this process or in a decode worker)."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    real = encoder.images._decode

    def counting(data: bytes, *args: Any, **kwargs: Any) -> Image.Image:
        with lock:
            counts[hashlib.sha256(data).hexdigest()] += 1
        return real(data, *args, **kwargs)

    monkeypatch.setattr(encoder.images, "_decode", counting)
    return counts


def _images() -> dict[str, bytes]:
    """A photo, a near-square JPEG (its thumbnail needs more than the embedding), a PNG with
    transparency, and a 16-bit PNG (decoded in a decode worker)."""
    rgba = Image.new("RGBA", (300, 200), (0, 0, 0, 0))
    rgba.paste((200, 30, 30, 255), (50, 50, 250, 150))
    sixteen = Image.fromarray((np.arange(240 * 160, dtype=np.uint16).reshape(160, 240) * 7).astype(np.uint16))
    out = {"photo": make_image(11, size=(1600, 1200)), "square": make_image(12, size=(1000, 1000))}
    for name, img in (("alpha", rgba), ("sixteen", sixteen)):
        buf = io.BytesIO()
        img.save(buf, "PNG")
        out[name] = buf.getvalue()
    return out


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rows(engine: sa.Engine, table: str) -> dict[str, tuple[str, bytes | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f'SELECT external_id, status, thumbnail, error FROM "{table}"').fetchall()
    return {r[0]: (r[1], None if r[2] is None else bytes(r[2]), r[3]) for r in rows}


def test_an_ingested_image_is_decoded_once_for_its_vector_and_thumbnail_and_a_bomb_not_at_all(
    worker_engine: sa.Engine, settings: Any, collection_name: str, tiny_engine: Any, decodes: Counter[str]
) -> None:
    c = VectorStore(worker_engine, settings=settings).create_collection(
        name=collection_name, dimensions=64, model=tiny_engine.info.model
    )
    images = _images()
    bomb = scan_bomb(512, 512, 2000)
    pending = [PendingItem(content=data, content_type="image/png", external_id=name) for name, data in images.items()]
    pending.append(PendingItem(content=bomb, content_type="image/jpeg", external_id="bomb"))
    jobs.enqueue(Database(worker_engine), c, pending)

    assert (
        IngestWorker(Database(worker_engine), tiny_engine, settings=IngestSettings(batch_size=16)).run(once=True) == 0
    )

    rows = _rows(worker_engine, c.table_name)
    store = VectorStore(worker_engine, settings=settings)
    for name, data in images.items():
        status, thumb, _ = rows[name]
        assert status == "ready"
        # One decode for the vector and the thumbnail. A near-square JPEG's reduced decode, sized for
        # the views alone, may be smaller than its thumbnail (256 px): then the thumbnail decodes on
        # its own, and the vector stays the one the image gets alone (below).
        assert decodes[_digest(data)] == 1 or (name == "square" and decodes[_digest(data)] == 2), name
        stored = store.get_item(collection=c.name, external_id=name, with_vector=True).vector
        alone = tiny_engine.embed_images([data])[0]
        assert np.array_equal(np.asarray(stored, dtype=np.float32), np.asarray(alone, dtype=np.float32)), name
        assert thumb is not None
        with Image.open(io.BytesIO(thumb)) as shown:
            assert shown.format == "WEBP"
            # The thumbnail is what a decode of its own would make: the same size and mode.
            with Image.open(io.BytesIO(thumbnails.make(data) or b"")) as alone:
                assert (shown.size, shown.mode) == (alone.size, alone.mode)
    assert rows["alpha"][1] is not None and Image.open(io.BytesIO(rows["alpha"][1])).mode == "RGBA"
    status, thumb, error = rows["bomb"]
    assert (status, thumb) == ("failed", None)
    assert error is not None and "scans" in error  # refused from its markers, naming the limit
    assert decodes[_digest(bomb)] == 0  # before any decode


def test_with_an_encoder_elsewhere_the_thumbnail_is_decoded_here(
    worker_engine: sa.Engine, settings: Any, collection_name: str, decodes: Counter[str]
) -> None:
    """A remote encoder decodes the bytes it is sent; the pixels stay there, so the worker decodes
    each image once itself, for the thumbnail."""
    backend = FakeBackend()
    c = VectorStore(worker_engine, settings=settings).create_collection(
        name=collection_name, dimensions=64, model=backend.info.model
    )
    photo = make_image(13, size=(800, 600))
    jobs.enqueue(Database(worker_engine), c, [PendingItem(content=photo, content_type="image/jpeg", external_id="p")])
    assert IngestWorker(Database(worker_engine), backend, settings=IngestSettings(batch_size=4)).run(once=True) == 0
    status, thumb, _ = _rows(worker_engine, c.table_name)["p"]
    assert status == "ready" and thumb is not None
    assert decodes[_digest(photo)] == 1
