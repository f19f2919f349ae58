"""Foreground first with real workers and a real server: a worker held by a controller at share
zero waits and resumes when the share returns; the controller's state in /metrics and /health."""

from __future__ import annotations

import threading
import time

import httpx
import sqlalchemy as sa

from memstore.db import online_ddl
from memstore.db.core import Database
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.services.foreground import ForegroundController
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker
from tests.api.api_helpers import FakeBackend


def embedded(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql(f'SELECT count(*) FROM "{table}" WHERE embedding IS NOT NULL').scalar() or 0)


def test_an_ingest_worker_waits_while_the_share_is_zero_and_resumes(
    worker_engine: sa.Engine, settings, collection_name: str
) -> None:
    store = VectorStore(worker_engine, settings=settings)
    c = store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")
    fg = ForegroundController(lambda start: [])
    fg.force(0.0)
    worker = IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings(batch_size=4), pace=fg)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        jobs.enqueue(Database(worker_engine), c, [PendingItem(text=f"t {i}", external_id=f"t{i}") for i in range(10)])
        time.sleep(1.0)
        assert embedded(worker_engine, c.table_name) == 0
        assert worker.totals.claimed == 0  # nothing claimed either: no claim is held while it waits
        assert fg.state()["units_waiting"] >= 1
        fg.force(1.0)
        deadline = time.monotonic() + 30
        while embedded(worker_engine, c.table_name) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert embedded(worker_engine, c.table_name) == 10
        assert fg.state()["units_done"].get("ingest", 0) >= 3
    finally:
        worker.stop()
        thread.join(10)
        fg.close()
    assert not thread.is_alive()


def test_the_controller_in_metrics_and_health(fake_client: httpx.Client, fake_server, fake_collection: str) -> None:
    rt = fake_server.runtime
    vec = [0.25] * 64
    for _ in range(5):
        r = fake_client.post(f"/v1/collections/{fake_collection}/search", json={"vector": vec, "k": 1})
        assert r.status_code == 200
    assert rt.latency.since(0.0)  # the route records each search's latency: the controller's input
    backoffs = rt.foreground.backoffs
    text = fake_client.get("/metrics").text
    assert "memstore_background_share " in text
    assert f"memstore_background_backoffs_total {float(backoffs)}" in text
    assert "memstore_foreground_search_p99_seconds" in text
    assert 'memstore_background_units{state="waiting"}' in text
    detail = fake_client.get("/health").json()["foreground"]
    assert {"background_share", "target_p99_ms", "backoffs", "last_backoff", "search_p99_ms"} <= set(detail)
    assert 0.0 <= detail["background_share"] <= 1.0
    assert detail["background_build_workers"] == online_ddl.background_build_workers(rt.store.settings)
