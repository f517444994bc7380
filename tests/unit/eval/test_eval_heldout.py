"""Held-out evaluation (``posttrain.eval.heldout``) under infrastructure failures, on the tiny model's ``hf`` engine.

The environment is the real ``synthetic_arith`` behind an infrastructure that fails (issue 32): the
sandbox of some episodes cannot start, as ``InfraError`` says. Run: ``python -m pytest -q tests/unit/eval/test_eval_heldout.py``.
"""

from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from posttrain.config import RunConfig
from posttrain.envs.base import InfraError
from posttrain.eval.heldout import evaluate_policy, heldout_tasks
from posttrain.eval.infra import AccuracyRefused
from posttrain.runtime import RunContext


class FailingSandboxEnv:
    """``inner``'s episodes, whose sandbox cannot start for the first ``fails[task_id]`` runs of a task (-1: every run).

    ``start`` raises ``InfraError`` as ``MathToolEnv`` or the SWE environment do when their sandbox cannot
    start (the tiny model's 4-token turns end before any grading step, so the failure comes at the start).
    """

    def __init__(self, inner: Any, fails: dict[str, int], cause: str = "sandbox_error") -> None:
        self.inner, self.fails, self.cause, self.name = inner, fails, cause, inner.name
        self.runs: dict[str, int] = defaultdict(int)

    def start(self, task: Any) -> Any:
        self.runs[task.task_id] += 1
        left = self.fails.get(task.task_id, 0)
        if left == -1 or self.runs[task.task_id] <= left:
            raise InfraError(f"sandbox for {task.task_id} could not start: bubblewrap: setting up uid map", self.cause)
        return self.inner.start(task)


def _ctx(tmp_path: Path, tiny_model: Any, **eval_section: Any) -> RunContext:
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path / "runs"), "run_name": "heldout", "technique": "sao",
        "data": {"env": "synthetic_arith", "num_eval_tasks": 5},
        "generator": {"engine": "hf", "max_new_tokens": 4, "max_turns": 1, "max_episode_tokens": 64},
        "eval": {"num_tasks": 5, "samples_per_task": 1, **eval_section}})
    ctx = RunContext(config)
    shutil.copytree(tiny_model.path, ctx.tokenizer_dir)
    return ctx


def test_a_heldout_sample_whose_sandbox_fails_is_rerun_then_left_out_by_cause_and_a_bound_refuses_the_accuracy(
        tmp_path: Path, tiny_model: Any, caplog: pytest.LogCaptureFixture) -> None:
    """5 held-out tasks x 1 sample, eval.infra_retries 2. Task A's sandbox fails once: it runs again with the same
    seed and is graded. Task B's fails on every run (1 + 2): it is left out of the accuracy (4 samples graded),
    counted by cause (infra_errors 1, infra_sandbox_error 1, 3 retries), and one warning line says so.
    1 of 5 (20%) is within eval.max_infra_error_share 0.25; at 0.1 no accuracy is given: one line.
    Before, the EpisodeInfraError of task A's first run ended the evaluation."""
    ctx = _ctx(tmp_path, tiny_model, max_infra_error_share=0.25)
    a, b = (t.task_id for t in heldout_tasks(ctx)[:2])
    env = FailingSandboxEnv(ctx.environment(), {a: 1, b: -1})
    ctx.environment = lambda: env  # type: ignore[method-assign]

    with caplog.at_level(logging.INFO, logger="posttrain.eval"):
        scores = evaluate_policy(ctx, tiny_model.path, engine_kind="hf")

    assert env.runs[a] == 2 and env.runs[b] == 3 and sum(env.runs.values()) == 5 + 1 + 2
    assert scores["num_rollouts"] == 4.0 and 0.0 <= scores["accuracy"] <= 1.0
    assert (scores["infra_errors"], scores["infra_sandbox_error"], scores["infra_retried"]) == (1.0, 1.0, 3.0)
    assert scores["infra_share"] == pytest.approx(0.2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["held-out eval: 1 of 5 samples failed for the infrastructure (sandbox_error 1) after 3 "
                        "retries and are left out of the accuracy"]
    assert any(b in r.getMessage() and "left out" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)

    strict = _ctx(tmp_path / "strict", tiny_model, max_infra_error_share=0.1)
    strict.environment = lambda: FailingSandboxEnv(RunContext(strict.config).environment(), {b: -1})  # type: ignore[method-assign]
    with pytest.raises(AccuracyRefused) as err:
        evaluate_policy(strict, tiny_model.path, engine_kind="hf")
    assert str(err.value) == (
        "held-out eval: 1 of 5 samples failed for the infrastructure (sandbox_error 1): 20% > "
        "eval.max_infra_error_share=0.1; no accuracy reported (the samples that ran may not stand for the set; fix "
        "the sandbox or grader and evaluate again)")
