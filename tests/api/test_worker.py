"""The durable queue and its workers, without HTTP: claims, crashes, SIGTERM, stale results, batching."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa

from encoder.errors import EncoderUnreachableError
from memstore.db.core import Database
from memstore.queue import claims, jobs
from memstore.queue.claims import Claim, Claimer
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker, Loaded, group_for_encoding
from tests.api.api_helpers import FakeBackend

HERE = Path(__file__).resolve().parent


@pytest.fixture
def worker_store(worker_engine: sa.Engine, settings) -> VectorStore:
    return VectorStore(worker_engine, settings=settings)


@pytest.fixture
def tiny_collection(worker_store, collection_name):
    return worker_store.create_collection(name=collection_name, dimensions=64, model="memstore-tiny")


def enqueue_texts(engine, c, n: int, prefix: str = "t") -> list[int]:
    done = jobs.enqueue(
        Database(engine), c, [PendingItem(text=f"{prefix} {i}", external_id=f"{prefix}{i}") for i in range(n)]
    )
    return [d.id for d in done]


def item_states(engine, c) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql(f'SELECT id, status FROM "{c.table_name}"').fetchall())


def test_grouping_splits_by_collection_modality_and_bytes() -> None:
    def loaded(cid: int, qid: int, text: str | None = None, size: int = 0) -> Loaded:
        return Loaded(Claim(qid, cid, qid, 1, 7), text, None if text else b"x" * size)

    items = [loaded(1, 1, "a"), loaded(1, 2, size=60), loaded(2, 3, "b"), loaded(1, 4, size=60), loaded(1, 5, "c")]
    groups = group_for_encoding(items, max_image_bytes=100)
    shapes = [(g.collection_id, g.modality, [it.claim.queue_id for it in g.items]) for g in groups]
    assert shapes == [(1, "text", [1, 5]), (1, "image", [2]), (1, "image", [4]), (2, "text", [3])]


def test_claims_are_disjoint_and_a_dead_claimers_rows_return_at_once(worker_engine, tiny_collection) -> None:
    enqueue_texts(worker_engine, tiny_collection, 10)
    a, b, c = Claimer(Database(worker_engine)), Claimer(Database(worker_engine)), Claimer(Database(worker_engine))
    try:
        first = claims.claim(Database(worker_engine), a, limit=5, collection_id=tiny_collection.id)
        second = claims.claim(Database(worker_engine), b, limit=50, collection_id=tiny_collection.id)
        assert len(first) == 5 and len(second) == 5
        assert not {x.item_id for x in first} & {x.item_id for x in second}
        assert claims.claim(Database(worker_engine), c, limit=50, collection_id=tiny_collection.id) == []
        a.close()  # the claimer's connection dies: its advisory lock goes with it
        deadline = time.monotonic() + 5
        again = []
        while not again and time.monotonic() < deadline:  # as soon as the server has ended that session
            again = claims.claim(Database(worker_engine), c, limit=50, collection_id=tiny_collection.id)
        assert sorted(x.item_id for x in again) == sorted(x.item_id for x in first)
        assert {x.attempts for x in again} == {2}
    finally:
        for claimer in (a, b, c):
            claimer.close()


def test_a_stale_result_never_overwrites_new_content(worker_engine, tiny_collection) -> None:
    [item_id] = enqueue_texts(worker_engine, tiny_collection, 1)
    claimer = Claimer(Database(worker_engine))
    try:
        [held] = claims.claim(Database(worker_engine), claimer, limit=1, collection_id=tiny_collection.id)
        jobs.enqueue(Database(worker_engine), tiny_collection, [PendingItem(text="new words", external_id="t0")])
        assert claims.complete(Database(worker_engine), tiny_collection, [held], {item_id: [0.1] * 64}) == []
        assert item_states(worker_engine, tiny_collection)[item_id] == "pending"
    finally:
        claimer.close()


def test_once_mode_drains_the_queue_and_exits_zero(worker_engine, tiny_collection) -> None:
    ids = enqueue_texts(worker_engine, tiny_collection, 40)
    backend = FakeBackend()
    worker = IngestWorker(Database(worker_engine), backend, settings=IngestSettings(batch_size=16))
    assert worker.run(once=True) == 0
    assert worker.totals.written >= 40
    assert {s for i, s in item_states(worker_engine, tiny_collection).items() if i in ids} == {"ready"}
    assert max(n for _, n, _ in backend.calls) <= 16


def test_a_collection_the_worker_cannot_embed_is_handed_back_then_failed(
    worker_engine, worker_store, collection_name
) -> None:
    """Another worker may run the collection's model: the items go back to the queue with the reason,
    and fail with it once their attempts are spent."""
    c = worker_store.create_collection(name=collection_name, dimensions=32)
    [item_id] = enqueue_texts(worker_engine, c, 1)
    settings = IngestSettings(max_attempts=2)
    IngestWorker(Database(worker_engine), FakeBackend(), settings=settings).run(once=True)
    assert item_states(worker_engine, c)[item_id] == "pending"
    with worker_engine.begin() as conn:
        error = conn.exec_driver_sql(
            "UPDATE memstore_ingest_queue SET not_before = now() WHERE item_id = %s AND collection_id = %s "
            "RETURNING last_error",
            (item_id, c.id),
        ).scalar_one()
    assert "has 32 dimensions" in error
    IngestWorker(Database(worker_engine), FakeBackend(), settings=settings).run(once=True)
    assert item_states(worker_engine, c)[item_id] == "failed"


def _spawn(worker_url: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.api.worker_proc", worker_url, mode],
        cwd=HERE.parents[1],  # the repository: tests is a package
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for(proc: subprocess.Popen[str], word: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if word in line:
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"the worker never printed {word}")


def test_a_worker_killed_mid_batch_leaves_its_rows_to_another(worker_engine, worker_url, tiny_collection) -> None:
    ids = enqueue_texts(worker_engine, tiny_collection, 12)
    proc = _spawn(worker_url, "block")
    try:
        _wait_for(proc, "ENCODING")
        with worker_engine.connect() as conn:
            held = conn.exec_driver_sql(
                "SELECT count(*) FROM memstore_ingest_queue WHERE collection_id = %s AND claimed_by IS NOT NULL",
                (tiny_collection.id,),
            ).scalar()
        assert held == 12
    finally:
        proc.kill()
        proc.wait(10)
    worker = IngestWorker(Database(worker_engine), FakeBackend(), settings=IngestSettings(batch_size=100))
    deadline = time.monotonic() + 20
    while worker.totals.written < 12 and time.monotonic() < deadline:
        worker.run_batch()  # the dead process's lock disappears as soon as PostgreSQL sees the socket close
        time.sleep(0.1)
    assert {s for i, s in item_states(worker_engine, tiny_collection).items() if i in ids} == {"ready"}


def test_sigterm_finishes_the_batch_then_exits_zero(worker_engine, worker_url, tiny_collection) -> None:
    ids = enqueue_texts(worker_engine, tiny_collection, 5)
    proc = _spawn(worker_url, "slow")
    _wait_for(proc, "ENCODING")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "written=5" in out
    assert {s for i, s in item_states(worker_engine, tiny_collection).items() if i in ids} == {"ready"}


def test_an_unexpected_error_mid_batch_gives_the_claims_back(worker_engine, tiny_collection, monkeypatch) -> None:
    ids = enqueue_texts(worker_engine, tiny_collection, 3, prefix="blip")
    worker = IngestWorker(
        Database(worker_engine), FakeBackend(), settings=IngestSettings(batch_size=100, backoff_base_s=0)
    )
    real_complete = claims.complete

    def broken(*args, **kwargs):
        raise RuntimeError("database blip")

    monkeypatch.setattr(claims, "complete", broken)
    with pytest.raises(RuntimeError):
        worker.run_batch()
    with worker_engine.connect() as conn:
        held = conn.exec_driver_sql(
            "SELECT count(*) FROM memstore_ingest_queue WHERE collection_id = %s AND claimed_by IS NOT NULL",
            (tiny_collection.id,),
        ).scalar()
    assert held == 0  # released, not left claimed by a live worker
    monkeypatch.setattr(claims, "complete", real_complete)
    assert worker.run(once=True) == 0
    assert {s for i, s in item_states(worker_engine, tiny_collection).items() if i in ids} == {"ready"}


def test_an_unreachable_encoder_service_hands_the_batch_back_without_spending_attempts(
    worker_engine, tiny_collection
) -> None:
    """The encoder service down (refused connections) is no item's fault: the whole batch goes back
    with its attempts as they were, and nothing fails however long the outage lasts."""
    ids = enqueue_texts(worker_engine, tiny_collection, 3, prefix="outage")
    backend = FakeBackend()
    worker = IngestWorker(Database(worker_engine), backend, settings=IngestSettings(batch_size=100, max_attempts=1))
    for _ in range(3):  # more outages than the single attempt each item has
        backend.fail("outage 0", 1, EncoderUnreachableError("refused"))
        with pytest.raises(EncoderUnreachableError):
            worker.run_batch()
        assert len(backend.calls) == 1  # no item-by-item retry against a service that is not there
        backend.calls.clear()
        with worker_engine.begin() as conn:
            rows = conn.exec_driver_sql(
                "UPDATE memstore_ingest_queue SET not_before = now() WHERE collection_id = %s "
                "RETURNING status, attempts, claimed_by",
                (tiny_collection.id,),
            ).fetchall()
        assert sorted(rows) == [("pending", 0, None)] * 3
    assert worker.run(once=True) == 0
    assert {s for i, s in item_states(worker_engine, tiny_collection).items() if i in ids} == {"ready"}


def test_an_idle_worker_waits_for_work_instead_of_polling(empty_database_url, monkeypatch) -> None:
    """An empty queue has nothing due: the worker sleeps until a NOTIFY or its poll interval."""
    from memstore.db.core import create_engine

    engine = create_engine(empty_database_url)
    db = Database(engine)
    try:
        assert claims.next_due_in(db) is None
        c = VectorStore(db).create_collection(name="idle", dimensions=64, model="memstore-tiny")
        jobs.enqueue(db, c, [PendingItem(text="later", external_id="later")])
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE memstore_ingest_queue SET not_before = now() + interval '30 seconds'")
        due = claims.next_due_in(db)
        assert due is not None and 25 < due <= 30
        with engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM memstore_ingest_queue")

        claimed: list[float] = []
        original = claims.claim

        def counting_claim(claim_db, *args, **kwargs):
            if claim_db is db:  # the API servers of this test session claim too
                claimed.append(time.monotonic())
            return original(claim_db, *args, **kwargs)

        monkeypatch.setattr(claims, "claim", counting_claim)
        worker = IngestWorker(db, FakeBackend(), settings=IngestSettings(poll_interval_s=5.0))
        thread = threading.Thread(target=worker.run)
        thread.start()
        time.sleep(2.0)
        worker.stop()
        thread.join(10)
        # One claim a second at most (the wait is capped at 1 s so that stop() is noticed).
        assert 1 <= len(claimed) <= 4, f"{len(claimed)} claims in 2 s on an empty queue"
    finally:
        engine.dispose()


def test_deleting_items_drops_their_queue_rows(worker_engine, worker_store, tiny_collection) -> None:
    ids = enqueue_texts(worker_engine, tiny_collection, 4, prefix="gone")

    def queued() -> set[int]:
        with worker_engine.connect() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT item_id FROM memstore_ingest_queue WHERE collection_id = {tiny_collection.id}"
            ).fetchall()
        return {int(r[0]) for r in rows}

    assert set(ids) <= queued()
    assert worker_store.delete_items(collection=tiny_collection.name, ids=ids[:3]) == 3
    assert queued() & set(ids) == {ids[3]}
    assert worker_store.delete_items(collection=tiny_collection.name, external_ids=["gone3", "nothing"]) == 1
    assert not queued() & set(ids)


def test_query_samples_keep_only_the_most_recent(worker_engine, tiny_collection) -> None:
    from memstore.services.query_sampler import QuerySampler

    sampler = QuerySampler(Database(worker_engine), rate=1.0, keep=5)
    vectors = [np.full(64, i, dtype=np.float32) for i in range(1, 13)]
    for v in vectors:
        sampler.offer(tiny_collection.id, v)
        time.sleep(0.01)  # several batches, so trimming runs more than once
    sampler.close()
    with worker_engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT embedding FROM memstore_query_samples WHERE collection_id = %s ORDER BY id",
            (tiny_collection.id,),
        ).fetchall()
    kept = [float(np.asarray(r[0].to_numpy())[0]) for r in rows]
    assert kept == [8.0, 9.0, 10.0, 11.0, 12.0]


def test_a_sampler_draws_its_share_before_anything_is_looked_up(worker_engine) -> None:
    """The search route draws first and looks the collection up for the drawn queries only: the draw
    alone must keep the sampler's share."""
    import random

    from memstore.services.query_sampler import QuerySampler

    db = Database(worker_engine)
    random.seed(7)
    assert not any(QuerySampler(db, rate=0.0).draw() for _ in range(1000))
    assert all(QuerySampler(db, rate=1.0).draw() for _ in range(1000))
    drawn = sum(QuerySampler(db, rate=0.25).draw() for _ in range(4000))
    assert 850 <= drawn <= 1150  # 1,000 expected; seeded, so the same count every run


def test_failing_claims_locks_items_in_id_order_so_an_enqueue_cannot_deadlock_with_it(
    worker_engine, tiny_collection
) -> None:
    """Another transaction holds item 1 and will ask for item 2 next (an enqueue locks in id order).
    Failing the claims of [2, 1] must wait for item 1 before it takes item 2; taking them in claim
    order (2, then 1) deadlocked with that transaction."""
    import psycopg

    from memstore.db.core import dedicated_connection

    first, second = enqueue_texts(worker_engine, tiny_collection, 2, prefix="lockorder")
    claimer = Claimer(Database(worker_engine))
    other = dedicated_connection(worker_engine, application_name="test-other", autocommit=False)
    try:
        held = claims.claim(Database(worker_engine), claimer, limit=2, collection_id=tiny_collection.id)
        by_item = {c.item_id: c for c in held}
        table = f'"{tiny_collection.table_name}"'
        other.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", (first,))
        errors: list[BaseException] = []

        def fail() -> None:
            try:
                claims.fail(
                    Database(worker_engine),
                    [by_item[second], by_item[first]],
                    "test",
                    settings=IngestSettings(),
                    permanent=True,
                    collections={tiny_collection.id: tiny_collection},
                )
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=fail)
        t.start()
        deadline = time.monotonic() + 30
        # Until the failing transaction waits on a lock (autocommit: each read sees the current state).
        with dedicated_connection(worker_engine, application_name="test-watch") as watch:
            while time.monotonic() < deadline:
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                time.sleep(0.05)
        assert time.monotonic() < deadline, "the failing transaction never waited for item 1"
        other.execute("SET LOCAL lock_timeout = '10s'")
        try:
            other.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", (second,))
        except psycopg.errors.DeadlockDetected:
            pytest.fail("failing claims took item 2 before item 1: a deadlock with an enqueue")
        other.commit()
        t.join(30)
        assert not errors, errors
        assert item_states(worker_engine, tiny_collection)[second] == "failed"
    finally:
        other.close()
        claimer.close()


def test_a_decoder_failure_is_retried_and_a_rejected_input_fails_at_once(worker_engine, tiny_collection) -> None:
    """A decode worker that died (or memory run out) says nothing against the item: it goes back
    with its attempt counted, and is embedded on the next try. A real verdict on the input fails it."""
    from encoder.errors import DecodeUnavailableError, ImageRejectedError

    backend = FakeBackend()
    settings = IngestSettings(batch_size=100, max_attempts=3, backoff_base_s=0)
    worker = IngestWorker(Database(worker_engine), backend, settings=settings)
    [flaky] = enqueue_texts(worker_engine, tiny_collection, 1, prefix="flaky")
    backend.fail("flaky 0", 1, DecodeUnavailableError("the image decoder process stopped"))
    report = worker.run_batch()
    assert (report.retried, report.failed) == (1, 0)
    assert item_states(worker_engine, tiny_collection)[flaky] == "pending"
    assert worker.run(once=True) == 0
    assert item_states(worker_engine, tiny_collection)[flaky] == "ready"

    [bad] = enqueue_texts(worker_engine, tiny_collection, 1, prefix="bad")
    backend.fail("bad 0", 1, ImageRejectedError("corrupt image data"))
    report = worker.run_batch()
    assert (report.retried, report.failed) == (0, 1)
    assert item_states(worker_engine, tiny_collection)[bad] == "failed"
