"""The engine with a fake model whose cost is counted in ticks (no torch model, no timing)."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError

import numpy as np
import pytest

from encoder.engine import EmbeddingEngine
from encoder.errors import (
    DecompressionBombError,
    ImageRejectedError,
    QueueFullError,
    RequestCancelledError,
    RequestTooLargeError,
)
from encoder.scheduling import plan_batch, plan_fifo
from encoder.types import ImageEmbedding, Priority
from tests.encoder.enc_helpers import FakeEncoder, make_image, settings_for

BIG = make_image(128, 128, seed=1)  # 16-px fake model: global view + 8x8 = 64 tiles = 65 units
SMALL = make_image(20, 20, seed=2)  # one unit


def engine_for(fake: FakeEncoder, planner=plan_batch, **overrides) -> EmbeddingEngine:
    """An engine driven by hand through tick(); fixed all-query shares keep the tests clock-free."""
    return EmbeddingEngine(
        fake, settings_for(batch_size=fake.batch_size, **overrides), planner=planner, adaptive_shares=False
    )


def ticks_until(engine: EmbeddingEngine, future, limit: int = 100) -> int:
    for n in range(1, limit + 1):
        assert engine.tick() is not None, "engine idle before the future resolved"
        if future.done():
            return n
    raise AssertionError(f"not done after {limit} ticks")


def test_small_request_behind_a_64_tile_image_finishes_in_the_next_tick(fake):
    engine = engine_for(fake)
    big = engine.submit_images([BIG], priority=Priority.QUERY)
    engine.tick()  # the big image is already being worked on
    small = engine.submit_images([SMALL], priority=Priority.QUERY)
    assert ticks_until(engine, small) == 1
    assert not big.done()
    assert ticks_until(engine, big) == 7  # 66 units at B=8: 9 ticks in all, one shared with the small
    assert fake.units == 66


def test_fifo_baseline_blocks_the_same_small_request_behind_the_whole_image():
    fake = FakeEncoder()
    engine = engine_for(fake, planner=plan_fifo)
    engine.submit_images([BIG])
    engine.tick()
    small = engine.submit_images([SMALL])
    assert ticks_until(engine, small) == 8  # head-of-line blocking: what the scheduler removes


def test_several_huge_images_still_leave_room_for_small_ones(fake):
    engine = engine_for(fake)
    bigs = [engine.submit_images([BIG], priority=Priority.BACKGROUND) for _ in range(3)]
    engine.tick()
    smalls = [engine.submit_images([make_image(20, 20, seed=10 + i)], priority=Priority.BACKGROUND) for i in range(4)]
    engine.tick()
    assert all(s.done() for s in smalls)  # even in the same class: fair share, not priority
    assert not any(b.done() for b in bigs)


def test_queries_overtake_bulk_and_deadlines_order_a_class(fake):
    engine = engine_for(fake)
    bulk = engine.submit_texts([f"doc {i}" for i in range(40)], priority=Priority.BACKGROUND)
    engine.tick()
    # Twelve one-text sync requests; later arrivals carry earlier deadlines.
    sync = [engine.submit_texts([f"s{i}"], priority=Priority.SYNC_INGEST, deadline_s=12.0 - i) for i in range(12)]
    query = engine.submit_texts(["q"], priority=Priority.QUERY, deadline_s=60.0)
    engine.tick()
    assert query.done()
    assert [f.done() for f in sync] == [False] * 5 + [True] * 7  # the 7 earliest deadlines
    engine.tick()
    assert all(f.done() for f in sync) and not bulk.done()
    assert ticks_until(engine, bulk) == 4


def test_results_go_back_to_their_own_requests(fake):
    engine = engine_for(fake)
    texts = [f"text number {i}" for i in range(21)]
    fut = engine.submit_texts(texts)
    other = engine.submit_texts(["another"])
    while not (fut.done() and other.done()):
        engine.tick()
    expected = np.stack([fake.text_vector(t) for t in texts])
    np.testing.assert_allclose(fut.result(), expected, rtol=1e-6)
    np.testing.assert_allclose(other.result()[0], fake.text_vector("another"), rtol=1e-6)


def test_per_tile_vectors_come_back_when_asked(fake):
    engine = engine_for(fake)
    fut = engine.submit_images([BIG, SMALL], return_tiles=True)
    while not fut.done():
        engine.tick()
    big, small = fut.result()
    assert isinstance(big, ImageEmbedding)
    assert big.grid == (8, 8) and big.tiles.shape == (64, 8) and len(big.boxes) == 64
    assert small.grid == (0, 0) and small.tiles.shape == (0, 8)
    assert np.array_equal(small.vector, small.global_vector)
    assert np.linalg.norm(big.vector) == pytest.approx(1.0, abs=1e-5)


def test_queue_limits_fail_fast_with_retry_after(fake):
    engine = engine_for(fake, queue_units_query=10, queue_units_background=100)
    engine.submit_texts(["x"] * 8)
    with pytest.raises(QueueFullError, match="query queue is full") as info:
        engine.submit_texts(["y"] * 3)
    assert info.value.retry_after > 0
    engine.submit_texts(["z"] * 50, priority=Priority.BACKGROUND)  # other classes have their own room
    with pytest.raises(RequestTooLargeError, match="split it"):
        engine.submit_texts(["w"] * 11)
    engine.tick()  # frees the query room
    engine.submit_texts(["y"] * 3)
    stats = engine.stats()["queues"]
    assert stats["query"]["units"] == 3 and stats["background"]["units"] == 50


def test_cancelling_drops_the_remaining_tiles(fake):
    engine = engine_for(fake)
    big = engine.submit_images([BIG])
    engine.tick()
    assert big.cancel()
    assert engine.tick() is None  # nothing left to run: the 57 remaining units were dropped
    assert fake.units == 8
    assert engine.stats()["queues"]["query"]["units"] == 0
    with pytest.raises(CancelledError):
        big.result()


def test_blocking_helper_timeout_cancels_the_request(fake):
    engine = engine_for(fake)  # never started: nothing will run
    with pytest.raises(RequestCancelledError, match="no result within"):
        engine.embed_texts(["never"], timeout=0.05)
    assert engine.tick() is None


def test_bad_images_fail_at_once_or_through_the_future(fake):
    engine = engine_for(fake)
    with pytest.raises(ImageRejectedError):
        engine.submit_images([b"not an image"])
    with pytest.raises(DecompressionBombError):
        EmbeddingEngine(fake, settings_for(max_image_pixels=100)).submit_images([SMALL])
    truncated = make_image(300, 300)[:2000]
    fut = engine.submit_images([SMALL, truncated])
    with pytest.raises(ImageRejectedError, match="corrupt or truncated"):
        fut.result(timeout=5)
    assert engine.stats()["queues"]["query"]["units"] == 0  # its queue room is given back
    with pytest.raises(TypeError):
        engine.submit_texts("a string, not a list")


def test_threaded_engine_with_preprocessing_pool(fake):
    engine = EmbeddingEngine(fake, settings_for(batch_size=8, preprocess_workers=2))
    with engine:
        futures = []

        def client(k):
            for i in range(5):
                futures.append((f"t{k}-{i}", engine.submit_texts([f"t{k}-{i}"], priority=Priority.QUERY)))
                futures.append((None, engine.submit_images([BIG if i == 0 else SMALL], priority=Priority.BACKGROUND)))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for text, fut in futures:
            result = fut.result(timeout=30)
            if text is not None:
                np.testing.assert_allclose(result[0], fake.text_vector(text), rtol=1e-6)
            else:
                assert result.shape == (1, 8)
        assert engine.stats()["running"]
    assert not engine.stats()["running"]
    with pytest.raises(RequestCancelledError):
        engine.submit_texts(["after stop"])


def test_stop_fails_what_is_still_queued(fake):
    engine = engine_for(fake)
    waiting = engine.submit_texts(["a"] * 20)
    engine.tick()
    engine.stop()
    assert isinstance(waiting.exception(timeout=5), RequestCancelledError)
    assert engine.stats()["queues"]["query"]["units"] == 0


def test_stats_and_metrics_describe_the_queues(fake):
    engine = engine_for(fake)
    engine.submit_images([BIG], priority=Priority.SYNC_INGEST)
    engine.submit_texts(["q"])
    s = engine.stats()
    assert s["queues"]["sync_ingest"] == {
        "requests": 1,
        "units": 65,
        "ready": 65,
        "preprocessing": 0,
        "limit": 2048,
        "encoded_bytes": 0,  # decoded already (in the submitting thread)
        "encoded_bytes_limit": 256 * 1024 * 1024,
    }
    assert s["queues"]["query"]["units"] == 1 and s["batch_size"] == 8
    engine.tick()
    from prometheus_client import generate_latest

    text = generate_latest(engine.metrics.registry).decode()
    for name in (
        'encoder_queue_units{class="sync_ingest"} 65.0',
        "encoder_batch_fill_ratio_bucket",
        "encoder_request_latency_seconds_bucket",
        "encoder_units_per_second",
        "encoder_units_total",
    ):
        assert name in text


def test_one_tenants_images_do_not_hold_every_preprocessing_thread(fake, monkeypatch):
    """One preprocessing thread; tenant A submits six images, then tenant B one: B's is decoded
    second (after the one of A's already started), not seventh."""
    import contextvars
    import time

    from encoder import engine as engine_module
    from encoder.tenancy import TENANT

    order: list[str] = []
    started = threading.Event()
    real = engine_module.load_views

    def recorded(blob, probe, plan, spec, **kwargs):
        order.append("B" if blob == b_image else "A")
        started.set()
        time.sleep(0.05)  # a slow decode: the queue fills behind it
        return real(blob, probe, plan, spec, **kwargs)

    monkeypatch.setattr(engine_module, "load_views", recorded)
    b_image = make_image(40, 30, seed=9)
    engine = EmbeddingEngine(fake, settings_for(batch_size=8, preprocess_workers=1))
    with engine:

        def submit(tenant: str, images: list[bytes]):
            context = contextvars.copy_context()
            context.run(TENANT.set, tenant)
            return context.run(engine.submit_images, images, priority=Priority.BACKGROUND)

        a = [submit("key:a", [make_image(32, 32, seed=i)]) for i in range(6)]
        started.wait(5)
        b = submit("key:b", [b_image])
        for fut in [*a, b]:
            assert fut.result(timeout=30).shape == (1, 8)
    assert order.index("B") <= 2, order
    assert len(order) == 7


def test_only_the_decodes_verdicts_blame_the_image(fake, monkeypatch):
    """Every failure while preparing the views was reported as ImageRejectedError ("cannot decode
    image"), which ingest fails for good: memory running out is DecodeUnavailableError (retried), a
    fault in this code is itself, and the decode's own verdicts and the imaging library's errors on
    bad data blame the image."""
    import encoder.engine as engine_module
    from encoder.errors import DecodeUnavailableError

    engine = engine_for(fake)
    for raised, expected in [
        (MemoryError(), DecodeUnavailableError),
        (RuntimeError("a bug"), RuntimeError),
        (DecodeUnavailableError("a decode worker died"), DecodeUnavailableError),
        (ImageRejectedError("corrupt"), ImageRejectedError),
        (OSError("image file is truncated"), ImageRejectedError),  # Pillow's word on bad data
        (SyntaxError("not a PNG file"), ImageRejectedError),
    ]:

        def failing(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(engine_module, "load_views", failing)
        fut = engine.submit_images([SMALL])
        error = fut.exception(timeout=5)
        assert type(error) is expected, (raised, error)
        if expected is not ImageRejectedError:
            assert not isinstance(error, ImageRejectedError)
        assert engine.stats()["queues"]["query"]["units"] == 0


def test_encoded_images_waiting_to_be_decoded_are_bounded_in_bytes_per_class(fake, held_decodes):
    """Admission counted model units only, while each admitted image keeps its file until a decoding
    thread reaches it: the queues could hold (512 + 2048 + 4096) files of up to 32 MiB. Each class
    now has a byte budget for them, given back as images are decoded or their request is dropped."""
    gate = held_decodes
    size = len(SMALL)
    engine = engine_for(fake, preprocess_workers=1, queue_bytes_background=2 * size)

    def waiting(label: str) -> int:
        return engine.stats()["queues"][label]["encoded_bytes"]

    try:
        first = engine.submit_images([SMALL], priority=Priority.BACKGROUND)
        second = engine.submit_images([SMALL], priority=Priority.BACKGROUND)
        assert waiting("background") == 2 * size
        with pytest.raises(QueueFullError, match="MEMSTORE_ENCODER_QUEUE_BYTES_BACKGROUND") as info:
            engine.submit_images([SMALL], priority=Priority.BACKGROUND)
        assert info.value.retry_after > 0
        query = engine.submit_images([SMALL], priority=Priority.QUERY)  # each class has its own budget
        assert waiting("query") == size

        second.cancel()  # cancelled before its decode: its bytes go at the next tick
        engine.tick()
        assert waiting("background") == size
        third = engine.submit_images([SMALL], priority=Priority.BACKGROUND)
        with pytest.raises(QueueFullError):
            engine.submit_images([SMALL], priority=Priority.BACKGROUND)

        gate.set()  # decoded: the room comes back, before the model has run any of them
        for _ in range(10_000):
            if waiting("background") == waiting("query") == 0:
                break
            threading.Event().wait(0.001)
        assert waiting("background") == 0 and waiting("query") == 0
        futures = [first, third, query]
        assert not any(f.done() for f in futures)
        for _ in range(10_000):
            if all(f.done() for f in futures):
                break
            engine.tick()
            threading.Event().wait(0.001)
        assert all(f.result().shape == (1, 8) for f in futures)
        # The cancelled image's job, run meanwhile, gave back nothing more.
        assert waiting("background") == 0 and waiting("query") == 0
        # A request larger than the whole budget is admitted while no other image of its class waits.
        big = engine.submit_images([SMALL] * 3, priority=Priority.BACKGROUND)
        assert waiting("background") == 3 * size
        with pytest.raises(QueueFullError):
            engine.submit_images([SMALL], priority=Priority.BACKGROUND)
        big.cancel()
        engine.tick()
        assert waiting("background") == 0
    finally:
        gate.set()
        engine.stop()


def test_a_failed_image_gives_its_bytes_back(fake):
    engine = engine_for(fake, preprocess_workers=0, queue_bytes_query=10 * len(SMALL))
    broken = SMALL[: len(SMALL) // 2]  # the header passes, the pixel data is cut
    fut = engine.submit_images([broken, SMALL])
    with pytest.raises(ImageRejectedError):
        fut.result(0)
    assert engine.stats()["queues"]["query"]["encoded_bytes"] == 0
