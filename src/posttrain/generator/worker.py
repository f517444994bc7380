"""The generator process: many episodes in flight, one rollout each, pushed to the rollout stream.

Run one with ``posttrain generator CONFIG --generator-id g0`` (``REDIS_URL`` must point at the
run's Redis). Each of ``generator.episodes_in_flight`` episode slots loops: take an admission
ticket (so no rollout starts that would be more than ``max_staleness`` policy versions old when
consumed), pick the next task, run the token-in/token-out agent loop, and XADD the rollout. A
watcher reloads weights in place whenever the weight store has a newer version (between
requests; a reload between two turns of one episode is allowed, the rollout then carries the
oldest version), publishes the generator's stats, and stops the generator when the run's stop
key is set or SIGTERM arrives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

import redis

from posttrain.config import RunConfig
from posttrain.generator.agent_loop import EpisodeLimits, run_episode
from posttrain.generator.engines.factory import make_engine
from posttrain.generator.stats import GeneratorStats, MeteredEngine, stats_key, stop_key
from posttrain.learner.grpo import run_group
from posttrain.learner.model import load_tokenizer
from posttrain.records import RecordError
from posttrain.rollout.admission import RedisAdmissionController
from posttrain.rollout.redis_streams import RedisStreamQueue
from posttrain.runtime import RunContext
from posttrain.weight_sync.store import FilesystemWeightStore

log = logging.getLogger("posttrain.generator")

@dataclass
class GeneratorSummary:
    """What a generator did (from ``GeneratorStats.snapshot``)."""

    generator_id: str
    stats: dict[str, float]


async def _serve(config: RunConfig, generator_id: str, redis_url: str, seed: int) -> GeneratorSummary:
    ctx = RunContext(config)
    client = redis.Redis.from_url(redis_url)
    store = FilesystemWeightStore(ctx.weights_dir)
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
        client, ctx.keys, batch_size=config.sao.batch_size, max_staleness=config.sao.max_staleness,
        lease_s=gen.admission_lease_s,
    )
    limits = EpisodeLimits(
        max_turns=gen.max_turns,
        max_new_tokens=gen.max_new_tokens,
        max_episode_tokens=gen.max_episode_tokens,
        timeout_s=gen.episode_timeout_s,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    stats.started_at = time.time()

    group_size = config.grpo.group_size if config.technique == "grpo" else 1
    group_lock = asyncio.Lock()

    async def tickets_for_group() -> list[Any]:
        """``group_size`` tickets, or none: a partial set is released, so group slots never deadlock."""
        async with group_lock:
            held: list[Any] = []
            while len(held) < group_size and not stopping.is_set():
                t0 = time.monotonic()
                ticket = await asyncio.to_thread(admission.acquire, 1.0)
                stats.admission_wait_s += time.monotonic() - t0
                if ticket is None:
                    break
                held.append(ticket)
            if len(held) < group_size:
                for ticket in held:
                    admission.release(ticket)
                return []
            return held

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
                rollouts = await run_group(
                    engine, tokenizer, env, task, limits, group_size=group_size, seed=rng.randrange(2**31),
                    generator_id=generator_id, temperature=gen.temperature, top_p=gen.top_p,
                )
            except (OSError, RuntimeError, ValueError) as exc:
                stats.failed += 1
                for ticket in tickets:
                    admission.release(ticket)
                log.error("generator %s: group of %s failed: %s", generator_id, task.task_id, exc)
                continue
            finally:
                for _ in tickets:
                    stats.episode_finished()
            for ticket, rollout in zip(tickets, rollouts, strict=True):
                await asyncio.to_thread(queue.put, rollout)
                admission.consume(ticket)
                stats.rollouts += 1
                stats.action_tokens += rollout.num_action_tokens
                stats.total_tokens += len(rollout.token_ids)

    async def slot(index: int) -> None:
        while not stopping.is_set():
            t0 = time.monotonic()
            ticket = await asyncio.to_thread(admission.acquire, 1.0)
            stats.admission_wait_s += time.monotonic() - t0
            if ticket is None:
                continue
            task = tasks[rng.randrange(len(tasks))]
            stats.episode_started()
            try:
                rollout = await run_episode(
                    engine, tokenizer, env, task, limits, generator_id=generator_id, seed=rng.randrange(2**31)
                )
                await asyncio.to_thread(queue.put, rollout)
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
            admission.consume(ticket)
            stats.rollouts += 1
            stats.action_tokens += rollout.num_action_tokens
            stats.total_tokens += len(rollout.token_ids)

    def stamp(version: int) -> tuple[int, int]:
        # A restarted learner re-publishes versions past its checkpoint: same number, new directory.
        return version, store.path_for(version).stat().st_mtime_ns

    served = stamp(version)

    async def watcher() -> None:
        nonlocal served
        while not stopping.is_set():
            latest = store.latest_version()
            if latest is not None:
                try:
                    current = stamp(latest)
                except FileNotFoundError:  # pruned or being replaced right now; look again next tick
                    current = served
                if current != served:
                    await engine.update_weights(store.path_for(latest), latest)
                    served = current
            client.hset(stats_key(ctx), generator_id, json.dumps(stats.snapshot()))
            if client.exists(stop_key(ctx)):
                stopping.set()
            await asyncio.sleep(0.2)

    try:
        if group_size > 1:
            slots = [group_slot(i) for i in range(max(1, gen.episodes_in_flight // group_size))]
        else:
            slots = [slot(i) for i in range(gen.episodes_in_flight)]
        await asyncio.gather(watcher(), *slots)
    finally:
        client.hset(stats_key(ctx), generator_id, json.dumps(stats.snapshot()))
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
