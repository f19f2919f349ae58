"""The served HTTP's own limits (memstore.api.http_limits), on raw sockets: an endless request head is
cut off with a 431 and bounded memory, a one-byte-a-second head is closed at its deadline, an idle
connection too, and other clients are served meanwhile. The guard sits below ASGI, so a plain ASGI
app stands in for the API (no database needed)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from memstore.api.http_limits import server_config
from memstore.settings import ApiSettings
from tests.api.api_helpers import free_port

HEAD_TIMEOUT_S = 1.5


async def hello(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b"hello"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    api = ApiSettings(max_head_bytes=64 * 1024, max_header_lines=100, head_timeout_s=HEAD_TIMEOUT_S, keep_alive_s=2)
    chosen = free_port()
    config = server_config(hello, api, host="127.0.0.1", port=chosen, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    yield chosen
    server.should_exit = True
    thread.join(10)


def _get(port: int, *headers: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        head = "GET / HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers) + "Connection: close\r\n\r\n"
        s.sendall(head.encode())
        return _read_all(s)


def _read_all(s: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := s.recv(65536):
            answer += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return answer


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_normal_request_is_served(port: int) -> None:
    assert _get(port, "X-A: 1").startswith(b"HTTP/1.1 200")
    assert _get(port, *(f"X-{i}: {'v' * 500}" for i in range(90))).startswith(b"HTTP/1.1 200")


def test_too_many_or_too_large_headers_are_a_431(port: int) -> None:
    assert _get(port, *(f"X-{i}: 1" for i in range(101))).startswith(b"HTTP/1.1 431")
    assert _get(port, "X-Big: " + "v" * 70_000).startswith(b"HTTP/1.1 431")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # an endless URL, too
        s.sendall(b"GET /" + b"a" * 100_000)
        assert _read_all(s).startswith(b"HTTP/1.1 431")


def _endless_head(port: int, results: list[tuple[int, bytes, float]]) -> None:
    """Header lines of 1 MiB each, never ending the head, until the server closes the connection."""
    line = b"X-Filler: " + b"a" * (1024 * 1024) + b"\r\n"
    sent = 0
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(100):
                s.sendall(line)
                sent += len(line)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        results.append((sent, _read_all(s), time.monotonic() - started))


def test_an_endless_head_is_cut_off_and_memory_stays_bounded(port: int) -> None:
    before = _rss_bytes()
    results: list[tuple[int, bytes, float]] = []
    attackers = [threading.Thread(target=_endless_head, args=(port, results)) for _ in range(4)]
    for t in attackers:
        t.start()
    served = _get(port, "X-Meanwhile: 1")  # another client, served while the four push
    for t in attackers:
        t.join(60)
    grew = _rss_bytes() - before
    print(
        f"4 endless heads: sent {[r[0] // 1024 for r in results]} KiB, closed after "
        f"{[round(r[2], 2) for r in results]} s; the process grew {grew / 2**20:.1f} MiB"
    )
    assert served.startswith(b"HTTP/1.1 200")
    assert len(results) == 4
    for sent, answer, took in results:
        assert sent < 100 * 1024 * 1024, "the server read the whole endless head"
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:80]
        assert took < 30
    # Without the limit each connection held every byte it sent (hundreds of MiB in all).
    assert grew < 40 * 2**20, f"the server's memory grew by {grew / 2**20:.0f} MiB"


def test_a_trickled_head_is_closed_at_its_deadline(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        started = time.monotonic()
        closed_after = None
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
            try:
                s.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
            s.settimeout(0.2)  # one byte every ~0.2 s: still far over the deadline for the whole head
            try:
                answer = s.recv(65536)
            except TimeoutError:
                continue
            closed_after = time.monotonic() - started
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
            break
            # (another client is served meanwhile: see below)
        assert closed_after is not None, "the trickling connection was never closed"
        assert HEAD_TIMEOUT_S - 0.2 < closed_after < HEAD_TIMEOUT_S + 3, closed_after
    assert _get(port).startswith(b"HTTP/1.1 200")


def test_a_silent_or_idle_connection_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # connects, sends nothing
        started = time.monotonic()
        _read_all(s)
        assert time.monotonic() - started < HEAD_TIMEOUT_S + 3
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # one request, then idle
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
        assert 1.5 < time.monotonic() - started < 6  # keep_alive_s=2


def test_keep_alive_requests_are_served_one_after_another(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(50):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"hello"):
                answer += s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
        # Two pipelined requests in one write.
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while answer.count(b"hello") < 2:
            answer += s.recv(65536)
        assert answer.count(b"HTTP/1.1 200") == 2


def test_the_access_log_setting_reads_its_old_booleans() -> None:
    assert ApiSettings().access_log == "sampled"
    for word, mode in (("true", "all"), ("1", "all"), ("false", "off"), ("0", "off"), ("all", "all"), ("OFF", "off")):
        assert ApiSettings(access_log=word).access_log == mode, word
    assert ApiSettings(access_log=True).access_log == "all"
    with pytest.raises(ValueError):
        ApiSettings(access_log="sometimes")


def test_uvicorn_writes_every_line_only_when_the_access_log_is_all() -> None:
    for mode, expected in (("all", True), ("sampled", False), ("off", False)):
        config = server_config(hello, ApiSettings(access_log=mode), host="127.0.0.1", port=1, lifespan="off")
        assert config.access_log is expected, mode
        assert config.log_config["loggers"]["memstore.access"]["handlers"] == ["access"]  # type: ignore[index]


def test_the_sampled_access_log_writes_every_error_and_one_in_n_of_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the metrics layer, as the API's front runs it: every answer of 400 or more has its
    line, the first of the others and then one in ``every``, and every request is counted either way."""
    import asyncio
    import logging

    from prometheus_client import CollectorRegistry

    from memstore.api.middleware import AccessLog, Metrics

    async def status_app(scope: Any, receive: Any, send: Any) -> None:
        status = int(scope["path"].strip("/"))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def noop(message: Any) -> None:
        return None

    async def requests(app: Any, statuses: list[int]) -> None:
        for status in statuses:
            scope = {
                "type": "http", "method": "GET", "path": f"/{status}", "query_string": b"a=1" if status == 404 else b"",
                "http_version": "1.1", "client": ("10.0.0.1", 5000), "headers": [],
            }  # fmt: skip
            await app(scope, None, noop)

    registry = CollectorRegistry()
    app = Metrics(status_app, registry=registry, access=AccessLog(every=3))
    with caplog.at_level(logging.INFO, logger="memstore.access"):
        asyncio.run(requests(app, [200, 200, 200, 401, 200, 404, 200, 200, 429, 500]))
    lines = [r.getMessage() for r in caplog.records if r.name == "memstore.access"]
    assert lines == [
        '10.0.0.1:5000 - "GET /200 HTTP/1.1" 200',
        '10.0.0.1:5000 - "GET /401 HTTP/1.1" 401',
        '10.0.0.1:5000 - "GET /200 HTTP/1.1" 200',
        '10.0.0.1:5000 - "GET /404?a=1 HTTP/1.1" 404',
        '10.0.0.1:5000 - "GET /429 HTTP/1.1" 429',
        '10.0.0.1:5000 - "GET /500 HTTP/1.1" 500',
    ]
    counted = sum(
        s.value for m in registry.collect() if m.name == "memstore_http_requests" for s in m.samples
        if s.name == "memstore_http_requests_total"
    )  # fmt: skip
    assert counted == 10

    caplog.clear()
    errors_only = Metrics(status_app, registry=CollectorRegistry(), access=AccessLog(every=0))
    with caplog.at_level(logging.INFO, logger="memstore.access"):
        asyncio.run(requests(errors_only, [200] * 50 + [403]))
    assert [r.getMessage() for r in caplog.records if r.name == "memstore.access"] == [
        '10.0.0.1:5000 - "GET /403 HTTP/1.1" 403'
    ]


def test_a_response_s_head_and_body_arrive_in_one_segment(port: int) -> None:
    """uvicorn writes them separately; the guarded protocol sends the turn's writes as one
    (memstore.api.coalesced_writes), so the client reads the whole answer in one receive."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(20):
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = s.recv(65536)
            time.sleep(0.01)  # had the body come as a segment of its own, it would be here by now
            s.setblocking(False)
            try:
                late = s.recv(65536)
            except BlockingIOError:
                late = b""
            s.setblocking(True)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello"), answer
            assert late == b""
