"""``train_sft`` through its KFP python function: a tiny run on the CPU, and a refused mismatch."""

import pytest
from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

from components.conftest import write_config
from components.train_sft.component import train_sft
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.prepare import prepare_dataset

TINY = ["run_name=tiny-sft", "sft.steps=2", "sft.checkpoint_every=1", "data.num_train_tasks=50", "data.num_eval_tasks=2", "eval.num_tasks=2"]


def run(tmp_path, prepared):
    model, metrics = Model(uri=str(tmp_path / "model")), Metrics(uri=str(tmp_path / "metrics"))
    train_sft.python_func(prepared=Dataset(uri=str(prepared)), run_id="run-sft", model=model, metrics=metrics,
                         report=Markdown(uri=str(tmp_path / "report.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")))
    return model, metrics


def test_a_dataset_prepared_for_another_technique_is_refused(tmp_path, prepared_sao):
    with pytest.raises(PipelineStepError, match="prepared for technique 'sao', not 'sft'"):
        run(tmp_path, prepared_sao)


@pytest.mark.slow
def test_train_(tmp_path, mlflow_uri):
    config = write_config(tmp_path / "sft.yaml", "configs/sft_cpu.yaml", TINY)
    prepared = tmp_path / "prepared"
    prepare_dataset(str(config), "sft", "", "", 0, "run-sft", prepared)
    model, _ = run(tmp_path, prepared)
    assert (tmp_path / "model" / "config.json").is_file()
    assert (tmp_path / "model" / "posttrain_model.json").is_file()
    assert model.metadata["technique"] == "sft"
    assert "sft".upper() in (tmp_path / "report.md").read_text()
    account = (tmp_path / "account.md").read_text()  # the time account's table and its plot (issue 35)
    assert "| learner | training |" in account and "![time account](data:image/png;base64," in account
    assert (tmp_path / "account.png").read_bytes().startswith(b"\x89PNG")
