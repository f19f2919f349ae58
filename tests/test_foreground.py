"""The foreground controller (memstore.services.foreground): its decision as a pure function, the
controller's loop on a given clock and given latencies, and how units of background work wait.

No database and no model: the worker side is tested with a real IngestWorker in
tests/api/test_foreground_api.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from encoder.types import Priority
from memstore.services.foreground import ForegroundController, Tuning, decide
from memstore.services.latency import p99
from memstore.settings import Settings
from memstore.workers.pacing import FULL_SPEED

T = Tuning()


# -- decide: a pure function ----------------------------------------------------------------------------


def test_over_the_target_the_share_is_cut_in_one_step() -> None:
    d = decide(1.0, 5, p99_ms=30.0, samples=20, target_ms=20.0)
    assert d.backed_off and d.calm == 0
    assert d.share == pytest.approx(0.5)  # at most half of it


def test_far_over_the_target_the_cut_follows_the_overshoot() -> None:
    d = decide(1.0, 0, p99_ms=100.0, samples=20, target_ms=20.0)
    assert d.backed_off and d.share == pytest.approx(0.2)  # target / p99


def test_a_cut_below_the_floor_is_zero_and_zero_stays_zero_while_slow() -> None:
    d = decide(0.08, 0, p99_ms=40.0, samples=20, target_ms=20.0)
    assert d.share == 0.0 and d.backed_off
    again = decide(0.0, 0, p99_ms=40.0, samples=20, target_ms=20.0)
    assert again.share == 0.0 and not again.backed_off  # nothing left to cut: not counted again


def test_recovery_waits_for_calm_ticks_in_a_row_then_adds_a_step() -> None:
    first = decide(0.2, 0, p99_ms=10.0, samples=20, target_ms=20.0)
    assert first.share == 0.2 and first.calm == 1  # hysteresis: one calm tick is not enough
    second = decide(first.share, first.calm, p99_ms=10.0, samples=20, target_ms=20.0)
    assert second.share == pytest.approx(0.2 + T.step) and not second.backed_off
    share, calm = second.share, second.calm
    for _ in range(20):
        d = decide(share, calm, p99_ms=10.0, samples=20, target_ms=20.0)
        share, calm = d.share, d.calm
    assert share == 1.0  # bounded


def test_between_relax_and_target_the_share_holds_and_calm_restarts() -> None:
    d = decide(0.4, 1, p99_ms=18.0, samples=20, target_ms=20.0)  # 0.9 x target
    assert d.share == 0.4 and d.calm == 0 and not d.backed_off


def test_too_few_searches_judge_nothing_and_none_at_all_is_calm() -> None:
    few = decide(0.4, 1, p99_ms=500.0, samples=T.min_samples - 1, target_ms=20.0)
    assert few.share == 0.4 and not few.backed_off
    none = decide(0.4, 1, p99_ms=None, samples=0, target_ms=20.0)
    assert none.share == pytest.approx(0.4 + T.step)  # nobody searches: nothing to protect


def test_no_target_means_full_share_and_shares_are_bounded() -> None:
    assert decide(0.1, 0, p99_ms=500.0, samples=20, target_ms=None).share == 1.0
    assert decide(7.0, 9, p99_ms=1.0, samples=20, target_ms=20.0).share == 1.0
    assert decide(-3.0, 0, p99_ms=500.0, samples=20, target_ms=20.0).share == 0.0


def test_p99_of_few_values_is_their_maximum() -> None:
    assert p99([]) is None
    assert p99([0.1, 0.3, 0.2]) == 0.3
    assert p99([float(i) for i in range(1000)]) == 989.0


# -- the controller on a given clock ----------------------------------------------------------------------


class Feed:
    """Search latencies by time, as memstore.services.latency.LatencyTracker.since gives them."""

    def __init__(self) -> None:
        self.now = 100.0
        self.samples: list[tuple[float, float]] = []

    def clock(self) -> float:
        return self.now

    def since(self, start: float) -> list[tuple[float, float]]:
        return [(t, s) for t, s in self.samples if t >= start]

    def searches(self, seconds: float, latency_s: float, rate: int = 40) -> None:
        """``seconds`` of searches at ``rate`` a second, each taking ``latency_s``; the clock moves on."""
        n = int(seconds * rate)
        for i in range(n):
            self.samples.append((self.now + i / rate, latency_s))
        self.now += seconds


def controller(feed: Feed, **kwargs: object) -> ForegroundController:
    return ForegroundController(feed.since, window_s=1.0, clock=feed.clock, **kwargs)  # type: ignore[arg-type]


def test_backs_off_within_one_window_of_slow_searches_and_recovers_when_they_hold() -> None:
    feed = Feed()
    fg = controller(feed, slo_ms=20.0)
    feed.searches(1.0, 0.005)
    assert fg.tick().share == 1.0
    feed.searches(0.25, 0.080)  # searches slow down: the next tick cuts
    d = fg.tick()
    assert d.backed_off and fg.share() < 0.5 and fg.backoffs == 1
    assert fg.last_backoff is not None and fg.last_backoff["share_before"] == 1.0
    cut = fg.share()
    feed.now += 0.25  # no search answered since the cut: the same slow window does not cut twice
    assert fg.tick().share == cut and fg.backoffs == 1
    for _ in range(60):  # searches fast again: capacity comes back, all of it
        feed.searches(0.25, 0.005)
        fg.tick()
    assert fg.share() == 1.0 and fg.backoffs == 1
    state = fg.state()
    assert state["background_share"] == 1.0 and state["backoffs"] == 1 and state["target_p99_ms"] == 20.0


def test_without_an_slo_the_target_is_a_multiple_of_the_idle_baseline() -> None:
    feed = Feed()
    fg = controller(feed, baseline_factor=2.0)
    assert fg.target_ms() is None
    for _ in range(8):  # searches with no background work: the baseline
        feed.searches(0.25, 0.004)
        fg.tick()
    assert fg.target_ms() == pytest.approx(8.0)
    feed.searches(0.25, 0.030)
    assert fg.tick().backed_off


def fast_ticks(feed: Feed, fg: ForegroundController, n: int) -> None:
    """``n`` ticks of a quarter window, each after a quarter window of 4 ms searches."""
    for _ in range(n):
        feed.searches(0.25, 0.004)
        fg.tick()


def assert_idle_again_a_window_after(feed: Feed, fg: ForegroundController) -> None:
    """Background work just ended: the next window is not idle (no baseline), the ones after are."""
    fast_ticks(feed, fg, 3)
    assert fg.state()["baseline_windows"] == 0
    fast_ticks(feed, fg, 6)
    assert fg.state()["baseline_windows"] > 0


def test_windows_with_background_work_do_not_enter_the_baseline() -> None:
    feed = Feed()
    fg = controller(feed)
    stop = threading.Event()
    with fg.unit(stop) as u:
        u.did(1)
    assert_idle_again_a_window_after(feed, fg)


def test_unpaced_work_is_never_held_back_and_keeps_its_windows_out_of_the_baseline() -> None:
    """``working``: work that waits its own way (a maintenance statement) runs even at a share of
    zero, and the windows while it runs, and one after, are not idle."""
    feed = Feed()
    fg = controller(feed)
    fg.force(0.0)
    with fg.working("vacuum") as u:  # a unit() would wait here for as long as the share is zero
        u.did(1)
        assert fg.state()["unpaced_running"] == 1
        fast_ticks(feed, fg, 8)  # however long it runs
        assert fg.state()["baseline_windows"] == 0
    assert fg.state()["unpaced_running"] == 0 and fg.state()["units_done"] == {"vacuum": 1}
    assert_idle_again_a_window_after(feed, fg)


def test_switched_off_the_share_stays_full() -> None:
    feed = Feed()
    fg = controller(feed, slo_ms=5.0, enabled=False)
    feed.searches(1.0, 0.5)
    assert fg.tick().share == 1.0 and fg.backoffs == 0


def test_from_settings_reads_the_slo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMSTORE_SEARCH_P99_SLO_MS", "25")
    monkeypatch.setenv("MEMSTORE_BACKGROUND_CONNECTIONS", "3")
    fg = ForegroundController.from_settings(Settings(), lambda start: [])
    assert fg.slo_ms == 25.0 and fg.connections == 3 and fg.enabled


# -- units of background work ----------------------------------------------------------------------------


def test_a_unit_waits_while_the_share_is_zero_and_runs_when_it_returns() -> None:
    fg = ForegroundController(lambda start: [])
    fg.force(0.0)
    stop = threading.Event()
    ran = threading.Event()

    def work() -> None:
        with fg.unit(stop, "test") as u:
            ran.set()
            u.did(1)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    assert not ran.wait(0.5)
    assert fg.state()["units_waiting"] == 1
    fg.force(1.0)
    assert ran.wait(5)
    t.join(5)
    assert fg.state()["units_done"] == {"test": 1}


def test_a_waiting_unit_is_let_go_when_its_worker_stops() -> None:
    fg = ForegroundController(lambda start: [])
    fg.force(0.0)
    stop = threading.Event()
    t = threading.Thread(target=lambda: fg.unit(stop).__enter__(), daemon=True)
    t.start()
    time.sleep(0.2)
    stop.set()
    t.join(5)
    assert not t.is_alive()


def test_the_share_bounds_the_units_running_at_once() -> None:
    fg = ForegroundController(lambda start: [], connections=4)
    fg.force(0.25)  # ceil(0.25 x 4) = 1 at a time
    stop, release = threading.Event(), threading.Event()
    running: list[int] = []
    most = [0]
    lock = threading.Lock()

    def work() -> None:
        with fg.unit(stop):
            with lock:
                running.append(1)
                most[0] = max(most[0], len(running))
            release.wait(0.2)
            with lock:
                running.pop()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 1
    fg.force(1.0)
    assert fg.state()["background_connections"] == 4


def test_a_unit_is_followed_by_a_pause_by_the_share() -> None:
    """At share 0.5 a unit that ran ~0.2 s is followed by ~0.2 s without work in that thread."""
    fg = ForegroundController(lambda start: [])
    fg.force(0.5)
    stop = threading.Event()
    with fg.unit(stop) as u:
        time.sleep(0.2)
        u.did(1)
    started = time.monotonic()
    with fg.unit(stop):
        waited = time.monotonic() - started
    assert waited >= 0.15
    with fg.unit(stop):  # the last unit did nothing: no pause after it
        pass


def test_no_pace_never_waits() -> None:
    stop = threading.Event()
    with FULL_SPEED.unit(stop) as u:
        u.did(3)
    assert FULL_SPEED.share() == 1.0 and u.work == 3


def test_the_encoder_gets_the_share() -> None:
    class Engine:
        background_share = 1.0

    fg = ForegroundController(lambda start: [])
    engine = Engine()
    fg.attach_encoder(engine)
    fg.force(0.3)
    assert engine.background_share == 0.3
    fg.close()
    assert engine.background_share == 1.0


def test_the_engine_holds_background_batches_alone_while_its_share_is_zero() -> None:
    """encoder.engine: background units alone wait at share 0; a query runs at once (and takes
    waiting background units along in its batch)."""
    from encoder.engine import EmbeddingEngine
    from tests.encoder.enc_helpers import FakeEncoder, settings_for

    engine = EmbeddingEngine(FakeEncoder(batch_size=4), settings_for(batch_size=4))
    engine.background_share = 0.0
    bulk = engine.submit_texts(["a", "b"], priority=Priority.BACKGROUND)
    assert engine.tick() is None and not bulk.done()
    query = engine.submit_texts(["q"], priority=Priority.QUERY)
    report = engine.tick()
    assert report is not None and query.done()
    engine.background_share = 1.0
    while engine.tick() is not None:
        pass
    assert bulk.done()


def test_the_switch_interval_is_short_while_a_model_loads_and_restored_after() -> None:
    import sys

    from memstore.services.encoder_host import LOAD_SWITCH_INTERVAL_S, _yielding

    before = sys.getswitchinterval()
    with _yielding(True):
        assert sys.getswitchinterval() == pytest.approx(LOAD_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before
    with _yielding(False):
        assert sys.getswitchinterval() == before
