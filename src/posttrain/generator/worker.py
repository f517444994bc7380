"""The generator process: many episodes in flight, one rollout each, pushed to the rollout stream.

Run one with ``posttrain generator CONFIG --generator-id g0`` (``REDIS_URL`` must point at the
run's Redis). Each of ``generator.episodes_in_flight`` episode slots loops: take an admission
ticket (so no rollout starts that would be more than ``max_staleness`` policy versions old when
consumed), pick the next task, run the token-in/token-out agent loop, and XADD the rollout.

Waiting never parks threads: tickets come through ``AsyncTicketGate`` (one poller per process,
backoff on the event loop), and the ``hf`` engine runs its batches on its own thread, so an
engine batch never queues behind blocked work in asyncio's default pool.

A watcher waits for the learner's new-weights announcement (``generator.weight_watch``: Redis
pub/sub) for at most ``WEIGHT_WAIT_S`` seconds, then reads the weight store's latest version
either way (a missed announcement costs at most that long) and reloads in place when it is new
(between requests; a reload between two turns of one episode is allowed, the rollout then
carries the oldest version). Before reloading it cancels the episodes in flight that the latest
version made too stale to train (``generator.abort_stale_episodes``, ``generator.inflight``):
their tickets are released and they count in ``stale_aborted``. Each wake-up also nudges the
admission gate (a new version raises capacity), publishes the generator's stats, and checks the
run's stop key. On stop (key or SIGTERM) episodes in flight are cancelled and their tickets
released.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import redis

from posttrain.config import RunConfig
from posttrain.config.roles import async_rl_settings
from posttrain.episodes.group import run_group
from posttrain.episodes.runner import EpisodeLimits, run_episode
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.inference.factory import make_engine
from posttrain.inference.metering import GeneratorStats, MeteredEngine
from posttrain.models.hf import load_tokenizer
from posttrain.records import RecordError
from posttrain.rollout.admission import AsyncTicketGate, RedisAdmissionController
from posttrain.rollout.redis_streams import RedisStreamQueue
from posttrain.rollout.telemetry import publish_generator_stats
from posttrain.runtime import RunContext
from posttrain.weight_sync.announce import WeightAnnouncements
from posttrain.weight_sync.factory import open_weight_store

log = logging.getLogger("posttrain.generator")

WEIGHT_WAIT_S = 1.0
"""Longest wait (seconds) for a new-weights announcement before the watcher reads the store anyway."""

TICKET_WAIT_S = 1.0
"""Longest wait (seconds) of one episode slot for an admission ticket before it re-checks for stop."""

@dataclass
class GeneratorSummary:
    """What a generator did (from ``GeneratorStats.snapshot``)."""

    generator_id: str
    stats: dict[str, float]


async def _serve(config: RunConfig, generator_id: str, redis_url: str, seed: int) -> GeneratorSummary:
    ctx = RunContext(config)
    settings = async_rl_settings(config)
    client = redis.Redis.from_url(redis_url)
    store = open_weight_store(ctx)
    version = store.latest_version()
    deadline = time.monotonic() + 600
    while version is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no weights published in {ctx.weights_dir} after 600 s")
        await asyncio.sleep(0.5)
        version = store.latest_version()
    gen = config.generator
    stats = GeneratorStats()
    raw_engine = make_engine(
        gen.engine,
        store.path_for(version),
        policy_version=version,
        seed=seed,
        max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
        kv_cache_gib=gen.vllm_kv_cache_gib,
        max_batch=gen.episodes_in_flight,
    )
    engine = MeteredEngine(raw_engine, stats)
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    env = ctx.environment()
    tasks = ctx.tasks("train")
    rng = random.Random(seed)
    queue = RedisStreamQueue(client, ctx.keys, consumer=f"generator-{generator_id}", maxlen=config.queue.maxlen)
    admission = RedisAdmissionController(
        client, ctx.keys, batch_size=settings.batch_rollouts, max_staleness=settings.max_staleness,
        lease_s=gen.admission_lease_s,
    )
    gate = AsyncTicketGate(admission)
    announcements = WeightAnnouncements(redis_url, ctx.keys)
    await announcements.subscribe()
    limits = EpisodeLimits(
        max_turns=gen.max_turns,
        max_new_tokens=gen.max_new_tokens,
        max_episode_tokens=gen.max_episode_tokens,
        timeout_s=gen.episode_timeout_s,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    stats.mark_started()

    running = InFlightEpisodes()
    group_size = settings.group_size
    group_lock = asyncio.Lock()

    async def tickets_for_group() -> list[Any]:
        """``group_size`` tickets, or none: a partial set is released, so group slots never deadlock."""
        async with group_lock:
            held: list[Any] = []
            while len(held) < group_size and not stopping.is_set():
                t0 = time.monotonic()
                ticket = await gate.acquire(TICKET_WAIT_S)
                stats.admission_wait_s += time.monotonic() - t0
                if ticket is None:
                    break
                held.append(ticket)
            if len(held) < group_size:
                for ticket in held:
                    admission.release(ticket)
                return []
            return held

    sending: set[asyncio.Task[None]] = set()

    async def send(pairs: list[tuple[Any, Any]]) -> None:
        """XADD each rollout, then consume its ticket (or release it when the record is refused)."""
        for ticket, rollout in pairs:
            try:
                await asyncio.to_thread(queue.put, rollout)
            except RecordError as exc:
                stats.rejected += 1
                admission.release(ticket)
                log.warning("generator %s: rollout of %s rejected: %s", generator_id, rollout.task_id, exc)
                continue
            except (OSError, RuntimeError, ValueError) as exc:
                stats.failed += 1
                admission.release(ticket)
                log.error("generator %s: rollout of %s not sent: %s", generator_id, rollout.task_id, exc)
                continue
            admission.consume(ticket)
            stats.rollouts += 1
            stats.action_tokens += rollout.num_action_tokens
            stats.total_tokens += len(rollout.token_ids)

    async def send_shielded(pairs: list[tuple[Any, Any]]) -> None:
        # A stop arriving during the XADD must not leave a ticket neither consumed nor released:
        # the send finishes on its own task (awaited before the process exits).
        task = asyncio.create_task(send(pairs))
        sending.add(task)
        task.add_done_callback(sending.discard)
        await asyncio.shield(task)

    async def group_slot(index: int) -> None:
        """GRPO: G episodes of one task sharing a group_id; a group is sent whole or not at all."""
        while not stopping.is_set():
            tickets = await tickets_for_group()
            if not tickets:
                continue
            task = tasks[rng.randrange(len(tasks))]
            for _ in tickets:
                stats.episode_started()
            try:
                rollouts = await running.run(functools.partial(
                    run_group, engine, tokenizer, env, task, limits, group_size=group_size, seed=rng.randrange(2**31),
                    generator_id=generator_id, temperature=gen.temperature, top_p=gen.top_p, arrays=True,
                ))
            except asyncio.CancelledError:  # stopping: give the slots back before unwinding
                for ticket in tickets:
                    admission.release(ticket)
                raise
            except (OSError, RuntimeError, ValueError) as exc:
                stats.failed += 1
                for ticket in tickets:
                    admission.release(ticket)
                log.error("generator %s: group of %s failed: %s", generator_id, task.task_id, exc)
                continue
            finally:
                for _ in tickets:
                    stats.episode_finished()
            if rollouts is None:  # cancelled as stale: the learner would drop the whole group
                stats.stale_aborted += len(tickets)
                for ticket in tickets:
                    admission.release(ticket)
                continue
            await send_shielded(list(zip(tickets, rollouts, strict=True)))

    async def slot(index: int) -> None:
        while not stopping.is_set():
            t0 = time.monotonic()
            ticket = await gate.acquire(TICKET_WAIT_S)
            stats.admission_wait_s += time.monotonic() - t0
            if ticket is None:
                continue
            task = tasks[rng.randrange(len(tasks))]
            stats.episode_started()
            try:
                rollout = await running.run(functools.partial(
                    run_episode, engine, tokenizer, env, task, limits, generator_id=generator_id,
                    seed=rng.randrange(2**31),
                    arrays=True,  # converted once while validating; put() packs them without a per-token pass
                ))
            except asyncio.CancelledError:  # stopping: give the slot back before unwinding
                admission.release(ticket)
                raise
            except RecordError as exc:
                stats.rejected += 1
                admission.release(ticket)
                log.warning("generator %s: rollout of %s rejected: %s", generator_id, task.task_id, exc)
                continue
            except (OSError, RuntimeError, ValueError) as exc:
                stats.failed += 1
                admission.release(ticket)
                log.error("generator %s: episode of %s failed: %s", generator_id, task.task_id, exc)
                continue
            finally:
                stats.episode_finished()
            if rollout is None:  # cancelled as stale: the learner would drop it
                stats.stale_aborted += 1
                admission.release(ticket)
                continue
            await send_shielded([(ticket, rollout)])

    def stamp(version: int) -> tuple[int, int]:
        # A restarted learner re-publishes versions past its checkpoint: same number, new directory.
        return version, store.path_for(version).stat().st_mtime_ns

    served = stamp(version)

    async def watcher() -> None:
        try:
            await watch()
        finally:  # a failing watcher stops the slots too, so the error surfaces instead of a hang
            stopping.set()

    async def watch() -> None:
        nonlocal served
        while not stopping.is_set():
            latest = store.latest_version()
            if latest is not None:
                if gen.abort_stale_episodes:
                    running.abort_stale(latest, settings.max_staleness)
                try:
                    current = stamp(latest)
                except FileNotFoundError:  # pruned or being replaced right now; look again next wake-up
                    current = served
                if current != served:
                    await engine.update_weights(store.path_for(latest), latest)
                    served = current
            publish_generator_stats(client, ctx.keys, generator_id, stats.snapshot())
            if client.exists(ctx.keys.stop):
                stopping.set()
                break
            try:
                announced = await announcements.wait(WEIGHT_WAIT_S)
            except redis.ConnectionError as exc:  # redis-py re-subscribes on the next wait
                log.warning("generator %s: weight announcements: %s; reading the store instead", generator_id, exc)
                announced = None
            if announced is None:
                stats.weight_wait_timeouts += 1
            else:
                stats.weight_announcements += 1
                gate.wake()  # the learner moved on: admission capacity grew

    async def stop_slots(slot_tasks: list[asyncio.Task[None]]) -> None:
        await stopping.wait()
        for t in slot_tasks:
            t.cancel()

    try:
        if group_size > 1:
            slots = [group_slot(i) for i in range(max(1, gen.episodes_in_flight // group_size))]
        else:
            slots = [slot(i) for i in range(gen.episodes_in_flight)]
        slot_tasks = [asyncio.create_task(s, name=f"episode-slot-{i}") for i, s in enumerate(slots)]
        for t in slot_tasks:  # a slot dying of an unexpected error stops the generator (raised below)
            t.add_done_callback(lambda done: stopping.set() if not done.cancelled() and done.exception() else None)
        results = await asyncio.gather(watcher(), stop_slots(slot_tasks), *slot_tasks, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        if errors:
            raise errors[0]
    finally:
        for result in await asyncio.gather(*sending, return_exceptions=True):
            if isinstance(result, BaseException):
                log.error("generator %s: sending a rollout failed while stopping: %r", generator_id, result)
        publish_generator_stats(client, ctx.keys, generator_id, stats.snapshot())
        await announcements.close()
        engine.close()
    return GeneratorSummary(generator_id, stats.snapshot())


def run_generator(config: RunConfig, generator_id: str, redis_url: str, seed: int = 0) -> GeneratorSummary:
    """Serve episodes until the run's stop key is set or SIGTERM arrives.

    Args:
        config: The run config (``generator`` section: engine, concurrency, limits).
        generator_id: Name of this generator (appears in rollouts and stats).
        redis_url: The run's Redis.
        seed: Sampling and task-order seed.

    Returns:
        The generator's final stats.

    Raises:
        TimeoutError: if no weights are published within 600 s.
    """
    import torch

    if not torch.cuda.is_available():
        # Generator and learner processes share the CPU cores; one thread each avoids the
        # oversubscription that made the hf engine 12x slower on a 2-core machine.
        torch.set_num_threads(1)
    return asyncio.run(_serve(config, generator_id, redis_url, seed))
