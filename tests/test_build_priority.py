"""Background builds at a lower CPU priority where the server is this machine's own (memstore.db.priority)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import psycopg
import pytest
import sqlalchemy as sa

from memstore.db import priority
from memstore.db.core import dedicated_connection
from memstore.items import sealing
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore


@pytest.fixture
def conn(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    c = dedicated_connection(engine, application_name="memstore-test-priority")
    try:
        yield c
    finally:
        c.close()


def _local(conn: psycopg.Connection[Any]) -> psutil.Process:
    backend = priority.local_backend(conn)
    if backend is None:
        pytest.skip("the test database's server runs on another machine or in a container (not the embedded one)")
    return backend


def test_a_lowered_backend_runs_at_the_niceness_and_others_keep_theirs(
    conn: psycopg.Connection[Any], engine: sa.Engine
) -> None:
    backend = _local(conn)
    assert backend.pid == conn.info.backend_pid
    with dedicated_connection(engine, application_name="memstore-test-other") as other:
        before = psutil.Process(other.info.backend_pid).nice()
        assert priority.lower(conn, 7)
        assert backend.nice() == 7
        assert psutil.Process(other.info.backend_pid).nice() == before
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the session works on
    # Never raised again by a lower request (an ordinary user could not): 7 stays.
    assert priority.lower(conn, 3) and backend.nice() == 7
    assert not priority.lower(conn, 0)


def test_the_parallel_workers_a_lowered_backend_starts_are_lowered_as_they_appear(
    conn: psycopg.Connection[Any], engine: sa.Engine
) -> None:
    """Parallel workers are the postmaster's children, not the backend's: they start at the server's
    priority and the watcher lowers them. A forced parallel plan (debug_parallel_query) gives one."""
    _local(conn)

    def watcher() -> psycopg.Connection[Any]:
        return dedicated_connection(engine, application_name="memstore-test-watcher")

    seen: list[int] = []

    def observe(leader: int, stop: threading.Event) -> None:
        with dedicated_connection(engine, application_name="memstore-test-observer") as probe:
            while not stop.is_set():
                for (pid,) in probe.execute(
                    "SELECT pid FROM pg_stat_activity WHERE leader_pid = %s", (leader,)
                ).fetchall():
                    with contextlib.suppress(psutil.Error):
                        seen.append(psutil.Process(pid).nice())
                time.sleep(0.05)

    conn.execute("SET debug_parallel_query = on")
    conn.execute("SET max_parallel_workers_per_gather = 1")
    stop = threading.Event()
    thread = threading.Thread(target=observe, args=(conn.info.backend_pid, stop), daemon=True)
    with priority.lowered(conn, 9, watcher=watcher) as lowered:
        assert lowered
        thread.start()
        try:
            plan = conn.execute("EXPLAIN SELECT pg_sleep(1.5) FROM generate_series(1, 1)").fetchall()
            assert any("Gather" in row[0] for row in plan), plan
            conn.execute("SELECT pg_sleep(1.5) FROM generate_series(1, 1)").fetchall()
        finally:
            stop.set()
            thread.join(5)
    assert seen, "no parallel worker was seen (the server did not start one)"
    assert seen[-1] == 9, seen


def test_a_server_elsewhere_is_left_alone(conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with the backend's pid that does not run in the server's data directory is not the
    server's (another container's or host's pid space): nothing is reniced."""
    backend = _local(conn)
    before = backend.nice()
    monkeypatch.setattr(psutil.Process, "cwd", lambda self: "/somewhere/else")
    assert priority.local_backend(conn) is None
    assert not priority.lower(conn, 11)
    monkeypatch.undo()
    assert backend.nice() == before


def test_a_seal_builds_on_a_lowered_connection(
    engine: sa.Engine, settings: Settings, collection_name: str, conn: psycopg.Connection[Any]
) -> None:
    """The sealer's build connection (``sealing._held``, where seals and merges run) is at
    ``build_niceness``; the store's own connections are not."""
    _local(conn)
    store = VectorStore(engine, settings=settings.model_copy(update={"build_niceness": 6, "seal_interval_s": 3600.0}))
    try:
        c = store.create_collection(name=collection_name, dimensions=8, write_path="segments")
        rows = np.random.default_rng(1).normal(size=(50, 8)).astype(np.float32)
        store.upsert_items(
            collection=collection_name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(rows)]
        )
        with sealing._held(store.db, c, store.settings, 10.0) as (build, _, _):
            assert psutil.Process(build.info.backend_pid).nice() == 6
        with store.db.write() as other:
            backend = psutil.Process(other.info.backend_pid)
            parent = backend.parent()
            assert parent is not None and backend.nice() == parent.nice()  # the postmaster's own
        assert sealing.seal(store.db, c, store.settings, min_rows=1) is not None
        assert store.search(collection=collection_name, vector=rows[3], k=1)[0].external_id == "3"
    finally:
        store.sealer.close()
