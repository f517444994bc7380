"""SFT registration when the KFP pipeline root is ``minio://mlpipeline``, against a real SeaweedFS S3 server.

On a cluster KFP keeps the Model artifact under its own pipeline root (``minio://mlpipeline/...``,
KFP's MinIO), which the tenant's S3 endpoint does not serve: reading it there fails with
NoSuchBucket. The train step therefore copies the checkpoint under the tenant's ``$S3_PREFIX``
and registration reads that copy; the registered version is an MLflow model that loads.

The shared test S3 server (``tests/conftest.py``) has the tenant bucket ``posttrain`` and no ``mlpipeline``, as a tenant
store would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from components.register_model.component import register_model
from kfp.dsl import Dataset, Markdown, Metrics, Model

from posttrain.config import load_config
from posttrain.services.s3 import S3Server
from posttrain.storage import S3Storage

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SFT_TINY = ["run_name=minio-sft", "sft.steps=1", "sft.checkpoint_every=1", "data.num_train_tasks=20",
            "data.num_eval_tasks=2", "eval.num_tasks=2", "tracking.registered_model=minio-sft-policy"]
KFP_MODEL_URI = "minio://mlpipeline/v2/artifacts/post-training/run-1/train-sft/model"
"""Where KFP's default pipeline root puts the train step's Model artifact."""



@pytest.fixture
def tenant_env(s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tenant ConfigMap's S3 settings and MLflow on sqlite; returns the tracking URI."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("S3_PREFIX", "s3://posttrain/tenants/team-a/")
    monkeypatch.delenv("POSTTRAIN_RUNS_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(REPO)
    return uri


def test_sft_registration_succeeds_when_the_pipeline_root_is_minio(tmp_path: Path, tenant_env: str) -> None:
    """1 SFT step; the Model artifact lives at a minio:// URI that the tenant's S3 server does not have."""
    import mlflow

    from posttrain.kfp.prepare import prepare_dataset
    from posttrain.kfp.train import train_technique

    cfg = load_config(REPO / "configs/sft_cpu.yaml", SFT_TINY)
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False))
    prepared = tmp_path / "prepared"
    prepare_dataset(str(config), "sft", "", "", 0, "run-1", prepared)
    trained = train_technique(prepared, tmp_path / "model-local", "sft", run_id="run-1")
    # KFP would hand the register step the artifact by its minio:// URI and the metadata the train step set.
    model = Model(uri=KFP_MODEL_URI, metadata=json.loads(json.dumps(trained.metadata)))
    scores = Metrics(uri=str(tmp_path / "metrics"), metadata={"heldout_accuracy": 0.0})
    text = register_model.python_func(prepared=Dataset(uri=str(prepared)), model=model, eval_metrics=scores,
                                      run_id="run-1", report=Markdown(uri=str(tmp_path / "report.md")))
    assert text.startswith("minio-sft-policy v1 champion")
    checkpoint = trained.metadata["checkpoint_uri"]
    assert checkpoint.startswith("s3://posttrain/tenants/team-a/")
    assert S3Storage().exists(f"{checkpoint}/config.json")
    mlflow.set_tracking_uri(tenant_env)
    version = mlflow.MlflowClient().get_model_version_by_alias("minio-sft-policy", "champion")
    assert version.run_id == trained.metadata["mlflow_run_id"] != ""
    assert version.tags["posttrain.source"] == checkpoint
    pipe = mlflow.transformers.load_model("models:/minio-sft-policy@champion")
    assert pipe.model.config.vocab_size > 0
