"""The generator's weight watcher: serve the newest published weights, cancel what they made stale.

The watcher waits for the learner's new-weights announcement (``WeightAnnouncements``, Redis
pub/sub) for at most ``WEIGHT_WAIT_S`` seconds, then reads the weight store's latest version
either way, so a missed announcement costs at most that long. At each wake-up it:

0. checks the run's stop key;
1. cancels the episodes in flight that the latest version made too stale to train
   (``generator.abort_stale_episodes``; ``InFlightEpisodes.abort_stale``);
2. reloads the engine's weights in place when the store's (version, directory mtime) stamp
   differs from the one served: a restarted learner re-publishes versions past its checkpoint
   under the same number in a new directory; then wakes the admission gate, which grants no
   ticket while the engine is more than tau versions behind the learner;
3. publishes the generator's stats (``publish_generator_stats``);
4. after an announcement, wakes the admission gate (a new version raises capacity).

When the watcher ends, for any reason, it sets ``stopping``: a failing watcher stops the slots,
so its error surfaces instead of a hang. Tested through a real generator process in
``tests/integration/test_generator_weight_announcements.py``.
"""

from __future__ import annotations

import asyncio
import logging

import redis

from posttrain.generator.inflight import InFlightEpisodes
from posttrain.inference.base import InferenceEngine
from posttrain.inference.metering import GeneratorStats
from posttrain.rollout.admission import AsyncTicketGate
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.telemetry import publish_generator_stats
from posttrain.weight_sync.announce import WeightAnnouncements
from posttrain.weight_sync.store import WeightStore
from posttrain.weight_sync.timed import acall

log = logging.getLogger("posttrain.generator")

WEIGHT_WAIT_S = 1.0
"""Longest wait (seconds) for a new-weights announcement before the watcher reads the store anyway."""


class WeightWatcher:
    """Keeps the engine on the latest weights and the generator's stats published (module docstring).

    Args:
        engine: The generator's engine (a ``MeteredEngine`` counts its reloads).
        store: The run's weight store.
        served_version: The version the engine was built with.
        client: The run's Redis (stats hash, stop key).
        keys: Key names of the run.
        announcements: The subscription to new-weights announcements (subscribed by the caller).
        gate: The admission gate, woken after an announcement.
        running: Episodes in flight, cancelled once stale.
        stats: The generator's counters (``weight_announcements``, ``weight_wait_timeouts``).
        generator_id: Name of this generator (its field in the stats hash).
        max_staleness: tau, in policy versions.
        abort_stale_episodes: Cancel stale episodes in flight (``generator.abort_stale_episodes``).
        stopping: Set on stop; the watcher sets it when the stop key is set or it ends.
        wait_s: Longest wait for an announcement (seconds).
        store_timeout_s: Deadline of each weight-store access (``weights_timeout_s``).

    Raises:
        FileNotFoundError: ``served_version`` has no directory in the store.
    """

    def __init__(self, engine: InferenceEngine, store: WeightStore, served_version: int, client: redis.Redis,
                 keys: StreamKeys, announcements: WeightAnnouncements, gate: AsyncTicketGate,
                 running: InFlightEpisodes, stats: GeneratorStats, generator_id: str, max_staleness: int,
                 abort_stale_episodes: bool, stopping: asyncio.Event, wait_s: float = WEIGHT_WAIT_S,
                 store_timeout_s: float = 300.0) -> None:
        self.engine = engine
        self.store = store
        self.client = client
        self.keys = keys
        self.announcements = announcements
        self.gate = gate
        self.running = running
        self.stats = stats
        self.generator_id = generator_id
        self.max_staleness = max_staleness
        self.abort_stale_episodes = abort_stale_episodes
        self.stopping = stopping
        self.wait_s = wait_s
        self.store_timeout_s = store_timeout_s
        self.served = self.stamp(served_version)

    def stamp(self, version: int) -> tuple[int, int]:
        """``(version, mtime in ns of its directory)``: a re-published version has a new stamp.

        Raises:
            FileNotFoundError: the version's directory is gone (pruned or being replaced).
        """
        return version, self.store.path_for(version).stat().st_mtime_ns

    async def run(self) -> None:
        """Check and wait in turn until ``stopping`` is set; set ``stopping`` when it ends, however it ends."""
        try:
            while not self.stopping.is_set():
                if not await self.check():
                    break
                await self.wait()
        finally:
            self.stopping.set()

    async def check(self) -> bool:
        """One wake-up: check the stop key, cancel stale episodes, reload new weights, publish stats.

        Every weight-store access runs off the loop with a deadline (``weights_timeout_s``) and is
        abandoned when ``stopping`` is set, so a hung store never keeps the generator from its
        stop key or SIGTERM.

        Returns:
            False when the stop key is set or stopping began (``stopping`` is then set), True otherwise.

        Raises:
            posttrain.weight_sync.timed.WeightStoreTimeout: a store access passed its deadline.
            OSError: the store cannot be read (``PermissionError`` on ``LATEST``...).
        """
        if self.client.exists(self.keys.stop):
            self.stopping.set()
            return False
        latest = await acall("read LATEST", self.store.latest_version, self.store_timeout_s, self.stopping)
        if self.stopping.is_set():
            return False
        if latest is not None:
            if self.abort_stale_episodes:
                self.running.abort_stale(latest, self.max_staleness)
            try:
                current = await acall(f"stat v{latest}", lambda: self.stamp(latest), self.store_timeout_s,
                                      self.stopping)
            except FileNotFoundError:  # pruned or being replaced right now; look again next wake-up
                current = self.served
            if current is not None and current != self.served:
                path = await acall(f"find v{latest}", lambda: self.store.path_for(latest), self.store_timeout_s,
                                   self.stopping)
                if path is None:
                    return False
                await self.engine.update_weights(path, latest)
                self.served = current
                self.gate.wake()  # tickets wait for the engine to catch up (AsyncTicketGate served_version)
        publish_generator_stats(self.client, self.keys, self.generator_id, self.stats.snapshot())
        return True

    async def wait(self) -> None:
        """Wait up to ``wait_s`` seconds for an announcement; count it, and wake the gate when one came."""
        try:
            announced = await self.announcements.wait(self.wait_s)
        except redis.ConnectionError as exc:  # redis-py re-subscribes on the next wait
            log.warning("generator %s: weight announcements: %s; reading the store instead", self.generator_id, exc)
            announced = None
        if announced is None:
            self.stats.weight_wait_timeouts += 1
        else:
            self.stats.weight_announcements += 1
            self.gate.wake()  # the learner moved on: admission capacity grew
