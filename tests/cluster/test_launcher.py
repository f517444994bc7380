"""The JobSet launcher against a loopback fake Kubernetes API server, through the real kubernetes client.

The fake (tests/fakes/fake_kube_api.py) stores objects and answers like an API server; the tests
play the JobSet controller by editing the stored JobSet between polls. Time is a fake clock that the
launcher's ``sleep`` advances, so nothing waits and no wall-clock time is asserted.

Run: .venv/bin/python -m pytest -q tests/cluster/test_launcher.py
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api, CustomObjectsApi

from fakes.fake_kube_api import FakeKubeAPI, pod_object
from posttrain.cluster.jobset import SAOImages, build_sao_jobset, jobset_name
from posttrain.cluster.launcher import (
    JobSetConflict,
    JobSetError,
    JobSetFailed,
    JobSetGone,
    JobSetTimeout,
    PreflightError,
    Terminated,
    delete_jobset,
    delete_on_termination,
    launch_or_attach,
    owner_reference_from_env,
    wait_for_jobset,
)

NS = "team-a"
JS = "jobset.x-k8s.io/v1alpha2"
RUN_ID = "8d3e0c7a-run-under-test"
NAME = jobset_name(RUN_ID)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class FakeClock:
    """Monotonic seconds; ``sleep`` advances it and then runs the next controller step, if any."""

    def __init__(self, steps: list[Callable[[], None]] | None = None):
        self.now = 0.0
        self.steps = list(steps or [])
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.steps:
            self.steps.pop(0)()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeKubeAPI, CustomObjectsApi, CoreV1Api]]:
    """A fake API server with the tenant's prerequisites: LocalQueue, Secrets, ConfigMap."""
    with FakeKubeAPI() as fake:
        fake.put("kueue.x-k8s.io/v1beta2", "localqueues",
                 {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                  "metadata": {"name": "posttrain", "namespace": NS}, "spec": {"clusterQueue": "team-a-cq"}})
        fake.put("v1", "secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-credentials", "namespace": NS},
                                   "data": {"password": b64("0123abcd" * 8)}})
        fake.put("v1", "secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-credentials", "namespace": NS},
                                   "data": {"AWS_ACCESS_KEY_ID": b64("team-a"), "AWS_SECRET_ACCESS_KEY": b64("x")}})
        fake.put("v1", "configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "posttrain-tenant", "namespace": NS},
                                      "data": {"S3_PREFIX": "s3://posttrain/tenants/team-a/"}})
        client = fake.api_client()
        try:
            yield fake, CustomObjectsApi(client), CoreV1Api(client)
        finally:
            client.close()


def jobset(run_id: str = RUN_ID) -> dict:
    return build_sao_jobset(run_id, NS, SAOImages("trainer:1", "generator:1"), 2, "posttrain",
                            "s3://posttrain/tenants/team-a/sao.yaml", "redis-credentials")


def set_status(fake: FakeKubeAPI, **status) -> Callable[[], None]:
    return lambda: fake.patch_status(JS, "jobsets", NAME, NS, status)


def counts(**per_role) -> list[dict]:
    return [{"name": n, "ready": r, "active": a, "succeeded": s, "failed": f, "suspended": 0}
            for n, (r, a, s, f) in per_role.items()]


def posts(fake: FakeKubeAPI) -> int:
    return sum(1 for m, p in fake.requests if m == "POST" and p.endswith("/jobsets"))


def test_launch_creates_the_jobset_in_the_tenant_namespace(cluster):
    fake, api, core = cluster
    assert launch_or_attach(api, core, NS, jobset()) == NAME
    stored = fake.get(JS, "jobsets", NAME, NS)
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "posttrain"
    assert stored["spec"] == jobset()["spec"]
    assert posts(fake) == 1


def test_a_retried_step_reattaches_to_the_same_jobset(cluster):
    """The second attempt builds the same name from the same run id, gets 409 and attaches."""
    fake, api, core = cluster
    first = launch_or_attach(api, core, NS, jobset())
    second = launch_or_attach(api, core, NS, jobset())
    assert first == second == NAME
    assert [o["metadata"]["name"] for o in fake.list(JS, "jobsets", NS)] == [NAME]
    assert posts(fake) == 2  # the second POST was answered 409 AlreadyExists


def test_attach_refuses_a_jobset_of_another_run(cluster):
    fake, api, core = cluster
    other = jobset()
    other["metadata"]["annotations"]["posttrain.io/run-id"] = "someone-else"
    fake.put(JS, "jobsets", other)
    with pytest.raises(JobSetConflict, match="someone-else"):
        launch_or_attach(api, core, NS, jobset())


def test_preflight_names_a_missing_secret_and_creates_nothing(cluster):
    fake, api, core = cluster
    fake.fail_next("GET", r"/secrets/s3-credentials$", 404)
    with pytest.raises(PreflightError, match="Secret 's3-credentials' not found in namespace team-a"):
        launch_or_attach(api, core, NS, jobset())
    assert posts(fake) == 0 and fake.list(JS, "jobsets", NS) == []


def test_preflight_names_a_missing_local_queue(cluster):
    fake, api, core = cluster
    fake.fail_next("GET", r"/localqueues/posttrain$", 404)
    with pytest.raises(PreflightError, match="LocalQueue 'posttrain'"):
        launch_or_attach(api, core, NS, jobset())


def test_preflight_rejects_a_redis_password_that_cannot_go_into_a_url(cluster):
    fake, api, core = cluster
    fake.put("v1", "secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-credentials", "namespace": NS},
                               "data": {"password": b64("p@ss/word")}})
    with pytest.raises(PreflightError, match="URL-safe"):
        launch_or_attach(api, core, NS, jobset())


def test_preflight_reports_forbidden_as_an_rbac_problem(cluster):
    fake, api, core = cluster
    fake.fail_next("GET", r"/secrets/redis-credentials$", 403)
    with pytest.raises(PreflightError, match="HTTP 403.*pipeline-runner Role"):
        launch_or_attach(api, core, NS, jobset())


def test_wait_streams_transitions_and_returns_on_completed(cluster):
    fake, api, core = cluster
    js = jobset()
    js["spec"]["suspend"] = True  # what Kueue's webhook does until the Workload is admitted
    launch_or_attach(api, core, NS, js)
    uid = fake.get(JS, "jobsets", NAME, NS)["metadata"]["uid"]
    fake.put("kueue.x-k8s.io/v1beta2", "workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": f"jobset-{NAME}-1a2b3", "namespace": NS, "labels": {"kueue.x-k8s.io/job-uid": uid}},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                   "message": "couldn't assign flavors to pod set generator: insufficient quota for nvidia.com/gpu"}]},
    })

    def admit() -> None:
        stored = fake.get(JS, "jobsets", NAME, NS)
        stored["spec"]["suspend"] = False
        fake.put(JS, "jobsets", stored)

    clock = FakeClock([
        admit,
        set_status(fake, replicatedJobsStatus=counts(redis=(1, 1, 0, 0), learner=(0, 1, 0, 0), generator=(0, 2, 0, 0))),
        lambda: None,  # nothing changed: no transition reported
        set_status(fake, replicatedJobsStatus=counts(redis=(1, 1, 0, 0), learner=(1, 1, 0, 0), generator=(2, 2, 0, 0))),
        set_status(fake, conditions=[{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                                      "message": "jobset completed successfully"}], terminalState="Completed"),
    ])
    seen = []
    final = wait_for_jobset(api, core, NS, NAME, poll_s=10, timeout_s=3600, on_status=seen.append, clock=clock, sleep=clock.sleep)
    assert [s.phase for s in seen] == ["Queued", "Starting", "Starting", "Running", "Completed"]
    assert "insufficient quota for nvidia.com/gpu" in seen[0].message
    assert seen[1].replicated_jobs == {} and seen[2].replicated_jobs["learner"].active == 1
    assert final.phase == "Completed" and final.reason == "AllJobsCompleted"
    assert clock.sleeps == [10, 10, 10, 10, 10]


def test_failed_jobset_raises_with_the_learner_failure_reason(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    selector = {"jobset.sigs.k8s.io/jobset-name": NAME}
    fake.put("v1", "pods", pod_object(f"{NAME}-generator-1-0-abcde", NS, {**selector, "jobset.sigs.k8s.io/replicatedjob-name": "generator"},
                                      container="generator", last_terminated={"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T00:05:00Z"}))
    fake.put("v1", "pods", pod_object(f"{NAME}-learner-0-0-fghij", NS, {**selector, "jobset.sigs.k8s.io/replicatedjob-name": "learner"},
                                      phase="Failed", container="learner",
                                      terminated={"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:04:00Z",
                                                  "message": "Traceback (most recent call last):\nValueError: sao.micro_batch_size (64) must be <= sao.batch_size (32)"}))
    fake.put("v1", "pods", pod_object("unrelated-pod", NS, {"app": "other"}, terminated={"exitCode": 2, "reason": "Error"}))
    fake.patch_status(JS, "jobsets", NAME, NS, {
        "restarts": 2, "terminalState": "Failed",
        "conditions": [{"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts",
                        "message": "jobset failed due to reaching max number of restarts"}]})
    clock = FakeClock()
    with pytest.raises(JobSetFailed) as info:
        wait_for_jobset(api, core, NS, NAME, poll_s=10, timeout_s=60, clock=clock, sleep=clock.sleep)
    err = info.value
    assert err.reason == "ReachedMaxRestarts"
    assert err.learner_failure is not None
    assert (err.learner_failure.exit_code, err.learner_failure.reason) == (1, "Error")
    assert "ValueError: sao.micro_batch_size (64)" in err.learner_failure.message
    assert [f.role for f in err.failures] == ["learner", "generator"]  # learner first; unrelated pod ignored
    assert "learner failure: learner pod" in str(err) and "ReachedMaxRestarts" in str(err)


def test_a_learner_failure_without_a_message_is_explained_from_its_log(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    pod = f"{NAME}-learner-0-0-fghij"
    fake.put("v1", "pods", pod_object(pod, NS, {"jobset.sigs.k8s.io/jobset-name": NAME, "jobset.sigs.k8s.io/replicatedjob-name": "learner"},
                                      phase="Failed", container="learner", terminated={"exitCode": 3, "reason": "Error", "message": ""}))
    fake.set_log(NS, pod, "step 12 loss 0.31\nRuntimeError: CUDA error: an illegal memory access was encountered\n")
    fake.patch_status(JS, "jobsets", NAME, NS, {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "m"}]})
    clock = FakeClock()
    with pytest.raises(JobSetFailed, match="illegal memory access") as info:
        wait_for_jobset(api, core, NS, NAME, poll_s=1, timeout_s=10, clock=clock, sleep=clock.sleep)
    assert info.value.learner_failure.exit_code == 3


def test_timeout_is_raised_after_a_bounded_number_of_polls(cluster):
    """poll_s=10, timeout_s=30: polls at t=0, 10, 20, 30, then the deadline has passed -> 4 GETs."""
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    fake.requests.clear()
    clock = FakeClock()
    with pytest.raises(JobSetTimeout, match=r"did not finish within 30 s; last status: .* Starting") as info:
        wait_for_jobset(api, core, NS, NAME, poll_s=10, timeout_s=30, clock=clock, sleep=clock.sleep)
    assert info.value.last_status.phase == "Starting"
    assert sum(1 for m, p in fake.requests if m == "GET" and p.endswith(f"/jobsets/{NAME}")) == 4
    assert clock.sleeps == [10, 10, 10]


def test_transient_api_errors_are_retried_a_bounded_number_of_times(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    fake.fail_next("GET", rf"/jobsets/{NAME}$", 503, times=2)
    done = set_status(fake, conditions=[{"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": ""}])
    clock = FakeClock([lambda: None, done])
    assert wait_for_jobset(api, core, NS, NAME, poll_s=5, timeout_s=600, max_api_errors=2,
                           clock=clock, sleep=clock.sleep).phase == "Completed"

    fake.fail_next("GET", rf"/jobsets/{NAME}$", 500, times=100)
    fake.requests.clear()
    clock = FakeClock()
    with pytest.raises(JobSetError, match="3 API errors in a row"):
        wait_for_jobset(api, core, NS, NAME, poll_s=5, timeout_s=600, max_api_errors=2, clock=clock, sleep=clock.sleep)
    assert sum(1 for m, _ in fake.requests if m == "GET") == 3


def test_a_deleted_jobset_stops_the_wait(cluster):
    _, api, core = cluster
    clock = FakeClock()
    with pytest.raises(JobSetGone, match=NAME):
        wait_for_jobset(api, core, NS, NAME, poll_s=5, timeout_s=60, clock=clock, sleep=clock.sleep)


def test_delete_jobset_removes_it_once(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    assert delete_jobset(api, NS, NAME) is True
    assert fake.list(JS, "jobsets", NS) == []
    assert delete_jobset(api, NS, NAME) is False


OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "train-sao-abc12", "uid": "0c1d-launcher-pod"}


def test_owner_reference_comes_from_the_downward_api_env_or_is_skipped(caplog):
    assert owner_reference_from_env({"POD_NAME": "train-sao-abc12", "POD_UID": "0c1d-launcher-pod"}) == OWNER
    with caplog.at_level("INFO", logger="posttrain.cluster.launcher"):
        assert owner_reference_from_env({"POD_NAME": "train-sao-abc12"}) is None
    assert "no ownerReference" in caplog.text


def test_the_created_jobset_is_owned_by_the_launcher_pod(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset(), owner=OWNER)
    assert fake.get(JS, "jobsets", NAME, NS)["metadata"]["ownerReferences"] == [OWNER]


def test_a_reattaching_retry_adds_its_pod_as_a_second_owner_once(cluster):
    """The JobSet is collected only when both the failed attempt's pod and the retry's pod are gone."""
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset(), owner=OWNER)
    retry = {**OWNER, "name": "train-sao-def34", "uid": "retry-pod"}
    launch_or_attach(api, core, NS, jobset(), owner=retry)
    launch_or_attach(api, core, NS, jobset(), owner=retry)
    assert fake.get(JS, "jobsets", NAME, NS)["metadata"]["ownerReferences"] == [OWNER, retry]


def test_sigterm_inside_delete_on_termination_deletes_the_jobset_and_exits_143(cluster):
    fake, api, core = cluster
    launch_or_attach(api, core, NS, jobset())
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info, delete_on_termination(api, NS, NAME):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted by the handler
    assert info.value.code == 143
    assert fake.get(JS, "jobsets", NAME, NS) is None
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_terminated_launcher_process_deletes_its_jobset(cluster, tmp_path):
    """The real KFP step (``train_sao_cluster``) in its own process, against the fake API server through a
    kubeconfig: it creates the JobSet owned by its pod, waits; SIGTERM -> JobSet deleted, exit status 143."""
    fake, _, _ = cluster
    from posttrain.kfp.prepare import prepare_dataset

    repo = Path(__file__).resolve().parents[2]
    dataset = tmp_path / "dataset"
    prepare_dataset(str(repo / "configs" / "sao_demo_cpu.yaml"), "sao", "", "", 2, RUN_ID, dataset)
    kubeconfig = fake.write_kubeconfig(tmp_path / "kubeconfig", NS)
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "POSTTRAIN_NAMESPACE")}
    env.update(KUBECONFIG=str(kubeconfig), POSTTRAIN_RUNS_URI=str(tmp_path / "runs"), POD_NAME=OWNER["name"],
               POD_UID=OWNER["uid"], PYTHONPATH=os.pathsep.join([str(repo / "src"), env.get("PYTHONPATH", "")]))
    script = ("import sys; from posttrain.kfp.train_cluster import train_sao_cluster; "
              "train_sao_cluster(sys.argv[1], sys.argv[2], queue='posttrain', run_id=sys.argv[3], "
              "learner_image='trainer:1', generator_image='generator:1', poll_s=0.2, timeout_s=600)")
    proc = subprocess.Popen([sys.executable, "-c", script, str(dataset), str(tmp_path / "model"), RUN_ID],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while fake.get(JS, "jobsets", NAME, NS) is None:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the launcher never created its JobSet"
            time.sleep(0.1)
        assert fake.get(JS, "jobsets", NAME, NS)["metadata"]["ownerReferences"] == [OWNER]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read().decode()
    assert code == 143, out[-3000:]
    assert fake.get(JS, "jobsets", NAME, NS) is None
    assert any(m == "DELETE" and p.endswith(f"/jobsets/{NAME}") for m, p in fake.requests)


def test_delete_on_termination_outside_the_main_thread_installs_nothing(cluster):
    import threading

    fake, api, core = cluster
    errors = []

    def body():
        try:
            with delete_on_termination(api, NS, NAME):
                pass
        except Exception as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert errors == []
