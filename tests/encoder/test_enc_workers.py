"""The preprocessing pool: urgency order, and a lane that keeps small pictures out of huge decodes' way."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from encoder import engine as engine_module
from encoder.engine import EmbeddingEngine
from encoder.images import ImageOptions, is_light, plan_for, probe_image
from encoder.types import Priority
from encoder.workers import PriorityPool
from tests.encoder.enc_helpers import FakeEncoder, make_image, settings_for


def key(priority: Priority, share: int = 0, deadline: float = 0.0) -> tuple[int, int, float]:
    """The engine's job key: class, the tenant's place, deadline."""
    return (-int(priority), share, deadline)


QUERY, BACKGROUND = key(Priority.QUERY), key(Priority.BACKGROUND)


class Recorder:
    """Jobs that record when they start and, when gated, wait for the test to let them finish."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.lock = threading.Lock()
        self.started = threading.Semaphore(0)
        self.gates: dict[str, threading.Event] = {}

    def job(self, name: str, gated: bool = False):
        gate = self.gates.setdefault(name, threading.Event())
        if not gated:
            gate.set()

        def run() -> None:
            with self.lock:
                self.order.append(name)
            self.started.release()
            assert gate.wait(10), f"job {name} was never released"

        return run

    def wait_started(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=10), f"only {len(self.order)} jobs started: {self.order}"


def test_with_one_thread_a_light_job_overtakes_every_waiting_heavy_one():
    pool, rec = PriorityPool(1), Recorder()
    try:
        pool.submit(QUERY, rec.job("heavy-0", gated=True), heavy=True)
        rec.wait_started(1)
        for i in range(1, 5):
            pool.submit(QUERY, rec.job(f"heavy-{i}"), heavy=True)
        pool.submit(QUERY, rec.job("light"))
        assert (pool.state()["light_waiting"], pool.state()["heavy_waiting"]) == (1, 4)
        rec.gates["heavy-0"].set()
        rec.wait_started(5)
    finally:
        pool.shutdown()
    assert rec.order == ["heavy-0", "light", "heavy-1", "heavy-2", "heavy-3", "heavy-4"]


def test_heavy_jobs_keep_half_the_threads_while_light_ones_stream_in():
    """Two threads: while light jobs wait, one thread stays with the heavy ones (they progress), and
    a light job waits for no heavy decode once a thread is free."""
    pool, rec = PriorityPool(2), Recorder()
    assert pool.heavy_reserve == 1
    try:
        pool.submit(QUERY, rec.job("heavy-0", gated=True), heavy=True)
        pool.submit(QUERY, rec.job("heavy-1", gated=True), heavy=True)
        rec.wait_started(2)  # both threads inside a heavy decode
        pool.submit(QUERY, rec.job("heavy-2", gated=True), heavy=True)
        for i in range(3):
            pool.submit(QUERY, rec.job(f"light-{i}", gated=True))
        rec.gates["heavy-0"].set()  # a thread frees: one heavy still runs, so it takes a light job
        rec.wait_started(1)
        assert rec.order[-1] == "light-0"
        rec.gates["heavy-1"].set()  # no heavy runs now: the reserve takes the next heavy job
        rec.wait_started(1)
        assert rec.order[-1] == "heavy-2"
        for name in ("light-0", "heavy-2", "light-1", "light-2"):
            rec.gates[name].set()
        rec.wait_started(2)
    finally:
        pool.shutdown()
    assert rec.order[:4] == ["heavy-0", "heavy-1", "light-0", "heavy-2"]
    assert set(rec.order[4:]) == {"light-1", "light-2"}  # two threads freed together: either first


def test_a_higher_class_goes_first_light_or_heavy():
    pool, rec = PriorityPool(1), Recorder()
    try:
        pool.submit(QUERY, rec.job("busy", gated=True))
        rec.wait_started(1)
        pool.submit(BACKGROUND, rec.job("background-light"))
        pool.submit(QUERY, rec.job("query-heavy"), heavy=True)
        pool.submit(QUERY, rec.job("query-light"))
        rec.gates["busy"].set()
        rec.wait_started(3)
    finally:
        pool.shutdown()
    assert rec.order == ["busy", "query-light", "query-heavy", "background-light"]


@pytest.mark.parametrize(("heavy_tenant", "expected"), [("b", "heavy"), ("a", "light")])
def test_across_tenants_places_decide_between_the_lanes(heavy_tenant, expected):
    """One thread. Another tenant's first huge image goes before this tenant's fifth small one; this
    tenant's own huge image, though its place is lower, waits for its small ones."""
    pool, rec = PriorityPool(1), Recorder()
    try:
        pool.submit(QUERY, rec.job("busy", gated=True))
        rec.wait_started(1)
        pool.submit(key(Priority.QUERY, share=4), rec.job("light"), tenant="a")
        pool.submit(key(Priority.QUERY, share=0), rec.job("heavy"), heavy=True, tenant=heavy_tenant)
        rec.gates["busy"].set()
        rec.wait_started(2)
    finally:
        pool.shutdown()
    assert rec.order[1] == expected, rec.order


def test_gc_freeze_reads_the_cores_variable(monkeypatch):
    monkeypatch.setenv("MEMSTORE_GC_FREEZE", "false")
    assert settings_for().gc_freeze is False
    monkeypatch.delenv("MEMSTORE_GC_FREEZE")
    assert settings_for().gc_freeze is True


def test_shutdown_drops_jobs_not_started_and_returns_promptly():
    pool, rec = PriorityPool(1), Recorder()
    pool.submit(QUERY, rec.job("running", gated=True))
    rec.wait_started(1)
    pool.submit(QUERY, rec.job("never"))
    threading.Timer(0.05, rec.gates["running"].set).start()
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 5
    pool.submit(QUERY, rec.job("after"))  # dropped: nothing would ever run it
    assert (pool.state()["light_waiting"], pool.state()["heavy_waiting"]) == (0, 0)
    assert rec.order == ["running"]
    with pytest.raises(ValueError):
        PriorityPool(0)


@pytest.mark.parametrize(
    ("image", "max_tiles", "light"),
    [
        (make_image(200, 150, "JPEG", quality=90), 0, True),
        (make_image(64, 64), 0, True),
        (make_image(200, 150, "JPEG", quality=90, progressive=True), 0, False),  # decoded in a worker process
        (make_image(1200, 1000, "JPEG", quality=90), 0, False),  # over a megapixel
        (make_image(200, 150, "JPEG", quality=90), 16, False),  # tiled: many views
    ],
)
def test_light_images_are_one_view_of_a_small_cheaply_decoded_picture(image, max_tiles, light):
    fake = FakeEncoder(image_size=16)
    options = ImageOptions(max_tiles=max_tiles)
    probe = probe_image(image, options)
    assert is_light(image, probe, plan_for(probe, fake.spec, options)) is light


def test_a_small_picture_is_not_decoded_behind_a_burst_of_huge_ones(monkeypatch):
    """Two decoding threads, one tenant, one class: six tiled images arrive, then a small one. It
    is decoded as soon as a thread frees, not seventh (the pool's order alone put it seventh)."""
    fake = FakeEncoder(batch_size=8, image_size=16)
    order: list[str] = []
    lock = threading.Lock()
    real = engine_module.load_views
    small = make_image(12, 10, seed=5)
    submitted = threading.Event()

    def slow(blob, probe, plan, spec, **kwargs):
        with lock:
            order.append("small" if blob == small else "big")
        if blob != small:
            assert submitted.wait(10)  # a slow decode: the queue fills behind it
        return real(blob, probe, plan, spec, **kwargs)

    monkeypatch.setattr(engine_module, "load_views", slow)
    engine = EmbeddingEngine(fake, settings_for(batch_size=8, preprocess_workers=2, max_tiles=64))
    with engine:
        context = contextvars.copy_context()
        bigs = [context.run(engine.submit_images, [make_image(128, 128, seed=i)]) for i in range(6)]
        late = context.run(engine.submit_images, [small])
        submitted.set()
        assert late.result(timeout=30).shape == (1, 8)
        for fut in bigs:
            assert fut.result(timeout=30).shape == (1, 8)
    assert order.index("small") <= 3, order  # the pool's order alone: 6
    assert len(order) == 7
    pool = engine.stats()["preprocessing_pool"]
    assert pool is not None and pool["threads"] == 2 and pool["heavy_reserve"] == 1


def test_the_pool_reports_its_lanes():
    """stats() and /metrics show what waits and runs in each lane."""
    from prometheus_client import generate_latest

    fake = FakeEncoder(batch_size=8, image_size=16)
    engine = EmbeddingEngine(fake, settings_for(batch_size=8, preprocess_workers=1, max_tiles=64))
    pool, rec = engine._pool, Recorder()
    assert pool is not None
    try:
        pool.submit(QUERY, rec.job("heavy", gated=True), heavy=True)
        rec.wait_started(1)
        pool.submit(QUERY, rec.job("light-0"))
        pool.submit(QUERY, rec.job("light-1"))
        state = engine.stats()["preprocessing_pool"]
        assert state == {
            "threads": 1,
            "heavy_reserve": 0,
            "light_waiting": 2,
            "heavy_waiting": 0,
            "light_running": 0,
            "heavy_running": 1,
        }
        text = generate_latest(engine.metrics.registry).decode()
        assert 'encoder_preprocess_jobs{lane="light",state="waiting"} 2.0' in text
        assert 'encoder_preprocess_jobs{lane="heavy",state="running"} 1.0' in text
        rec.gates["heavy"].set()
        rec.wait_started(2)
    finally:
        engine.stop()
    assert EmbeddingEngine(fake, settings_for(batch_size=8, preprocess_workers=0)).stats()["preprocessing_pool"] is None
