"""``train_dpo`` through its KFP python function: a tiny run on the CPU, and a refused mismatch."""

import pytest
from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

from components.conftest import write_config
from components.train_dpo.component import train_dpo
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.prepare import prepare_dataset

TINY = ["run_name=tiny-dpo", "dpo.steps=2", "dpo.max_examples=16", "dpo.checkpoint_every=1", "data.num_train_tasks=50", "data.num_eval_tasks=2", "eval.num_tasks=2"]


def run(tmp_path, prepared):
    model, metrics = Model(uri=str(tmp_path / "model")), Metrics(uri=str(tmp_path / "metrics"))
    train_dpo.python_func(prepared=Dataset(uri=str(prepared)), run_id="run-dpo", model=model, metrics=metrics,
                         report=Markdown(uri=str(tmp_path / "report.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")))
    return model, metrics


def test_a_dataset_prepared_for_another_technique_is_refused(tmp_path, prepared_sao):
    with pytest.raises(PipelineStepError, match="prepared for technique 'sao', not 'dpo'"):
        run(tmp_path, prepared_sao)


@pytest.mark.slow
def test_train_(tmp_path, mlflow_uri):
    config = write_config(tmp_path / "dpo.yaml", "configs/dpo_cpu.yaml", TINY)
    prepared = tmp_path / "prepared"
    prepare_dataset(str(config), "dpo", "", "", 0, "run-dpo", prepared)
    model, _ = run(tmp_path, prepared)
    assert (tmp_path / "model" / "config.json").is_file()
    assert (tmp_path / "model" / "posttrain_model.json").is_file()
    assert model.metadata["technique"] == "dpo"
    assert "dpo".upper() in (tmp_path / "report.md").read_text()
