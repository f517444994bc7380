"""The committed ``pipelines/compiled/*.yaml`` match the source, and carry the Kubernetes settings kfp.local ignores."""

import re
from pathlib import Path

import pytest
import yaml
from components.images import BASE_IMAGE, TRAINER_IMAGE
from pipelines.compile import COMPILED_DIR, drifted, main
from pipelines.post_training import PIPELINES

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def load(name):
    ir, platform = yaml.load_all((COMPILED_DIR / f"{name}.yaml").read_text(), Loader=yaml.CSafeLoader)
    return ir, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def executors_named(ir, prefix):
    return {k: v for k, v in ir["deploymentSpec"]["executors"].items() if k.startswith(f"exec-{prefix}")}


def test_committed_yaml_matches_a_fresh_compile():
    """Fails when a component or pipeline changed without `python -m pipelines.compile`."""
    assert drifted() == [], "run: python -m pipelines.compile"


def test_check_mode_reports_a_drifted_file_and_a_stale_one(tmp_path, capsys):
    for path in COMPILED_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "sao.yaml").write_text((tmp_path / "sao.yaml").read_text().replace("posttrain/trainer", "x/trainer"))
    (tmp_path / "old_pipeline.yaml").write_text("{}\n")
    assert drifted(tmp_path) == ["sao", "old_pipeline (no such pipeline)"]
    assert main(["--check", "--dir", str(tmp_path)]) == 1
    assert f"{tmp_path}/sao.yaml differs from the source" in capsys.readouterr().err


def test_every_pipeline_has_a_committed_file():
    assert sorted(p.stem for p in COMPILED_DIR.glob("*.yaml")) == sorted(PIPELINES)


def test_post_training_parameters_are_only_the_per_run_knobs():
    ir, _ = load("post_training")
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert sorted(params) == ["benchmark_limit", "benchmarks", "config", "dataset", "model", "promote_on", "queue",
                              "sao_mode", "steps", "technique"]
    assert params["technique"]["defaultValue"] == "sao"
    assert params["steps"]["parameterType"] == "NUMBER_INTEGER"
    assert params["queue"]["defaultValue"] == "posttrain"


def test_post_training_branches_on_the_technique_after_preparing():
    ir, _ = load("post_training")
    tasks = ir["root"]["dag"]["tasks"]
    branches = tasks["condition-branches-1"]["componentRef"]["name"]
    conditions = [t["triggerPolicy"]["condition"] for t in ir["components"][branches]["dag"]["tasks"].values()]
    for technique in ("sft", "dpo", "grpo", "sao"):
        assert any(f"== '{technique}'" in c for c in conditions), technique
    assert tasks["condition-branches-1"]["dependentTasks"] == ["prepare-dataset"]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_steps_run_in_the_project_images_and_install_nothing(name):
    ir, _ = load(name)
    for label, executor in ir["deploymentSpec"]["executors"].items():
        container = executor["container"]
        assert container["image"] in (BASE_IMAGE, TRAINER_IMAGE), label
        assert "pip install" not in " ".join(container["command"]), label
    for label in executors_named(ir, "prepare-dataset"):
        assert ir["deploymentSpec"]["executors"][label]["container"]["image"] == BASE_IMAGE
    for label in executors_named(ir, "register-model"):  # logging a transformers model loads it (torch)
        assert ir["deploymentSpec"]["executors"][label]["container"]["image"] == TRAINER_IMAGE


def test_post_training_passes_benchmarks_limit_and_promotion_metric_to_every_branch():
    """The UI parameters reach evaluate (benchmarks, limit) and register_model (promote_on) in all 4 branches."""
    ir, _ = load("post_training")
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert params["benchmarks"]["defaultValue"] == "heldout" and params["benchmark_limit"]["defaultValue"] == 0
    assert params["promote_on"]["defaultValue"] == "heldout.accuracy"
    wired = {}
    for component in ir["components"].values():
        for task_name, task in component.get("dag", {}).get("tasks", {}).items():
            inputs = task.get("inputs", {}).get("parameters", {})
            for arg, spec in inputs.items():
                source = spec.get("componentInputParameter", "")
                if task_name.startswith(("evaluate", "register-model")) and source.startswith(
                        ("pipelinechannel--benchmark", "pipelinechannel--promote_on")):
                    wired.setdefault(source.split("--", 1)[1], []).append((re.sub(r"-[0-9]+$", "", task_name), arg))
    assert sorted(wired["benchmarks"]) == [("evaluate", "benchmarks")] * 4
    assert sorted(wired["benchmark_limit"]) == [("evaluate", "limit")] * 4
    assert sorted(wired["promote_on"]) == [("register-model", "promote_on")] * 4


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_caching_is_off_for_every_step(name):
    ir, _ = load(name)
    dags = [ir["root"]["dag"]] + [c["dag"] for c in ir["components"].values() if "dag" in c]
    for dag in dags:
        for task_name, task in dag["tasks"].items():
            if "componentRef" in task and task["componentRef"]["name"].startswith("comp-condition"):
                continue
            assert task.get("cachingOptions", {}).get("enableCache", False) is False, task_name


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_step_gets_the_tenant_config_and_s3_credentials(name):
    ir, platform = load(name)
    for label in ir["deploymentSpec"]["executors"]:
        k8s = platform[label]
        assert k8s["configMapAsEnv"][0]["configMapName"] == "posttrain-tenant", label
        assert k8s["secretAsEnv"][0]["secretName"] == "s3-credentials", label


@pytest.mark.parametrize("name", ["post_training", "sft", "dpo", "grpo"])
def test_model_steps_get_a_gpu_the_queue_label_and_the_gpu_toleration(name):
    ir, platform = load(name)
    gpu_steps = [k for k in ir["deploymentSpec"]["executors"] if k.startswith(("exec-train-sft", "exec-train-dpo",
                                                                              "exec-train-grpo", "exec-evaluate"))]
    assert gpu_steps
    for label in gpu_steps:
        resources = ir["deploymentSpec"]["executors"][label]["container"]["resources"]
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert resources["accelerator"]["resourceCount"] == "1"
        assert platform[label]["podMetadata"]["labels"][QUEUE_LABEL] == "posttrain"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in platform[label]["tolerations"]
        assert platform[label]["emptyDirMounts"][0]["mountPath"] == "/dev/shm"
    for label in (k for k in gpu_steps if k.startswith("exec-train")):
        assert platform[label]["genericEphemeralVolume"][0]["mountPath"] == "/workspace"
        env = ir["deploymentSpec"]["executors"][label]["container"]["env"]
        assert {"name": "POSTTRAIN_WORKSPACE", "value": "/workspace"} in env


@pytest.mark.parametrize("name", ["post_training", "sao"])
def test_train_sao_asks_for_no_gpu_and_passes_the_queue_to_its_jobset(name):
    ir, platform = load(name)
    (label,) = executors_named(ir, "train-sao")
    assert "resources" not in ir["deploymentSpec"]["executors"][label]["container"]
    assert "podMetadata" not in platform[label]
    comp = ir["components"]["comp-train-sao"]["inputDefinitions"]["parameters"]
    assert sorted(comp) == ["generator_image", "learner_image", "mode", "queue", "run_id"]


def test_compile_writes_every_pipeline(tmp_path):
    from pipelines.compile import compile_all

    written = compile_all(tmp_path)
    assert sorted(written) == sorted(PIPELINES)
    assert all(Path(p).read_text().startswith("# PIPELINE DEFINITION") for p in written.values())
