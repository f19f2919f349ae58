"""The retry strategies (tenacity): what is retried, how often, and what a caller sees at the end."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from memstore.commands.ingest import Client
from memstore.db import retrying


def _flaky(failures: list[Exception]):
    calls = []

    def run() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "done"

    return run, calls


def test_lock_timeouts_are_retried_with_doubling_pauses_then_reraised() -> None:
    pauses: list[float] = []
    run, calls = _flaky([psycopg.errors.LockNotAvailable(), psycopg.errors.LockNotAvailable()])
    strategy = retrying.lock_timeouts(attempts=3, first_s=0.5, sleep=pauses.append)
    assert strategy(run) == "done" and len(calls) == 3 and pauses == [0.5, 1.0]
    run, calls = _flaky([psycopg.errors.LockNotAvailable()] * 5)
    with pytest.raises(psycopg.errors.LockNotAvailable):
        retrying.lock_timeouts(attempts=3, first_s=0.5, sleep=pauses.append)(run)
    assert len(calls) == 3
    run, calls = _flaky([ValueError("not a lock timeout")])
    with pytest.raises(ValueError):
        retrying.lock_timeouts(attempts=3, first_s=0.5, sleep=pauses.append)(run)
    assert len(calls) == 1  # anything else is not retried


def test_deadlocks_are_retried_whole() -> None:
    run, calls = _flaky([psycopg.errors.DeadlockDetected()])
    assert retrying.deadlocks(attempts=2)(run) == "done" and len(calls) == 2
    run, calls = _flaky([psycopg.errors.DeadlockDetected()] * 3)
    with pytest.raises(psycopg.errors.DeadlockDetected):
        retrying.deadlocks(attempts=2)(run)


def _client(answers: list[httpx.Response | Exception]) -> tuple[Client, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = Client("http://memstore.test", "k", "c")
    client.http = httpx.Client(base_url="http://memstore.test", transport=httpx.MockTransport(handler))
    return client, seen


def test_the_ingest_client_waits_for_a_busy_server_and_gives_up_clearly() -> None:
    busy = httpx.Response(503, headers={"Retry-After": "0"})
    client, seen = _client([busy, busy, httpx.Response(200, json={"ok": True})])
    assert client.call("GET", "/x").json() == {"ok": True} and len(seen) == 3
    client, seen = _client([httpx.Response(429, headers={"Retry-After": "0"})])
    assert client.call("GET", "/x").status_code == 429 and len(seen) == 8  # the last answer, after 8 tries
    client, seen = _client([httpx.Response(404)])
    assert client.call("GET", "/x").status_code == 404 and len(seen) == 1  # not retried


def test_the_ingest_client_says_when_it_cannot_reach_the_server(monkeypatch) -> None:
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda _s: None)  # the doubling pauses, skipped
    client, seen = _client([httpx.ConnectError("refused")])
    with pytest.raises(SystemExit, match="cannot reach"):
        client.call("GET", "/x")
    assert len(seen) == 8
