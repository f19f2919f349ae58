"""The HTTP service, the remote client and the openai client against the real tiny model."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from encoder.__main__ import main
from encoder.client import RemoteEncoder
from encoder.engine import EmbeddingEngine
from encoder.errors import (
    DecompressionBombError,
    EncoderNoAnswerError,
    EncoderUnreachableError,
    ImageRejectedError,
    QueueFullError,
)
from encoder.service import create_app
from encoder.types import Priority
from tests.encoder.enc_helpers import FakeEncoder, make_image, settings_for

PNG = make_image(60, 40, seed=1)
BIG = make_image(300, 200, "JPEG", seed=2)


@pytest.fixture(scope="module")
def engine(tiny):
    with EmbeddingEngine(tiny, settings_for(preprocess_workers=1, max_tiles=16, max_image_pixels=200_000)) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine)) as c:
        yield c


def post(client, **body):
    return client.post("/v1/embeddings", json=body)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def assert_problem(resp, status, kind):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == status and body["type"].endswith(kind) and body["detail"]
    return body


def test_text_embeddings_are_openai_shaped_and_match_the_engine(client, engine):
    resp = post(client, input=["a cat", "a dog"], model="memstore-tiny")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list" and body["model"] == "memstore-tiny"
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    vectors = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.array_equal(vectors, engine.embed_texts(["a cat", "a dog"]))
    single = post(client, input="a cat", encoding_format="base64").json()["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(single), dtype="<f4"), vectors[0])


def test_image_inputs_as_base64_or_data_urls_with_tiles(client, engine):
    body = post(
        client,
        input=[b64(PNG), "data:image/jpeg;base64," + b64(BIG)],
        modality="image",
        return_tiles=True,
        priority="background",
    ).json()
    expected = engine.embed_images([PNG, BIG])
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert np.array_equal(got, expected)
    small, big = body["data"][0]["tiles"], body["data"][1]["tiles"]
    assert small["grid"] == [0, 0] and small["embeddings"] == []
    assert big["grid"][0] * big["grid"][1] >= len(big["embeddings"]) > 1
    assert len(big["boxes"]) == len(big["weights"]) == len(big["embeddings"])
    assert body["usage"]["prompt_tokens"] == 2 + len(big["embeddings"])


@pytest.mark.parametrize(
    ("body", "status", "kind", "fix"),
    [
        ({"input": "not base64!", "modality": "image"}, 422, "image-rejected", "neither a data: URL nor valid base64"),
        ({"input": "https://example.com/cat.png", "modality": "image"}, 422, "image-rejected", "fetches nothing"),
        ({"input": b64(b"plain text, not a picture"), "modality": "image"}, 422, "image-rejected", "send JPEG, PNG"),
        ({"input": b64(make_image(600, 500)), "modality": "image"}, 413, "decompression-bomb", "downscale it"),
        ({"input": "x", "model": "gpt-4"}, 404, "model-not-found", "this service serves 'memstore-tiny'"),
        ({"input": "x", "dimensions": 512}, 422, "invalid-request", "returns 64 dimensions"),
        ({"input": [1, 2, 3]}, 422, "invalid-request", "input"),
        ({"input": []}, 422, "invalid-request", "at least one item"),
        ({"input": "x", "priority": "urgent"}, 422, "invalid-request", "priority"),
    ],
)
def test_errors_are_problem_details_saying_what_to_fix(client, body, status, kind, fix):
    problem = assert_problem(post(client, **body), status, kind)
    assert fix in problem["detail"]


def test_health_and_metrics(client):
    post(client, input="warm up")
    health = client.get("/health").json()
    assert health["status"] == "ok"
    assert {"model", "dimensions", "device", "precision", "pretrained_weights", "queues"} <= set(health)
    assert set(health["queues"]) == {"query", "sync_ingest", "background"}
    assert client.get("/v1/models").json()["data"][0]["id"] == "memstore-tiny"
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    for name in (
        'encoder_queue_units{class="query"}',
        "encoder_batch_fill_ratio_bucket",
        'encoder_request_latency_seconds_bucket{class="query"',
        "encoder_units_per_second",
    ):
        assert name in metrics.text


def test_queue_full_is_429_with_retry_after_and_the_client_raises_queue_full():
    fake = FakeEncoder()
    engine = EmbeddingEngine(fake, settings_for(queue_units_query=4))  # never started: nothing drains
    engine.submit_texts(["a", "b", "c", "d"])
    app = create_app(engine)
    http = TestClient(app)  # no lifespan, so the engine stays stopped
    resp = post(http, input="one more")
    assert_problem(resp, 429, "queue-full")
    assert int(resp.headers["Retry-After"]) >= 1
    with pytest.raises(QueueFullError) as info:
        RemoteEncoder("http://testserver", client=http).embed_texts(["one more"])
    assert info.value.retry_after > 0


def test_images_past_the_byte_budget_are_429_with_retry_after(held_decodes):
    gate = held_decodes
    image = make_image(20, 20)
    engine = EmbeddingEngine(FakeEncoder(), settings_for(preprocess_workers=1, queue_bytes_query=len(image)))
    try:
        engine.submit_images([image])  # waits to be decoded: the query class's bytes are spent
        http = TestClient(create_app(engine))
        resp = post(http, input=[b64(image)], modality="image")
        body = assert_problem(resp, 429, "queue-full")
        assert "MEMSTORE_ENCODER_QUEUE_BYTES_QUERY" in body["detail"] and body["retry_after"] > 0
        assert int(resp.headers["Retry-After"]) >= 1
    finally:
        gate.set()
        engine.stop()


def test_remote_encoder_tells_an_unreachable_service_from_one_that_gave_no_answer():
    """Nothing listening: the request never arrived (no input at fault). A service that takes the
    request and drops the connection: no answer came (the input may be at fault)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with RemoteEncoder(f"http://127.0.0.1:{port}", timeout=5) as remote, pytest.raises(EncoderUnreachableError):
        remote.embed_texts(["hello"])

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def hang_up() -> None:
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.close()

        server = threading.Thread(target=hang_up, daemon=True)
        server.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with RemoteEncoder(url, timeout=5) as remote, pytest.raises(EncoderNoAnswerError):
            remote.embed_texts(["hello"])
        server.join(5)


def test_remote_encoder_mirrors_the_engine(client, engine):
    remote = RemoteEncoder("http://testserver", client=client)
    assert remote.info == engine.info
    assert np.array_equal(remote.embed_texts(["hello"], priority=Priority.SYNC_INGEST), engine.embed_texts(["hello"]))
    tiles = remote.embed_images([BIG], return_tiles=True)[0]
    local = engine.embed_images([BIG], return_tiles=True)[0]
    assert np.array_equal(tiles.vector, local.vector) and np.array_equal(tiles.tiles, local.tiles)
    assert tiles.boxes == local.boxes and tiles.grid == local.grid
    assert remote.embed_texts([]).shape == (0, 64)
    with pytest.raises(DecompressionBombError):
        remote.embed_images([make_image(600, 500)])
    with pytest.raises(ImageRejectedError):
        remote.embed_images([b"junk"])


def test_openai_client_works_for_text(client, engine):
    openai = pytest.importorskip("openai", reason="the openai package is not installed (dev extra)")
    oa = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    result = oa.embeddings.create(model="memstore-tiny", input=["a red car", "a blue boat"])
    got = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert np.array_equal(got, engine.embed_texts(["a red car", "a blue boat"]))
    floats = oa.embeddings.create(model="memstore-tiny", input="a red car", encoding_format="float")
    assert np.array_equal(np.array(floats.data[0].embedding, dtype=np.float32), got[0])


def test_cli_help_and_bad_model(capsys):
    assert main(["--help"]) == 0
    assert "--pretrained" in capsys.readouterr().out
    assert main(["--model", "no-such-model", "--pretrained", "none"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


@pytest.mark.slow
def test_python_m_encoder_serves_over_real_http():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MEMSTORE_ENCODER_BATCH_SIZE": "8"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "encoder",
            "--model",
            "memstore-tiny",
            "--pretrained",
            "none",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "encoder service did not come up"
            time.sleep(0.2)
        with RemoteEncoder(url, timeout=30) as remote:
            assert remote.info.model == "memstore-tiny" and remote.info.batch_size == 8
            v = remote.embed_texts(["over the wire"])
            assert v.shape == (1, 64) and abs(float(np.linalg.norm(v)) - 1) < 1e-5
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_keyed_service_refuses_requests_without_its_key_before_reading_them(engine):
    """With MEMSTORE_ENCODER_API_KEY set, /v1 answers 401 to no key, a wrong key or two keys;
    the remote client with the key is served. /health stays open (liveness)."""
    with TestClient(create_app(engine, api_key="s3cret-key")) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
            assert_problem(c.post("/v1/embeddings", json={"input": "x"}, headers=headers), 401, "unauthorized")
        two = [("authorization", "Bearer s3cret-key"), ("authorization", "Bearer s3cret-key")]
        assert_problem(c.post("/v1/embeddings", json={"input": "x"}, headers=two), 401, "unauthorized")
        assert c.get("/health").status_code == 200
        good = c.post("/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer s3cret-key"})
        assert good.status_code == 200
        keyed = RemoteEncoder("http://testserver", client=c)
        with pytest.raises(Exception, match=r"401|nauthori"):
            keyed.embed_texts(["no key sent"])
    with TestClient(create_app(engine, api_key="s3cret-key"), headers={"Authorization": "Bearer s3cret-key"}) as c:
        assert RemoteEncoder("http://testserver", client=c).embed_texts(["with the key"]).shape == (1, 64)


def test_body_limit_text_length_and_unit_count_are_checked_before_work(tiny):
    settings = settings_for(preprocess_workers=0, queue_units_query=50, max_text_chars=100)
    with EmbeddingEngine(tiny, settings) as eng, TestClient(create_app(eng, max_body_bytes=4096)) as c:
        assert_problem(post(c, input="x" * 5000), 413, "request-too-large")  # Content-Length over the limit

        def chunks():  # no Content-Length: counted while reading
            yield b'{"input": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        r = c.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
        assert_problem(r, 413, "request-too-large")
        assert "detail" in assert_problem(post(c, input="z" * 101), 413, "request-too-large")
        calls = []
        original = eng.encoder.tokenize
        eng.encoder.tokenize = lambda texts: calls.append(len(texts)) or original(texts)  # type: ignore[method-assign]
        try:
            assert_problem(post(c, input=["t"] * 51), 413, "request-too-large")
            assert calls == [], "too many texts must be refused before tokenising"
            assert post(c, input=["t"] * 3).status_code == 200 and calls == [3]
        finally:
            eng.encoder.tokenize = original  # type: ignore[method-assign]


def test_cli_refuses_an_open_address_without_a_key(capsys, monkeypatch):
    monkeypatch.delenv("MEMSTORE_ENCODER_API_KEY", raising=False)
    assert main(["--model", "memstore-tiny", "--pretrained", "none", "--host", "0.0.0.0"]) == 2
    assert "MEMSTORE_ENCODER_API_KEY" in capsys.readouterr().err


def _served_fake(monkeypatch, submit_images):
    """A service around a fake model's engine (not started) whose submit_images is ``submit_images``."""
    engine = EmbeddingEngine(FakeEncoder(), settings_for())
    monkeypatch.setattr(engine, "submit_images", submit_images)
    return TestClient(create_app(engine))  # no lifespan: nothing else runs


def test_a_decoder_failure_is_503_with_retry_after_and_the_client_raises_it(monkeypatch):
    """A dead decode worker is the service's trouble, not the image's: not a 422 image-rejected."""
    from concurrent.futures import Future

    from encoder.errors import DecodeUnavailableError

    def failed(*args, **kwargs):
        fut = Future()
        fut.set_exception(DecodeUnavailableError("the image decoder process stopped", retry_after=7))
        return fut

    http = _served_fake(monkeypatch, failed)
    resp = post(http, input=b64(PNG), modality="image")
    assert_problem(resp, 503, "decode-unavailable")
    assert resp.headers["Retry-After"] == "7"
    with pytest.raises(DecodeUnavailableError, match="decoder process stopped") as info:
        RemoteEncoder("http://testserver", client=http).embed_images([PNG])
    assert info.value.retry_after == 7 and not isinstance(info.value, ImageRejectedError)


def test_base64_images_are_decoded_off_the_event_loop(monkeypatch):
    """Up to 64 MiB of base64 a request: decoded on the event loop, it held every other request."""
    import asyncio

    import encoder.service as service

    on_loop: list[bool] = []
    decode = service.decode_image_input

    def watched(value, index):
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return decode(value, index)

    monkeypatch.setattr(service, "decode_image_input", watched)
    engine = EmbeddingEngine(FakeEncoder(), settings_for())
    with TestClient(create_app(engine)) as http:
        assert post(http, input=[b64(PNG), b64(PNG)], modality="image").status_code == 200
    assert on_loop == [False, False]


def test_the_remote_client_carries_the_tenant_to_the_service(monkeypatch):
    """The service decoded every remote caller's images as one tenant: one collection's slow images
    held the decoding threads for all of them (encoder.tenancy)."""
    from concurrent.futures import Future

    from encoder.tenancy import TENANT

    seen: list[str] = []

    def submit_images(images, **kwargs):
        seen.append(TENANT.get())
        fut = Future()
        fut.set_exception(ImageRejectedError("not needed"))
        return fut

    remote = RemoteEncoder("http://testserver", client=_served_fake(monkeypatch, submit_images))
    token = TENANT.set("collection:7")
    try:
        with pytest.raises(ImageRejectedError):
            remote.embed_images([PNG])
    finally:
        TENANT.reset(token)
    with pytest.raises(ImageRejectedError):
        remote.embed_images([PNG])  # no tenant set: the one shared tenant, as before
    assert seen == ["collection:7", ""]
