"""``train_sao`` in cluster mode through its KFP python function, against a real Kubernetes API server.

The step runs in-process with a kubeconfig holding a real token of the tenant's ``pipeline-runner``
service account (what its pod would mount), against the cluster tier's control plane
(``tests/kube_control_plane.py``): the JobSet it creates is stored and validated by a real
kube-apiserver with the JobSet CRD. No JobSet controller runs there, so the test plays it: a thread
watching the namespace marks each new JobSet ``Completed`` (or ``Failed``) through its ``status``
subresource, and the step's first read is terminal. Local mode (processes) runs in the kfp.local
end-to-end test (``tests/pipelines/test_kfp_local_post_training.py``).
"""

from pathlib import Path

import pytest
import yaml
from kfp.dsl import HTML, Artifact, Dataset, Markdown, Metrics, Model
from kubernetes import client as k8s

from components.conftest import TINY_SAO, write_config
from components.images import GENERATOR_IMAGE, TRAINER_IMAGE
from components.train_sao.component import train_sao
from kube_control_plane import kustomize
from posttrain.cluster.jobset import jobset_name
from posttrain.cluster.launcher import JobSetFailed, PreflightError

JOBSETS = ("jobset.x-k8s.io", "v1alpha2")
REPO = Path(__file__).resolve().parents[2]


class Cluster:
    """A tenant on the real API server, the step's kubeconfig pointing at it."""

    def __init__(self, kube, namespace):
        self.kube = kube
        self.ns = namespace
        self.api = k8s.CustomObjectsApi(kube.admin())

    def jobsets(self):
        return self.api.list_namespaced_custom_object(*JOBSETS, self.ns, "jobsets")["items"]

    def finishing(self, condition="Completed"):
        return self.kube.finishing_jobsets(self.ns, condition)


@pytest.fixture
def cluster(kube, kube_tenant, tmp_path, monkeypatch):
    """team's LocalQueue, Secrets and ConfigMap on a real API server; the step's kubeconfig and runs dir in tmp."""
    token = kube.token_for(kube_tenant, "pipeline-runner")
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", kube_tenant, token)
    for var in ("KUBERNETES_SERVICE_HOST", "POSTTRAIN_NAMESPACE", "POD_NAME", "POD_NAMESPACE", "KFP_POD_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("POSTTRAIN_RUNS_URI", str(tmp_path / "runs"))
    return Cluster(kube, kube_tenant)


def run(tmp_path, prepared, run_id="3f2a-run", **extra):
    model = Model(uri=str(tmp_path / "model"))
    metrics = Metrics(uri=str(tmp_path / "metrics"))
    train_sao.python_func(prepared=Dataset(uri=str(prepared)), mode="cluster", queue="posttrain", run_id=run_id,
                          learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE, model=model,
                          metrics=metrics, report=Markdown(uri=str(tmp_path / "report.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")),
                          curves=HTML(uri=str(tmp_path / "curves.html")), **extra)
    return model, metrics


def test_cluster_mode_creates_one_queued_jobset_and_points_the_model_at_its_checkpoint(tmp_path, prepared_sao, cluster):
    with cluster.finishing("Completed"):
        model, metrics = run(tmp_path, prepared_sao)
    name = jobset_name("3f2a-run")
    (js,) = cluster.jobsets()
    assert js["metadata"]["name"] == name
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "posttrain"
    jobs = {r["name"]: r["replicas"] for r in js["spec"]["replicatedJobs"]}
    assert jobs == {"redis": 1, "learner": 1, "generator": 1}  # generator.num_processes of the tiny config
    learner = js["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]
    config_uri = str(tmp_path / "runs" / name / "config.yaml")
    assert learner["image"] == TRAINER_IMAGE and config_uri in learner["command"]
    assert js["spec"]["failurePolicy"]["rules"] == [{"name": "anyFailureRestartsTheGroup", "action": "RestartJobSet"}]
    staged = yaml.safe_load((tmp_path / "runs" / name / "config.yaml").read_text())
    assert staged["data"]["train_path"] == str(tmp_path / "runs" / name / "dataset" / "train.jsonl")
    assert (tmp_path / "runs" / name / "dataset" / "train.jsonl").is_file()
    assert model.metadata["checkpoint_uri"] == str(tmp_path / "runs" / name / "final_model")
    assert model.metadata["jobset"] == name and model.metadata["namespace"] == cluster.ns
    assert metrics.metadata == {"jobset_restarts": 0.0, "generators": 1.0}
    assert f"JobSet {cluster.ns}/" in (tmp_path / "report.md").read_text()
    assert "No MLflow run of the learner of tiny-sao-run0001" in (tmp_path / "curves.html").read_text()


def test_the_report_draws_the_reward_curve_of_the_learners_mlflow_run(tmp_path, prepared_sao, cluster, mlflow_uri):
    """The learner pod logs reward/mean for versions 0..2 into its run (tag posttrain.learner_of); the step draws it."""
    from posttrain.tracking import Tracker

    with Tracker(mlflow_uri, "posttrain-demo", run_name="learner",
                 tags={"posttrain.learner_of": "tiny-sao-run0001"}) as learner:
        for version, reward in enumerate((0.1, 0.3, 0.6)):
            learner.log_metrics({"reward/mean": reward}, step=version)
    with cluster.finishing("Completed"):
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
    with cluster.finishing("Completed"):
        run(tmp_path, tmp_path / "prepared")
    (js,) = cluster.jobsets()
    learner, generator = js["spec"]["replicatedJobs"][1:]
    assert (learner["template"]["spec"]["parallelism"], learner["template"]["spec"]["completions"]) == (2, 2)
    command = learner["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:3] == ["torchrun", "--nnodes=2", "--nproc_per_node=2"]
    assert learner["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert generator["template"]["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "12"


def test_a_retried_step_attaches_to_its_jobset_and_a_failed_one_fails_the_step(tmp_path, prepared_sao, cluster):
    with cluster.finishing("Completed") as finished:
        run(tmp_path / "a", prepared_sao)
        run(tmp_path / "b", prepared_sao)
    assert len(cluster.jobsets()) == 1 and len(finished) == 1  # created once, attached once
    with cluster.finishing("Failed"), pytest.raises(JobSetFailed, match="learner failed"):
        run(tmp_path / "c", prepared_sao, run_id="another-run")


def test_a_missing_local_queue_fails_before_anything_is_created(tmp_path, prepared_sao, cluster):
    with pytest.raises(PreflightError, match="LocalQueue 'nope'"):
        train_sao.python_func(prepared=Dataset(uri=str(prepared_sao)), mode="cluster", queue="nope", run_id="r",
                              learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE,
                              model=Model(uri=str(tmp_path / "m")), metrics=Metrics(uri=str(tmp_path / "x")),
                              report=Markdown(uri=str(tmp_path / "r.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")),
                              curves=HTML(uri=str(tmp_path / "c.html")))
    assert cluster.jobsets() == []


def test_an_unknown_mode_is_refused(tmp_path, prepared_sao):
    from posttrain.kfp.artifacts import PipelineStepError

    with pytest.raises(PipelineStepError, match=r"mode: 'gpu' is not one of \['local', 'cluster'\]"):
        train_sao.python_func(prepared=Dataset(uri=str(prepared_sao)), mode="gpu", queue="posttrain", run_id="r",
                              learner_image="", generator_image="", model=Model(uri=str(tmp_path / "m")),
                              metrics=Metrics(uri=str(tmp_path / "x")), report=Markdown(uri=str(tmp_path / "r.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")),
                              curves=HTML(uri=str(tmp_path / "c.html")))


@pytest.mark.parametrize(("sidecar_env", "restart_env"), [(None, None), ("false", "true"), ("true", "false"),
                                                          ("maybe", None), (None, "sometimes")])
def test_the_jobset_carries_the_priority_class_and_the_tenants_istio_and_restart_choices(
        tmp_path, prepared_sao, cluster, monkeypatch, sidecar_env, restart_env):
    """priority_class labels the JobSet and its pods; the tenant ConfigMap's POSTTRAIN_ISTIO_SIDECAR picks the
    opt-out and POSTTRAIN_JOBSET_RESTART_JOB (the JobSet controller's RestartJob gate) the failure policy."""
    from posttrain.kfp.artifacts import PipelineStepError

    for key, value in (("POSTTRAIN_ISTIO_SIDECAR", sidecar_env), ("POSTTRAIN_JOBSET_RESTART_JOB", restart_env)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    bad = next((k for k, v in (("POSTTRAIN_ISTIO_SIDECAR", sidecar_env), ("POSTTRAIN_JOBSET_RESTART_JOB", restart_env))
                if v not in (None, "true", "false")), None)
    if bad is not None:
        with pytest.raises(PipelineStepError, match=rf"{bad}: '\w+' \(ConfigMap posttrain-tenant\) must be 'true' or 'false'"):
            run(tmp_path, prepared_sao, priority_class="posttrain-scheduled")
        assert cluster.jobsets() == []
        return
    with cluster.finishing("Completed"):
        run(tmp_path, prepared_sao, priority_class="posttrain-scheduled")
    (js,) = cluster.jobsets()
    assert js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "posttrain-scheduled"
    for rjob in js["spec"]["replicatedJobs"]:
        labels = rjob["template"]["spec"]["template"]["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/priority-class"] == "posttrain-scheduled"
        assert ("sidecar.istio.io/inject" in labels) is (sidecar_env != "true")
    actions = {r["action"] for r in js["spec"]["failurePolicy"]["rules"]}
    assert actions == ({"RestartJob"} if restart_env == "true" else {"RestartJobSet"})


def test_a_scheduled_run_creates_its_jobset_at_the_scheduled_priority_as_far_as_the_api_server_goes(
        tmp_path, prepared_sao, cluster, monkeypatch):
    """``posttrain schedule`` (against the loopback fake KFP API: no KFP server runs here) stores a recurring run;
    when it fires, its ``train_sao`` step runs with the recurring run's parameters as the run's service account.
    On the real API server: the JobSet is created, labelled with the scheduled priority, and that
    WorkloadPriorityClass (applied from ``manifests/base``) exists, lower than the interactive one."""
    from fakes.fake_kfp_api import FakeKFPAPI
    from posttrain.cluster.schedule import pipeline_inputs, schedule_cli

    pipeline = REPO / "pipelines" / "compiled" / "post_training.yaml"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KF_PIPELINES_TOKEN", raising=False)
    with FakeKFPAPI() as kfp_api:
        assert schedule_cli(["--host", kfp_api.url, "--namespace", cluster.ns, "--name", "nightly-sao", "--pipeline",
                             str(pipeline), "--registered-model", "team-policy", "--cron", "0 0 2 * * *",
                             "--service-account", "pipeline-runner", "--param", "technique=sao"]) == 0
        (recurring,) = kfp_api.recurring_runs.values()
    params = recurring["runtime_config"]["parameters"]
    assert recurring["service_account"] == "pipeline-runner"
    queue = params.get("queue", pipeline_inputs(pipeline)["queue"]["defaultValue"])
    cluster.kube.apply([o for o in kustomize(REPO / "manifests" / "kueue") if o["kind"] == "WorkloadPriorityClass"])
    with cluster.finishing("Completed"):
        train_sao.python_func(prepared=Dataset(uri=str(prepared_sao)), mode="cluster", queue=queue,
                              run_id="scheduled-run-1", learner_image=TRAINER_IMAGE, generator_image=GENERATOR_IMAGE,
                              priority_class=params["priority_class"], model=Model(uri=str(tmp_path / "m")),
                              metrics=Metrics(uri=str(tmp_path / "x")), report=Markdown(uri=str(tmp_path / "r.md")), time_account=Markdown(uri=str(tmp_path / "account.md")), time_account_plot=Artifact(uri=str(tmp_path / "account.png")),
                              curves=HTML(uri=str(tmp_path / "c.html")))
    (js,) = cluster.jobsets()
    priority = js["metadata"]["labels"]["kueue.x-k8s.io/priority-class"]
    assert priority == params["priority_class"] == "posttrain-scheduled"
    classes = {o["metadata"]["name"]: o["value"] for o in cluster.api.list_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses")["items"]}
    assert classes[priority] < classes["posttrain-interactive"]
    assert cluster.api.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", cluster.ns, "localqueues", queue)
