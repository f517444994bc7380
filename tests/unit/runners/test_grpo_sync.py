"""Synchronous GRPO (``posttrain.runners.grpo_sync``) in one process on the tiny model and the ``hf`` engine.

Run: ``python -m pytest -q tests/unit/runners/test_grpo_sync.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from posttrain.config import RunConfig
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.learner.ledger import LEDGER_NAME, read_ledger
from posttrain.learner.liveness import LearnerStopped
from posttrain.runners.grpo_sync import run_grpo_sync
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
