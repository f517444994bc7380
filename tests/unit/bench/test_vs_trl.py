"""``bench.vs_trl``: its method configs are the committed run's settings, and bad arguments fail in one line."""

from __future__ import annotations

import pytest
from bench.common import load_method, read_result


def test_the_configs_give_the_committed_runs_settings() -> None:
    """Both of our methods share the budget of the committed run: steps, prompts x group size, lr, tokens, tasks."""
    s = read_result("vs_trl")["settings"]
    grpo, sao = load_method("vs_trl", "grpo_sync"), load_method("vs_trl", "sao")
    g = grpo.grpo
    assert (g.steps, g.prompts_per_step, g.group_size, g.optim.lr) == (s["steps"], s["prompts"], s["group_size"], s["lr"])
    assert (sao.sao.steps, sao.sao.batch_size, sao.sao.optim.lr) == (s["steps"], s["prompts"] * s["group_size"], s["lr"])
    for c in (grpo, sao):
        assert (c.data.env_args["high"], c.data.num_train_tasks, c.generator.max_new_tokens, c.warm_start.steps,
                c.eval.num_tasks, c.eval.samples_per_task) == (s["operand_high"], s["train_tasks"], s["max_new_tokens"],
                                                               s["sft_steps"], s["eval_tasks"], s["eval_samples"])


@pytest.mark.parametrize(("argv", "message"), [
    (["grpo.steps=0"], "override 'grpo.steps=0': grpo.steps: Input should be greater than or equal to 1"),
    (["--methods", "ppo"], "argument --methods: invalid choice: 'ppo'"),
    (["--eval-every", "0"], "--eval-every: must be >= 1 steps, got 0"),
])
def test_bad_arguments_fail_in_one_line_before_the_warm_start(tmp_path, capsys, argv, message):
    from bench.vs_trl import main

    with pytest.raises(SystemExit) as exc:
        main([*argv, f"output_dir={tmp_path / 'w'}", "--no-docs", "--out", str(tmp_path / "r.json")])
    assert exc.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()
