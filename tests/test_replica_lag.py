"""``memstore.db.replica_lag.PrimaryTimeline``: a standby's lag read from the primary's WAL positions
(pure; the standbys themselves are in tests/test_replicas.py)."""

from __future__ import annotations

from memstore.db.replica_lag import PrimaryTimeline


def test_a_standby_with_everything_the_primary_had_is_not_behind_however_old_the_last_write() -> None:
    t = PrimaryTimeline(keep_s=60)
    assert t.lag_s(0, now=0.0) is None  # nothing known yet: the caller falls back to the standby's own view
    t.record(0.0, 100)
    for second in range(1, 500):  # an idle primary: its position does not move for minutes
        t.record(float(second), 100)
    assert t.lag_s(100, now=500.0) == 0.0
    assert t.lag_s(150, now=500.0) == 0.0  # ahead of the last sample (it replayed what came since)


def test_a_standby_is_behind_since_the_primary_first_passed_what_it_replayed() -> None:
    t = PrimaryTimeline(keep_s=60)
    for second, position in enumerate([100, 100, 200, 300, 300, 400]):
        t.record(float(second), position)
    # Replayed 250: it misses what the primary had at second 3 (300), not what it had at second 2.
    assert t.lag_s(250, now=10.0) == 7.0
    assert t.lag_s(300, now=10.0) == 5.0  # the first position past it came at second 5
    assert t.lag_s(99, now=10.0) == 10.0
    assert t.lag_s(400, now=10.0) == 0.0


def test_a_long_transaction_on_the_primary_leaves_a_keeping_up_standby_at_about_zero() -> None:
    """WAL flows for seconds without a commit: a standby a moment behind reads a moment, not the age
    of the last commit it replayed."""
    t = PrimaryTimeline(keep_s=60)
    for tick in range(200):  # a probe every 0.1 s, the primary writing all along
        now = tick / 10
        t.record(now, 1_000 + 1_000 * tick)
        replayed = 1_000 + 1_000 * tick - 500  # half a sample behind, every time
        lag = t.lag_s(replayed, now=now + 0.01)
        assert lag is not None and lag <= 0.011 + 1e-9


def test_samples_past_the_horizon_go_but_a_standby_behind_all_of_them_still_reads_old() -> None:
    t = PrimaryTimeline(keep_s=10)
    t.record(0.0, 100)
    for second in range(1, 100):
        t.record(float(second), 100 + second)
    assert len(t._samples) <= 12  # bounded by the horizon, whatever the probes' count
    # A standby stuck at the start: behind at least as long as the horizon, not the age of the oldest
    # sample left alone.
    lag = t.lag_s(100, now=99.0)
    assert lag is not None and lag >= 10.0
