"""GeneratorWatch: dead generators' tickets come back, a status line while none is alive, a stop reason after the timeout."""

from __future__ import annotations

from posttrain.learner.liveness import GeneratorWatch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_live_generator_prints_status_then_gives_the_stop_reason_at_the_timeout(capsys) -> None:
    """timeout 60 s, status every 30 s (first at min(30, 60/2) = 30 s): None at 0, 29; status at 30; reason at 60."""
    clock, alive = Clock(), []
    watch = GeneratorWatch(lambda: alive, lambda: 0, timeout_s=60.0, status_every_s=30.0, clock=clock)
    assert watch.check() is None and watch.status_lines == 0
    clock.now = 29.0
    assert watch.check() is None and watch.status_lines == 0
    clock.now = 30.0
    assert watch.check() is None and watch.status_lines == 1
    assert "no live generator for 30 s" in capsys.readouterr().out
    clock.now = 60.0
    reason = watch.check()
    assert reason is not None and "no live generator for 60 s" in reason
    assert "learner.no_generator_timeout_s=60" in reason


def test_a_live_generator_resets_the_silence() -> None:
    """Alive at 50 s: the clock restarts; dead again at 55 s, so the reason comes at 115 s, not 60 s."""
    clock, alive = Clock(), []
    watch = GeneratorWatch(lambda: alive, lambda: 0, timeout_s=60.0, clock=clock)
    clock.now, alive[:] = 50.0, ["g0"]
    assert watch.check() is None
    clock.now, alive[:] = 55.0, []
    assert watch.check() is None
    clock.now = 114.0
    assert watch.check() is None
    clock.now = 115.0
    assert watch.check() is not None


def test_each_check_returns_dead_generators_tickets_first() -> None:
    """return_dead gives 3 then 0: leases_returned counts 3, whatever the liveness."""
    returned = iter([3, 0])
    watch = GeneratorWatch(lambda: ["g1"], lambda: next(returned), timeout_s=10.0, clock=Clock())
    watch.check()
    watch.check()
    assert watch.leases_returned == 3


def test_a_learner_busy_on_a_backlog_is_not_waiting_for_generators() -> None:
    """No generator alive for 100 s while batches still come (waiting=False): no reason; the clock starts when it waits."""
    clock = Clock()
    watch = GeneratorWatch(lambda: [], lambda: 0, timeout_s=60.0, clock=clock)
    clock.now = 100.0
    assert watch.check(waiting=False) is None
    clock.now = 159.0
    assert watch.check(waiting=True) is None
    clock.now = 160.0
    assert watch.check(waiting=True) is None
    clock.now = 220.0
    assert watch.check(waiting=True) is not None
