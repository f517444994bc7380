"""``prepare_dataset`` run through its KFP python function with local artifacts."""

import json

import pytest
import yaml
from kfp.dsl import Dataset, Metrics

from components.prepare_dataset.component import prepare_dataset
from posttrain.data.tasks import DatasetError
from posttrain.kfp.artifacts import PipelineStepError, load_prepared


def run(tmp_path, config, technique="sao", model="", dataset="", steps=0, run_id="0a1b2c3d-4e5f"):
    prepared, summary = Dataset(uri=str(tmp_path / "prepared")), Metrics(uri=str(tmp_path / "summary"))
    prepare_dataset.python_func(config=str(config), technique=technique, model=model, dataset=dataset, steps=steps,
                                run_id=run_id, prepared=prepared, summary=summary)
    return prepared, summary


def test_prepare_writes_the_resolved_config_tasks_and_manifest(tmp_path, tiny_sao_config, mlflow_uri):
    """64 train and 2 eval tasks from the config; steps=3 lands in sao.steps; run name gets 8 id characters."""
    prepared, summary = run(tmp_path, tiny_sao_config, steps=3)
    root = tmp_path / "prepared"
    assert sorted(p.name for p in root.iterdir()) == ["config.yaml", "eval.jsonl", "manifest.json", "train.jsonl"]
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    assert cfg["sao"]["steps"] == 3 and cfg["technique"] == "sao"
    assert cfg["run_name"] == "tiny-sao-0a1b2c3d"
    assert cfg["data"]["train_path"] == "train.jsonl" and cfg["data"]["eval_path"] == "eval.jsonl"
    assert len((root / "train.jsonl").read_text().splitlines()) == 64
    assert summary.metadata == {"train_rows": 64.0, "eval_rows": 2.0}
    manifest = json.loads((root / "manifest.json").read_text())
    assert prepared.metadata["dataset_hash"] == manifest["dataset_hash"] and len(manifest["dataset_hash"]) == 16
    assert manifest["base_model"].startswith("tiny")


def test_later_steps_read_the_artifact_with_absolute_paths(tmp_path, tiny_sao_config, mlflow_uri):
    run(tmp_path, tiny_sao_config)
    cfg, manifest = load_prepared(tmp_path / "prepared", tmp_path / "work")
    assert cfg.data.train_path == str(tmp_path / "prepared" / "train.jsonl")
    assert cfg.output_dir == str(tmp_path / "work")
    assert manifest["technique"] == "sao"


def test_the_dataset_parameter_replaces_the_configured_tasks(tmp_path, tiny_sao_config, mlflow_uri):
    tasks = tmp_path / "mine.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Compute {i} + 1.", "reference": str(i + 1)}) + "\n"
                             for i in range(3)))
    _, summary = run(tmp_path, tiny_sao_config, dataset=str(tasks))
    assert summary.metadata["train_rows"] == 3.0
    manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert manifest["dataset_source"] == str(tasks)


def test_a_bad_task_row_names_file_line_and_field(tmp_path, tiny_sao_config, mlflow_uri):
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text('{"prompt": "Compute 1 + 1.", "reference": "2"}\n{"prompt": 7, "reference": "3"}\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: field 'prompt'"):
        run(tmp_path, tiny_sao_config, dataset=str(tasks))


def test_an_unknown_technique_or_missing_config_is_refused(tmp_path, tiny_sao_config, mlflow_uri):
    with pytest.raises(PipelineStepError, match=r"technique: 'ppo' is not one of"):
        run(tmp_path, tiny_sao_config, technique="ppo")
    with pytest.raises(PipelineStepError, match=r"config: configs/nope.yaml not found"):
        run(tmp_path, "configs/nope.yaml")


def test_models_uri_resolves_to_the_current_champion(tmp_path, tiny_sao_config, mlflow_uri):
    from posttrain.tracking import CHAMPION, Lineage, promote_if_better, register_checkpoint

    ckpt = tmp_path / "champion-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    lineage = Lineage(run="r", technique="sao", dataset_hash="d", config_hash="c", base_model="b")
    v = register_checkpoint(str(ckpt), registered_model="team-policy", lineage=lineage,
                            eval_scores={"heldout.accuracy": 0.5}, tracking_uri=mlflow_uri, log_model=False)
    promote_if_better("team-policy", v.version, metric="heldout.accuracy", tracking_uri=mlflow_uri)
    prepared, _ = run(tmp_path, tiny_sao_config, model=f"models:/team-policy@{CHAMPION}")
    cfg = yaml.safe_load((tmp_path / "prepared" / "config.yaml").read_text())
    assert cfg["model"]["path"] == str(ckpt)
    assert prepared.metadata["base_model"] == f"models:/team-policy@champion = team-policy version 1 ({ckpt})"
    with pytest.raises(PipelineStepError, match="has no alias 'gold'"):
        run(tmp_path, tiny_sao_config, model="models:/team-policy@gold")


def test_a_model_path_without_config_json_fails_early(tmp_path, tiny_sao_config, mlflow_uri):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PipelineStepError, match="model: .*empty has no config.json"):
        run(tmp_path, tiny_sao_config, model=str(tmp_path / "empty"))


@pytest.mark.integration
def test_config_dataset_and_model_can_live_in_s3(tmp_path, tiny_sao_config, mlflow_uri, monkeypatch):
    """A real SeaweedFS S3 server; the steps find it through AWS_ENDPOINT_URL and the credentials."""
    from posttrain.services.s3 import start_s3_server
    from posttrain.storage import S3Storage

    with start_s3_server(tmp_path / "weed", buckets=["team"]) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        s3 = S3Storage(client=server.client())
        s3.write_bytes("s3://team/configs/sao.yaml", tiny_sao_config.read_bytes())
        s3.write_bytes("s3://team/data/tasks.jsonl", b'{"prompt": "Compute 2 + 2.", "reference": "4"}\n')
        s3.write_bytes("s3://team/models/base/config.json", b"{}")
        prepared, summary = run(tmp_path, "s3://team/configs/sao.yaml", dataset="s3://team/data/tasks.jsonl",
                                model="s3://team/models/base")
        with pytest.raises(PipelineStepError, match="s3://team/models/none has no config.json"):
            run(tmp_path / "again", "s3://team/configs/sao.yaml", model="s3://team/models/none")
    assert summary.metadata["train_rows"] == 1.0
    cfg = yaml.safe_load((tmp_path / "prepared" / "config.yaml").read_text())
    assert cfg["model"]["path"] == "s3://team/models/base"
    assert not (tmp_path / "prepared" / ".inputs").exists()


def test_gkd_teacher_resolves_through_the_registry_and_fixed_sequences_join_the_artifact(tmp_path, mlflow_uri):
    """gkd.teacher.path models:/team-policy@champion becomes that version's checkpoint (the RL champion a team
    distils); gkd.data_path (lambda < 1) is validated and copied as fixed.jsonl; a teacher without config.json
    fails before anything trains."""
    from components.conftest import write_config
    from posttrain.tracking import CHAMPION, Lineage, promote_if_better, register_checkpoint

    ckpt = tmp_path / "teacher-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    lineage = Lineage(run="r", technique="sao", dataset_hash="d", config_hash="c", base_model="b")
    v = register_checkpoint(str(ckpt), registered_model="team-policy", lineage=lineage,
                            eval_scores={"heldout.accuracy": 0.5}, tracking_uri=mlflow_uri, log_model=False)
    promote_if_better("team-policy", v.version, metric="heldout.accuracy", tracking_uri=mlflow_uri)
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text(json.dumps({"messages": [{"role": "user", "content": "Compute 1 + 1."},
                                              {"role": "assistant", "content": "#### 2"}]}) + "\n")
    tiny = ["run_name=tiny-gkd", "data.num_train_tasks=16", "data.num_eval_tasks=2", "gkd.lmbda=0.5",
            f"gkd.data_path={fixed}", f"gkd.teacher.path=models:/team-policy@{CHAMPION}"]
    config = write_config(tmp_path / "gkd.yaml", "configs/gkd_cpu.yaml", tiny)
    prepared, _ = run(tmp_path, config, technique="gkd", steps=4)
    root = tmp_path / "prepared"
    cfg, manifest = load_prepared(root)
    assert cfg.gkd.teacher.path == str(ckpt) and cfg.gkd.steps == 4
    assert cfg.gkd.data_path == str(root / "fixed.jsonl") and (root / "fixed.jsonl").read_text() == fixed.read_text()
    assert prepared.metadata["teacher_model"] == f"models:/team-policy@champion = team-policy version 1 ({ckpt})"
    assert manifest["files"]["gkd.data_path"] == "fixed.jsonl"
    (tmp_path / "empty").mkdir()
    config = write_config(tmp_path / "gkd2.yaml", "configs/gkd_cpu.yaml",
                          [*tiny[:3], f"gkd.teacher.path={tmp_path / 'empty'}"])
    with pytest.raises(PipelineStepError, match="gkd.teacher.path: .*empty has no config.json"):
        run(tmp_path / "second", config, technique="gkd")
