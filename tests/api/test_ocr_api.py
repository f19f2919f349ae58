"""Text in images (OCR) end to end: the ingest worker reads new images of a collection with OCR on,
turning it on reaches the images already stored, a failed read leaves the item ready and searchable,
and keyword search finds a word seen only in an image. Then the API: the option, GET item, and the
abuse cases of the new PATCH option."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest
import sqlalchemy as sa

from bench import ocr_images
from memstore.access import keys
from memstore.catalog import ocr_items
from memstore.db.core import Database
from memstore.media import ocr
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker
from memstore.workers.ocr_pass import OcrPass
from tests.api.api_helpers import FakeBackend

if shutil.which("tesseract") is None:
    if os.environ.get("CI"):
        pytest.fail("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)", pytrace=False)
    pytest.skip("tesseract is not installed (apt-get install tesseract-ocr tesseract-ocr-eng)", allow_module_level=True)

FONT = ocr_images.fonts()[0]


def _image(seed: int) -> ocr_images.Rendered:
    return ocr_images.render(seed, font=FONT, size=32, lines=1, per_line=3, noise=8.0)


def _pending(r: ocr_images.Rendered, eid: str) -> PendingItem:
    meta = {"filename": f"{eid}.png"}
    return PendingItem(content=r.content, content_type="image/png", external_id=eid, metadata=meta)


@pytest.fixture
def worker_store(worker_engine: sa.Engine, settings) -> VectorStore:
    return VectorStore(worker_engine, settings=settings)


def _drain(engine: sa.Engine, **ocr_settings: float) -> IngestWorker:
    worker = IngestWorker(Database(engine), FakeBackend(), settings=IngestSettings(batch_size=50))
    if ocr_settings:
        worker.ocr = OcrPass(Database(engine), settings=ocr.OcrSettings(**ocr_settings))  # type: ignore[arg-type]
    assert worker.run(once=True) == 0
    return worker


def _keyword_hits(store: VectorStore, name: str, word: str) -> list[str]:
    return [r.external_id for r in store.search(collection=name, text=word, mode="keyword", k=10)]


def test_new_images_are_read_and_their_words_found_by_keyword_search(worker_engine, worker_store, collection_name):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    assert c.ocr
    shown, other = _image(1), _image(2)
    jobs.enqueue(
        Database(worker_engine), c, [_pending(shown, "shown"), _pending(other, "other"), PendingItem(text="a note")]
    )
    _drain(worker_engine)
    item = worker_store.get_item(collection=collection_name, external_id="shown")
    assert item.status == "ready" and item.ocr_status == "done" and item.ocr_error is None
    assert ocr_images.recall(shown.words, item.ocr_text or "") == 1.0
    word = next(w for w in shown.words if w not in other.words)
    assert _keyword_hits(worker_store, collection_name, word) == ["shown"]
    # A text item has nothing to read.
    note = worker_store.get_item(collection=collection_name, external_id=PendingItem(text="a note").key())
    assert note.ocr_status is None
    # New content replaces what was read: the old words no longer find the item, the new ones do.
    replaced = _image(3)
    jobs.enqueue(Database(worker_engine), c, [_pending(replaced, "shown")])
    assert worker_store.get_item(collection=collection_name, external_id="shown").ocr_status == "pending"
    _drain(worker_engine)
    gone = next(w for w in shown.words if w not in replaced.words + other.words)
    assert _keyword_hits(worker_store, collection_name, gone) == []
    new = next(w for w in replaced.words if w not in shown.words + other.words)
    assert _keyword_hits(worker_store, collection_name, new) == ["shown"]


def test_turning_ocr_on_reads_the_images_already_stored(worker_engine, worker_store, collection_name, monkeypatch):
    monkeypatch.setattr(ocr_items, "BACKFILL_BATCH", 2)  # several batches, so the cursor moves
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")
    images = {f"img{i}": _image(10 + i) for i in range(5)}
    jobs.enqueue(
        Database(worker_engine), c, [_pending(r, eid) for eid, r in images.items()] + [PendingItem(text="words")]
    )
    _drain(worker_engine)
    assert {worker_store.get_item(collection=collection_name, external_id=e).ocr_status for e in images} == {None}
    word = images["img3"].words[0]
    assert "img3" not in _keyword_hits(worker_store, collection_name, word)

    c = worker_store.set_keywords(collection=collection_name, ocr=True, grace_s=0)
    assert c.ocr and c.options[ocr_items.BACKFILL] == 0
    assert worker_store.collection_stats(name=collection_name).extra["ocr_pending"] == 0  # not reached yet
    _drain(worker_engine)
    c = worker_store.get_collection(name=collection_name, fresh=True)
    assert c.options.get(ocr_items.BACKFILL) is None  # the walk is over
    for eid, r in images.items():
        item = worker_store.get_item(collection=collection_name, external_id=eid)
        assert item.ocr_status == "done" and ocr_images.recall(r.words, item.ocr_text or "") == 1.0, (eid, item)
    assert "img3" in _keyword_hits(worker_store, collection_name, word)
    # Off again: keywords no longer include the text read (it stays on the item), and nothing new is read.
    worker_store.set_keywords(collection=collection_name, ocr=False, grace_s=0)
    assert "img3" not in _keyword_hits(worker_store, collection_name, word)
    assert worker_store.get_item(collection=collection_name, external_id="img3").ocr_status == "done"


def test_a_read_interrupted_mid_way_is_done_again(worker_engine, worker_store, collection_name):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    jobs.enqueue(Database(worker_engine), c, [_pending(_image(30), "a")])
    _drain(worker_engine, timeout_s=0.001)  # embedded, and its read failed
    assert worker_store.get_item(collection=collection_name, external_id="a").ocr_status == "failed"
    # A worker that dies while reading: its transaction is rolled back, the item stays pending.
    jobs.enqueue(Database(worker_engine), c, [_pending(_image(31), "a")])
    IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings()).run_batch()  # embedded, not read
    crashing = OcrPass(Database(worker_engine))

    def die(*_args, **_kwargs):
        raise KeyboardInterrupt("killed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ocr, "extract", die)
        with pytest.raises(KeyboardInterrupt):
            crashing.read_one(worker_store.get_collection(name=collection_name))
    assert worker_store.get_item(collection=collection_name, external_id="a").ocr_status == "pending"
    _drain(worker_engine)
    assert worker_store.get_item(collection=collection_name, external_id="a").ocr_status == "done"


def test_an_unexpected_error_on_one_image_fails_that_read_only(worker_engine, worker_store, collection_name):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    jobs.enqueue(Database(worker_engine), c, [_pending(_image(70), "odd"), _pending(_image(71), "fine")])
    IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings()).run_batch()  # embedded, not read
    real = ocr.extract
    calls = 0

    def flaky(content, settings):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("boom")
        return real(content, settings)

    reader = OcrPass(Database(worker_engine))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ocr, "extract", flaky)
        while reader.step():
            pass
    first, second = (worker_store.get_item(collection=collection_name, external_id=e) for e in ("odd", "fine"))
    assert first.status == "ready" and first.ocr_status == "failed" and first.ocr_error == "ValueError: boom"
    assert second.ocr_status == "done"


def test_a_decoder_that_died_leaves_the_image_pending_then_fails_it_named(worker_engine, worker_store, collection_name):
    """A decode worker that died is the decoder's trouble: the read is tried again on later steps, the
    item pending meanwhile; an image that kills every worker is failed after DECODER_TRIES, saying so."""
    from encoder.errors import DecodeUnavailableError
    from memstore.workers import ocr_pass

    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    jobs.enqueue(Database(worker_engine), c, [_pending(_image(72), "once"), _pending(_image(73), "always")])
    IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings()).run_batch()
    ids = {e: worker_store.get_item(collection=collection_name, external_id=e).id for e in ("once", "always")}
    real = ocr.extract
    seen: list[int] = []

    def dying(content, settings):
        seen.append(len(seen))
        if content == bytes(_image(73).content) or len(seen) == 1:
            raise DecodeUnavailableError("a decode worker died")
        return real(content, settings)

    reader = OcrPass(Database(worker_engine))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ocr, "extract", dying)
        assert reader.step() == 0  # the first read failed for the decoder: nothing done, nothing failed
        once = worker_store.get_item(collection=collection_name, external_id="once")
        assert once.ocr_status == "pending", once
        for _ in range(3 * ocr_pass.DECODER_TRIES):
            reader.step()
    once, always = (worker_store.get_item(collection=collection_name, external_id=e) for e in ("once", "always"))
    assert once.ocr_status == "done" and once.id == ids["once"]
    assert always.ocr_status == "failed"
    assert always.ocr_error.startswith(f"the image's decode failed {ocr_pass.DECODER_TRIES} times")


_WORKER = """
import sys
from memstore.db.core import Database, create_engine
from memstore.workers.ingest import IngestWorker
from memstore.settings import IngestSettings
from tests.api.api_helpers import FakeBackend
IngestWorker(Database(create_engine(sys.argv[1])), FakeBackend(), settings=IngestSettings(poll_interval_s=0.2)).run()
"""


def test_a_worker_killed_while_reading_leaves_the_image_to_the_next(
    worker_engine, worker_url, worker_store, collection_name
):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    page = ocr_images.render(60, font=FONT, size=28, lines=10, per_line=6, noise=12.0)  # a second or more to read
    jobs.enqueue(Database(worker_engine), c, [_pending(page, "page")])
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER, worker_url], cwd=Path(__file__).resolve().parents[2], stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 90
        reader = None
        while reader is None and time.monotonic() < deadline and proc.poll() is None:
            reader = next((p for p in psutil.Process(proc.pid).children() if p.name() == "tesseract"), None)
            time.sleep(0.05)
        assert reader is not None, "the worker never started reading"
        proc.kill()  # kill -9 mid-read: its transaction dies with its connection
        proc.wait(10)
        with contextlib.suppress(psutil.NoSuchProcess):
            reader.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    item = worker_store.get_item(collection=collection_name, external_id="page")
    assert item.status == "ready" and item.ocr_status == "pending" and item.ocr_text is None
    _drain(worker_engine)
    item = worker_store.get_item(collection=collection_name, external_id="page")
    assert item.ocr_status == "done" and ocr_images.recall(page.words, item.ocr_text or "") >= 0.9


@pytest.mark.parametrize(
    ("content", "ocr_settings", "reason"),
    [(b"\x89PNG\r\n\x1a\n broken", {}, "cannot be decoded"), (None, {"timeout_s": 0.001}, "time limit")],
    ids=["corrupt", "timeout"],
)
def test_a_failed_read_marks_the_ocr_failed_and_leaves_the_item_ready_and_searchable(
    worker_engine, worker_store, collection_name, content, ocr_settings, reason
):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny", ocr=True)
    item = PendingItem(
        content=content or _image(40).content,
        content_type="image/png",
        external_id="scan",
        metadata={"filename": "scan-report.png"},
    )
    jobs.enqueue(Database(worker_engine), c, [item])
    _drain(worker_engine, **ocr_settings)
    got = worker_store.get_item(collection=collection_name, external_id="scan", with_vector=True)
    assert got.status == "ready" and got.error is None
    assert got.ocr_status == "failed" and reason in (got.ocr_error or "") and got.ocr_text is None
    assert _keyword_hits(worker_store, collection_name, "scan-report") == ["scan"]
    assert got.vector is not None
    hits = worker_store.search(collection=collection_name, vector=got.vector, k=1)
    assert [h.external_id for h in hits] == ["scan"]


# ---------------------------------------------------------------------------------------------- API


def _wait_read(client: httpx.Client, name: str, item_id: int, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/collections/{name}/items/{item_id}").json()
        if (body.get("ocr") or {}).get("status") in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_api_a_word_seen_only_in_an_image_is_found(client: httpx.Client, collection_name: str) -> None:
    r = client.post("/v1/collections", json={"name": collection_name, "ocr": True})
    assert r.status_code == 201, r.text
    assert r.json()["ocr"] is True
    rendered = _image(50)
    files = [("files", ("photo.png", rendered.content, "image/png"))]
    r = client.post(f"/v1/collections/{collection_name}/items", files=files)
    assert r.status_code in (200, 201, 202), r.text
    item_id = r.json()["items"][0]["id"]
    body = _wait_read(client, collection_name, item_id)
    assert body["status"] == "ready" and body["ocr"]["status"] == "done", body
    assert ocr_images.recall(rendered.words, body["ocr"]["text"]) == 1.0
    word = rendered.words[1]
    r = client.post(f"/v1/collections/{collection_name}/search", json={"text": word, "mode": "keyword", "k": 5})
    assert r.status_code == 200, r.text
    assert [h["id"] for h in r.json()["results"]] == [item_id]
    assert client.get(f"/v1/collections/{collection_name}").json()["ocr_pending"] == 0


def test_api_ocr_option_abuse(client: httpx.Client, server, engine: sa.Engine, collection_name: str) -> None:
    assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
    url = f"/v1/collections/{collection_name}"
    assert client.get(url).json()["ocr"] is False
    _, reader = keys.create_key(Database(engine), name=f"r-{uuid.uuid4().hex[:8]}", scopes=["read"])
    r = httpx.patch(server.url + url, json={"ocr": True}, headers={"Authorization": f"Bearer {reader}"})
    assert r.status_code == 403, r.text
    assert httpx.patch(server.url + url, json={"ocr": True}).status_code == 401
    for bad in ("yes", 1, 0, "true", [True], {"on": True}):
        r = client.patch(url, json={"ocr": bad})
        assert r.status_code == 422, (bad, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    assert client.post("/v1/collections", json={"name": collection_name + "x", "ocr": "true"}).status_code == 422
    assert client.get(url).json()["ocr"] is False  # nothing changed by the refused requests
    r = client.patch(url, json={"ocr": True})
    assert r.status_code == 200, r.text
    assert r.json()["ocr"] is True
