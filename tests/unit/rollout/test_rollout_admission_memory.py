"""Admission tickets (in-memory controller), capacity, is_stale and StalenessStats.

Run: .venv/bin/python -m pytest -q tests/unit/rollout/test_rollout_admission_memory.py
"""

from __future__ import annotations

import threading

import pytest

from posttrain.rollout.admission import (
    AdmissionController,
    MemoryAdmissionController,
    StalenessStats,
    capacity,
    is_stale,
)
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore


def make_controller(batch_size: int = 4, max_staleness: int = 1, **kw) -> MemoryAdmissionController:
    return MemoryAdmissionController(MemoryPolicyVersionStore(0), batch_size, max_staleness, **kw)


def acquire_all(ctl: AdmissionController) -> list:
    tickets = []
    while (t := ctl.acquire(timeout_s=0.0)) is not None:
        tickets.append(t)
    return tickets


def test_capacity_is_learner_version_plus_tau_plus_one_batches():
    """(v + tau + 1) * B: (0+1+1)*4 = 8; (2+1+1)*4 = 16; tau=0: (3+0+1)*128 = 512."""
    assert capacity(0, 1, 4) == 8
    assert capacity(2, 1, 4) == 16
    assert capacity(3, 0, 128) == 512
    with pytest.raises(ValueError, match="batch_size"):
        capacity(0, 1, 0)
    with pytest.raises(ValueError, match="max_staleness"):
        capacity(0, -1, 4)


def test_is_stale_only_beyond_max_staleness():
    """tau=2, learner 5: versions 3 (lag 2) kept, 2 (lag 3) stale; a rollout ahead (6) is not stale."""
    assert not is_stale(3, 5, 2)
    assert is_stale(2, 5, 2)
    assert not is_stale(6, 5, 2)
    assert not is_stale(5, 5, 0) and is_stale(4, 5, 0)


def test_memory_controller_satisfies_the_protocol():
    assert isinstance(make_controller(), AdmissionController)


def test_exactly_capacity_tickets_then_the_next_waits_until_the_version_advances():
    """B=4, tau=1, v=0: 8 tickets (numbered 1..8), the 9th is refused; at v=1, 4 more (12 total)."""
    ctl = make_controller(batch_size=4, max_staleness=1)
    tickets = acquire_all(ctl)
    assert [t.started for t in tickets] == list(range(1, 9))
    assert all(t.capacity == 8 and t.learner_version == 0 for t in tickets)
    for t in tickets:
        ctl.consume(t)
    assert ctl.acquire(timeout_s=0.0) is None
    ctl.version_store.set(1)
    more = acquire_all(ctl)
    assert len(more) == 4 and more[0].learner_version == 1 and more[-1].started == 12


def test_a_waiting_acquire_is_granted_when_the_version_advances():
    ctl = make_controller(batch_size=4, max_staleness=1, poll_interval_s=0.005)
    acquire_all(ctl)
    result = []
    waiter = threading.Thread(target=lambda: result.append(ctl.acquire(timeout_s=60.0)))
    waiter.start()
    assert ctl.state().granted_total == 8
    ctl.version_store.set(1)
    waiter.join()
    assert result[0] is not None and result[0].started == 9
    assert ctl.state().granted_total == 9


def test_release_gives_the_slot_back_and_consume_does_not():
    """Capacity 8: 8 granted; consume 1 (started stays 8); release 1 -> started 7 -> one more ticket."""
    ctl = make_controller()
    tickets = acquire_all(ctl)
    ctl.consume(tickets[0])
    assert ctl.acquire(timeout_s=0.0) is None
    ctl.release(tickets[1])
    s = ctl.state()
    assert (s.consumed, s.in_flight, s.started, s.released_total) == (1, 6, 7, 1)
    assert ctl.acquire(timeout_s=0.0) is not None
    assert ctl.acquire(timeout_s=0.0) is None


def test_refund_of_dropped_rollouts_frees_their_slots():
    """8 consumed, learner drops 3 -> consumed 5 -> 3 new tickets, then full."""
    ctl = make_controller()
    for t in acquire_all(ctl):
        ctl.consume(t)
    ctl.refund(3)
    assert len(acquire_all(ctl)) == 3
    assert ctl.state().refunded_total == 3
    with pytest.raises(ValueError, match="count"):
        ctl.refund(99)


def test_a_ticket_cannot_be_consumed_or_released_twice():
    ctl = make_controller()
    t = ctl.acquire(timeout_s=0.0)
    assert t is not None
    ctl.consume(t)
    with pytest.raises(ValueError, match="ticket"):
        ctl.consume(t)
    with pytest.raises(ValueError, match="ticket"):
        ctl.release(t)


def test_expired_leases_free_capacity_and_late_consumes_are_counted():
    """lease 10 s on a hand-driven clock: at t=0, 8 tickets; at t=11 all 8 expired, 8 fresh granted;
    consuming an expired one counts as late (consumed 1, in flight 8)."""
    now = [0.0]
    ctl = make_controller(lease_s=10.0, clock=lambda: now[0])
    old = acquire_all(ctl)
    now[0] = 11.0
    assert len(acquire_all(ctl)) == 8
    ctl.consume(old[0])
    s = ctl.state()
    assert (s.expired_total, s.late_total, s.consumed, s.in_flight) == (8, 1, 1, 8)


def test_concurrent_acquirers_never_exceed_capacity():
    """4 threads grab tickets until refused: exactly 8 in total, 8 distinct ids."""
    ctl = make_controller(batch_size=4, max_staleness=1)
    got: list = []
    lock = threading.Lock()

    def grab() -> None:
        mine = acquire_all(ctl)
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=grab) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({t.ticket_id for t in got}) == 8
    assert ctl.state().in_flight == 8


def test_staleness_stats_histogram_and_drops():
    """tau=2, learner at 5, rollout versions 5,4,4,3,1 -> lags 0,1,1,2,4 and one ahead (6).

    mean = (0+1+1+2+4)/5 = 1.6, max 4, hist [1,2,1], over 1, ahead 1; 2 drops recorded.
    """
    stats = StalenessStats(max_staleness=2)
    for v in (5, 4, 4, 3, 1, 6):
        stats.observe(v, learner_version=5)
    stats.record_dropped(2)
    assert stats.as_metrics() == {
        "staleness/mean": 1.6,
        "staleness/max": 4.0,
        "staleness/count": 5.0,
        "staleness/dropped_total": 2.0,
        "staleness/ahead_total": 1.0,
        "staleness/hist_0": 1.0,
        "staleness/hist_1": 2.0,
        "staleness/hist_2": 1.0,
        "staleness/hist_over": 1.0,
    }


def test_staleness_stats_empty_is_all_zero():
    assert set(StalenessStats(0).as_metrics().values()) == {0.0}


def test_admission_state_metrics_are_flat_floats():
    ctl = make_controller()
    ctl.acquire(timeout_s=0.0)
    m = ctl.state().as_metrics()
    assert (
        m["admission/in_flight"] == 1.0 and m["admission/capacity"] == 8.0 and m["admission/started"] == 1.0
    )
    assert all(isinstance(v, float) for v in m.values())
