"""Foreground first across processes (memstore.services.foreground_signal): a search server's share,
published in the database, followed by a process that answers no searches.

The rows are real (the migrated ``memstore_foreground`` table); the search server's controller is
held at a share with ``force`` so that what is published is known.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from memstore.db.core import Database, create_engine
from memstore.services.foreground import ForegroundController
from memstore.services.foreground_signal import ForegroundFollower, SharePublisher
from memstore.settings import Settings
from tests.databases import scratch_database


@pytest.fixture(scope="module")
def db(server_url: str) -> Iterator[Database]:
    """A database of its own: the suite's API servers publish their shares in the shared one."""
    with scratch_database(server_url, "memstore_signal") as url:
        database = Database(create_engine(url, pool_size=2))
        try:
            yield database
        finally:
            database.close()


@pytest.fixture(autouse=True)
def no_rows(db: Database) -> Iterator[None]:
    with db.write() as conn:
        conn.execute("DELETE FROM memstore_foreground")
    yield


def _server(share: float) -> ForegroundController:
    controller = ForegroundController(lambda since: [])
    controller.force(share)
    return controller


def _follower(db: Database, **settings: object) -> ForegroundFollower:
    return ForegroundFollower.for_process(db, Settings(_env_file=None, **settings))  # type: ignore[call-arg]


def test_a_follower_takes_the_lowest_fresh_share_the_search_servers_published(db: Database) -> None:
    a, b = SharePublisher(db, source="host-a:1"), SharePublisher(db, source="host-b:2")
    a(_server(0.6))
    b(_server(0.25))
    follower = _follower(db)
    try:
        follower.tick()
        assert follower.share() == pytest.approx(0.25)
        state = follower.state()
        assert state["search_servers"] == 2 and state["target_from"] == "search servers"
        assert follower.backoffs == 1 and follower.last_backoff is not None
        b.close()  # a server that stops takes its row with it: the other one's share rules at once
        follower.tick()
        assert follower.share() == pytest.approx(0.6)
        a.close()
        follower.tick()
        assert follower.share() == 1.0 and follower.state()["search_servers"] == 0
    finally:
        follower.close()


def test_a_stale_row_counts_for_nothing(db: Database) -> None:
    SharePublisher(db, source="crashed:9")(_server(0.0))
    with db.write() as conn:
        conn.execute("UPDATE memstore_foreground SET updated_at = clock_timestamp() - interval '1 minute'")
    follower = _follower(db)
    try:
        follower.tick()
        assert follower.share() == 1.0  # a server that died at share 0 holds nothing back
    finally:
        follower.close()


def test_units_in_the_follower_wait_while_a_search_server_publishes_zero(db: Database) -> None:
    publisher = SharePublisher(db, source="busy:1")
    server = _server(0.0)
    publisher(server)
    follower = _follower(db)
    follower.tick()
    stop, ran = threading.Event(), threading.Event()

    def work() -> None:
        with follower.unit(stop) as unit:
            unit.did(1)
            ran.set()

    thread = threading.Thread(target=work, daemon=True)
    try:
        thread.start()
        assert not ran.wait(0.5)  # held back: the search server gives the background nothing
        server.force(1.0)
        publisher(server)  # a changed share is written at once, heartbeat or not
        follower.tick()
        assert ran.wait(5)
    finally:
        stop.set()
        thread.join(5)
        follower.close()
        publisher.close()


def test_the_publisher_writes_on_a_change_and_on_the_heartbeat_only(db: Database) -> None:
    publisher = SharePublisher(db, source="beat:1", heartbeat_s=0.3)
    server = _server(0.5)
    publisher(server)
    publisher(server)
    assert publisher.published == 1  # the same share within the heartbeat: no write
    server.force(0.4)
    publisher(server)
    assert publisher.published == 2
    time.sleep(0.35)
    publisher(server)
    assert publisher.published == 3
    with db.write() as conn:
        row = conn.execute("SELECT share FROM memstore_foreground WHERE source = 'beat:1'").fetchone()
    assert row is not None and row[0] == pytest.approx(0.4)
    publisher.close()


def test_switched_off_the_follower_runs_at_full_speed(db: Database) -> None:
    SharePublisher(db, source="busy:2")(_server(0.0))
    follower = _follower(db, foreground_shared=False)
    try:
        follower.tick()
        assert follower.share() == 1.0 and follower.backoffs == 0
    finally:
        follower.close()


def test_an_unreachable_database_neither_raises_nor_holds_work_back() -> None:
    # A port nothing listens on: every round trip fails at once, and is not retried at every tick.
    db = Database(create_engine("postgresql://memstore@127.0.0.1:9/memstore"))
    try:
        publisher = SharePublisher(db, source="nowhere:1")
        publisher(_server(0.0))
        assert publisher.published == 0
        follower = _follower(db)
        started = time.monotonic()
        for _ in range(10):
            follower.tick()
        assert time.monotonic() - started < 5
        assert follower.share() == 1.0
        follower.close()
        publisher.close()
    finally:
        db.close()


def test_windows_in_which_a_follower_worked_do_not_enter_the_search_servers_baseline(db: Database) -> None:
    now = [100.0]
    fast = [(99.5, 0.002)] * 5  # five searches in the last window, 2 ms each
    server = ForegroundController(lambda since: fast, clock=lambda: now[0])
    publisher = SharePublisher(db, source="search:1", heartbeat_s=0.0)
    follower = _follower(db)
    try:
        publisher(server)
        server.tick()
        assert server.state()["baseline_windows"] == 1  # no background work anywhere: an idle window
        with follower.unit(threading.Event()) as unit:
            unit.did(1)
        follower.tick()
        assert follower.reported == 1
        publisher(server)  # its write reads when the follower last worked
        server.tick()
        assert server.state()["baseline_windows"] == 1  # that window is left out
        now[0] += 10 * server.window_s  # long after the follower's work (and the news of it)
        fast[:] = [(now[0] - 0.5, 0.002)] * 5
        server.tick()
        assert server.state()["baseline_windows"] == 2
    finally:
        follower.close()
        publisher.close()
    with db.write() as conn:
        assert conn.execute("SELECT count(*) FROM memstore_foreground").fetchone() == (0,)  # both rows gone


def test_a_follower_reports_unpaced_work_while_it_runs(db: Database) -> None:
    """The maintenance daemon's statements run under ``working`` (never held back): the follower
    tells the search servers while one is under way, so their baseline leaves those windows out."""
    now = [100.0]
    fast = [(99.5, 0.002)] * 5
    server = ForegroundController(lambda since: fast, clock=lambda: now[0])
    publisher = SharePublisher(db, source="search:1", heartbeat_s=0.0)
    follower = _follower(db)
    try:
        server.force(0.0)  # searches hold background work back entirely: a statement still runs
        publisher(server)
        follower.tick()
        assert follower.share() == 0.0
        with follower.working("rebuild") as unit:
            unit.did(1)
            follower.tick()
            assert follower.reported == 1  # while it runs, not only after
            publisher(server)
            server.tick()
            assert server.state()["baseline_windows"] == 0
    finally:
        follower.close()
        publisher.close()
