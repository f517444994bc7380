"""The committed ``pipelines/compiled/*.yaml`` match the source, and carry the Kubernetes settings kfp.local ignores."""

import re
from pathlib import Path

import pytest
import yaml
from components.images import BASE_IMAGE, TRAINER_IMAGE
from pipelines.compile import COMPILED_DIR, drifted, main

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NAMES = sorted(p.stem for p in COMPILED_DIR.glob("*.yaml"))
"""The committed pipelines, named from the files so that collecting this module defines (compiles) no pipeline;
``test_every_pipeline_has_a_committed_file`` checks they are ``PIPELINES``'s."""


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
    from pipelines import PIPELINES

    assert NAMES == sorted(PIPELINES)


def test_post_training_parameters_are_only_the_per_run_knobs():
    ir, _ = load("post_training")
    params = ir["root"]["inputDefinitions"]["parameters"]
    assert sorted(params) == ["benchmark_limit", "benchmarks", "config", "dataset", "model", "priority_class",
                              "promote_on", "queue", "sao_mode", "steps", "technique"]
    assert params["technique"]["defaultValue"] == "sao"
    assert params["priority_class"]["defaultValue"] == "posttrain-interactive"
    assert params["steps"]["parameterType"] == "NUMBER_INTEGER"
    assert params["queue"]["defaultValue"] == "posttrain"


def test_post_training_branches_on_the_technique_after_preparing():
    ir, _ = load("post_training")
    tasks = ir["root"]["dag"]["tasks"]
    branches = tasks["condition-branches-1"]["componentRef"]["name"]
    conditions = [t["triggerPolicy"]["condition"] for t in ir["components"][branches]["dag"]["tasks"].values()]
    for technique in ("sft", "dpo", "grpo", "sao", "gkd"):
        assert any(f"== '{technique}'" in c for c in conditions), technique
    assert tasks["condition-branches-1"]["dependentTasks"] == ["prepare-dataset"]


@pytest.mark.parametrize("name", NAMES)
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
    """The UI parameters reach evaluate (benchmarks, limit) and register_model (promote_on) in all 5 branches."""
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
    assert sorted(wired["benchmarks"]) == [("evaluate", "benchmarks")] * 5
    assert sorted(wired["benchmark_limit"]) == [("evaluate", "limit")] * 5
    assert sorted(wired["promote_on"]) == [("register-model", "promote_on")] * 5


@pytest.mark.parametrize("name", NAMES)
def test_caching_is_off_for_every_step(name):
    ir, _ = load(name)
    dags = [ir["root"]["dag"]] + [c["dag"] for c in ir["components"].values() if "dag" in c]
    for dag in dags:
        for task_name, task in dag["tasks"].items():
            if "componentRef" in task and task["componentRef"]["name"].startswith("comp-condition"):
                continue
            assert task.get("cachingOptions", {}).get("enableCache", False) is False, task_name


@pytest.mark.parametrize("name", NAMES)
def test_every_step_gets_the_tenant_config_and_s3_credentials(name):
    ir, platform = load(name)
    for label in ir["deploymentSpec"]["executors"]:
        k8s = platform[label]
        assert k8s["configMapAsEnv"][0]["configMapName"] == "posttrain-tenant", label
        assert k8s["secretAsEnv"][0]["secretName"] == "s3-credentials", label
        optional = [c for c in k8s["configMapAsEnv"] if c.get("optional")]
        assert [e["envVar"] for c in optional for e in c["keyToEnv"]] == [
            "POSTTRAIN_ISTIO_SIDECAR", "POSTTRAIN_JOBSET_RESTART_JOB"], label


@pytest.mark.parametrize("name", ["post_training", "sft", "dpo", "grpo", "gkd"])
def test_model_steps_get_a_gpu_the_queue_label_and_the_gpu_toleration(name):
    ir, platform = load(name)
    gpu_steps = [k for k in ir["deploymentSpec"]["executors"] if k.startswith(("exec-train-sft", "exec-train-dpo",
                                                                              "exec-train-grpo", "exec-train-gkd",
                                                                              "exec-evaluate"))]
    assert gpu_steps
    for label in gpu_steps:
        resources = ir["deploymentSpec"]["executors"][label]["container"]["resources"]
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu"
        assert resources["accelerator"]["resourceCount"] == "1"
        assert platform[label]["podMetadata"]["labels"][QUEUE_LABEL] == "posttrain"
        # Pod labels are fixed at compile time: these single-pod steps carry the interactive class.
        assert platform[label]["podMetadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "posttrain-interactive"
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
    assert sorted(comp) == ["generator_image", "learner_image", "mode", "priority_class", "queue", "run_id"]
    (task,) = [t for t in _all_tasks(ir) if t["componentRef"]["name"] == "comp-train-sao"]
    assert task["inputs"]["parameters"]["priority_class"]["componentInputParameter"].endswith("priority_class")


def test_compile_writes_every_pipeline(tmp_path):
    from pipelines.compile import compile_all

    written = compile_all(tmp_path)
    assert sorted(written) == NAMES
    assert all(Path(p).read_text().startswith("# PIPELINE DEFINITION") for p in written.values())


@pytest.mark.parametrize("name", NAMES)
def test_every_image_reference_names_the_lock_registry_and_tag(name):
    """No bare ``posttrain/x:tag`` (which Kubernetes resolves to docker.io): refs come from images/digests.yaml."""
    from components.images import LOCK

    ir, _ = load(name)
    refs = [e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values()]
    refs += [v["runtimeValue"]["constant"] for t in _all_tasks(ir) for k, v in t.get("inputs", {}).get("parameters", {}).items()
             if k in ("learner_image", "generator_image")]
    assert refs
    for ref in refs:
        assert ref == LOCK.ref(ref.split("/")[-1].split(":")[0]), ref
        assert "." in ref.split("/")[0], ref


def _all_tasks(ir):
    dags = [ir["root"]["dag"]] + [c["dag"] for c in ir["components"].values() if "dag" in c]
    return [task for dag in dags for task in dag["tasks"].values()]


def test_compile_writes_the_registry_and_digests_of_a_lock_file(tmp_path):
    """``--registry`` / ``--digests`` reach every step image and the JobSet's images; the drift check sees them."""
    import os
    import subprocess
    import sys

    digests = {role: "sha256:" + f"{i}" * 64 for i, role in enumerate(("base", "trainer", "generator"), 1)}
    lock = tmp_path / "digests.yaml"
    lock.write_text(yaml.safe_dump({"registry": "unused.example/x", "tag": "1.2.3", "digests": digests}))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "src")])}
    out = tmp_path / "out"

    def compile_(*args):
        return subprocess.run([sys.executable, "-m", "pipelines.compile", "--dir", str(out), *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)

    assert compile_("--registry", "ghcr.io/acme/posttrain", "--digests", str(lock)).returncode == 0
    ir = next(yaml.load_all((out / "sao.yaml").read_text(), Loader=yaml.CSafeLoader))
    images = {e["container"]["image"] for e in ir["deploymentSpec"]["executors"].values()}
    images |= {v["runtimeValue"]["constant"] for t in _all_tasks(ir)
               for k, v in t.get("inputs", {}).get("parameters", {}).items() if k.endswith("_image")}
    assert images == {f"ghcr.io/acme/posttrain/{role}:1.2.3@{digests[role]}" for role in digests}
    # --check against the committed lock: every file written with other references has drifted.
    assert sorted(drifted(out)) == NAMES
    bad = compile_("--registry", "posttrain")
    assert bad.returncode == 2
    assert "--registry: 'posttrain' has no registry host" in bad.stderr


def test_image_lock_errors_name_the_file_and_field(tmp_path):
    from components.images import ImageLockError, load_lock

    lock = tmp_path / "digests.yaml"
    lock.write_text("registry: ghcr.io/acme\ntag: '1'\ndigests: {base: 'sha256:abc', trainer: '', generator: ''}\n")
    with pytest.raises(ImageLockError, match=r"digests.yaml: digests.base: 'sha256:abc' is not sha256:<64"):
        load_lock(lock)
    lock.write_text("registry: acme\ntag: '1'\ndigests: {base: '', trainer: '', generator: ''}\n")
    with pytest.raises(ImageLockError, match=r"digests.yaml: registry: 'acme' has no registry host"):
        load_lock(lock)
    assert load_lock(lock, registry="localhost:5000/p").ref("trainer") == "localhost:5000/p/trainer:1"


@pytest.mark.parametrize("name", NAMES)
def test_only_the_steps_safe_to_repeat_have_retries(name):
    """evaluate and the SAO launcher retry (pipelines.post_training.RETRY); prepare, sft/dpo/grpo and register do not."""
    ir, _ = load(name)
    retried, not_retried = set(), set()
    for task_name, task in ((n, t) for dag in [ir["root"]["dag"]] + [c["dag"] for c in ir["components"].values() if "dag" in c]
                            for n, t in dag["tasks"].items()):
        if task["componentRef"]["name"].startswith("comp-condition"):
            continue
        policy = task.get("retryPolicy")
        (retried if policy else not_retried).add(task_name.rsplit("-", 1)[0] if task_name[-1].isdigit() else task_name)
        if policy:
            assert policy == {"maxRetryCount": 2, "backoffDuration": "60s", "backoffFactor": 2.0,
                              "backoffMaxDuration": "600s"}, task_name
    assert retried <= {"evaluate", "train-sao"} and "evaluate" in retried
    assert {"prepare-dataset", "register-model"} <= not_retried and not (not_retried & {"evaluate", "train-sao"})
    if name in ("sao", "post_training"):
        assert "train-sao" in retried
