"""Generator positions saved by the learner and written back to a Redis that lost them (issue 23, item 18).

Against a real embedded Valkey. Run: ``python -m pytest -q tests/unit/rollout/test_generator_positions.py``.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from posttrain.generator.worker import wait_for_learner
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.positions import check_positions, learner_started, read_positions, restore_positions
from posttrain.rollout.queue import QueueError
from posttrain.services.embedded_redis import EmbeddedRedis


@pytest.fixture(scope="module")
def client():
    with EmbeddedRedis() as server:
        yield redis.Redis.from_url(server.url)


def _keys() -> StreamKeys:
    return StreamKeys("positions", uuid.uuid4().hex[:12])


def test_restore_brings_back_every_position_on_an_empty_server_and_never_lowers_one(client) -> None:
    """Saved {0: 128, 1: 64, 2: 192}; Redis holds {1: 256, 2: 64}: 0 and 2 are raised, 1 (ahead) is kept."""
    keys = _keys()
    assert read_positions(client, keys) == {}
    assert restore_positions(client, keys, {"0": 128, "1": 64}) == ["0", "1"]
    assert read_positions(client, keys) == {"0": 128, "1": 64}
    client.hset(keys.generator_positions, mapping={"1": 256, "2": 64})
    assert restore_positions(client, keys, {"0": 128, "1": 64, "2": 192}) == ["2"]
    assert read_positions(client, keys) == {"0": 128, "1": 256, "2": 192}
    assert restore_positions(client, keys, {}) == []
    # A generator's next reservation continues from the restored position.
    assert client.hincrby(keys.generator_positions, "0", 64) == 192


def test_malformed_positions_are_refused_with_the_field(client) -> None:
    keys = _keys()
    with pytest.raises(ValueError, match=r"restore_positions: generator position 'g0': 64"):
        restore_positions(client, keys, {"g0": 64})
    with pytest.raises(ValueError, match=r"generator position '1': -3"):
        check_positions({"1": -3}, "state.json")
    client.hset(keys.generator_positions, "0", "abc")
    with pytest.raises(QueueError, match=r"field '0' holds 'abc'"):
        read_positions(client, keys)
    with pytest.raises(QueueError, match=r"is not an integer"):
        restore_positions(client, keys, {"0": 64})


def test_a_generator_waits_for_the_version_key_before_it_reserves(client) -> None:
    """No key: still waiting after 1.2 s (3 polls); key set: True; stop key or SIGTERM first: False."""
    keys = _keys()

    async def wait(stopping: asyncio.Event, timeout_s: float) -> bool | None:
        try:
            return await asyncio.wait_for(wait_for_learner(client, keys, stopping), timeout_s)
        except TimeoutError:
            return None

    async def main() -> list[bool | None]:
        stopping = asyncio.Event()
        out = [await wait(stopping, 1.2)]
        client.set(keys.policy_version, 0)
        out.append(await wait(stopping, 5.0))
        stopped = asyncio.Event()
        stopped.set()
        out.append(await wait_for_learner(client, _keys(), stopped))
        other = _keys()
        client.set(other.stop, "1")
        out.append(await wait_for_learner(client, other, asyncio.Event()))
        return out

    assert asyncio.run(main()) == [None, True, False, False]
    assert learner_started(client, keys)
