"""Reads on hot standbys, with two real standbys of the embedded test server (pg_basebackup -R,
pg_ctl; made by memstore.db.standby, as `memstore db replica create` makes them): reads go to them,
writes do not; a standby that dies or lags serves no reads and no search fails; a read given a
write's LSN sees that write, also while a standby's replay is paused (in Python and through the
API); /metrics shows each standby; the primary's maintenance cancels no search on them."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from memstore.api.runtime import RuntimeOptions
from memstore.cli import main as memstore_main
from memstore.db.core import Database, create_engine, parse_lsn
from memstore.db.standby import Standby, embedded_socket
from memstore.errors import InvalidInputError
from memstore.models import ItemIn
from memstore.settings import ApiSettings, Settings, get_settings
from memstore.store import VectorStore
from memstore.web import create_app
from tests.api.api_helpers import LiveServer


@pytest.fixture(scope="module")
def standbys(database_url: str) -> Iterator[list[Standby]]:
    """Two hot standbys of the embedded test server, made as ``memstore db replica create`` makes them."""
    socket = embedded_socket(database_url)
    if os.environ.get("MEMSTORE_TEST_DATABASE_URL") or socket is None:
        pytest.skip("needs the embedded test server (a local standby is made of its data folder)")
    nodes: list[Standby] = []
    try:
        for i in range(2):
            folder = Path(tempfile.mkdtemp(prefix=f"memstore-standby{i}-"))
            folder.rmdir()  # made again by Standby.create, owned by the server's user
            nodes.append(Standby.create(folder, socket, database=str(sa.make_url(database_url).database)))
            nodes[-1].start()
        yield nodes
    finally:
        for node in nodes:
            node.remove()


@pytest.fixture(scope="module")
def standby(standbys: list[Standby]) -> Standby:
    return standbys[0]


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
    # A standby made a moment ago, or one on a loaded machine, may lag past max_lag_s at first: it
    # serves reads from the probe that finds it caught up (the routing under lag has its own tests).
    _wait(lambda: replicated.replicas[0].healthy, "the standby to catch up")
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
    # Streaming replication is asynchronous: a read sees the write at once when it asks to, on the
    # standby once it has replayed the write (or on the primary if it took too long).
    with replicated.reading_after(replicated.current_lsn()):
        served = replicated.replicas[0].reads + replicated.primary_reads
        assert store.search(collection=collection_name, vector=vectors[7], k=1)[0].external_id == "7"
        assert replicated.replicas[0].reads + replicated.primary_reads == served + 1
    table = store.get_collection(name=collection_name).table_name
    _wait(lambda: _rows_on(replicated.replicas[0].engine, table) == 50, "the rows on the standby")
    assert store.search(collection=collection_name, vector=vectors[7], k=1)[0].external_id == "7"
    assert replicated.states()[0]["healthy"] is True


def test_a_table_the_standby_has_not_replayed_is_read_on_the_primary(
    engine: sa.Engine, standby: Standby, settings: Settings, collection_name: str
) -> None:
    # Probed once a minute and never too far behind: the paused standby keeps serving reads.
    db = Database(engine, [create_engine(standby.url, pool_size=2, max_overflow=0)], max_lag_s=3600, probe_s=60)
    _replay(db.replicas[0].engine, "pause")
    try:
        store = VectorStore(db, settings=settings)
        store.create_collection(name=collection_name, dimensions=4)
        store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1, 0, 0, 0], external_id="a")])
        assert [h.external_id for h in store.search(collection=collection_name, vector=[1, 0, 0, 0], k=1)] == ["a"]
        assert db.replicas[0].reads == 1  # tried there first, answered by the primary
    finally:
        _replay(db.replicas[0].engine, "resume")
        db.close()


def test_a_read_that_meets_an_index_swaps_replay_is_read_on_the_primary(replicated: Database) -> None:
    """On a standby, "could not open relation with OID" when the replay of REINDEX CONCURRENTLY's drop
    lands under the planner: the read runs again on the primary. Other internal errors are raised."""

    def read(conn):  # type: ignore[no-untyped-def]
        standby = conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        if standby:
            raise psycopg.errors.InternalError_("could not open relation with OID 33806")
        return "primary"

    assert replicated.run_read(read) == "primary"
    assert replicated.replicas[0].conflicts == 0  # no recovery conflict: the standby stays as it was

    def broken(conn):  # type: ignore[no-untyped-def]
        raise psycopg.errors.InternalError_("something else went wrong")

    with pytest.raises(psycopg.errors.InternalError_, match="something else"):
        replicated.run_read(broken)


def _replay(replica: sa.Engine, action: str) -> None:
    with replica.connect() as conn:
        conn.exec_driver_sql(f"SELECT pg_wal_replay_{action}()")


def test_no_search_fails_when_the_standby_dies_and_it_serves_again_once_back(
    replicated: Database, standby: Standby, settings: Settings, collection_name: str
) -> None:
    store = VectorStore(replicated, settings=settings)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1, 0, 0, 0], external_id="a")])
    table = store.get_collection(name=collection_name).table_name
    _wait(lambda: _rows_on(replicated.replicas[0].engine, table) == 1, "replication")
    standby.stop("immediate")
    try:
        for _ in range(5):  # the first runs on the dead standby's pooled connection, then again on the primary
            assert [h.external_id for h in store.search(collection=collection_name, vector=[1, 0, 0, 0], k=1)] == ["a"]
        assert replicated.states()[0]["healthy"] is False
        with replicated.read() as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    finally:
        standby.start()
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


def test_a_long_transaction_on_the_primary_does_not_make_a_keeping_up_standby_lag(
    replicated: Database, engine: sa.Engine, collection_name: str
) -> None:
    """WAL flows for seconds with no commit (a bulk load, an index build): the standby replays it as
    it comes, so it serves reads all along. Its own view (the last replayed commit's age) read 9 to
    18 s behind in such a load, and took it out of service; the lag is read from WAL positions now
    (memstore.db.replica_lag)."""
    _wait(lambda: replicated.states()[0]["healthy"], "the standby to catch up")
    table = f"long_tx_{collection_name}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE TABLE "{table}" (id int, pad text)')
    states: list[dict[str, object]] = []
    try:
        with engine.connect() as conn:
            started = time.monotonic()
            with conn.begin():  # one transaction, about 3 times max_lag_s long
                while time.monotonic() - started < 3 * replicated.max_lag_s:
                    conn.exec_driver_sql(
                        f"INSERT INTO \"{table}\" SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g"
                    )
                    time.sleep(0.25)
                    states.append(replicated.states()[0])
        healthy = [bool(state["healthy"]) for state in states]
        print(f"{len(states)} probes in the transaction: healthy {sum(healthy)}, lags {[s['lag_s'] for s in states]}")
        assert healthy[-1] and sum(healthy) >= 0.75 * len(healthy), states
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP TABLE "{table}"')


@pytest.fixture
def two_replicas(engine: sa.Engine, standbys: list[Standby]) -> Iterator[Database]:
    # Never too far behind for the probe: a paused standby stays among those serving reads, which is
    # the case a read's min_lsn is for.
    replicas = [create_engine(s.url, pool_size=2, max_overflow=0) for s in standbys]
    db = Database(engine, replicas, max_lag_s=3600, probe_s=60, wait_s=0.5)
    yield db
    db.close()


def test_a_read_after_a_write_sees_it_every_time_while_a_replica_is_paused(
    two_replicas: Database, settings: Settings, collection_name: str
) -> None:
    db = two_replicas
    store = VectorStore(db, settings=settings)
    store.create_collection(name=collection_name, dimensions=4)
    _replay(db.replicas[1].engine, "pause")
    try:
        for i in range(20):
            vector = [1.0, float(i), 0.5, 0.0]
            store.upsert_items(collection=collection_name, items=[ItemIn(vector=vector, external_id=f"w{i}")])
            with db.reading_after(db.current_lsn()):
                assert store.find_external_ids(collection=collection_name, external_ids=[f"w{i}"]).keys() == {f"w{i}"}
                assert (
                    store.search(collection=collection_name, vector=vector, k=1, exact=True)[0].external_id == f"w{i}"
                )
    finally:
        _replay(db.replicas[1].engine, "resume")
    assert db.replicas[1].reads == 0  # asked, never had the write: no read went there
    assert db.replicas[0].reads + db.primary_reads == 40
    assert db.replicas[0].reads > 0


def test_a_read_no_replica_can_serve_in_time_goes_to_the_primary(
    two_replicas: Database, settings: Settings, collection_name: str
) -> None:
    db = two_replicas
    store = VectorStore(db, settings=settings)
    store.create_collection(name=collection_name, dimensions=4)
    for replica in db.replicas:
        _replay(replica.engine, "pause")
    try:
        store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1, 0, 0, 0], external_id="a")])
        lsn = db.current_lsn()
        started = time.monotonic()
        with db.reading_after(lsn):
            assert store.find_external_ids(collection=collection_name, external_ids=["a"]) != {}
        assert time.monotonic() - started >= db.wait_s  # waited for a replica first
        assert db.primary_reads == 1 and [r.reads for r in db.replicas] == [0, 0]
        # A position past the primary's own is refused rather than waited for.
        with pytest.raises(InvalidInputError, match="ahead of the database's WAL"), db.reading_after("FFFFFFFF/0"):
            store.find_external_ids(collection=collection_name, external_ids=["a"])
    finally:
        for replica in db.replicas:
            _replay(replica.engine, "resume")
    with pytest.raises(InvalidInputError, match="not a WAL position"), db.reading_after("0/1; DROP TABLE x"):
        pass


def test_the_api_answers_writes_with_their_lsn_and_reads_given_it_see_them(
    settings: Settings, standbys: list[Standby], collection_name: str
) -> None:
    replicated = settings.model_copy(
        update={"read_database_urls": [s.url for s in standbys], "max_replica_lag_s": 3600.0}
    )
    app = create_app(replicated, api_settings=ApiSettings(auth="off"), options=RuntimeOptions(encoder="none"))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        db = live.runtime.store.db
        try:
            made = client.post("/v1/collections", json={"name": collection_name, "dimensions": 4})
            assert made.status_code == 201 and parse_lsn(made.headers["X-Memstore-LSN"]) > 0
            assert made.json()["lsn"] == made.headers["X-Memstore-LSN"]  # the body says it too
            _replay(db.replicas[1].engine, "pause")
            try:
                for i in range(10):
                    vector = [1.0, float(i), 0.5, 0.0]
                    wrote = client.post(
                        f"/v1/collections/{collection_name}/items",
                        json={"items": [{"vector": vector, "external_id": f"w{i}"}]},
                    )
                    assert wrote.status_code == 201, wrote.text
                    lsn = wrote.headers["X-Memstore-LSN"]
                    assert wrote.json()["lsn"] == lsn
                    found = client.post(
                        f"/v1/collections/{collection_name}/search",
                        json={"vector": vector, "k": 1, "exact": True},
                        headers={"X-Memstore-Min-LSN": lsn},
                    )
                    assert [h["external_id"] for h in found.json()["results"]] == [f"w{i}"], found.text
                    assert "X-Memstore-LSN" not in found.headers  # a read: no position
                    listed = client.get(
                        f"/v1/collections/{collection_name}/items", params={"external_id": f"w{i}", "min_lsn": lsn}
                    )
                    assert [it["external_id"] for it in listed.json()["items"]] == [f"w{i}"], listed.text
            finally:
                _replay(db.replicas[1].engine, "resume")
            assert db.replicas[1].reads == 0 and db.replicas[0].reads + db.primary_reads == 20
            # Abuse: a malformed position, a position from the future.
            for bad, words in (("x/y'--", "not a WAL position"), ("FFFFFFFF/FFFFFFFF", "ahead of the database's WAL")):
                refused = client.post(
                    f"/v1/collections/{collection_name}/search",
                    json={"vector": [1, 0, 0, 0], "k": 1},
                    headers={"X-Memstore-Min-LSN": bad},
                )
                assert refused.status_code == 422 and words in refused.json()["detail"], refused.text
            refused = client.get(f"/v1/collections/{collection_name}/items", params={"min_lsn": "1" * 100})
            assert refused.status_code == 422 and "not a WAL position" in refused.json()["detail"]
        finally:
            db.close()


def _replica_metrics(client: httpx.Client) -> dict[tuple[str, str], float]:
    """/metrics' replica samples by (name, replica)."""
    text = client.get("/metrics").text
    return {
        (sample.name, sample.labels.get("replica", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(("memstore_replica_", "memstore_primary_reads"))
    }


def test_metrics_show_each_replicas_health_lag_and_reads(
    settings: Settings, standbys: list[Standby], engine: sa.Engine, collection_name: str
) -> None:
    replicated = settings.model_copy(
        update={"read_database_urls": [s.url for s in reversed(standbys)], "max_replica_lag_s": 1.0}
    )
    app = create_app(replicated, api_settings=ApiSettings(auth="off"), options=RuntimeOptions(encoder="none"))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=30) as client:
        db = live.runtime.store.db
        try:
            _wait(lambda: all(r["healthy"] for r in db.states()), "both replicas to serve")
            assert client.post("/v1/collections", json={"name": collection_name, "dimensions": 4}).status_code == 201
            before = _replica_metrics(client)
            assert before[("memstore_replica_healthy", "0")] == before[("memstore_replica_healthy", "1")] == 1.0
            assert before[("memstore_replica_lag_seconds", "1")] >= 0.0
            for _ in range(4):
                client.get(f"/v1/collections/{collection_name}/items")
            after = _replica_metrics(client)
            served = sum(
                after[("memstore_replica_reads_total", r)] - before[("memstore_replica_reads_total", r)] for r in "01"
            )
            assert (
                served + after[("memstore_primary_reads_total", "")] - before[("memstore_primary_reads_total", "")] == 4
            )
            _replay(db.replicas[1].engine, "pause")
            try:
                # WAL the paused replica receives and does not replay: it falls behind by the clock.
                deadline = time.monotonic() + 30
                while db.states()[1]["healthy"] and time.monotonic() < deadline:
                    with engine.begin() as conn:
                        conn.exec_driver_sql("SELECT pg_logical_emit_message(true, 'memstore-test', 'x')")
                    time.sleep(0.2)
                lagging = _replica_metrics(client)
                assert lagging[("memstore_replica_healthy", "1")] == 0.0
                assert lagging[("memstore_replica_lag_seconds", "1")] > 1.0
                assert lagging[("memstore_replica_healthy", "0")] == 1.0
            finally:
                _replay(db.replicas[1].engine, "resume")
            _wait(lambda: db.states()[1]["healthy"], "the replica to catch up")
            assert _replica_metrics(client)[("memstore_replica_healthy", "1")] == 1.0
        finally:
            db.close()


def test_memstore_db_replica_create_makes_a_standby_and_stop_stops_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    socket = embedded_socket(database_url)
    if os.environ.get("MEMSTORE_TEST_DATABASE_URL") or socket is None or not (Path(socket) / "PG_VERSION").exists():
        pytest.skip("needs the embedded test server, whose socket is its data folder")
    # The command as a user runs it: no MEMSTORE_DATABASE_URL, the embedded server's data folder.
    monkeypatch.delenv("MEMSTORE_DATABASE_URL", raising=False)
    monkeypatch.setenv("MEMSTORE_DATA_DIR", str(Path(socket).parent))
    # Joining the server applies these: keep the test server's own (tests/conftest.py).
    monkeypatch.setenv("MEMSTORE_MAINTENANCE_WORK_MEM", "256MB")
    monkeypatch.setenv("MEMSTORE_MAX_PARALLEL_MAINTENANCE_WORKERS", "1")
    get_settings.cache_clear()
    folder = Path(tempfile.mkdtemp(prefix="memstore-cli-standby-"))
    folder.rmdir()
    try:
        assert memstore_main(["db", "replica", "create", str(folder), "--json"]) == 0
        made = json.loads(capsys.readouterr().out)
        standby = create_engine(made["url"], pool_size=1, max_overflow=0)
        with standby.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback'), "
                "(SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming')"
            ).one()
        standby.dispose()
        assert tuple(row) == (True, "on", 1)
        assert memstore_main(["db", "replica", "stop", str(folder)]) == 0
        assert not Standby(folder).running
        # Not for a database the embedded server is not: refused, nothing made.
        monkeypatch.setenv("MEMSTORE_DATABASE_URL", database_url)
        get_settings.cache_clear()
        capsys.readouterr()
        assert memstore_main(["db", "replica", "create", str(folder.with_name(folder.name + "-2"))]) == 2
        assert "MEMSTORE_DATABASE_URL" in capsys.readouterr().err
        assert not folder.with_name(folder.name + "-2").exists()
    finally:
        get_settings.cache_clear()
        Standby(folder).remove()


def _conflicts_on(replica: sa.Engine) -> int:
    """Queries this standby has cancelled in this database for a recovery conflict, ever."""
    with replica.connect() as conn:
        return int(
            conn.exec_driver_sql(
                "SELECT confl_tablespace + confl_lock + confl_snapshot + confl_bufferpin + confl_deadlock "
                "FROM pg_stat_database_conflicts WHERE datname = current_database()"
            ).scalar()
            or 0
        )


def _hnsw_indexes(engine: sa.Engine, table: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.exec_driver_sql(
                # The table's own index, or its partitions' (a partitioned table's index is rebuilt by
                # rebuilding each partition's).
                "SELECT i.indexrelid::regclass::text FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'hnsw' AND c.relkind = 'i' "
                "AND (i.indrelid = %s::regclass OR i.indrelid IN (SELECT relid FROM pg_partition_tree(%s::regclass)))",
                (table, table),
            ).scalars()
        )


def test_maintenance_on_the_primary_cancels_no_search_on_the_standbys(
    two_replicas: Database, engine: sa.Engine, settings: Settings, collection_name: str
) -> None:
    """A VACUUM after many deletes and a concurrent rebuild replay on standbys made as `memstore db
    replica create` makes them (hot_standby_feedback on) while searches run there: none is cancelled."""
    db = two_replicas
    store = VectorStore(db, settings=settings)
    store.create_collection(name=collection_name, dimensions=16)
    rng = np.random.default_rng(3)
    for start in range(0, 4000, 1000):
        rows = rng.normal(size=(1000, 16))
        store.upsert_items(
            collection=collection_name, items=[ItemIn(vector=r, external_id=str(start + i)) for i, r in enumerate(rows)]
        )
    table = store.get_collection(name=collection_name).table_name
    indexes = _hnsw_indexes(engine, table)
    assert indexes, "the collection has no HNSW index to rebuild"
    _wait(lambda: all(_rows_on(r.engine, table) == 4000 for r in db.replicas), "the rows on both standbys")
    conflicts_before = [_conflicts_on(r.engine) for r in db.replicas]
    stop, failures, searches = threading.Event(), [], [0]

    def search_stream() -> None:
        local = np.random.default_rng()
        while not stop.is_set():
            try:
                exact = searches[0] % 5 == 0  # some scans of the whole table, which hold their snapshot longer
                store.search(collection=collection_name, vector=local.normal(size=16), k=10, exact=exact)
                searches[0] += 1
            except Exception as exc:  # every failure is the test's finding
                failures.append(exc)

    streams = [threading.Thread(target=search_stream) for _ in range(3)]
    for t in streams:
        t.start()
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f'DELETE FROM "{table}" WHERE mod(id, 3) = 0')
            conn.exec_driver_sql(f'VACUUM (INDEX_CLEANUP ON) "{table}"')
            for index in indexes:
                conn.exec_driver_sql(f"REINDEX INDEX CONCURRENTLY {index}")
            conn.exec_driver_sql(f'DELETE FROM "{table}" WHERE mod(id, 3) = 1')
            conn.exec_driver_sql(f'VACUUM "{table}"')
        target = parse_lsn(db.current_lsn())
        _wait(lambda: all(_replayed(r.engine) >= target for r in db.replicas), "both standbys to replay it all")
    finally:
        stop.set()
        for t in streams:
            t.join()
    assert failures == []
    assert searches[0] > 0 and sum(r.reads for r in db.replicas) > 0
    assert [_conflicts_on(r.engine) for r in db.replicas] == conflicts_before
    assert [r.conflicts for r in db.replicas] == [0, 0]


def _replayed(replica: sa.Engine) -> int:
    with replica.connect() as conn:
        return parse_lsn(str(conn.exec_driver_sql("SELECT pg_last_wal_replay_lsn()::text").scalar()))


def _index_scans(engine: sa.Engine, index: str) -> int:
    with engine.connect() as conn:
        value = conn.exec_driver_sql(
            "SELECT coalesce(sum(idx_scan), 0) FROM pg_stat_user_indexes WHERE indexrelname = %s", (index,)
        ).scalar()
        return int(value or 0)


def test_the_recall_probe_can_read_a_standbys_copy_of_the_index(
    engine: sa.Engine, standby: Standby, settings: Settings, collection_name: str
) -> None:
    """With recall_on_replica, the maintenance pass's sampled recall runs its index searches on the
    standby (its scans counted there), and the primary's index is not searched at all."""
    from maintenance.config import MaintenanceConfig
    from maintenance.worker import MaintenanceWorker

    store = VectorStore(engine, settings=settings)
    c = store.create_collection(name=collection_name, dimensions=16)
    rng = np.random.default_rng(7)
    store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=v, external_id=str(i)) for i, v in enumerate(rng.normal(size=(1500, 16)))],
    )
    replica = create_engine(standby.url, pool_size=1, max_overflow=0)
    try:
        _wait(lambda: _rows_on(replica, c.table_name) == 1500, "the rows on the standby")
        primary_before, standby_before = _index_scans(engine, c.index_name), _index_scans(replica, c.index_name)
        worker = MaintenanceWorker(
            Database(engine),
            settings=settings.model_copy(update={"read_database_urls": [standby.url]}),
            config=MaintenanceConfig(recall_on_replica=True, recall_sample=5),
            collections=[collection_name],
        )
        try:
            assert worker.run_once() == 0
        finally:
            worker.close()  # the standby's session flushes its statistics as it ends
        _wait(lambda: _index_scans(replica, c.index_name) > standby_before, "the probe's index scans on the standby")
        assert _index_scans(engine, c.index_name) == primary_before
        with engine.connect() as conn:
            recall = conn.exec_driver_sql(
                "SELECT recall FROM memstore_maintenance_probes WHERE collection = %s ORDER BY id DESC LIMIT 1",
                (collection_name,),
            ).scalar()
        assert recall is not None and recall > 0.5
    finally:
        replica.dispose()
