"""The generator process: many episodes in flight, one rollout each, pushed to the rollout stream.

Run one with ``posttrain generator CONFIG --generator-index 0`` (``REDIS_URL`` must point at the
run's Redis; each generator of a run needs its own index: ``generator.seeds``). ``serve`` builds the parts and wires them:

* ``generator.slots``: ``generator.episodes_in_flight // G`` episode slots (G = 1 for SAO, the
  group size for async GRPO). Each loops: take G admission tickets (so no rollout starts that
  would be more than ``max_staleness`` policy versions old when consumed), pick the next task,
  run the token-in/token-out episode or group, and hand the rollouts to the sender;
* ``generator.sender``: XADD each rollout, then consume its ticket (or release it when refused);
* ``generator.watcher``: wakes on the learner's new-weights announcement or after
  ``WEIGHT_WAIT_S``, reloads the engine in place when the store has new weights (between
  requests; a reload between two turns of one episode is allowed, the rollout then carries the
  oldest version), cancels episodes in flight that became too stale to train
  (``generator.inflight``; only under ``staleness_rule: episode``, see ``abort_stale_episodes``), nudges the admission gate, publishes the stats, checks the stop key.

Before its first episode a generator waits for the learner's first weights and for the policy-version
key, and only then reserves its episode numbers (``generator.seeds``): a learner resumed on a Redis
that lost its data first writes back the positions its checkpoint recorded (``rollout.positions``).
Before any of that, it releases the admission tickets its previous life (same id) still held: that
life was killed with those episodes in flight, and the heartbeat the new life renews would keep the
learner from ever returning them; they are counted as lost in flight and their tasks re-issued
(issue 32).

Tickets are granted only while the engine serves weights within ``max_staleness`` versions of the
learner's (``AsyncTicketGate(served_version=)``): at tau = 0 a slot woken by a new version used to
start its episode on the previous weights, before the watcher's reload, and the learner dropped
the rollout as "no fresh token" (2-4 per update; issue 32).

Waiting never parks threads: tickets come through ``AsyncTicketGate`` (one poller per process,
backoff on the event loop), and the ``hf`` engine runs its batches on its own thread, so an
engine batch never queues behind blocked work in asyncio's default pool. On stop (the run's stop
key, SIGTERM or SIGINT) episodes in flight are cancelled and their tickets released; rollouts being sent
are sent first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from dataclasses import dataclass

import redis

from posttrain.config import RunConfig
from posttrain.config.load import ConfigError
from posttrain.config.roles import async_rl_settings, samples_on_policy
from posttrain.episodes.runner import EpisodeLimits
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.generator.seeds import EpisodeSeeds, generator_index
from posttrain.generator.sender import RolloutSender
from posttrain.generator.slots import EpisodeSlot, EpisodeWork, TicketTaker, run_until_stopped, slot_count
from posttrain.generator.watcher import WeightWatcher
from posttrain.inference.factory import make_engine
from posttrain.inference.metering import GeneratorStats, MeteredEngine
from posttrain.models.hf import load_tokenizer
from posttrain.rollout.admission import AsyncTicketGate, RedisAdmissionController
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.liveness import Heartbeat
from posttrain.rollout.positions import learner_started
from posttrain.rollout.redis_streams import RedisStreamQueue, check_reachable, connect
from posttrain.rollout.telemetry import own_generator_stats, publish_generator_stats
from posttrain.runtime import RunContext
from posttrain.weight_sync.announce import WeightAnnouncements
from posttrain.weight_sync.factory import open_weight_store
from posttrain.weight_sync.store import WeightStore
from posttrain.weight_sync.timed import acall

log = logging.getLogger("posttrain.generator")

FIRST_WEIGHTS_TIMEOUT_S = 600.0
"""Longest wait (seconds) at start for the learner's first published weights."""


@dataclass
class GeneratorSummary:
    """What a generator did (from ``GeneratorStats.snapshot``)."""

    generator_id: str
    stats: dict[str, float]


def abort_stale_episodes(config: RunConfig) -> bool:
    """Whether the generator cancels episodes in flight for their age (``generator.inflight``).

    Only under ``staleness_rule: episode`` with ``generator.abort_stale_episodes``: that rule drops
    a rollout by its oldest turn, so an episode past the bound can no longer train. Under the
    token rule the next turn is sampled with the newest weights and trains, so nothing is cancelled.

    Raises:
        posttrain.config.ConfigError: the technique does not use the asynchronous runtime.
    """
    return config.generator.abort_stale_episodes and async_rl_settings(config).staleness_rule == "episode"


async def first_version(store: WeightStore, where: object, timeout_s: float, stopping: asyncio.Event) -> int | None:
    """The store's latest version, polled every 0.5 s for up to ``FIRST_WEIGHTS_TIMEOUT_S`` seconds.

    Each read has the store's deadline (``timeout_s``); None when ``stopping`` is set first (SIGTERM).

    Raises:
        TimeoutError: nothing published in time (``WeightStoreTimeout`` when a read hung).
    """
    deadline = time.monotonic() + FIRST_WEIGHTS_TIMEOUT_S
    while not stopping.is_set():
        version = await acall("read LATEST", store.latest_version, timeout_s, stopping)
        if version is not None:
            return version
        if time.monotonic() > deadline:
            raise TimeoutError(f"no weights published in {where} after {FIRST_WEIGHTS_TIMEOUT_S:.0f} s")
        try:
            await asyncio.wait_for(stopping.wait(), timeout=0.5)
        except TimeoutError:
            pass
    return None


async def wait_for_learner(client: redis.Redis, keys: StreamKeys, stopping: asyncio.Event) -> bool:
    """Wait until the run's policy-version key exists (the learner set it, after restoring positions).

    Polled every 0.5 s for up to ``FIRST_WEIGHTS_TIMEOUT_S`` seconds. False when ``stopping`` is
    set (SIGTERM) or the run's stop key appears first.

    Raises:
        TimeoutError: no version key within ``FIRST_WEIGHTS_TIMEOUT_S`` seconds (no learner).
        redis.ConnectionError: Redis stayed unreachable for ``queue.reconnect_window_s``.
    """
    deadline = time.monotonic() + FIRST_WEIGHTS_TIMEOUT_S
    while not stopping.is_set():
        if learner_started(client, keys):
            return True
        if client.exists(keys.stop):
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"no learner set {keys.policy_version} within {FIRST_WEIGHTS_TIMEOUT_S:.0f} s "
                               f"(the generator reserves its episode numbers only after the learner is up)")
        try:
            await asyncio.wait_for(stopping.wait(), timeout=0.5)
        except TimeoutError:
            pass
    return False


async def serve(config: RunConfig, generator_id: str, redis_url: str, seed: int,
                index: int | None = None) -> GeneratorSummary:
    """Build the generator's parts, run its slots and watcher until stopped, and clean up (module docstring).

    Args:
        config: The run config; shared runtime numbers come from ``async_rl_settings(config)``.
        generator_id: Name of this generator.
        redis_url: The run's Redis.
        seed: Engine sampling seed and task-order seed.
        index: The generator's index in the run (episode seeds: ``generator.seeds``); None: from a
            ``g<N>`` ``generator_id``, else 0.

    Returns:
        The generator's final stats.

    Raises:
        posttrain.rollout.queue.RedisUnreachableError: ``redis_url`` does not answer within
            ``queue.reconnect_window_s`` (checked first, before any wait).
        TimeoutError: no weights published, or no policy-version key set by the learner, within
            ``FIRST_WEIGHTS_TIMEOUT_S`` seconds, or a weight-store access passed
            ``weights_timeout_s`` (``WeightStoreTimeout``).
        posttrain.config.ConfigError: the run samples nothing on-policy (GKD at ``gkd.lmbda: 0``).
        The first error of a slot or the watcher.
    """
    if not samples_on_policy(config):
        raise ConfigError("gkd.lmbda: 0 trains on fixed sequences only (supervised KD): the run has no on-policy "
                          "sample for a generator to draw; start only the learner")
    ctx = RunContext(config)
    # Every command retries over queue.reconnect_window_s (the client's own backoff); the objects add no retries.
    client = connect(redis_url, reconnect_window_s=config.queue.reconnect_window_s)
    check_reachable(client, redis_url, config.queue.reconnect_window_s)  # before any wait: a wrong URL fails now
    heartbeat = Heartbeat(client, ctx.keys, generator_id, config.generator.heartbeat_ttl_s).start()
    try:
        return await _serve(config, ctx, generator_id, redis_url, seed, index, client)
    finally:
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):  # the first error is the one to show
            heartbeat.stop()  # the learner sees this generator gone at once


async def _serve(config: RunConfig, ctx: RunContext, generator_id: str, redis_url: str, seed: int,
                 index: int | None, client: redis.Redis) -> GeneratorSummary:
    """``serve`` once Redis answers and the heartbeat runs."""
    settings, gen = async_rl_settings(config), config.generator
    position = generator_index(index, generator_id)
    stopping = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # SIGINT: a Ctrl-C reaches the run's whole process group
        asyncio.get_running_loop().add_signal_handler(signum, stopping.set)
    admission = RedisAdmissionController(client, ctx.keys, batch_size=settings.batch_rollouts,
                                         max_staleness=settings.max_staleness, lease_s=gen.admission_lease_s,
                                         retries=0, owner=generator_id)
    # First thing (the heartbeat this life renews hides its previous life's death from the learner): every
    # ticket this id holds now is the previous life's, its episode lost in flight.
    lost = admission.release_leases_of(generator_id)
    if lost:
        log.warning("generator %s: its previous life left %d episodes in flight; counted as lost in flight and "
                    "their tasks re-issued", generator_id, lost)
    store = open_weight_store(ctx)
    version = await first_version(store, ctx.weights_dir, config.weights_timeout_s, stopping)
    # Reserve only once the learner has set the version key: a resumed learner first gives back the
    # positions its checkpoint recorded (a fresh Redis has lost them; posttrain.rollout.positions).
    if version is None or not await wait_for_learner(client, ctx.keys, stopping):
        return GeneratorSummary(generator_id, GeneratorStats().snapshot())  # SIGTERM or stop key: nothing taken
    # The client retries over queue.reconnect_window_s, so the reservation adds no retries of its own.
    seeds = EpisodeSeeds(config.seed, position,
                         reserve=lambda n: client.hincrby(ctx.keys.generator_positions, str(position), n))
    stats = GeneratorStats()
    stats.lost_in_flight = lost
    engine = MeteredEngine(make_engine(
        gen.engine, store.path_for(version), policy_version=version, seed=seed,
        max_model_len=gen.max_episode_tokens + gen.max_new_tokens, kv_cache_gib=gen.vllm_kv_cache_gib,
        max_batch=gen.episodes_in_flight,
    ), stats)
    work = EpisodeWork(
        engine, load_tokenizer(ctx.tokenizer_dir), ctx.environment(), ctx.tasks("train"),
        EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                      max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s),
        generator_id=generator_id, group_size=settings.group_size, temperature=gen.temperature, top_p=gen.top_p,
        infra_retries=gen.infra_retries,
    )
    rng = random.Random(seed * 2**32 + seeds.start)  # a restarted generator draws a new task order too
    queue = RedisStreamQueue(client, ctx.keys, consumer=f"generator-{generator_id}", maxlen=config.queue.maxlen,
                             retries=0)
    gate = AsyncTicketGate(admission, served_version=lambda: engine.policy_version)
    announcements = WeightAnnouncements(redis_url, ctx.keys)
    await announcements.subscribe()
    stats.mark_started(units=slot_count(gen.episodes_in_flight, settings.group_size) * settings.group_size)
    # A restarted generator (same id: a second life after a crash or an eviction) adds its earlier
    # lives' time account, read back from the run's telemetry hash, instead of overwriting it.
    if stats.carry_account(own_generator_stats(client, ctx.keys, generator_id)):
        log.info("generator %s: a restarted life; its time account adds the earlier lives'", generator_id)

    running = InFlightEpisodes()
    sender = RolloutSender(queue, admission, stats, generator_id)
    tickets = TicketTaker(gate, admission, settings.group_size, stats, stopping)
    slots = [EpisodeSlot(work, tickets, admission, running, sender, stats, rng, stopping, seeds)
             for _ in range(slot_count(gen.episodes_in_flight, settings.group_size))]
    watcher = WeightWatcher(
        engine, store, version, client, ctx.keys, announcements, gate, running, stats, generator_id,
        max_staleness=settings.max_staleness, abort_stale_episodes=abort_stale_episodes(config), stopping=stopping,
        store_timeout_s=config.weights_timeout_s,
    )
    try:
        await run_until_stopped(slots, watcher.run(), stopping)
    finally:
        await sender.drain()
        await announcements.close()
        engine.close()
        say_goodbye(client, ctx.keys, generator_id, stats)
    return GeneratorSummary(generator_id, stats.snapshot())


def say_goodbye(client: redis.Redis, keys: StreamKeys, generator_id: str, stats: GeneratorStats) -> None:
    """Publish the final stats; with Redis gone, log one line instead of raising.

    The error that stopped the generator (a Redis outage longer than the window, most often) is
    the one the caller must see; a second one from this cleanup would hide it.
    """
    try:
        publish_generator_stats(client, keys, generator_id, stats.snapshot())
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("generator %s: final stats not published (Redis unreachable: %s)", generator_id, exc)


def run_generator(config: RunConfig, generator_id: str, redis_url: str, seed: int = 0,
                  index: int | None = None) -> GeneratorSummary:
    """Serve episodes until the run's stop key is set or SIGTERM arrives.

    Args:
        config: The run config (``generator`` section: engine, concurrency, limits).
        generator_id: Name of this generator (appears in rollouts and stats).
        redis_url: The run's Redis.
        seed: Engine sampling and task-order seed.
        index: The generator's index in the run (see ``serve``).

    Returns:
        The generator's final stats.

    Raises:
        TimeoutError: if no weights are published within ``FIRST_WEIGHTS_TIMEOUT_S`` (600) seconds.
    """
    import torch

    if not torch.cuda.is_available():
        # Generator and learner processes share the CPU cores: one torch thread per process.
        torch.set_num_threads(1)
    return asyncio.run(serve(config, generator_id, redis_url, seed, index))
