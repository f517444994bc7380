"""Fixtures of the component tests: tiny run configs, a prepared Dataset artifact, MLflow on sqlite.

Components are called through ``<component>.python_func`` with real ``kfp.dsl`` artifact objects
whose URIs are local paths, so each test runs exactly the body KFP would run, in-process. Also
puts ``tests/`` on ``sys.path`` for the real Kubernetes control plane of the cluster tier
(``tests/kube_control_plane.py``: the ``kube`` fixtures) and the loopback fakes (``tests/fakes``).
"""

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.append(str(REPO / "tests"))

from kube_control_plane import kube, kube_ns, kube_tenant  # noqa: E402,F401 - fixtures of the cluster tier

TINY_SAO = [
    "run_name=tiny-sao",
    "data.num_train_tasks=64",
    "data.num_eval_tasks=2",
    "warm_start.steps=2",
    "sao.steps=1",
    "eval.num_tasks=2",
    "eval.samples_per_task=1",
    "generator.engine=hf",
    "generator.num_processes=1",
    "generator.max_new_tokens=8",
]
"""Overrides of ``configs/sao_demo_cpu.yaml`` small enough for a unit test (seconds)."""


def write_config(path: Path, base: str = "configs/sao_demo_cpu.yaml", overrides: list[str] | None = None) -> Path:
    """Resolve ``base`` with ``overrides`` and write it as a standalone YAML file at ``path``."""
    from posttrain.config import load_config

    cfg = load_config(REPO / base, overrides if overrides is not None else TINY_SAO)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """MLflow on a fresh sqlite file, exported as ``MLFLOW_TRACKING_URI``."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture
def tiny_sao_config(tmp_path):
    """A tiny SAO run config file."""
    return write_config(tmp_path / "tiny_sao.yaml")


@pytest.fixture
def prepared_sao(tmp_path, tiny_sao_config, mlflow_uri):
    """A Dataset artifact directory prepared for technique sao from ``tiny_sao_config``."""
    from posttrain.kfp.prepare import prepare_dataset

    out = tmp_path / "prepared"
    prepare_dataset(str(tiny_sao_config), "sao", "", "", 0, "run-0001", out)
    return out


@pytest.fixture
def tiny_checkpoint(tmp_path, prepared_sao):
    """A tiny policy checkpoint (random weights, tokenizer trained on the prepared tasks)."""
    from posttrain.kfp.artifacts import load_prepared
    from posttrain.runners.common import prepare
    from posttrain.runtime import RunContext

    cfg, _ = load_prepared(prepared_sao, tmp_path / "work")
    ctx = RunContext(cfg)
    prepare(ctx)
    return ctx.base_model_dir
