"""``train_grpo`` through its KFP python function: a tiny run on the CPU, and a refused mismatch."""

import pytest
from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

from components.conftest import write_config
from components.train_grpo.component import train_grpo
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.prepare import prepare_dataset

TINY = ["run_name=tiny-grpo", "grpo.steps=1", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.micro_batch_size=4", "grpo.checkpoint_every=1", "warm_start.steps=2", "data.num_train_tasks=50", "data.num_eval_tasks=2", "eval.num_tasks=2", "generator.engine=hf"]


def run(tmp_path, prepared):
    model, metrics = Model(uri=str(tmp_path / "model")), Metrics(uri=str(tmp_path / "metrics"))
    train_grpo.python_func(prepared=Dataset(uri=str(prepared)), run_id="run-grpo", model=model, metrics=metrics,
                         report=Markdown(uri=str(tmp_path / "report.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")))
    return model, metrics


def test_a_dataset_prepared_for_another_technique_is_refused(tmp_path, prepared_sao):
    with pytest.raises(PipelineStepError, match="prepared for technique 'sao', not 'grpo'"):
        run(tmp_path, prepared_sao)


@pytest.mark.slow
def test_train_(tmp_path, mlflow_uri):
    config = write_config(tmp_path / "grpo.yaml", "configs/grpo_cpu.yaml", TINY)
    prepared = tmp_path / "prepared"
    prepare_dataset(str(config), "grpo", "", "", 0, "run-grpo", prepared)
    model, _ = run(tmp_path, prepared)
    assert (tmp_path / "model" / "config.json").is_file()
    assert (tmp_path / "model" / "posttrain_model.json").is_file()
    assert model.metadata["technique"] == "grpo"
    assert "grpo".upper() in (tmp_path / "report.md").read_text()
