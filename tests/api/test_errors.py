"""Every limit and error path answers an RFC 9457 problem with a useful detail; nothing answers 5xx."""

from __future__ import annotations

import struct
import time
import zlib

import httpx
import pytest

from encoder.errors import EncoderNoAnswerError, EncoderUnreachableError, ImageRejectedError, QueueFullError
from tests.api.api_helpers import make_image


def problem(r: httpx.Response, status: int, slug: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == f"/problems/{slug}" and body["status"] == status
    assert body["title"] and body["detail"]
    return body


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels but holds almost nothing: a decompression bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def test_body_over_the_limit(fake_client: httpx.Client, fake_collection: str) -> None:
    big = b"x" * (300 * 1024)
    r = fake_client.post(
        f"/v1/collections/{fake_collection}/items", content=big, headers={"content-type": "application/json"}
    )
    assert "MEMSTORE_API_MAX_BODY_BYTES" in problem(r, 413, "payload-too-large")["detail"]


def test_chunked_body_over_the_limit_is_cut_off(fake_client: httpx.Client, fake_collection: str) -> None:
    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(40):
            yield b" " * 10_000

    for path in ("search", "items"):
        r = fake_client.post(
            f"/v1/collections/{fake_collection}/{path}", content=chunks(), headers={"content-type": "application/json"}
        )
        problem(r, 413, "payload-too-large")


def test_too_many_files_items_and_long_text(fake_client: httpx.Client, fake_collection: str) -> None:
    url = f"/v1/collections/{fake_collection}/items"
    files = [("files", (f"{i}.jpg", make_image(i), "image/jpeg")) for i in range(4)]
    assert "at most 3 files" in problem(fake_client.post(url, files=files), 413, "payload-too-large")["detail"]
    items = [{"text": f"t{i}"} for i in range(5)]
    body = problem(fake_client.post(url, json={"items": items}), 413, "payload-too-large")
    assert body["limit"] == 4
    r = fake_client.post(url, json={"items": [{"text": "x" * 101}]})
    assert "limit is 100" in problem(r, 422, "invalid-input")["detail"]


def test_image_limits_and_corrupt_images(fake_client: httpx.Client, fake_collection: str) -> None:
    url = f"/v1/collections/{fake_collection}/items"
    bomb = png_header(20_000, 20_000)
    r = fake_client.post(url, files=[("files", ("bomb.png", bomb, "image/png"))])
    assert "pixels" in problem(r, 413, "payload-too-large")["detail"]
    r = fake_client.post(url, files=[("files", ("junk.jpg", b"not an image at all", "image/jpeg"))])
    assert "junk.jpg" in problem(r, 422, "image-rejected")["detail"]
    r = fake_client.post(url, files=[("files", ("cut.jpg", make_image(1)[:20], "image/jpeg"))])
    assert r.status_code in (202, 422)  # a truncated JPEG may pass the header check; it must not 500
    r = fake_client.post(f"/v1/collections/{fake_collection}/search", files={"image": ("b.png", bomb, "image/png")})
    problem(r, 413, "payload-too-large")


def test_malformed_and_mistyped_bodies(fake_client: httpx.Client, fake_collection: str) -> None:
    url = f"/v1/collections/{fake_collection}/items"
    problem(
        fake_client.post(url, content=b"{not json", headers={"content-type": "application/json"}),
        400,
        "malformed-request",
    )
    problem(
        fake_client.post(url, content=b"hello", headers={"content-type": "text/plain"}), 415, "unsupported-media-type"
    )
    body = problem(fake_client.post(url, json={"items": [{"text": "a", "colour": "red"}]}), 422, "invalid-input")
    assert body["errors"][0]["field"].endswith("colour")
    body = problem(fake_client.post(url, json={"items": [{"metadata": {"a": 1}}]}), 422, "invalid-input")
    assert "give a text, a vector, or both" in body["detail"]
    r = fake_client.post(url, json={"items": [{"vector": [1.0, 2.0]}]})
    assert "expected 64 dimensions, not 2" in problem(r, 422, "invalid-input")["detail"]
    problem(fake_client.post(url, json={"items": [{"vector": [1e39] * 64}]}), 422, "invalid-input")
    problem(fake_client.post(url, json={"items": [{"text": "a", "metadata": [1]}]}), 422, "invalid-input")


def test_search_errors(fake_client: httpx.Client, fake_collection: str) -> None:
    url = f"/v1/collections/{fake_collection}/search"
    assert "give a text, an image" in problem(fake_client.post(url, json={"k": 3}), 422, "invalid-input")["detail"]
    r = fake_client.post(url, json={"item_id": 1, "vector": [0.0] * 64})
    assert "at most one of image, vector or item_id" in problem(r, 422, "invalid-input")["detail"]
    r = fake_client.post(url, json={"text": "a", "vector": [0.5] * 64, "mode": "keyword"})
    assert "keyword search takes a text alone" in problem(r, 422, "invalid-input")["detail"]
    r = fake_client.post(url, json={"vector": [0.5] * 64, "mode": "hybrid"})
    assert "needs a text" in problem(r, 422, "invalid-input")["detail"]
    r = fake_client.post(url, json={"text": "a", "k": 10, "offset": 995})
    assert "offset + k" in problem(r, 422, "invalid-input")["detail"]
    r = fake_client.post(url, json={"text": "a", "mode": "keyword", "weights": {"vector": -1}})
    problem(r, 422, "invalid-input")
    assert (
        "MEMSTORE_API_MAX_K"
        in problem(fake_client.post(url, json={"text": "a", "k": 21}), 422, "invalid-input")["detail"]
    )
    problem(fake_client.post(url, json={"text": "a", "k": 0}), 422, "invalid-input")
    problem(fake_client.post(url, json={"image": "!!!notbase64"}), 422, "invalid-input")
    problem(fake_client.post(url, json={"item_id": 999999}), 404, "not-found")
    problem(
        fake_client.post(
            url, json={"text": "a", "filter": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}}
        ),
        422,
        "invalid-input",
    )


def test_not_found_and_method_and_conflict(fake_client: httpx.Client, fake_collection: str) -> None:
    problem(fake_client.get("/v1/collections/nope_nothing"), 404, "not-found")
    problem(fake_client.get(f"/v1/collections/{fake_collection}/items/123456"), 404, "not-found")
    problem(fake_client.get("/v1/nothing-here"), 404, "not-found")
    problem(fake_client.put("/v1/collections"), 405, "method-not-allowed")
    problem(fake_client.get("/v1/collections/Bad-Name"), 422, "invalid-input")
    problem(fake_client.get(f"/v1/collections/{fake_collection}/items/99999999999999999999"), 422, "invalid-input")
    body = problem(fake_client.post("/v1/collections", json={"name": fake_collection}), 409, "conflict")
    assert "already exists" in body["detail"]
    r = fake_client.post("/v1/collections", json={"name": "x_other", "model": "ViT-H-14"})
    assert "is not one this server runs (memstore-tiny)" in problem(r, 422, "invalid-input")["detail"]
    explained = fake_client.get("/problems/payload-too-large")
    assert explained.status_code == 200 and "limit" in explained.text


def test_encoder_back_pressure_is_429_with_retry_after(fake_client, fake_collection, fake_backend) -> None:
    fake_backend.fail("busy?", 1, QueueFullError("the query queue is full", retry_after=1.2))
    r = fake_client.post(f"/v1/collections/{fake_collection}/search", json={"text": "busy?"})
    body = problem(r, 429, "too-many-requests")
    assert r.headers["retry-after"] == "2" and body["retry_after"] == pytest.approx(1.2)


@pytest.mark.parametrize("error", [EncoderUnreachableError("refused"), EncoderNoAnswerError("connection reset")])
def test_an_encoder_service_that_is_down_is_503_with_retry_after(
    fake_client, fake_collection, fake_backend, error
) -> None:
    """A remote encoder restarting is the service's state, not the server's fault: no 500."""
    fake_backend.fail("down?", 1, error)
    r = fake_client.post(f"/v1/collections/{fake_collection}/search", json={"text": "down?"})
    assert str(error) in problem(r, 503, "service-unavailable")["detail"]
    assert r.headers["retry-after"] == "5"


def test_search_by_an_item_that_is_not_ready_is_a_conflict(fake_client, fake_collection, fake_backend) -> None:
    import threading

    fake_backend.gate = threading.Event()
    try:
        r = fake_client.post(f"/v1/collections/{fake_collection}/items", json={"items": [{"text": "slow"}]})
        item_id = r.json()["items"][0]["id"]
        r = fake_client.post(f"/v1/collections/{fake_collection}/search", json={"item_id": item_id})
        assert "no vector yet in the space searched" in problem(r, 409, "conflict")["detail"]
    finally:
        fake_backend.gate.set()


def _wait_status(client: httpx.Client, url: str, status: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        item = client.get(url).json()
        if item["status"] == status or time.monotonic() > deadline:
            return item
        time.sleep(0.1)


def test_a_bad_item_is_marked_failed_with_its_error(fake_client, fake_collection, fake_backend) -> None:
    # A bad image fails every time it is tried (alone or in a batch), until the test says otherwise.
    fake_backend.fail(make_image(5), 100, ImageRejectedError("cannot decode image: broken stream"))
    r = fake_client.post(
        f"/v1/collections/{fake_collection}/items",
        params={"wait": True},
        files=[("files", ("bad.jpg", make_image(5), "image/jpeg"))],
    )
    body = problem(r, 422, "ingest-failed")
    assert body["items"][0]["status"] == "failed" and "broken stream" in body["items"][0]["error"]
    item = fake_client.get(f"/v1/collections/{fake_collection}/items/{body['items'][0]['id']}").json()
    assert item["status"] == "failed" and "broken stream" in item["error"] and item["attempts"] == 1
    stats = fake_client.get(f"/v1/collections/{fake_collection}").json()
    assert stats["failed"] == 1
    # re-sending a failed item queues it again
    fake_backend.failures.clear()
    r = fake_client.post(
        f"/v1/collections/{fake_collection}/items",
        params={"wait": True},
        files=[("files", ("bad.jpg", make_image(5), "image/jpeg"))],
    )
    assert r.status_code == 201 and r.json()["items"][0]["status"] == "ready"


def test_transient_failures_are_retried_with_back_off(fake_client, fake_collection, fake_backend) -> None:
    fake_backend.fail("flaky", 2, RuntimeError("encoder exploded"))  # the server allows 3 attempts
    r = fake_client.post(f"/v1/collections/{fake_collection}/items", json={"items": [{"text": "flaky"}]})
    url = f"/v1/collections/{fake_collection}/items/{r.json()['items'][0]['id']}"
    item = _wait_status(fake_client, url, "ready")
    assert item["status"] == "ready" and fake_backend.failures["flaky"][0] == 0

    fake_backend.fail("hopeless", 10, RuntimeError("encoder exploded"))
    r = fake_client.post(f"/v1/collections/{fake_collection}/items", json={"items": [{"text": "hopeless"}]})
    url = f"/v1/collections/{fake_collection}/items/{r.json()['items'][0]['id']}"
    seen_retry = False
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        item = fake_client.get(url).json()
        if item["status"] == "pending" and item["attempts"] and "encoder exploded" in (item["error"] or ""):
            seen_retry = True
        if item["status"] == "failed":
            break
        time.sleep(0.05)
    assert seen_retry, "the pending item should show its attempts and last error while it waits to retry"
    assert item["status"] == "failed" and item["attempts"] == 3 and "RuntimeError" in item["error"]


def test_no_encoder_means_503_for_text_search(settings, admin_key, collection_name) -> None:
    from tests.api.api_helpers import start_server

    with (
        start_server(settings, backend=None, workers=0) as live,
        httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {admin_key}"}) as c,
    ):
        r = c.post("/v1/collections", json={"name": collection_name})
        assert "give dimensions" in problem(r, 422, "invalid-input")["detail"]
        assert c.post("/v1/collections", json={"name": collection_name, "dimensions": 8}).status_code == 201
        r = c.post(f"/v1/collections/{collection_name}/search", json={"text": "hello"})
        assert "no encoder" in problem(r, 503, "service-unavailable")["detail"]
        r = c.post(f"/v1/collections/{collection_name}/search", json={"vector": [0.5] * 8})
        assert r.status_code == 200 and r.json() == {"results": []}
        health = c.get("/health").json()
        assert health["encoder"] == {"state": "off"} and health["status"] == "ok"


def test_a_bad_search_is_refused_before_the_query_is_embedded(
    fake_client: httpx.Client, fake_collection: str, fake_backend
) -> None:
    url = f"/v1/collections/{fake_collection}/search"
    before = len(fake_backend.calls)
    for body in (
        {"text": "a", "filter": {"n": {"$between": 1}}},
        {"text": "a", "k": 10, "offset": 995},
        {"text": "a", "weights": {"vector": 0, "keyword": 0}},
        {"text": "a", "candidates": 5},
    ):
        problem(fake_client.post(url, json=body), 422, "invalid-input")
    assert len(fake_backend.calls) == before


def test_a_statement_the_database_cancelled_is_a_timeout_and_a_lost_database_is_unavailable() -> None:
    """QueryCanceled (a statement timeout) is an OperationalError too: it must not read as an outage."""
    import psycopg

    from memstore.api.problems import from_exception

    cancelled = from_exception(psycopg.errors.QueryCanceled("canceling statement due to statement timeout"))
    assert (cancelled.status, cancelled.slug) == (504, "timeout")
    lost = from_exception(psycopg.OperationalError("server closed the connection unexpectedly"))
    assert (lost.status, lost.slug) == (503, "service-unavailable")
