"""What a hostile client found, and what now holds:

- A 3,000-deep JSON line in a bulk load is a 422 naming the line, not a 500.
- ``X-Memstore-Min-LSN`` is checked without replicas too: malformed, ahead of the WAL, or sent twice
  (header or parameter) is a 422.
- /metrics (no key) reads the queue once per MEMSTORE_API_METRICS_CACHE_S, off the event loop.
- /docs, its assets and /openapi.json carry no-framing, nosniff and a CSP that lets the Swagger page
  run its one inline script only (by hash).
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from memstore.queue import jobs
from memstore.settings import Settings
from tests.api.api_helpers import LiveServer, start_server
from tests.api.test_errors import problem

NDJSON = {"content-type": "application/x-ndjson"}


def test_a_deeply_nested_load_line_is_a_422_naming_it(client: httpx.Client, collection_name: str) -> None:
    client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
    good = b'{"external_id": "a", "vector": [1, 0, 0, 0]}\n'
    for deep in (
        b"[" * 3000 + b"]" * 3000,
        b'{"external_id": "b", "vector": [1, 0, 0, 0], "metadata": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001,
        b'{"external_id": "b", "vector": [1, 0, 0, 0], "metadata": {"a": ' + b"[" * 900 + b"]" * 900 + b"}}",
    ):
        r = client.post(f"/v1/collections/{collection_name}/load", content=good + deep + b"\n", headers=NDJSON)
        body = problem(r, 422, "invalid-input")
        assert body["detail"].startswith("line 2"), body


def test_min_lsn_is_checked_without_replicas(client: httpx.Client, collection: str) -> None:
    url = f"/v1/collections/{collection}/search"
    search = {"vector": [0.1] * 64, "k": 1}
    written = client.post(f"/v1/collections/{collection}/items", json={"items": [{"text": "x"}]})
    lsn = written.headers["x-memstore-lsn"]
    assert client.post(url, json=search, headers={"X-Memstore-Min-LSN": lsn}).status_code == 200
    assert client.post(url, json=search, params={"min_lsn": lsn}).status_code == 200
    body = problem(
        client.post(url, json=search, headers={"X-Memstore-Min-LSN": "not/a/position"}), 422, "invalid-input"
    )
    assert "not a WAL position" in body["detail"]
    body = problem(client.post(url, json=search, headers={"X-Memstore-Min-LSN": "FFFFFFFF/0"}), 422, "invalid-input")
    assert "ahead of the database's WAL" in body["detail"]
    body = problem(client.post(url, json=search, params={"min_lsn": "FFFFFFFF/0"}), 422, "invalid-input")
    assert "ahead" in body["detail"]
    twice = httpx.Headers([("X-Memstore-Min-LSN", lsn), ("X-Memstore-Min-LSN", "FFFFFFFF/0")])
    body = problem(client.post(url, json=search, headers=twice), 422, "invalid-input")
    assert "2 X-Memstore-Min-LSN headers" in body["detail"]
    body = problem(client.post(url, json=search, params=[("min_lsn", lsn), ("min_lsn", lsn)]), 422, "invalid-input")
    assert "2 min_lsn parameters" in body["detail"]
    # A write's own answer moves the known position: a floor it answered is valid at once.
    again = client.post(f"/v1/collections/{collection}/items", json={"items": [{"text": "y"}]})
    r = client.post(url, json=search, headers={"X-Memstore-Min-LSN": again.headers["x-memstore-lsn"]})
    assert r.status_code == 200, r.text


def test_the_api_documents_carry_security_headers(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        policy = page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
        assert "script-src 'self' 'sha256-" in policy and "unsafe-inline" not in policy
        scripts = re.findall(r"<script>(.*?)</script>", page.text, flags=re.DOTALL)
        assert len(scripts) == 1
        digest = base64.b64encode(hashlib.sha256(scripts[0].encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy  # the page's own start script may run, no other
        assert "validator.swagger.io" not in page.text and "https://" not in page.text
        for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui-bundle.js", "/redoc"):
            r = c.get(path)
            assert r.headers["x-frame-options"] == "DENY", path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        assert c.get("/openapi.json").json()["info"]["title"] == "memstore"
        assert "content-security-policy" not in c.get("/health").headers


def test_metrics_read_the_queue_once_per_interval_off_the_event_loop(settings: Settings, monkeypatch: Any) -> None:
    """32 clients scraping /metrics at once cause one reading of the queue, in the executor: a slow
    reading (held here until the test lets it go) holds neither the event loop (/health answers
    meanwhile) nor the scrapes that came while it ran beyond it."""
    readings: list[str] = []
    release = threading.Event()
    original = jobs.queue_depth

    def slow_depth(db: Any) -> dict[str, int]:
        readings.append(threading.current_thread().name)
        release.wait(60)
        return original(db)

    monkeypatch.setattr(jobs, "queue_depth", slow_depth)
    with start_server(settings, backend=None, workers=0, metrics_cache_s=3.0) as live:
        with httpx.Client(base_url=live.url, timeout=30) as c:
            c.get("/health")
        with ThreadPoolExecutor(32) as pool:
            scrapes = [pool.submit(httpx.get, f"{live.url}/metrics", timeout=90) for _ in range(32)]
            deadline = time.monotonic() + 30
            while not readings and time.monotonic() < deadline:
                time.sleep(0.05)
            assert readings, "no scrape started a reading of the queue"
            try:
                # Answered while the reading is held: an event loop that waited for it would not.
                health = httpx.get(f"{live.url}/health", timeout=20)
                held_meanwhile = not release.is_set()
            finally:
                release.set()
            texts = [f.result().text for f in scrapes]
        assert health.status_code == 200 and held_meanwhile
        assert len(readings) == 1 and not readings[0].startswith("MainThread"), readings
        assert all('memstore_ingest_queue_items{status="pending"}' in t for t in texts)
        httpx.get(f"{live.url}/metrics", timeout=30)
        assert len(readings) == 1  # still fresh
        time.sleep(3.1)
        httpx.get(f"{live.url}/metrics", timeout=30)
        assert len(readings) == 2
