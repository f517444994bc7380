"""``register_model`` through its KFP python function: MLflow on sqlite, champion only when better."""

import pytest
from kfp.dsl import Dataset, Markdown, Metrics, Model

from components.register_model.component import register_model
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.evaluate import model_location
from posttrain.tracking import show_model


def checkpoint(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def register(tmp_path, prepared, ckpt, accuracy, run_id):
    model = Model(uri=str(ckpt), metadata={"mlflow_run_id": ""})
    scores = Metrics(uri=str(tmp_path / f"m-{run_id}"), metadata={"heldout_accuracy": accuracy})
    report = Markdown(uri=str(tmp_path / f"report-{run_id}.md"))
    text = register_model.python_func(prepared=Dataset(uri=str(prepared)), model=model, eval_metrics=scores,
                                      run_id=run_id, report=report)
    return text, (tmp_path / f"report-{run_id}.md").read_text()


def test_champion_moves_only_to_a_better_checkpoint(tmp_path, prepared_sao, mlflow_uri):
    """Accuracies 0.5, 0.25, 0.75: versions 1 and 3 become champion, version 2 stays challenger."""
    text1, _ = register(tmp_path, prepared_sao, checkpoint(tmp_path, "a"), 0.5, "run-a")
    text2, report2 = register(tmp_path, prepared_sao, checkpoint(tmp_path, "b"), 0.25, "run-b")
    text3, _ = register(tmp_path, prepared_sao, checkpoint(tmp_path, "c"), 0.75, "run-c")
    assert text1.startswith("sao-demo-policy v1 champion: first champion")
    assert text2.startswith("sao-demo-policy v2 challenger: version 2 does not beat champion version 1")
    assert text3.startswith("sao-demo-policy v3 champion: version 3 beats champion version 1")
    assert "| alias | challenger |" in report2
    (v2,) = show_model("sao-demo-policy", version=2, tracking_uri=mlflow_uri)
    assert v2.tags["posttrain.run"] == "run-b" and v2.tags["posttrain.technique"] == "sao"
    assert v2.tags["eval.heldout.accuracy"] == "0.25"
    assert v2.source == str(tmp_path / "b")


def test_without_heldout_accuracy_nothing_is_registered(tmp_path, prepared_sao, mlflow_uri):
    with pytest.raises(PipelineStepError, match="no heldout_accuracy"):
        register_model.python_func(prepared=Dataset(uri=str(prepared_sao)), model=Model(uri=str(tmp_path)),
                                   eval_metrics=Metrics(uri=str(tmp_path / "m")), run_id="r",
                                   report=Markdown(uri=str(tmp_path / "r.md")))


def test_model_location_prefers_the_recorded_checkpoint_uri():
    assert model_location("minio://b/x", "/minio/b/x", {"checkpoint_uri": "s3://t/runs/j/final_model"}) \
        == "s3://t/runs/j/final_model"
    assert model_location("minio://mlpipeline/v2/a/model", "/minio/mlpipeline/v2/a/model", {}) \
        == "s3://mlpipeline/v2/a/model"
    assert model_location("/tmp/root/train/model", "/tmp/root/train/model", {}) == "/tmp/root/train/model"
