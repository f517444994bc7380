"""Real generator processes over the embedded Redis, with the test playing the learner by hand.

Shared by the integration tests that check what generators sample (``test_distinct_generators``,
``test_generator_restart``): the run is prepared and warm-started, the start model is published to
the weight store as version ``VERSION_AHEAD`` and the policy-version key set to it, so admission
never blocks (no ticket goes to an engine behind the key by more than tau); the test then reads
the stream itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from posttrain.config import load_config
from posttrain.models.hf import load_policy
from posttrain.records import Rollout
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue
from posttrain.runners.common import prepare, warm_start
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.factory import open_weight_store

GENERATOR_OVERRIDES = [
    "generator.engine=hf", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=60",
    "generator.admission_lease_s=600", "data.num_train_tasks=3", "data.num_eval_tasks=2",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=4", "sao.micro_batch_size=4",
    "sao.max_staleness=0", "sao.steps=4",
]
"""Tiny model, hf engine, 3 training tasks (so tasks repeat), tau 0 (capacity set by the version key)."""
VERSION_AHEAD = 1000
"""Policy version the test sets: admission capacity (1000 + 0 + 1) * 4 rollouts, never reached."""


@dataclass
class HandRun:
    """A prepared run and its Redis: ``ctx`` (run context), ``config_path`` (resolved config for
    ``posttrain generator``), ``url``/``client`` (the embedded server), ``queue`` (the stream, read
    by consumer ``test``), ``logs`` (generator logs)."""

    ctx: RunContext
    config_path: Path
    url: str
    client: redis.Redis
    queue: RedisStreamQueue
    logs: Path

    def collect(self, procs: list, enough, timeout_s: float = 300.0) -> list[Rollout]:
        """Rollouts read until ``enough(rollouts)`` is true; fails with the g0 log if a process died
        or after ``timeout_s`` seconds (a bound on a hang, not a timing check)."""
        out: list[Rollout] = []
        deadline = time.monotonic() + timeout_s
        while not enough(out):
            assert time.monotonic() < deadline, f"timed out with {len(out)} rollouts; logs in {self.logs}"
            assert all(p.poll() is None for p in procs), (self.logs / "generator-g0.log").read_text()[-3000:]
            out += [e.rollout for e in self.queue.get_batch(50, 1.0)]
        return out


@contextlib.contextmanager
def hand_run(tmp_path: Path, overrides: list[str], run_name: str) -> Iterator[HandRun]:
    """Prepare ``run_name`` under ``tmp_path`` with ``GENERATOR_OVERRIDES + overrides`` and yield it
    with a fresh embedded Redis (stopped on exit)."""
    cfg = load_config(None, [*GENERATOR_OVERRIDES, *overrides, f"output_dir={tmp_path}", f"run_name={run_name}"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    open_weight_store(ctx).publish(load_policy(model_dir).state_dict(), VERSION_AHEAD, model_dir)
    config_path = ctx.save_resolved_config()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        RedisPolicyVersionStore(client, ctx.keys).set(VERSION_AHEAD)
        queue = RedisStreamQueue(client, ctx.keys, consumer="test")
        queue.ensure_group()
        yield HandRun(ctx, config_path, server.url, client, queue, ctx.run_dir / "logs")
