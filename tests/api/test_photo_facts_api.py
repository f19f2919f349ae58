"""Photos' own facts end to end: stored with the item by the ingest path (in the same insert, before
any worker), found by a date-range filter, never over the client's own ``image``, a broken EXIF
still ingested; the backfill giving stored images their facts, a batch at a time, resumable after a
crash, run by the ingest worker; then the same through the API (uploads with ?wait=true)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
import sqlalchemy as sa

from memstore.api.ingest import with_facts
from memstore.db.core import Database, raw_connection
from memstore.media import photo_facts
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers import photo_pass
from memstore.workers.ingest import IngestWorker
from tests.api.api_helpers import FakeBackend
from tests.test_photo_facts import PARIS, exif_block, picture

SUMMER = {"image": {"taken_at": {"$gte": "2024-06-01", "$lt": "2024-09-01"}}}


def photo(taken: str, seed: int, **exif: Any) -> bytes:
    """A distinct JPEG per seed, with its EXIF."""
    return picture(exif_block(taken=taken, offset=None, **exif), size=(64 + seed, 48))


def broken_exif(seed: int) -> bytes:
    good = photo("2024:07:01 10:00:00", seed)
    at = good.index(b"Exif\x00\x00") + 6
    return good[:at] + b"\xaa" * 40 + good[at + 40 :]


def _pending(data: bytes, eid: str, metadata: dict[str, Any] | None = None) -> PendingItem:
    return PendingItem(content=data, content_type="image/jpeg", external_id=eid, metadata=metadata)


@pytest.fixture
def worker_store(worker_engine: sa.Engine, settings) -> VectorStore:
    return VectorStore(worker_engine, settings=settings)


def _drain(engine: sa.Engine) -> None:
    assert IngestWorker(Database(engine), FakeBackend(), settings=IngestSettings(batch_size=50)).run(once=True) == 0


def _found(store: VectorStore, name: str, where: dict[str, Any]) -> set[str]:
    hits = store.search(collection=name, vector=np.ones(64, dtype=np.float32), k=50, filter=where, exact=True)
    return {h.external_id for h in hits}


def _metadata(store: VectorStore, name: str, eid: str) -> dict[str, Any]:
    return store.get_item(collection=name, external_id=eid).metadata


def test_facts_are_stored_with_the_item_and_found_by_a_date_range(worker_engine, worker_store, collection_name):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")
    items = [
        _pending(photo("2024:07:14 15:30:05", 1, gps=PARIS), "july"),
        _pending(photo("2024:08:31 23:59:59", 2), "august"),
        _pending(photo("2024:09:01 00:00:00", 3), "september"),
        _pending(photo("2023:07:14 12:00:00", 4), "last-year"),
        _pending(photo("2024:07:20 09:00:00", 5), "client", {"image": {"taken_at": "1999-12-31"}, "k": 1}),
        _pending(broken_exif(6), "broken", {"k": 2}),
    ]
    jobs.enqueue(Database(worker_engine), c, [with_facts(p) for p in items] + [with_facts(PendingItem(text="a note"))])
    # Stored with the item: there before any worker has run.
    july = _metadata(worker_store, collection_name, "july")
    assert july["image"] == {
        "taken_at": "2024-07-14T15:30:05",
        "camera": {"make": "Canon", "model": "Canon EOS R6"},
        "gps": {"lat": 48.8583694, "lon": 2.2944444, "alt": 35.2},
        "width": 65,
        "height": 48,
    }
    # The client's own image object keeps its keys; the missing ones are added.
    client = _metadata(worker_store, collection_name, "client")
    assert client["k"] == 1 and client["image"]["taken_at"] == "1999-12-31"
    assert client["image"]["camera"]["make"] == "Canon" and client["image"]["width"] == 69
    # A broken EXIF: stored, without the facts it held.
    broken = _metadata(worker_store, collection_name, "broken")
    assert broken == {"k": 2, "image": {"width": 70, "height": 48}}
    note = worker_store.get_item(collection=collection_name, external_id=PendingItem(text="a note").key())
    assert "image" not in note.metadata
    _drain(worker_engine)
    assert _found(worker_store, collection_name, SUMMER) == {"july", "august"}
    near_paris = {"image": {"gps": {"lat": {"$gt": 48.8, "$lt": 48.9}}}}
    assert _found(worker_store, collection_name, near_paris) == {"july"}
    assert _found(worker_store, collection_name, {"image": {"camera": {"model": "Canon EOS R6"}}}) >= {"july", "client"}
    # Re-sent as it was: nothing changes.
    again = jobs.enqueue(Database(worker_engine), c, [with_facts(items[0])])
    assert again[0].change == "unchanged"


def _walk(engine: sa.Engine, limit: int = 10_000) -> int:
    walker = photo_pass.PhotoFactsPass(Database(engine))
    steps = 0
    while walker.step():
        steps += 1
        assert steps < limit
    return steps


def test_the_backfill_gives_stored_images_their_facts_and_resumes_after_a_crash(
    worker_engine, worker_store, collection_name, monkeypatch
):
    monkeypatch.setattr(photo_pass, "WINDOW", 3)
    monkeypatch.setattr(photo_pass, "STEP_IMAGES", 2)
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")
    old = {f"old{i}": photo(f"2024:0{5 + i % 3}:10 12:00:00", 10 + i) for i in range(6)}
    # Stored without facts, as before they were read at ingest.
    jobs.enqueue(
        Database(worker_engine),
        c,
        [_pending(data, eid, {"n": i}) for i, (eid, data) in enumerate(old.items())]
        + [
            _pending(photo("2024:07:01 08:00:00", 20), "client", {"image": {"camera": {"make": "Mine"}}}),
            _pending(photo("2024:07:01 08:00:00", 21), "opted-out", {"image": None}),
            _pending(broken_exif(22), "broken"),
            PendingItem(text="a note", external_id="note"),
        ],
    )
    assert all("image" not in _metadata(worker_store, collection_name, e) for e in old)
    # The worker runs the pass only when idle: embed first, so the walk is ours alone.
    worker = IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings(batch_size=50))
    while worker.run_batch().claimed:
        pass

    # A crash in the middle of a step: its transaction is rolled back whole.
    calls = {"n": 0}
    real = photo_facts.with_facts

    def dies_on_the_second(metadata: Any, data: bytes) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(metadata, data)

    with monkeypatch.context() as mp:
        mp.setattr(photo_facts, "with_facts", dies_on_the_second)
        with pytest.raises(KeyboardInterrupt), raw_connection(worker_engine) as conn:
            photo_pass.backfill_step(conn, c)
    assert all("image" not in _metadata(worker_store, collection_name, e) for e in old)
    assert photo_pass.OPTION not in worker_store.get_collection(name=collection_name, fresh=True).options

    # Resumed: a step at a time, the cursor in the registry.
    with raw_connection(worker_engine) as conn:
        assert photo_pass.backfill_step(conn, c)
    first = worker_store.get_collection(name=collection_name, fresh=True).options[photo_pass.OPTION]
    assert isinstance(first, int) and first > 0
    assert "image" in _metadata(worker_store, collection_name, "old0")
    assert "image" not in _metadata(worker_store, collection_name, "old5")
    _walk(worker_engine)
    assert worker_store.get_collection(name=collection_name, fresh=True).options[photo_pass.OPTION] == "done"
    for i, eid in enumerate(old):
        meta = _metadata(worker_store, collection_name, eid)
        assert meta["n"] == i and meta["image"]["taken_at"] == f"2024-0{5 + i % 3}-10T12:00:00", meta
    assert _metadata(worker_store, collection_name, "client")["image"]["camera"] == {"make": "Mine"}
    assert _metadata(worker_store, collection_name, "client")["image"]["taken_at"] == "2024-07-01T08:00:00"
    assert _metadata(worker_store, collection_name, "opted-out") == {"image": None}
    assert _metadata(worker_store, collection_name, "broken") == {"image": {"width": 86, "height": 48}}
    assert _metadata(worker_store, collection_name, "note") == {}
    assert _found(worker_store, collection_name, SUMMER) == {"old1", "old2", "old4", "old5", "client"}
    # Done: a further step does nothing.
    with raw_connection(worker_engine) as conn:
        assert not photo_pass.backfill_step(conn, c)


def test_the_ingest_worker_runs_the_backfill_when_idle(worker_engine, worker_store, collection_name):
    c = worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")
    jobs.enqueue(Database(worker_engine), c, [_pending(photo("2024:07:04 12:00:00", 30), "old")])
    _drain(worker_engine)  # embeds, then walks every collection still to be walked
    assert _metadata(worker_store, collection_name, "old")["image"]["taken_at"] == "2024-07-04T12:00:00"
    assert worker_store.get_collection(name=collection_name, fresh=True).options[photo_pass.OPTION] == "done"


# ---------------------------------------------------------------------------------------- the API


def _upload(client: httpx.Client, name: str, files: list[tuple[str, bytes]], metadata: Any = None) -> httpx.Response:
    form = {"metadata": json.dumps(metadata)} if metadata is not None else {}
    return client.post(
        f"/v1/collections/{name}/items",
        params={"wait": True},
        files=[("files", (filename, data, "image/jpeg")) for filename, data in files],
        data=form,
    )


def test_api_uploads_get_their_facts_and_a_date_range_finds_them(client: httpx.Client, collection: str) -> None:
    files = [
        ("july.jpg", photo("2024:07:14 15:30:05", 40, gps=PARIS)),
        ("august.jpg", photo("2024:08:02 10:00:00", 41)),
        ("winter.jpg", photo("2024:01:15 10:00:00", 42)),
    ]
    r = _upload(client, collection, files)
    assert r.status_code == 201, r.text
    july = client.get(f"/v1/collections/{collection}/items/{r.json()['items'][0]['id']}").json()
    assert july["metadata"]["filename"] == "july.jpg"
    assert july["metadata"]["image"]["taken_at"] == "2024-07-14T15:30:05"
    assert july["metadata"]["image"]["gps"] == {"lat": 48.8583694, "lon": 2.2944444, "alt": 35.2}
    # The client's own image, and a broken EXIF: both stored.
    mine = _upload(
        client, collection, [("mine.jpg", photo("2024:07:20 09:00:00", 43))], {"image": {"taken_at": "2001-01-01"}}
    )
    assert mine.status_code == 201, mine.text
    broken = _upload(client, collection, [("broken.jpg", broken_exif(44))])
    assert broken.status_code == 201, broken.text
    got = client.get(f"/v1/collections/{collection}/items/{mine.json()['items'][0]['id']}").json()["metadata"]
    assert got["image"]["taken_at"] == "2001-01-01" and got["image"]["camera"]["make"] == "Canon"
    got = client.get(f"/v1/collections/{collection}/items/{broken.json()['items'][0]['id']}").json()["metadata"]
    assert got == {"filename": "broken.jpg", "image": {"width": 108, "height": 48}}
    r = client.post(
        f"/v1/collections/{collection}/search",
        json={"vector": [1.0] * 64, "k": 10, "filter": SUMMER, "exact": True},
    )
    assert r.status_code == 200, r.text
    found = {h["metadata"]["filename"] for h in r.json()["results"]}
    assert found == {"july.jpg", "august.jpg"}
    # The same file again: nothing changes.
    again = _upload(client, collection, files[:1])
    assert again.json()["items"][0]["change"] == "unchanged"


def test_a_replaced_image_keeps_the_facts_it_had_whole(client: httpx.Client, collection: str) -> None:
    """PUT .../content keeps the item's metadata, its `image` whole: the new picture's facts merged
    into the old ones would describe neither picture. An item without `image` gets the new facts."""
    plain = picture(size=(80, 40))  # no EXIF: its facts are its size alone
    r = _upload(client, collection, [("plain.jpg", plain)])
    assert r.status_code == 201, r.text
    item = f"/v1/collections/{collection}/items/{r.json()['items'][0]['id']}"
    before = client.get(item).json()["metadata"]
    assert before["image"] == {"width": 80, "height": 40}
    replaced = client.put(f"{item}/content?wait=true", files={"file": ("new.jpg", photo("2024:07:14 15:30:05", 45))})
    assert replaced.status_code in (201, 202), replaced.text
    assert client.get(item).json()["metadata"] == before
    texts = client.post(f"/v1/collections/{collection}/items?wait=true", json={"items": [{"text": "a note"}]})
    note = f"/v1/collections/{collection}/items/{texts.json()['items'][0]['id']}"
    replaced = client.put(f"{note}/content?wait=true", files={"file": ("new.jpg", photo("2024:07:14 15:30:05", 46))})
    assert replaced.status_code in (201, 202), replaced.text
    assert client.get(note).json()["metadata"]["image"]["taken_at"] == "2024-07-14T15:30:05"
