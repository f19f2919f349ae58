"""The search routes' guard (memstore.api.search_guard): one key runs at most so many searches at
once (the excess is a 429 with Retry-After while other keys are served), and a search whose client
goes away is cancelled in PostgreSQL, its connection back in the set.

A slow search is a real one made slow on its own connection: a search asking ``ef_search`` 77 first
runs ``pg_sleep`` on the search connection it holds (on the event loop's path, memstore.search.runner).
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
import sqlalchemy as sa

from memstore.access import keys
from memstore.db.core import Database, libpq_url
from memstore.search import runner
from memstore.settings import Settings
from tests.api.api_helpers import LiveServer, start_server
from tests.api.test_errors import problem

SLOW_EF = 77
SLEEP_S = 4.0


@pytest.fixture(scope="module")
def guarded(settings: Settings) -> Iterator[LiveServer]:
    original = runner._run_under

    async def maybe_slow(conn: psycopg.AsyncConnection[Any], plan: Any, search_settings: Any) -> list[Any]:
        if search_settings.ef_search == SLOW_EF:
            await conn.execute("SELECT pg_sleep(%s) /* memstore slow test search */", [SLEEP_S])
        return await original(conn, plan, search_settings)

    runner._run_under = maybe_slow  # type: ignore[assignment]
    try:
        with start_server(settings, backend=None, workers=0, searches_per_key=2) as live:
            yield live
    finally:
        runner._run_under = original


@pytest.fixture(scope="module")
def two_keys(engine: sa.Engine) -> tuple[str, str]:
    a = keys.create_key(Database(engine), name=f"tenant-a-{uuid.uuid4().hex[:6]}", scopes=["admin"])[1]
    b = keys.create_key(Database(engine), name=f"tenant-b-{uuid.uuid4().hex[:6]}", scopes=["admin"])[1]
    return a, b


@pytest.fixture
def vectors(guarded: LiveServer, two_keys: tuple[str, str], collection_name: str) -> str:
    with httpx.Client(base_url=guarded.url, headers={"Authorization": f"Bearer {two_keys[0]}"}) as c:
        assert c.post("/v1/collections", json={"name": collection_name, "dimensions": 4}).status_code == 201
        r = c.post(f"/v1/collections/{collection_name}/items", json={"items": [{"vector": [1, 0, 0, 0]}]})
        assert r.status_code in (200, 201), r.text
    return collection_name


def _search(server: LiveServer, key: str, name: str, *, slow: bool, timeout: float = 30) -> httpx.Response:
    body: dict[str, Any] = {"vector": [1, 0, 0, 0], "k": 1}
    if slow:
        body["ef_search"] = SLOW_EF
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{server.url}/v1/collections/{name}/search", json=body, headers=headers, timeout=timeout)


def _busy(server: LiveServer) -> int:
    """Search connections out of the event loop's set now."""
    connections = server.runtime.searcher.connections
    return int(connections.max_size - connections._slots._value)


def _slow_statements(database_url: str) -> list[tuple[int, str]]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, state FROM pg_stat_activity "
            "WHERE query LIKE %s AND pid <> pg_backend_pid() AND state = 'active'",
            ["%memstore slow test search%"],
        ).fetchall()
    return [(int(pid), str(state)) for pid, state in rows]


def test_one_key_gets_429_beyond_its_limit_while_another_is_served(
    guarded: LiveServer, two_keys: tuple[str, str], vectors: str
) -> None:
    a, b = two_keys
    answers: list[httpx.Response] = []
    slow = [threading.Thread(target=lambda: answers.append(_search(guarded, a, vectors, slow=True))) for _ in range(2)]
    for t in slow:
        t.start()
    deadline = time.monotonic() + 10
    while _busy(guarded) < 2:
        assert time.monotonic() < deadline, "the slow searches did not start"
        time.sleep(0.05)
    started = time.monotonic()
    refused = _search(guarded, a, vectors, slow=False)
    body = problem(refused, 429, "too-many-requests")
    assert refused.headers["retry-after"] == "1" and "MEMSTORE_API_SEARCHES_PER_KEY" in body["detail"]
    served = _search(guarded, b, vectors, slow=False)
    took = time.monotonic() - started
    assert served.status_code == 200 and served.json()["results"], served.text
    assert took < SLEEP_S / 2, f"the other key waited {took:.1f} s"
    for t in slow:
        t.join(30)
    assert [r.status_code for r in answers] == [200, 200]
    assert _search(guarded, a, vectors, slow=False).status_code == 200  # its slots are free again


def test_a_search_is_cancelled_in_postgresql_when_its_client_goes_away(
    guarded: LiveServer, two_keys: tuple[str, str], vectors: str, database_url: str
) -> None:
    connections = guarded.runtime.searcher.connections
    body = b'{"vector": [1, 0, 0, 0], "k": 1, "ef_search": %d}' % SLOW_EF
    head = (
        f"POST /v1/collections/{vectors}/search HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {two_keys[0]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=10) as s:
        s.sendall(head + body)
        deadline = time.monotonic() + 10
        while not _slow_statements(database_url):
            assert time.monotonic() < deadline, "the slow search never ran"
            time.sleep(0.05)
        busy = _busy(guarded)
        assert busy >= 1
    closed = time.monotonic()
    while _slow_statements(database_url) or _busy(guarded) >= busy:
        assert time.monotonic() - closed < 2.0, "the statement was not cancelled when the client went away"
        time.sleep(0.05)
    print(f"cancelled and returned {time.monotonic() - closed:.2f} s after the client closed its socket")
    # The connection went back to the set in working order, and the key's slot is free again.
    assert connections.idle_count() >= 1
    for _ in range(3):
        assert _search(guarded, two_keys[0], vectors, slow=False).status_code == 200
