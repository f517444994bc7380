"""MLflow registry on sqlite: loadable versions, lineage tags, challenger/champion promotion in both score orders, S3 sources.

Promotion tests register with ``log_model=False`` (a stand-in directory, no model logged: they
check the alias arithmetic); the others register the tiny model, which MLflow then loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.eval.cli import models_cli
from posttrain.services.s3 import S3Server
from posttrain.storage import S3Storage
from posttrain.tracking import (
    Lineage,
    Tracker,
    TrackingError,
    config_hash,
    dataset_hash,
    promote_if_better,
    register_checkpoint,
    show_model,
)

pytestmark = pytest.mark.integration

LINEAGE = Lineage(run="run-1", technique="sao", dataset_hash="d" * 16, config_hash="c" * 16, base_model="tiny-qwen2")


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    (d / "model.safetensors").write_bytes(b"\0" * 64)
    return d


@pytest.fixture()
def model_dir(tiny_model) -> Path:
    """A real transformers checkpoint (the tiny model and its tokenizer)."""
    return tiny_model.path


def _register(uri: str, name: str, ckpt: Path, score: float) -> int:
    mv = register_checkpoint(
        str(ckpt), registered_model=name, lineage=LINEAGE, eval_scores={"gsm8k.avg@1": score}, tracking_uri=uri,
        log_model=False,
    )
    return mv.version


def _champion(uri: str, name: str) -> int:
    return show_model(name, alias="champion", tracking_uri=uri)[0].version


def test_registered_version_carries_lineage_scores_and_challenger_alias(uri: str, model_dir: Path) -> None:
    import mlflow

    mv = register_checkpoint(
        str(model_dir), registered_model="lineage-model", lineage=LINEAGE,
        eval_scores={"gsm8k.avg@1": 0.25, "imo_answerbench.pass@4": 0.5}, tracking_uri=uri,
    )
    assert mv.version == 1 and mv.aliases == ["challenger"] and mv.checkpoint == str(model_dir.resolve())
    assert mv.source.startswith("models:/") and mv.run_id, "an MLflow model in a run made for the registration"
    mlflow.set_tracking_uri(uri)
    pipe = mlflow.transformers.load_model("models:/lineage-model@challenger")
    assert pipe.model.config.vocab_size == len(pipe.tokenizer)  # the tiny model was built on its own tokenizer
    assert mv.tags["posttrain.technique"] == "sao"
    assert mv.tags["posttrain.dataset_hash"] == "d" * 16
    assert mv.tags["posttrain.config_hash"] == "c" * 16
    assert mv.tags["posttrain.base_model"] == "tiny-qwen2"
    assert mv.tags["posttrain.run"] == "run-1"
    assert float(mv.tags["eval.gsm8k.avg_at_1"]) == 0.25
    assert float(mv.tags["eval.imo_answerbench.pass_at_4"]) == 0.5


@pytest.mark.parametrize(
    ("first", "second", "champion_after"),
    [(0.50, 0.60, 2), (0.60, 0.50, 1)],
    ids=["better-second-is-promoted", "worse-second-is-not"],
)
def test_promotion_moves_champion_only_to_a_better_version(
    uri: str, ckpt: Path, first: float, second: float, champion_after: int
) -> None:
    """Margin 0.05. Order A: 0.50 then 0.60, +0.10 >= 0.05, v2 wins. Order B: 0.60 then 0.50, -0.10, v1 stays."""
    name = f"promo-{champion_after}"
    v1 = _register(uri, name, ckpt, first)
    d1 = promote_if_better(name, v1, metric="gsm8k.avg@1", margin=0.05, tracking_uri=uri)
    assert d1.promoted and d1.previous_champion is None and _champion(uri, name) == 1
    v2 = _register(uri, name, ckpt, second)
    d2 = promote_if_better(name, v2, metric="gsm8k.avg@1", margin=0.05, tracking_uri=uri)
    assert d2.promoted is (champion_after == 2)
    assert _champion(uri, name) == champion_after
    assert show_model(name, alias="challenger", tracking_uri=uri)[0].version == 2
    note = show_model(name, version=2, tracking_uri=uri)[0].tags["posttrain.promotion"]
    assert ("does not beat" in note) is (champion_after == 1)
    assert ("version 2 beats" in note) is (champion_after == 2)


def test_improvement_below_margin_or_tie_does_not_promote(uri: str, ckpt: Path) -> None:
    """0.50 champion; 0.52 is +0.02 < margin 0.05: no. 0.50 again is a tie: no (even with margin 0)."""
    name = "margin-model"
    promote_if_better(name, _register(uri, name, ckpt, 0.50), metric="gsm8k.avg@1", tracking_uri=uri)
    assert not promote_if_better(name, _register(uri, name, ckpt, 0.52), metric="gsm8k.avg@1", margin=0.05, tracking_uri=uri).promoted
    assert not promote_if_better(name, _register(uri, name, ckpt, 0.50), metric="gsm8k.avg@1", margin=0.0, tracking_uri=uri).promoted
    assert _champion(uri, name) == 1


def test_lower_is_better_metric_promotes_the_smaller_value(uri: str, ckpt: Path) -> None:
    name = "lower-model"
    promote_if_better(name, _register(uri, name, ckpt, 3.0), metric="gsm8k.avg@1", tracking_uri=uri)
    d = promote_if_better(name, _register(uri, name, ckpt, 2.0), metric="gsm8k.avg@1", higher_is_better=False, tracking_uri=uri)
    assert d.promoted and _champion(uri, name) == 2


def test_missing_metric_and_missing_checkpoint_are_clear_errors(uri: str, ckpt: Path, tmp_path: Path) -> None:
    name = "err-model"
    v = _register(uri, name, ckpt, 0.1)
    with pytest.raises(TrackingError, match="eval.math500.avg_at_1"):
        promote_if_better(name, v, metric="math500.avg@1", tracking_uri=uri)
    with pytest.raises(TrackingError, match="no version 99"):
        promote_if_better(name, 99, metric="gsm8k.avg@1", tracking_uri=uri)
    with pytest.raises(TrackingError, match="no config.json"):
        register_checkpoint(str(tmp_path / "nowhere"), registered_model=name, lineage=LINEAGE, tracking_uri=uri)



def test_checkpoint_in_s3_is_registered_as_a_model_that_loads(
    uri: str, model_dir: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    S3Storage().upload_dir(model_dir, "s3://ckpts/team-a/run-1/final")
    mv = register_checkpoint(
        "s3://ckpts/team-a/run-1/final/", registered_model="s3-model", lineage=LINEAGE,
        eval_scores={"gsm8k.avg@1": 0.4}, tracking_uri=uri,
    )
    assert mv.checkpoint == "s3://ckpts/team-a/run-1/final"
    assert mv.tags["posttrain.source"] == "s3://ckpts/team-a/run-1/final"
    mlflow.set_tracking_uri(uri)
    assert mlflow.pyfunc.load_model(f"models:/s3-model/{mv.version}").metadata.run_id == mv.run_id
    with pytest.raises(TrackingError, match="no config.json"):
        register_checkpoint("s3://ckpts/team-a/missing", registered_model="s3-model", lineage=LINEAGE, tracking_uri=uri)


def test_models_cli_register_list_show_promote(uri: str, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--tracking-uri", uri]
    reg = ["register", str(model_dir), "--name", "cli-model", "--run", "r", "--technique", "grpo",
           "--dataset-hash", "h1", "--config-hash", "h2", "--base-model", "b"]
    assert models_cli(base + reg + ["--score", "gsm8k.avg@1=0.3"]) == 0
    assert models_cli(base + reg + ["--score", "gsm8k.avg@1=0.4"]) == 0
    assert models_cli(base + ["promote", "cli-model", "--version", "1", "--metric", "gsm8k.avg@1"]) == 0
    assert models_cli(base + ["promote", "cli-model", "--version", "2", "--metric", "gsm8k.avg@1", "--margin", "0.05"]) == 0
    capsys.readouterr()
    assert models_cli(base + ["list"]) == 0
    out = capsys.readouterr().out
    assert "cli-model" in out and "champion=v2" in out and "challenger=v2" in out
    assert models_cli(base + ["show", "cli-model", "--alias", "champion"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown[0]["version"] == 2 and shown[0]["tags"]["posttrain.technique"] == "grpo"
    assert models_cli(base + ["show", "no-such-model"]) == 1
    assert "error: no registered model 'no-such-model'" in capsys.readouterr().err
    assert models_cli(base + reg + ["--score", "nonsense"]) == 1
    assert models_cli(["frobnicate"]) == 2


def test_tracker_logs_params_metrics_artifacts_and_resumes_the_run(uri: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    with Tracker(uri, "exp-a", run_name="sao-1") as tracker:
        tracker.log_params({"sao": {"loss": {"mask_eps_low": 0.3}}, "technique": "sao"})
        for step in range(3):
            tracker.log_metrics({"reward/mean": step / 10, "eval.gsm8k.avg@1": 0.5}, step=step)
        (tmp_path / "art").mkdir()
        (tmp_path / "art" / "report.md").write_text("# report")
        tracker.log_artifacts(tmp_path / "art", "eval")
        run_id = tracker.run_id
    with Tracker(uri, "exp-a", run_id=run_id) as again:
        again.log_metrics({"reward/mean": 0.9}, step=3)
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["sao.loss.mask_eps_low"] == "0.3"
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [0, 1, 2, 3]
    assert "eval.gsm8k.avg_at_1" in run.data.metrics
    assert [f.path for f in client.list_artifacts(run_id, "eval")] == ["eval/report.md"]
    with pytest.raises(TrackingError, match="no such MLflow run"):
        Tracker(uri, "exp-a", run_id="0" * 32)
    with pytest.raises(KeyboardInterrupt), Tracker(uri, "exp-a", run_name="interrupted") as stopped:
        raise KeyboardInterrupt  # a Ctrl-C: KILLED, not FAILED
    assert client.get_run(stopped.run_id).info.status == "KILLED"


def test_config_and_dataset_hashes_are_stable(tmp_path: Path) -> None:
    assert config_hash({"a": 1, "b": {"c": 2}}) == config_hash({"b": {"c": 2}, "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
    (tmp_path / "x.jsonl").write_text("1\n")
    assert len(dataset_hash([tmp_path / "x.jsonl"])) == 16
    with pytest.raises(FileNotFoundError, match="nope"):
        dataset_hash([tmp_path / "nope"])


def test_tracker_for_run_registers_with_lineage_from_the_config(uri: str, model_dir: Path, tmp_path: Path) -> None:
    """``posttrain run``'s registration: the model's first version is its champion (the demo's docs load
    ``@champion``, which no run ever set); a re-run of a finished run registers the same checkpoint once (it made
    a second version of it); a worse checkpoint stays challenger."""
    import shutil

    from posttrain.config.run import RunConfig
    from posttrain.config.sections import TrackingConfig

    cfg = RunConfig(run_name="flow-run", output_dir=str(tmp_path),
                    tracking=TrackingConfig(tracking_uri=uri, registered_model="flow-model"))
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    final = tmp_path / "final_model"
    shutil.copytree(model_dir, final)
    (final / "resolved_config.yaml").write_text("run_name: flow-run\n")
    with Tracker.for_run(cfg, tmp_path / "flow-run") as tracker:
        tracker.log_params_from_config(cfg)
        first = tracker.register_model(final, technique="sao", scores={"heldout.accuracy": 0.7}, data_paths=[data])
    assert (first.version, first.alias, first.reused) == (1, "champion", False)
    assert first.describe().startswith("1, champion (first champion: version 1 with eval.heldout.accuracy=0.7000")
    mv = show_model("flow-model", version=first.version, tracking_uri=uri)[0]
    assert mv.run_id == tracker.run_id and mv.aliases == ["challenger", "champion"]
    assert mv.tags["posttrain.run"] == "flow-run" and mv.tags["posttrain.base_model"] == "tiny"
    assert mv.tags["posttrain.config_hash"] == config_hash(cfg.model_dump(mode="json"))
    assert mv.tags["posttrain.dataset_hash"] == dataset_hash([data])
    assert float(mv.tags["eval.heldout.accuracy"]) == 0.7
    (final / "resolved_config.yaml").write_text("run_name: flow-run\noutput_dir: elsewhere\n")  # not the model
    with Tracker.for_run(cfg, tmp_path / "flow-run") as rerun:
        again = rerun.register_model(final, technique="sao", scores={"heldout.accuracy": 0.65})
    assert (again.version, again.alias, again.reused) == (1, "champion", True)
    assert again.describe() == "1 (already registered: same checkpoint, nothing new registered)"
    assert [v.version for v in show_model("flow-model", tracking_uri=uri)] == [1]
    (final / "generation_config.json").write_text('{"max_new_tokens": 7}')  # another checkpoint
    with Tracker.for_run(cfg, tmp_path / "flow-run") as later:
        worse = later.register_model(final, technique="sao", scores={"heldout.accuracy": 0.6})
    assert (worse.version, worse.alias, worse.reused) == (2, "challenger", False)
    assert "does not beat champion version 1" in worse.reason and _champion(uri, "flow-model") == 1
    with pytest.raises(TrackingError, match="for_run"):
        Tracker(uri, "plain").register_model(model_dir, technique="sao", scores={})
