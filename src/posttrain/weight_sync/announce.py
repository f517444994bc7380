"""New-weights notifications: the learner announces each published policy version over Redis pub/sub.

After the learner writes a version to the weight store (and sets the run's policy-version key),
it calls ``announce_weights``: one ``PUBLISH <prefix>:<run>:weights <version>`` whose payload is
the version as ASCII digits (no pickle, nothing else on the wire). Generators hold a
``WeightAnnouncements`` subscription (``redis.asyncio``, so waiting parks no thread) and call
``wait(timeout_s)``: it returns as soon as an announcement arrives, or after ``timeout_s``.

The announcement is a doorbell, not the source of truth: after every wake-up, announced or
timed out, the generator reads the weight store's latest version itself. Pub/sub delivers only
to subscribers connected at the time, so a message missed during a reconnect, before the
subscription, or while the generator was busy reloading costs at most one ``timeout_s`` of
delay and loses nothing. A learner that restarts and re-publishes an existing version number
announces it again; the generator compares the store's (version, directory mtime) stamp, not
the number.

Run the tests: ``python -m pytest -q tests/unit/weight_sync/test_announce.py``.
"""

from __future__ import annotations

import asyncio
import logging

import redis
import redis.asyncio as aioredis

from posttrain.rollout.keys import StreamKeys

log = logging.getLogger(__name__)



def announce_weights(client: redis.Redis, keys: StreamKeys, policy_version: int) -> int:
    """Tell the run's generators that ``policy_version`` is in the weight store (call after publishing).

    Args:
        client: The run's Redis.
        keys: Key names of the run.
        policy_version: The version just published (count of weight publications, >= 0).

    Returns:
        Subscribers that received the message (0 is fine: generators also poll the store).

    Raises:
        ValueError: ``policy_version < 0``.
        redis.ConnectionError: Redis unreachable (the weights are published regardless; the
            generators' bounded wait falls back to reading the store).
    """
    if policy_version < 0:
        raise ValueError(f"policy_version: must be >= 0, got {policy_version}")
    return int(client.publish(keys.weights, str(policy_version)))  # type: ignore[arg-type]


class WeightAnnouncements:
    """A generator's subscription to ``StreamKeys.weights``; ``wait`` returns on an announcement or a timeout.

    Args:
        redis_url: The run's Redis.
        keys: Key names of the run.

    Attributes:
        received: Well-formed announcements received.
        malformed: Messages whose payload was not a non-negative integer (logged, then treated
            as a plain wake-up).
        timeouts: ``wait`` calls that ended without a message.
    """

    def __init__(self, redis_url: str, keys: StreamKeys) -> None:
        self.channel = keys.weights
        self._client = aioredis.Redis.from_url(redis_url)
        self._pubsub = self._client.pubsub()
        self._subscribed = False
        self.received = 0
        self.malformed = 0
        self.timeouts = 0

    async def subscribe(self) -> None:
        """Subscribe (idempotent); announcements published before this are not seen.

        Raises:
            redis.ConnectionError: Redis unreachable.
        """
        if not self._subscribed:
            await self._pubsub.subscribe(self.channel)
            self._subscribed = True

    async def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` seconds (> 0) for the next announcement.

        Returns:
            The announced policy version, -1 for a malformed payload (a wake-up all the same),
            or None when ``timeout_s`` passed without one (read the store anyway).

        Raises:
            ValueError: ``timeout_s <= 0``.
            redis.ConnectionError: the subscription's connection failed (the caller re-reads
                the store and may call ``wait`` again: redis-py reconnects and re-subscribes).
        """
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
        await self.subscribe()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=remaining)
            if message is None or message.get("type") != "message":
                continue  # subscribe confirmations and empty polls: keep waiting until the deadline
            data = message.get("data")
            text = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
            if not text.isdigit():
                self.malformed += 1
                log.warning("%s: ignoring malformed announcement %r (expected a policy version)", self.channel, text)
                return -1
            self.received += 1
            return int(text)
        self.timeouts += 1
        return None

    async def close(self) -> None:
        """Unsubscribe and close the connection."""
        await self._pubsub.aclose()
        await self._client.aclose()
