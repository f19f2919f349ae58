"""The scheduling decision as a pure function of queue state: no model, no threads, no clock."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from encoder.scheduling import QueueState, RequestState, ShareController, plan_batch, plan_fifo
from encoder.types import Modality, Priority

Q, S, BG = Priority.QUERY, Priority.SYNC_INGEST, Priority.BACKGROUND
IMG, TXT = Modality.IMAGE, Modality.TEXT


def req(rid, units, *, priority=Q, modality=IMG, deadline=None, pending=0, served=0):
    dl = float(rid if deadline is None else deadline)
    return RequestState(rid, priority, modality, dl, rid, tuple(range(units)), pending, served)


def counts(plan):
    return Counter(ref.request_id for ref in plan)


def test_nothing_ready_means_no_batch():
    assert plan_batch(QueueState(8, ())) == []
    assert plan_batch(QueueState(8, (req(1, 0, pending=5),))) == []


def test_a_huge_image_advances_a_slice_while_small_requests_all_get_in():
    big = req(1, 64)
    smalls = [req(i, 1) for i in range(2, 6)]
    plan = plan_batch(QueueState(8, (big, *smalls)))
    assert counts(plan) == {1: 4, 2: 1, 3: 1, 4: 1, 5: 1}
    assert [r.unit for r in plan if r.request_id == 1] == [0, 1, 2, 3]  # in unit order


def test_alone_a_huge_image_fills_whole_batches():
    assert counts(plan_batch(QueueState(8, (req(1, 64),)))) == {1: 8}


def test_many_big_requests_share_the_batch_round_robin():
    plan = plan_batch(QueueState(8, tuple(req(i, 40) for i in range(1, 4))))
    assert counts(plan) == {1: 3, 2: 3, 3: 2}  # the earliest deadline gets the odd slot


def test_classes_are_served_in_priority_order():
    state = QueueState(8, (req(1, 20, priority=BG), req(2, 6, priority=S), req(3, 3, priority=Q)))
    assert counts(plan_batch(state)) == {3: 3, 2: 5}


def test_earliest_deadline_first_within_a_class():
    state = QueueState(4, tuple(req(i, 1, deadline=10 - i) for i in range(1, 9)))
    assert set(counts(plan_batch(state))) == {8, 7, 6, 5}


def test_new_requests_go_before_ones_in_progress_even_with_later_deadlines():
    # Overload: 6 huge images already in progress (old, so earliest deadlines) and 5 new small ones.
    bigs = tuple(req(i, 40, deadline=0.0, served=3) for i in range(1, 7))
    smalls = tuple(req(i, 1, deadline=9.0) for i in range(10, 15))
    plan = counts(plan_batch(QueueState(8, (*bigs, *smalls))))
    assert {10, 11, 12, 13, 14} <= set(plan)  # every small one gets in
    assert sum(plan[i] for i in range(1, 7)) == 3  # the leftover slots go to the oldest images
    assert set(plan) - set(range(10, 15)) == {1, 2, 3}


def test_the_most_urgent_request_picks_the_modality():
    state = QueueState(8, (req(1, 30, priority=BG, modality=IMG), req(2, 2, priority=Q, modality=TXT)))
    plan = plan_batch(state)
    assert counts(plan) == {2: 2}  # a text batch; the images wait one tick
    state = QueueState(8, (req(1, 30, priority=BG, modality=IMG),))
    assert counts(plan_batch(state)) == {1: 8}


def test_shares_reserve_room_for_bulk_and_leftovers_flow_back():
    flood = tuple(req(i, 4) for i in range(1, 9))  # 32 query units
    bulk = req(100, 50, priority=BG, deadline=0)
    strict = plan_batch(QueueState(8, (*flood, bulk)))
    assert 100 not in counts(strict)  # all-query shares: bulk waits
    shares = {Q: 0.5, S: 0.25, BG: 0.25}
    shared = counts(plan_batch(QueueState(8, (*flood, bulk), shares)))
    assert shared[100] == 2  # its own quarter of the batch ...
    assert sum(v for k, v in shared.items() if k != 100) == 6  # ... the idle sync quarter goes to queries
    # With no query waiting, bulk takes the whole batch whatever the shares say.
    assert counts(plan_batch(QueueState(8, (bulk,), shares))) == {100: 8}


def test_fifo_baseline_runs_whole_requests_in_arrival_order():
    state = QueueState(8, (req(1, 5, priority=BG), req(2, 6, priority=Q), req(3, 1)))
    assert counts(plan_fifo(state)) == {1: 5, 2: 3}
    # A request joins the line once fully preprocessed.
    assert counts(plan_fifo(QueueState(8, (req(1, 2, pending=3), req(2, 1))))) == {2: 1}
    # A modality change ends the batch.
    assert counts(plan_fifo(QueueState(8, (req(1, 2, modality=TXT), req(2, 3))))) == {1: 2}


requests_strategy = st.lists(
    st.builds(
        lambda rid, n, p, m, d, pend, served: RequestState(rid, p, m, d, rid, tuple(range(n)), pend, served),
        st.integers(0, 10**6),
        st.integers(0, 70),
        st.sampled_from(list(Priority)),
        st.sampled_from(list(Modality)),
        st.floats(0, 100),
        st.integers(0, 3),
        st.integers(0, 2),
    ),
    max_size=30,
    unique_by=lambda r: r.request_id,
)


@settings(max_examples=300, deadline=None)
@given(requests=requests_strategy, batch=st.integers(1, 64), q=st.floats(0, 1))
def test_plan_invariants(requests, batch, q):
    shares = {Q: q, S: (1 - q) * 0.75, BG: (1 - q) * 0.25}
    state = QueueState(batch, tuple(requests), shares)
    plan = plan_batch(state)
    by_id = {r.request_id: r for r in requests}
    assert len(plan) <= batch
    assert len(set(plan)) == len(plan)  # no unit twice
    assert all(ref.unit in by_id[ref.request_id].ready for ref in plan)
    assert len({by_id[ref.request_id].modality for ref in plan}) <= 1
    waiting = [r for r in requests if r.ready]
    if waiting:
        modality = by_id[plan[0].request_id].modality
        available = sum(len(r.ready) for r in waiting if r.modality == modality)
        assert len(plan) == min(batch, available)  # work-conserving: never pads while work waits
        top = max(r.priority for r in waiting)
        if top != Q or math.floor(q * batch) >= 1:  # a zero query share may hand the batch to bulk
            assert any(by_id[ref.request_id].priority == top for ref in plan)
        # Fair share: if every same-modality request fits one round, each one gets a unit.
        same = [r for r in waiting if r.modality == modality]
        if len(same) <= batch and q == 1.0:
            assert set(counts(plan)) >= {r.request_id for r in same if r.priority == top}
    assert plan_batch(state) == plan  # deterministic


def test_share_controller_takes_the_batch_back_at_once_and_gives_it_away_slowly():
    c = ShareController(0.1, min_query_share=0.5, sync_share=0.75, decay_per_s=0.25)
    assert c.update(0.0)[Q] == 1.0
    assert c.update(1.0)[Q] == 0.75  # no queries: decays
    assert c.update(10.0)[Q] == 0.5  # ... down to the floor
    shares = c.shares()
    assert shares[S] == 0.375 and shares[BG] == 0.125
    for i in range(100):
        c.observe(0.3 if i >= 98 else 0.01, now=10.0)  # two slow queries in a hundred: p99 over target
    assert c.update(10.5)[Q] == 1.0
    assert c.p99(10.5) == 0.3
    for _ in range(300):
        c.observe(0.05, now=11.0)  # p99 back under 0.8 x target (the slow one left the window)
    assert c.update(11.5)[Q] == 0.75
    for _ in range(5):
        c.observe(0.09, now=12.0)  # p99 between relax x target and target: hold
    held = c.query_share
    assert c.update(14.0)[Q] == held
