"""Synchronous GRPO (``posttrain.runners.grpo_sync``) in one process on the tiny model and the ``hf`` engine.

Run: ``python -m pytest -q tests/unit/runners/test_grpo_sync.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.config import RunConfig
from posttrain.envs.base import InfraError
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.learner.ledger import LEDGER_NAME, read_ledger
from posttrain.learner.liveness import LearnerStopped
from posttrain.runners.grpo_sync import SyncGRPO, run_grpo_sync
from posttrain.runtime import RunContext


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sync_grpo_on_a_reward_that_is_always_zero_stops_within_the_bound_with_one_line(tmp_path: Path, tiny_model,
                                                                                        capsys) -> None:
    """``synthetic_arith`` on tasks whose reference is no integer: no answer can match, every reward is 0, every
    group of 2 is uniform and no version is published. With the bound at 3 the run stops at iteration 3 of 10
    after a checkpoint of iteration 3, with one line naming the cause and the shares, having said so at 1 and 2.
    Before, it ran its 10 iterations and wrote a final model identical to the start."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"Compute {i} + 1.", "reference": "none"}) + "\n"
                             for i in range(4)), encoding="utf-8")
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path / "runs"), "run_name": "sync", "technique": "grpo",
        "data": {"env": "synthetic_arith", "train_path": str(tasks), "num_train_tasks": 4},
        "grpo": {"steps": 10, "prompts_per_step": 2, "group_size": 2, "micro_batch_size": 4, "checkpoint_every": 100},
        "generator": {"engine": "hf", "max_new_tokens": 4, "max_turns": 1, "max_episode_tokens": 64},
        "learner": {"max_iterations_without_progress": 3}})
    ctx = RunContext(config)
    shutil.copytree(tiny_model.path, ctx.tokenizer_dir)

    with pytest.raises(LearnerStopped) as err:
        run_grpo_sync(config, start_model_dir=tiny_model.path, progress=False)

    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 1
    assert message == (
        "synchronous GRPO stopped at iteration 3 of 10 (policy version 0): no progress for 3 learner iterations in a "
        "row (learner.max_iterations_without_progress=3): every group uniform (equal rewards, zero advantage) in all "
        "3; uniform groups 100% (6 of 6 groups), stale drops 0% (0 of 12 rollouts), masked tokens n/a (no update "
        "tokens); stopped after a final checkpoint")
    ledger = read_ledger(ctx.run_dir / LEDGER_NAME)
    assert [line["iteration"] for line in ledger] == [1, 2, 3]
    assert all(r["reward"] == 0.0 for line in ledger for r in line["rollouts"])
    assert latest_checkpoint(ctx.checkpoints_dir).name == "iter-000003"
    assert not ctx.final_model_dir.exists()
    status = [line for line in capsys.readouterr().out.splitlines() if line.startswith("learner: no progress")]
    assert len(status) == 2 and all("uniform groups 100%" in line for line in status)


class InfraFailingEnv:
    """The run's environment behind an infrastructure that fails (issue 32): a sandbox that cannot start.

    Tasks are numbered in the order their groups first start episodes; the first task's first episode
    fails once (``tool_killed``), and every episode of the tasks numbered in ``always`` fails
    (``sandbox_unavailable``). The failure is raised by ``start``, before the episode's first await, so the
    counts do not depend on how the engine's calls interleave.
    """

    def __init__(self, inner: Any, always: set[int]) -> None:
        self.inner, self.always, self.name = inner, always, inner.name
        self.seen: list[str] = []
        self.starts: dict[str, int] = {}

    def start(self, task: Any) -> Any:
        if task.task_id not in self.seen:
            self.seen.append(task.task_id)
        index = self.seen.index(task.task_id)
        self.starts[task.task_id] = self.starts.get(task.task_id, 0) + 1
        if index in self.always:
            raise InfraError(f"sandbox for {task.task_id} cannot start", "sandbox_unavailable")
        if index == 0 and self.starts[task.task_id] == 1:
            raise InfraError(f"tool of {task.task_id} killed from outside", "tool_killed")
        return self.inner.start(task)


def test_sync_grpo_reruns_an_infra_failed_episode_in_its_group_gives_up_a_group_that_keeps_failing_and_stops_at_the_share_bound(
        tmp_path: Path, tiny_model) -> None:
    """8 tasks, 4 iterations of 2 groups of 2, generator.infra_retries 1, bound 50% after 8 finished episodes.

    Iteration 1: task A's first episode fails (tool_killed) and runs again in its group; task B's sandbox never
    starts: each member fails twice (re-run once, then given up) and the group is given up: the batch trains
    A's group alone. Infra 5 (3 re-run, 2 given up) against 2 completed: 7 finished, under the 8 the bound needs.
    Iteration 2 trains 2 groups (5 of 11, 45%). Iteration 3's two groups both keep failing: no step, and
    13 of 19 (68%) passes the bound: a checkpoint, then one line. Nothing failed is trained as reward 0; the
    counts are in the metrics and the checkpoint's counters (a resume counts on), by cause.
    Before, the first failure ended the run with the EpisodeInfraError."""
    from posttrain.rollout.infra import InfraTally
    from posttrain.runners.common import infra_row

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "prompt": f"Compute {i} + 1.", "reference": str(i + 1)})
                             + "\n" for i in range(8)), encoding="utf-8")
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path / "runs"), "run_name": "sync-infra", "technique": "grpo",
        "data": {"env": "synthetic_arith", "train_path": str(tasks), "num_train_tasks": 8},
        "grpo": {"steps": 4, "prompts_per_step": 2, "group_size": 2, "micro_batch_size": 4, "checkpoint_every": 100},
        "generator": {"engine": "hf", "max_new_tokens": 4, "max_turns": 1, "max_episode_tokens": 64,
                      "infra_retries": 1, "max_infra_error_share": 0.5, "infra_min_episodes": 8}})
    ctx = RunContext(config)
    shutil.copytree(tiny_model.path, ctx.tokenizer_dir)
    sync = SyncGRPO(config, tiny_model.path)
    env = sync.env = InfraFailingEnv(sync.env, always={1, 4, 5})
    logged: list[dict[str, float]] = []

    with pytest.raises(LearnerStopped) as err:
        sync.run(sink=lambda metrics, version: logged.append(metrics), progress=False)

    assert "\n" not in str(err.value) and err.value.exit_code == 1
    assert re.fullmatch(
        r"synchronous GRPO stopped at iteration 3 of 4 \(policy version \d\): 13 of 19 finished episodes failed for "
        r"the infrastructure \(sandbox_unavailable 12, tool_killed 1\): 68% > generator.max_infra_error_share=0.5; "
        r"stopped after a final checkpoint \(the run log's lines name the tasks\)", str(err.value)), str(err.value)
    a, b, e, f = (env.seen[i] for i in (0, 1, 4, 5))
    assert env.starts[a] == 3 and env.starts[b] == env.starts[e] == env.starts[f] == 4  # each member: 1 + 1 retry
    ledger = read_ledger(ctx.run_dir / LEDGER_NAME)
    assert [len(line["rollouts"]) for line in ledger] == [2, 4, 0]
    trained = [r["task_id"] for line in ledger for r in line["rollouts"]]
    assert trained.count(a) == 2 and not {b, e, f} & set(trained)
    assert [m["infra/errors"] for m in logged] == [5.0, 5.0, 13.0]
    assert (logged[0]["infra/reissued"], logged[0]["infra/abandoned"], logged[0]["infra/tool_killed"]) == (3.0, 2.0, 1.0)
    saved = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
    assert saved["account"]["lives"] == 1 and saved["account"]["shares"]["waiting_for_batch"] > 0  # issue 35
    assert latest_checkpoint(ctx.checkpoints_dir).name == "iter-000003"
    assert InfraTally.from_metrics(saved["counters"]) == InfraTally(
        infra_total=13, completed_total=6, infra_by_cause={"sandbox_unavailable": 12, "tool_killed": 1},
        reissued_total=7, abandoned_total=6)
    assert infra_row(saved["counters"]) == "13 (sandbox_unavailable 12, tool_killed 1); 7 re-issued, 6 given up"
