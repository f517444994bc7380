"""``train_sao`` in cluster mode through its KFP python function, against a loopback fake Kubernetes API.

The fake plays the JobSet controller: a hook marks the JobSet ``Completed`` (or ``Failed``) as soon as
it is created, so the step's first status read is terminal. Local mode (processes) runs in the
kfp.local end-to-end test (``tests/pipelines/test_kfp_local_post_training.py``).
"""

import base64

import pytest
import yaml
from kfp.dsl import HTML, Dataset, Markdown, Metrics, Model

from components.conftest import TINY_SAO, write_config
from components.images import GENERATOR_IMAGE, TRAINER_IMAGE
from components.train_sao.component import train_sao
from fakes.fake_kube_api import FakeKubeAPI
from posttrain.cluster.jobset import jobset_name
from posttrain.cluster.launcher import JobSetFailed, PreflightError

JOBSETS = ("jobset.x-k8s.io/v1alpha2", "jobsets")


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A fake API server with team-a's LocalQueue, Secrets and ConfigMap; kubeconfig and runs dir in tmp."""
    with FakeKubeAPI() as fake:
        ns = "team-a"
        fake.put("kueue.x-k8s.io/v1beta2", "localqueues", {"metadata": {"name": "posttrain", "namespace": ns}})
        fake.put("v1", "secrets", {"metadata": {"name": "redis-credentials", "namespace": ns},
                                   "data": {"password": b64("0123abcd")}})
        fake.put("v1", "secrets", {"metadata": {"name": "s3-credentials", "namespace": ns},
                                   "data": {"AWS_ACCESS_KEY_ID": b64("k"), "AWS_SECRET_ACCESS_KEY": b64("s")}})
        fake.put("v1", "configmaps", {"metadata": {"name": "posttrain-tenant", "namespace": ns}, "data": {}})
        kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig", ns)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.delenv("POSTTRAIN_NAMESPACE", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("POSTTRAIN_RUNS_URI", str(tmp_path / "runs"))
        yield fake


def finish_jobsets_as(fake, condition):
    def hook(method, path):
        if method == "POST" and path.endswith("/jobsets"):
            for js in fake.list(*JOBSETS, namespace="team-a"):
                fake.patch_status(*JOBSETS, js["metadata"]["name"], "team-a",
                                  {"conditions": [{"type": condition, "status": "True", "reason": "Test",
                                                   "message": f"learner {condition.lower()}"}], "restarts": 0})
    fake.add_hook(hook)


def run(tmp_path, prepared, run_id="3f2a-run", **extra):
    model = Model(uri=str(tmp_path / "model"))
    metrics = Metrics(uri=str(tmp_path / "metrics"))
    train_sao.python_func(prepared=Dataset(uri=str(prepared)), mode="cluster", queue="posttrain", run_id=run_id,
                          learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE, model=model,
                          metrics=metrics, report=Markdown(uri=str(tmp_path / "report.md")),
                          curves=HTML(uri=str(tmp_path / "curves.html")), **extra)
    return model, metrics


def test_cluster_mode_creates_one_queued_jobset_and_points_the_model_at_its_checkpoint(tmp_path, prepared_sao, cluster):
    finish_jobsets_as(cluster, "Completed")
    model, metrics = run(tmp_path, prepared_sao)
    name = jobset_name("3f2a-run")
    (js,) = cluster.list(*JOBSETS, namespace="team-a")
    assert js["metadata"]["name"] == name
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "posttrain"
    jobs = {r["name"]: r["replicas"] for r in js["spec"]["replicatedJobs"]}
    assert jobs == {"redis": 1, "learner": 1, "generator": 1}  # generator.num_processes of the tiny config
    learner = js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]
    config_uri = str(tmp_path / "runs" / name / "config.yaml")
    assert learner["image"] == TRAINER_IMAGE and config_uri in learner["command"]
    staged = yaml.safe_load((tmp_path / "runs" / name / "config.yaml").read_text())
    assert staged["data"]["train_path"] == str(tmp_path / "runs" / name / "dataset" / "train.jsonl")
    assert (tmp_path / "runs" / name / "dataset" / "train.jsonl").is_file()
    assert model.metadata["checkpoint_uri"] == str(tmp_path / "runs" / name / "final_model")
    assert model.metadata["jobset"] == name and model.metadata["namespace"] == "team-a"
    assert metrics.metadata == {"jobset_restarts": 0.0, "generators": 1.0}
    assert "JobSet team-a/" in (tmp_path / "report.md").read_text()
    assert "No MLflow run of the learner of tiny-sao-run0001" in (tmp_path / "curves.html").read_text()


def test_the_report_draws_the_reward_curve_of_the_learners_mlflow_run(tmp_path, prepared_sao, cluster, mlflow_uri):
    """The learner pod logs reward/mean for versions 0..2 into its run (tag posttrain.learner_of); the step draws it."""
    from posttrain.tracking import Tracker

    with Tracker(mlflow_uri, "posttrain-demo", run_name="learner",
                 tags={"posttrain.learner_of": "tiny-sao-run0001"}) as learner:
        for version, reward in enumerate((0.1, 0.3, 0.6)):
            learner.log_metrics({"reward/mean": reward}, step=version)
    finish_jobsets_as(cluster, "Completed")
    run(tmp_path, prepared_sao)
    page = (tmp_path / "curves.html").read_text()
    assert "src='data:image/png;base64," in page
    assert "3 steps; first 0.1000, last 0.6000." in page and learner.run_id in page


def test_learner_pods_and_resources_come_from_the_prepared_config(tmp_path, cluster, mlflow_uri):
    """learner.nodes=2 x 2 GPUs, generators of 12 cores: the JobSet the step creates carries them."""
    from posttrain.kfp.prepare import prepare_dataset

    config = write_config(tmp_path / "sized.yaml", overrides=TINY_SAO + [
        "learner.nodes=2", "learner.resources.gpus=2", "generator.resources.cpu=12"])
    prepare_dataset(str(config), "sao", "", "", 0, "run-0001", tmp_path / "prepared")
    finish_jobsets_as(cluster, "Completed")
    run(tmp_path, tmp_path / "prepared")
    (js,) = cluster.list(*JOBSETS, namespace="team-a")
    learner, generator = js["spec"]["replicatedJobs"][1:]
    assert (learner["template"]["spec"]["parallelism"], learner["template"]["spec"]["completions"]) == (2, 2)
    command = learner["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=2"]
    assert learner["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert generator["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "12"


def test_a_retried_step_attaches_to_its_jobset_instead_of_starting_another(tmp_path, prepared_sao, cluster):
    finish_jobsets_as(cluster, "Completed")
    run(tmp_path / "a", prepared_sao)
    run(tmp_path / "b", prepared_sao)
    assert len(cluster.list(*JOBSETS, namespace="team-a")) == 1
    assert [m for m, p in cluster.requests if m == "POST" and p.endswith("/jobsets")] == ["POST", "POST"]


def test_a_failed_jobset_fails_the_step_with_the_reason(tmp_path, prepared_sao, cluster):
    finish_jobsets_as(cluster, "Failed")
    with pytest.raises(JobSetFailed, match="learner failed"):
        run(tmp_path, prepared_sao)


def test_a_missing_local_queue_fails_before_anything_is_created(tmp_path, prepared_sao, cluster):
    with pytest.raises(PreflightError, match="LocalQueue 'nope'"):
        train_sao.python_func(prepared=Dataset(uri=str(prepared_sao)), mode="cluster", queue="nope", run_id="r",
                              learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE,
                              model=Model(uri=str(tmp_path / "m")), metrics=Metrics(uri=str(tmp_path / "x")),
                              report=Markdown(uri=str(tmp_path / "r.md")),
                              curves=HTML(uri=str(tmp_path / "c.html")))
    assert cluster.list(*JOBSETS, namespace="team-a") == []


def test_an_unknown_mode_is_refused(tmp_path, prepared_sao):
    from posttrain.kfp.artifacts import PipelineStepError

    with pytest.raises(PipelineStepError, match=r"mode: 'gpu' is not one of \['local', 'cluster'\]"):
        train_sao.python_func(prepared=Dataset(uri=str(prepared_sao)), mode="gpu", queue="posttrain", run_id="r",
                              learner_image="", generator_image="", model=Model(uri=str(tmp_path / "m")),
                              metrics=Metrics(uri=str(tmp_path / "x")), report=Markdown(uri=str(tmp_path / "r.md")),
                              curves=HTML(uri=str(tmp_path / "c.html")))


@pytest.mark.parametrize("sidecar_env", [None, "false", "true", "maybe"])
def test_the_jobset_carries_the_priority_class_and_the_tenants_istio_choice(tmp_path, prepared_sao, cluster,
                                                                            monkeypatch, sidecar_env):
    """priority_class labels the JobSet and its pods; POSTTRAIN_ISTIO_SIDECAR (tenant ConfigMap) picks the opt-out."""
    from posttrain.kfp.artifacts import PipelineStepError

    if sidecar_env is None:
        monkeypatch.delenv("POSTTRAIN_ISTIO_SIDECAR", raising=False)
    else:
        monkeypatch.setenv("POSTTRAIN_ISTIO_SIDECAR", sidecar_env)
    finish_jobsets_as(cluster, "Completed")
    if sidecar_env == "maybe":
        with pytest.raises(PipelineStepError, match=r"POSTTRAIN_ISTIO_SIDECAR: 'maybe' \(ConfigMap posttrain-tenant\)"):
            run(tmp_path, prepared_sao, priority_class="posttrain-scheduled")
        assert cluster.list(*JOBSETS, namespace="team-a") == []
        return
    run(tmp_path, prepared_sao, priority_class="posttrain-scheduled")
    (js,) = cluster.list(*JOBSETS, namespace="team-a")
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "posttrain-scheduled"
    for rjob in js["spec"]["replicatedJobs"]:
        labels = rjob["template"]["spec"]["template"]["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/priority-class"] == "posttrain-scheduled"
        assert ("sidecar.istio.io/inject" in labels) is (sidecar_env != "true")
