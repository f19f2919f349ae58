"""Embedding spaces (memstore.spaces.lifecycle) through the store and real ingest workers: a second space is
filled from the stored originals through the queue, indexed, searched with ``using``, activated and
dropped; items written meanwhile reach every space; bare vectors block activation until given."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from encoder.types import EncoderInfo, Priority
from memstore.db import online_ddl
from memstore.db.core import Database, raw_connection
from memstore.errors import ConflictError, InvalidInputError, SpaceNotFoundError
from memstore.models import ItemIn
from memstore.queue import jobs
from memstore.queue.jobs import PendingItem
from memstore.settings import IngestSettings, Settings
from memstore.spaces import lifecycle
from memstore.store import VectorStore
from memstore.workers.ingest import IngestWorker
from memstore.workers.pacing import Pace
from memstore.workers.space_pass import INTERVAL_S, SpacePass
from tests.api.api_helpers import TINY, WIDE, FakeBackend


class TwoModels(FakeBackend):
    """The fake encoder with a second model of other dimensions (as MEMSTORE_MODELS runs two)."""

    def __init__(self) -> None:
        super().__init__(dimensions=64, model=TINY)
        self.wide = FakeBackend(dimensions=96, model=WIDE)
        self.infos = {TINY: self.info, WIDE: self.wide.info}
        self.by_model: dict[str, int] = {}

    def embed_texts(self, texts: list[str], *, priority: Priority = Priority.QUERY, model: str | None = None,
                    deadline_s: Any = None) -> Any:  # fmt: skip
        self.by_model[model or TINY] = self.by_model.get(model or TINY, 0) + len(texts)
        self.calls.append(("text", len(texts), priority))
        return (self.wide if model == WIDE else FakeBackend(64)).embed_texts(texts, priority=priority)


def _info(backend: TwoModels) -> EncoderInfo:
    return backend.wide.info


@pytest.fixture
def worker_store(worker_engine: sa.Engine, settings: Any) -> VectorStore:
    return VectorStore(worker_engine, settings=settings)


def _drain(engine: sa.Engine, backend: TwoModels) -> IngestWorker:
    worker = IngestWorker(Database(engine), backend, settings=IngestSettings(batch_size=64))
    assert worker.run(once=True) == 0
    return worker


def _texts(n: int, start: int = 0) -> list[PendingItem]:
    return [PendingItem(text=f"{i} is a note", external_id=f"t{i}", metadata={"n": i}) for i in range(start, n)]


def _queued(engine: sa.Engine, cid: int, space_id: int) -> int:
    with raw_connection(engine) as conn:
        row = conn.execute(
            "SELECT count(*) FROM memstore_ingest_queue WHERE collection_id = %s AND space_id = %s", (cid, space_id)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_new_space_is_filled_indexed_searched_activated_and_dropped(worker_engine, worker_store, collection_name):
    backend = TwoModels()
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    jobs.enqueue(Database(worker_engine), c, _texts(40))
    _drain(worker_engine, backend)

    space = worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    assert space.state == "filling" and space.table_name == f"c{c.id}_s{space.id}"
    before = worker_store.space_progress(collection=collection_name, name="wide")
    assert (before.vectors, before.total, before.active) == (0, 40, False)
    # Searches name the space they use; until it is filled it answers from what it has (an exact scan).
    assert worker_store.search(collection=collection_name, vector=np.ones(96), using="wide", k=5) == []
    with pytest.raises(ConflictError, match="still filling"):
        worker_store.activate_space(collection=collection_name, name="wide")

    worker = _drain(worker_engine, backend)
    assert worker.totals.written == 40 and backend.by_model[WIDE] == 40
    done = worker_store.space_progress(collection=collection_name, name="wide")
    assert (done.vectors, done.total, done.pending, done.failed) == (40, 40, 0, 0)
    assert done.space.state == "ready"
    with raw_connection(worker_engine) as conn:
        index = conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                             (space.index_name,)).fetchone()  # fmt: skip
    assert index == (True,)

    # The space holds the second model's vectors: a query by that model finds the text first.
    query = backend.wide.embed_texts(["7 is a note"])[0]
    hits = worker_store.search(collection=collection_name, vector=query, using="wide", k=3)
    assert hits[0].external_id == "t7" and hits[0].score == pytest.approx(1.0, abs=1e-5)
    # ... with filters and in hybrid mode too.
    filtered = worker_store.search(collection=collection_name, vector=query, using="wide", k=3, filter={"n": 9})
    assert [h.external_id for h in filtered] == ["t9"]
    hybrid = worker_store.search(collection=collection_name, vector=query, text="7", using="wide", k=3)
    assert hybrid[0].external_id == "t7" and hybrid[0].distance == pytest.approx(0.0, abs=1e-5)
    # The default space is untouched and still the one searched by default.
    own = FakeBackend(64).embed_texts(["7 is a note"])[0]
    assert worker_store.search(collection=collection_name, vector=own, k=1)[0].external_id == "t7"
    with pytest.raises(InvalidInputError, match="96"):
        worker_store.search(collection=collection_name, vector=own, using="wide", k=1)
    with pytest.raises(SpaceNotFoundError, match="has no space 'nope'"):
        worker_store.search(collection=collection_name, vector=own, using="nope", k=1)

    # Activation switches searches that name no space.
    worker_store.activate_space(collection=collection_name, name="wide")
    assert worker_store.search(collection=collection_name, vector=query, k=1)[0].external_id == "t7"
    with pytest.raises(ConflictError, match="activate another space first"):
        worker_store.delete_space(collection=collection_name, name="wide")
    with pytest.raises(ConflictError, match="cannot be dropped"):
        worker_store.delete_space(collection=collection_name, name="default")

    # Items written after the space exists get vectors in both spaces; a deleted item leaves both.
    jobs.enqueue(Database(worker_engine), c, _texts(45, start=40))
    assert _queued(worker_engine, c.id, space.id) == 5
    _drain(worker_engine, backend)
    assert worker_store.space_progress(collection=collection_name, name="wide").vectors == 45
    worker_store.delete_items(collection=collection_name, external_ids=["t0", "t41"])
    assert worker_store.space_progress(collection=collection_name, name="wide").vectors == 43
    # A changed original is embedded again into every space (its stale vector goes at once).
    jobs.enqueue(Database(worker_engine), c, [PendingItem(text="something else", external_id="t7")])
    assert worker_store.space_progress(collection=collection_name, name="wide").vectors == 42
    _drain(worker_engine, backend)
    moved = worker_store.search(collection=collection_name, vector=backend.wide.embed_texts(["something else"])[0], k=1)
    assert moved[0].external_id == "t7"

    # Back to default, then the wide space can go, with its table.
    worker_store.activate_space(collection=collection_name, name="default")
    worker_store.delete_space(collection=collection_name, name="wide")
    assert worker_store.get_collection(name=collection_name).spaces == ()
    with raw_connection(worker_engine) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (space.table_name,)).fetchone() == (None,)
        triggers = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND tgname LIKE 'memstore_spaces%%'",
            (c.table_name,),
        ).fetchone()
    assert triggers == (0,)
    assert _queued(worker_engine, c.id, space.id) == 0


def test_a_new_space_is_queued_at_the_next_step_not_after_the_registry_cache_time(
    worker_engine, worker_store, collection_name
):
    """A worker that has just listed the filling spaces sees a space created after that at its next
    step (INTERVAL_S), not once its listing is CACHE_SECONDS old."""
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    jobs.enqueue(Database(worker_engine), c, _texts(12))
    _drain(worker_engine, TwoModels())
    passer = SpacePass(Database(worker_engine))
    try:
        passer.step()  # lists the filling spaces now (the listing is then fresh for CACHE_SECONDS)
        space = worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
        time.sleep(INTERVAL_S + 0.1)
        passer.step()
        assert _queued(worker_engine, c.id, space.id) == 12
    finally:
        passer.close()


def test_a_space_index_build_takes_the_workers_the_pace_allows(
    worker_engine, worker_store, collection_name, monkeypatch
):
    """An index build cannot be paused once it runs: one that starts while searches are held back
    (the worker's pace at half) takes half the parallel workers, and one at full pace all of them."""

    class Half(Pace):
        def share(self) -> float:
            return 0.5

    full = Settings(max_parallel_maintenance_workers=4, background_build_workers=4)
    assert [online_ddl.paced_build_workers(full, s) for s in (1.0, 0.5, 0.3, 0.0)] == [4, 2, 1, 0]
    backend = TwoModels()
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    jobs.enqueue(Database(worker_engine), c, _texts(12))
    _drain(worker_engine, backend)
    space = worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    built_with: list[tuple[str, ...]] = []
    build = lifecycle.build_index

    def watched(conn: Any, c: Any, s: Any, **options: Any) -> bool:
        built = build(conn, c, s, **options)
        if built:  # the session's setting the build ran under
            built_with.append(conn.execute("SHOW max_parallel_maintenance_workers").fetchone())
        return built

    monkeypatch.setattr(lifecycle, "build_index", watched)
    worker = IngestWorker(Database(worker_engine), backend, settings=IngestSettings(batch_size=64), pace=Half())
    worker.spaces.settings = full
    assert worker.run(once=True) == 0
    assert worker_store.get_collection(name=collection_name, fresh=True).space("wide").state == "ready"
    assert built_with == [("2",)]
    with raw_connection(worker_engine) as raw:
        valid = raw.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", (space.index_name,))
        assert valid.fetchone() == (True,)


def test_bare_vectors_block_activation_until_their_vectors_are_given(worker_engine, worker_store, collection_name):
    backend = TwoModels()
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    rng = np.random.default_rng(3)
    worker_store.upsert_items(
        collection=collection_name,
        items=[ItemIn(vector=rng.standard_normal(64), external_id=f"v{i}") for i in range(3)],
    )
    jobs.enqueue(Database(worker_engine), c, _texts(5))
    _drain(worker_engine, backend)
    worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    _drain(worker_engine, backend)
    p = worker_store.space_progress(collection=collection_name, name="wide")
    assert (p.vectors, p.without_original, p.without_original_ids) == (5, 3, ["v0", "v1", "v2"])
    with pytest.raises(ConflictError, match=r"3 item\(s\).*v0, v1, v2"):
        worker_store.activate_space(collection=collection_name, name="wide")
    with pytest.raises(InvalidInputError, match="96"):
        worker_store.put_space_vectors(collection=collection_name, name="wide", vectors={"v0": [1.0] * 64})
    given = {f"v{i}": rng.standard_normal(96) for i in range(3)}
    assert worker_store.put_space_vectors(collection=collection_name, name="wide", vectors=given) == 3
    after = worker_store.space_progress(collection=collection_name, name="wide")
    assert (after.vectors, after.total, after.without_original) == (8, 8, 0)
    active = worker_store.activate_space(collection=collection_name, name="wide")
    assert active.active_space_name == "wide"
    hit = worker_store.search(collection=collection_name, vector=given["v1"], k=1)[0]
    assert hit.external_id == "v1"


def test_force_activates_without_the_bare_vectors(worker_engine, worker_store, collection_name):
    backend = TwoModels()
    worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    worker_store.upsert_items(collection=collection_name, items=[ItemIn(vector=[1.0] * 64, external_id="bare")])
    worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    _drain(worker_engine, backend)
    worker_store.activate_space(collection=collection_name, name="wide", force=True)
    assert worker_store.search(collection=collection_name, vector=[1.0] * 96, k=5) == []


def test_space_names_and_duplicates_are_refused(worker_store, collection_name):
    worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    for bad in ("default", "Upper", "1abc", "a" * 33, "semi;colon"):
        with pytest.raises(InvalidInputError):
            worker_store.create_space(collection=collection_name, name=bad, model=WIDE, dimensions=96)
    with pytest.raises(InvalidInputError, match="dimensions"):
        worker_store.create_space(collection=collection_name, name="big", model=WIDE, dimensions=5000)
    worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    with pytest.raises(ConflictError, match="already has a space 'wide'"):
        worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)


def test_dropping_the_collection_drops_its_spaces(worker_engine, worker_store, collection_name):
    worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    space = worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    worker_store.drop_collection(name=collection_name)
    with raw_connection(worker_engine) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (space.table_name,)).fetchone() == (None,)
        assert conn.execute("SELECT count(*) FROM memstore_spaces WHERE id = %s", (space.id,)).fetchone() == (0,)


def test_a_partitioned_collection_gets_spaces_too(worker_engine, worker_store, collection_name):
    backend = TwoModels()
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY, partitions=3)
    jobs.enqueue(Database(worker_engine), c, _texts(30))
    worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    _drain(worker_engine, backend)
    p = worker_store.space_progress(collection=collection_name, name="wide")
    assert (p.vectors, p.total, p.space.state) == (30, 30, "ready")
    query = backend.wide.embed_texts(["12 is a note"])[0]
    assert worker_store.search(collection=collection_name, vector=query, using="wide", k=1)[0].external_id == "t12"
    # The triggers reach every partition: a deleted item leaves the space, a new one enters it.
    worker_store.delete_items(collection=collection_name, external_ids=["t12", "t13"])
    jobs.enqueue(Database(worker_engine), c, _texts(31, start=30))
    _drain(worker_engine, backend)
    assert worker_store.space_progress(collection=collection_name, name="wide").vectors == 29


def test_items_that_failed_to_embed_block_activation_unless_forced(worker_engine, worker_store, collection_name):
    backend = TwoModels()
    c = worker_store.create_collection(name=collection_name, dimensions=64, model=TINY)
    jobs.enqueue(Database(worker_engine), c, _texts(4))
    _drain(worker_engine, backend)
    worker_store.create_space(collection=collection_name, name="wide", model=WIDE, dimensions=96)
    backend.wide.fail("2 is a note", 10, ValueError("this text cannot be embedded"))
    _drain(worker_engine, backend)
    p = worker_store.space_progress(collection=collection_name, name="wide")
    assert (p.vectors, p.failed, p.space.state) == (3, 1, "ready")
    # The item itself is untouched: its own vector is ready.
    assert worker_store.get_item(collection=collection_name, external_id="t2").status == "ready"
    with pytest.raises(ConflictError, match=r"1 item\(s\) .* could not be embedded"):
        worker_store.activate_space(collection=collection_name, name="wide")
    assert worker_store.activate_space(collection=collection_name, name="wide", force=True).active_space_name == "wide"
