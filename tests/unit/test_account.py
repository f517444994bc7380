"""The time account's clocks add up by construction, and its records round-trip (issue 35)."""

from __future__ import annotations

import pytest

from posttrain.account import OTHER, Occupancy, RoleAccount, RunAccount, StateClock, StateTimer


class Ticks:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_state_clock_splits_wall_time_into_shares_that_add_up():
    """0-2 s other, 2-5 s training, 5-6 s publishing, 6-10 s training: 2 + 7 + 1 = 10 s."""
    t = Ticks()
    clock = StateClock(("training", "publishing"), clock=t)
    t.now += 2
    assert clock.switch("training") == OTHER
    t.now += 3
    clock.switch("publishing")
    t.now += 1
    clock.switch("training")
    clock.switch("training")  # no-op
    t.now += 4
    assert clock.shares() == {"training": 7.0, "publishing": 1.0, OTHER: 2.0}
    assert clock.wall_s() == 10.0
    acc = RoleAccount.from_clock("learner", clock, cores=2.0, used_cpu_s=5.0)
    assert acc.wall_s == 10.0 and acc.requested_cpu_s == 20.0 and acc.gap() == 0.0
    acc.check()


def test_state_timer_returns_to_the_state_it_left():
    t = Ticks()
    clock = StateClock(("waiting_for_batch", "checkpointing"), initial="waiting_for_batch", clock=t)
    timer = StateTimer(clock)
    with timer("checkpointing"):
        t.now += 3
    t.now += 1
    assert clock.state == "waiting_for_batch"
    assert clock.shares() == {"waiting_for_batch": 1.0, "checkpointing": 3.0, OTHER: 0.0}


def test_state_clock_refuses_an_unknown_state():
    clock = StateClock(("training",))
    with pytest.raises(ValueError, match="'trianing' is not one of"):
        clock.switch("trianing")


def test_occupancy_counts_unit_seconds_and_the_rest_is_other():
    """4 slots: 0-1 s 4 running; 1-3 s 1 running, 3 waiting for the group; 3-4 s all 'other'.
    running = 4 + 2 = 6, waiting_for_group = 6, other = 4: 16 = 4 slots x 4 s."""
    t = Ticks()
    occ = Occupancy(("running", "waiting_for_group"), units=4, clock=t)
    occ.set({"running": 4})
    t.now += 1
    occ.set({"running": 1, "waiting_for_group": 3})
    t.now += 2
    occ.set({})
    t.now += 1
    assert occ.shares() == {"running": 6.0, "waiting_for_group": 6.0, OTHER: 4.0}
    acc = RoleAccount.from_clock("generator_slots", occ)
    assert acc.wall_s == 16.0 and acc.gap() == 0.0


def test_occupancy_clips_counts_to_its_units():
    t = Ticks()
    occ = Occupancy(("running", "waiting_for_admission"), units=2, clock=t)
    occ.set({"running": 3, "waiting_for_admission": 1})
    t.now += 1
    assert occ.shares() == {"running": 2.0, "waiting_for_admission": 0.0, OTHER: 0.0}


def test_check_names_the_role_when_shares_do_not_add_up():
    acc = RoleAccount("learner", 10.0, {"training": 5.0})
    with pytest.raises(ValueError, match="time account of learner: shares add up to 5.000 s, wall time 10.000 s"):
        acc.check()


def test_run_account_round_trips_and_derives_costs():
    """requested 100 CPU-s for 50 trained tokens = 2 per token; accuracy 0.30 -> 0.55 = 25 points, 4 per point."""
    learner = RoleAccount("learner", 50.0, {"training": 40.0, OTHER: 10.0}, requested_cpu_s=100.0, used_cpu_s=60.0)
    gen = RoleAccount("generator", 40.0, {"generating": 30.0, "idle": 10.0}, used_cpu_s=30.0, used_by="engine_busy")
    run = RunAccount("team-a", "sao", "2026-12", [learner, gen], trained_tokens=50.0,
                     heldout_before=0.30, heldout_after=0.55)
    back = RunAccount.from_json(run.to_json())
    assert back == run
    d = run.derived()
    assert d["cost/requested_cpu_s_per_trained_token"] == 2.0
    assert d["cost/requested_cpu_s_per_point"] == pytest.approx(4.0)
    m = run.metrics()
    assert m["time/learner/training_s"] == 40.0 and m["time/generator/generating_share"] == 0.75
    flat = gen.flat("time/")
    assert RoleAccount.from_flat("generator", flat, "time/", "engine_busy") == gen
    assert [k for k, _ in run.lines()] == ["time: learner (50 s)", "time: generator (40 s)", "cost (CPU-seconds)"]


def test_run_account_refuses_another_schema_version():
    with pytest.raises(ValueError, match="schema_version 7"):
        RunAccount.from_json('{"schema_version": 7}')


def test_a_second_life_adds_the_first_lives_account_instead_of_starting_over():
    """Life 1: 3 s preparing, 5 s training (its record, as a checkpoint keeps it). Life 2 carries it, then
    2 s training and 1 s checkpointing: 3 + 7 + 1 = 11 s over 2 lives, still adding up to the wall."""
    t = Ticks()
    first = StateClock(("preparing", "training", "checkpointing"), initial="preparing", clock=t)
    t.now += 3
    first.switch("training")
    t.now += 5
    record = first.record()
    assert record["lives"] == 1 and record["shares"]["training"] == 5.0 and record["used_cpu_s"] >= 0
    second = StateClock(("preparing", "training", "checkpointing"), initial="training", clock=t)
    second.carry(record)
    t.now += 2
    second.switch("checkpointing")
    t.now += 1
    shares = second.shares()
    assert shares == {"preparing": 3.0, "training": 7.0, "checkpointing": 1.0, OTHER: 0.0}
    assert second.wall_s() == pytest.approx(sum(shares.values()))
    assert second.lives == 2 and second.carried == {"preparing": 3.0, "training": 5.0, "checkpointing": 0.0, OTHER: 0.0}
    assert second.cpu_s() >= record["used_cpu_s"]
    account = RoleAccount.from_clock("learner", second)
    assert account.wall_s == 11.0 and account.gap() < 1e-12
    third = StateClock(("training",), clock=t)
    third.carry({"shares": {"warm_start": 4.0}, "lives": 2})  # a state it does not know: kept, as other
    assert third.shares()[OTHER] == 4.0 and third.lives == 3
    with pytest.raises(ValueError, match="shares"):
        third.carry({"shares": {"training": -1.0}})
    with pytest.raises(ValueError, match="'shares' must be a mapping"):
        third.carry({"training": 1.0})


def test_reassign_moves_a_child_processes_split_out_of_other_within_the_limit():
    """10 s in other (a torchrun); rank 0's split 6 s training + 2 s waiting moves out of it; a split larger
    than the limit is scaled down alike; the wall never changes."""
    t = Ticks()
    clock = StateClock(("training", "waiting_for_batch"), clock=t)
    t.now += 10
    clock.reassign(OTHER, {"training": 6.0, "waiting_for_batch": 2.0}, limit_s=10.0)
    assert clock.shares() == {"training": 6.0, "waiting_for_batch": 2.0, OTHER: 2.0}
    clock.reassign(OTHER, {"training": 4.0}, limit_s=1.0)
    assert clock.shares()["training"] == 7.0 and sum(clock.shares().values()) == pytest.approx(clock.wall_s())
    with pytest.raises(ValueError, match="not one of"):
        clock.reassign(OTHER, {"publishing": 1.0}, limit_s=1.0)


def test_occupancy_carries_an_earlier_lifes_unit_seconds():
    t = Ticks()
    slots = Occupancy(("running",), units=2, clock=t)
    slots.carry({"running": 6.0, "waiting_for_group": 2.0})
    t.now += 1
    assert slots.shares() == {"running": 6.0, OTHER: 4.0}
    assert slots.wall_s() == pytest.approx(5.0)  # 8 unit-seconds carried over 2 units, then 1 s
