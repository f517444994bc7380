"""``register_model`` through its KFP python function: MLflow on sqlite, loadable versions, champion only when better."""

import pytest
from kfp.dsl import Dataset, Markdown, Metrics, Model

from components.register_model.component import register_model
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.evaluate import model_location
from posttrain.tracking import show_model


def register(tmp_path, prepared, ckpt, scores, run_id, promote_on="heldout.accuracy"):
    model = Model(uri=str(ckpt), metadata={"mlflow_run_id": ""})
    metrics = Metrics(uri=str(tmp_path / f"m-{run_id}"), metadata=scores)
    report = Markdown(uri=str(tmp_path / f"report-{run_id}.md"))
    text = register_model.python_func(prepared=Dataset(uri=str(prepared)), model=model, eval_metrics=metrics,
                                      run_id=run_id, report=report, promote_on=promote_on)
    return text, (tmp_path / f"report-{run_id}.md").read_text()


def test_champion_moves_only_to_a_better_checkpoint_on_the_named_benchmark(tmp_path, prepared_sao, tiny_checkpoint,
                                                                          mlflow_uri):
    """beyond_aime accuracies 0.5, 0.25, 0.75 (heldout the other way round): versions 1 and 3 become champion."""
    def scores(aime, heldout):
        return {"beyond_aime_accuracy": aime, "beyond_aime_num_tasks": 2.0, "heldout_accuracy": heldout}

    on = "beyond_aime.accuracy"
    text1, _ = register(tmp_path, prepared_sao, tiny_checkpoint, scores(0.5, 0.5), "run-a", on)
    text2, report2 = register(tmp_path, prepared_sao, tiny_checkpoint, scores(0.25, 0.75), "run-b", on)
    text3, _ = register(tmp_path, prepared_sao, tiny_checkpoint, scores(0.75, 0.25), "run-c", on)
    assert text1.startswith("sao-demo-policy v1 champion: first champion")
    assert text2.startswith("sao-demo-policy v2 challenger: version 2 does not beat champion version 1 "
                            "on eval.beyond_aime.accuracy")
    assert text3.startswith("sao-demo-policy v3 champion: version 3 beats champion version 1")
    assert "| alias | challenger |" in report2 and "| promoted on | beyond_aime.accuracy |" in report2
    (v2,) = show_model("sao-demo-policy", version=2, tracking_uri=mlflow_uri)
    assert v2.tags["posttrain.run"] == "run-b" and v2.tags["posttrain.technique"] == "sao"
    assert v2.tags["eval.beyond_aime.accuracy"] == "0.25" and v2.tags["eval.heldout.accuracy"] == "0.75"
    assert v2.checkpoint == str(tiny_checkpoint) and v2.source.startswith("models:/")
    assert v2.run_id, "a version registered without a training run gets a registration run"


def test_the_champion_loads_through_mlflow_pyfunc(tmp_path, prepared_sao, tiny_checkpoint, mlflow_uri):
    import mlflow

    register(tmp_path, prepared_sao, tiny_checkpoint, {"heldout_accuracy": 0.5}, "run-a")
    mlflow.set_tracking_uri(mlflow_uri)
    model = mlflow.pyfunc.load_model("models:/sao-demo-policy@champion")
    (text,) = model.predict(["1 + 2 ="])
    assert isinstance(text, str)


def test_without_the_promotion_metric_nothing_is_registered(tmp_path, prepared_sao, mlflow_uri):
    with pytest.raises(PipelineStepError, match="promote_on 'beyond_aime.accuracy': eval_metrics have no "
                                                "beyond_aime_accuracy"):
        register(tmp_path, prepared_sao, tmp_path, {"heldout_accuracy": 0.5}, "r", "beyond_aime.accuracy")
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


def test_a_cluster_sao_version_is_linked_to_the_learners_mlflow_run(tmp_path, prepared_sao, tiny_checkpoint, mlflow_uri):
    """Cluster SAO metadata has no mlflow_run_id; the learner's run (tag posttrain.learner_of) is found instead."""
    from posttrain.tracking import Tracker

    with Tracker(mlflow_uri, "posttrain-demo", run_name="learner",
                 tags={"posttrain.learner_of": "tiny-sao-run0001"}) as learner:
        learner.log_metrics({"reward/mean": 0.5}, step=1)
    model = Model(uri=str(tiny_checkpoint), metadata={"technique": "sao", "checkpoint_uri": str(tiny_checkpoint),
                                                      "jobset": "sao-x"})
    register_model.python_func(prepared=Dataset(uri=str(prepared_sao)), model=model,
                               eval_metrics=Metrics(uri=str(tmp_path / "m"), metadata={"heldout_accuracy": 0.5}),
                               run_id="run-x", report=Markdown(uri=str(tmp_path / "r.md")))
    (version,) = show_model("sao-demo-policy", version=1, tracking_uri=mlflow_uri)
    assert version.run_id == learner.run_id and version.tags["posttrain.mlflow_run_id"] == learner.run_id
