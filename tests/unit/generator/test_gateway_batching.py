"""The gateway's batching gate in front of the real ``hf`` engine (tiny model): what goes to the engine together.

Every assertion is a count (engine batch sizes, the gate's counters), never a duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from fixtures_models import TinyModel
from posttrain.generator.gateway.batching import BatchGate
from posttrain.generator.gateway.stats import GatewayStats
from posttrain.inference.base import GenerationRequest
from posttrain.inference.factory import make_engine


@pytest.fixture(scope="module")
def engine(tiny_model: TinyModel) -> Iterator:
    engine = make_engine("hf", tiny_model.path, max_model_len=128)
    yield engine
    engine.close()


def _request(i: int) -> GenerationRequest:
    return GenerationRequest(prompt_token_ids=[5 + i, 6, 7], max_new_tokens=3, seed=i)


def test_the_turns_of_every_open_episode_go_as_one_engine_batch(engine):
    stats = GatewayStats()
    gate = BatchGate(engine, 60.0, lambda: 3, stats)  # a wait that never ends within a test

    async def go() -> None:
        await asyncio.gather(*(gate.generate(_request(i)) for i in range(3)))

    asyncio.run(go())
    assert list(engine.batch_sizes)[-1] == 3
    assert (stats.gate_releases, stats.gate_released, stats.gate_timeouts) == (1, 3, 0)


def test_a_turn_goes_at_the_wait_end_when_another_open_episode_sends_none(engine):
    stats = GatewayStats()
    gate = BatchGate(engine, 0.01, lambda: 2, stats)
    result = asyncio.run(gate.generate(_request(0)))
    assert len(result.token_ids) >= 1 and list(engine.batch_sizes)[-1] == 1
    assert (stats.gate_releases, stats.gate_released, stats.gate_timeouts) == (1, 1, 1)


def test_episodes_opened_back_to_back_after_a_close_wait_for_each_other_not_for_the_first(engine):
    """Two agents close their episodes and open the next ones one after the other: the open count dips to 0 and
    the first new turn arrives while it is 1; the gate expects the 2 it saw before and sends both turns as one batch."""
    stats, opened = GatewayStats(), [2]
    gate = BatchGate(engine, 60.0, lambda: opened[0], stats)

    async def go() -> None:
        await asyncio.gather(gate.generate(_request(0)), gate.generate(_request(1)))
        opened[0] = 0
        gate.check()  # as the service does when an episode closes
        opened[0] = 1
        first = asyncio.create_task(gate.generate(_request(2)))
        for _ in range(1000):  # until the gate holds it or (the dip's bug) sends it alone
            if gate.held or stats.gate_releases == 2:
                break
            await asyncio.sleep(0)
        opened[0] = 2
        await asyncio.gather(first, gate.generate(_request(3)))

    asyncio.run(go())
    assert list(engine.batch_sizes)[-2:] == [2, 2]
    assert (stats.gate_releases, stats.gate_released, stats.gate_timeouts) == (2, 4, 0)


def test_a_pool_that_shrinks_is_waited_for_once(engine):
    """Two episodes, then one agent stops for good: its partner's next turn goes at the wait's end (once); after that
    the gate expects one episode and lets each turn through at once."""
    stats, opened = GatewayStats(), [2]
    gate = BatchGate(engine, 0.01, lambda: opened[0], stats)

    async def go() -> None:
        await asyncio.gather(gate.generate(_request(0)), gate.generate(_request(1)))
        opened[0] = 1
        await gate.generate(_request(2))
        await gate.generate(_request(3))

    asyncio.run(go())
    assert list(engine.batch_sizes)[-3:] == [2, 1, 1]
    assert (stats.gate_releases, stats.gate_released, stats.gate_timeouts) == (3, 4, 1)


def test_a_held_turn_that_is_cancelled_leaves_the_gate_and_never_reaches_the_engine(engine):
    stats = GatewayStats()
    gate = BatchGate(engine, 60.0, lambda: 2, stats)
    batches = len(engine.batch_sizes)

    async def go() -> None:
        task = asyncio.create_task(gate.generate(_request(0)))
        while gate.held == 0:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert gate.held == 0 and len(engine.batch_sizes) == batches and stats.gate_releases == 0


def test_a_zero_wait_is_no_gate_and_a_negative_one_is_refused(engine):
    stats = GatewayStats()
    asyncio.run(BatchGate(engine, 0.0, lambda: 5, stats).generate(_request(0)))
    assert stats.gate_releases == 0 and list(engine.batch_sizes)[-1] == 1
    with pytest.raises(ValueError, match="max_wait_s"):
        BatchGate(engine, -0.001, lambda: 1, stats)
