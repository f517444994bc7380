"""The JobSet launcher against a real Kubernetes API server, as the tenant's service account.

The session's control plane (``tests/kube_control_plane.py``) is a real kube-apiserver with the
JobSet, Kueue and Argo CRDs, RBAC, watches and the garbage collector. What it cannot run here is
played through the API, as the missing parts would do it:

* the JobSet controller's status transitions (and Kueue's admission) are written by the test
  through the JobSet's ``status`` subresource (and the Workload's), which no controller here owns;
* the kubelet's part (pod status, container logs) is written through the pod's ``status`` and served
  by the fake kubelet's log endpoint.

Every launcher call runs with a real token of the tenant's ``pipeline-runner`` service account, so
the tenant's Role is exercised by everything the launcher does. Nothing asserts wall-clock time; the
waits are bounded.

Run: .venv/bin/python -m pytest -q tests/cluster/test_launcher.py
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from posttrain.cluster.jobset import SAOImages, build_sao_jobset, jobset_name
from posttrain.cluster.launcher import (
    JobSetConflict,
    JobSetError,
    JobSetFailed,
    JobSetGone,
    JobSetTimeout,
    KubeUnavailable,
    Owner,
    PreflightError,
    Terminated,
    cancel_on_termination,
    delete_jobset,
    launch_or_attach,
    run_owner,
    termination_cause,
    wait_for_jobset,
)

JS = ("jobset.x-k8s.io", "v1alpha2")
RUN_ID = "8d3e0c7a-run-under-test"
NAME = jobset_name(RUN_ID)
REPO = Path(__file__).resolve().parents[2]


class Counting:
    """The real API object, counting the calls made through it (instrumentation, not a stand-in)."""

    def __init__(self, api: Any):
        self._api = api
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._api, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)  # keeps the docstring kubernetes.watch reads the return type from
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


class Env:
    """One tenant, and the launcher's clients as its ``pipeline-runner`` service account."""

    def __init__(self, kube: Any, namespace: str):
        self.kube = kube
        self.ns = namespace
        self.token = kube.token_for(namespace, "pipeline-runner")
        client = kube.client(self.token)
        self.api = Counting(k8s.CustomObjectsApi(client))
        self.core = k8s.CoreV1Api(client)
        self.admin_api = k8s.CustomObjectsApi(kube.admin())
        self.admin_core = k8s.CoreV1Api(kube.admin())

    def jobset(self, run_id: str = RUN_ID, **options: Any) -> dict[str, Any]:
        return build_sao_jobset(run_id, self.ns, SAOImages("registry.example.com/t:1", "registry.example.com/g:1"), 2,
                                "posttrain", "s3://posttrain/tenants/x/sao.yaml", "redis-credentials", **options)

    def stored(self, name: str = NAME) -> dict[str, Any] | None:
        try:
            return self.admin_api.get_namespaced_custom_object(*JS, self.ns, "jobsets", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def set_status(self, status: dict[str, Any], name: str = NAME) -> None:
        """What the JobSet controller writes (no JobSet controller runs here)."""
        self.kube.set_status(*JS, self.ns, "jobsets", name, status)

    def workflow(self, name: str = "post-training-abc12") -> Owner:
        """The KFP run's Argo Workflow (an object only: no Argo controller runs here)."""
        (wf,) = self.kube.apply([{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                                  "metadata": {"name": name, "namespace": self.ns}, "spec": {"entrypoint": "main"}}])
        return Owner("argoproj.io/v1alpha1", "Workflow", name, wf["metadata"]["uid"], self.ns)

    def launcher_pod(self, name: str, workflow: Owner) -> str:
        """The ``train_sao`` step's pod as Argo creates it (owned by the Workflow), bound to the fake kubelet's node."""
        self.kube.pod(self.ns, name, owner={**workflow.reference(), "controller": True, "blockOwnerDeletion": True})
        return name

    def evict(self, pod: str) -> None:
        """A drain's eviction: the pod gets DisruptionTarget and a deletionTimestamp (no kubelet finishes it)."""
        self.admin_core.create_namespaced_pod_eviction(pod, self.ns, {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": self.ns}})

    def gone(self, name: str = NAME) -> bool:
        return self.stored(name) is None


@pytest.fixture
def env(kube, kube_tenant) -> Env:
    return Env(kube, kube_tenant)


def counts(**per_role: tuple[int, int, int, int]) -> list[dict[str, Any]]:
    return [{"name": n, "ready": r, "active": a, "succeeded": s, "failed": f, "suspended": 0}
            for n, (r, a, s, f) in per_role.items()]


COMPLETED = {"conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                             "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
             "terminalState": "Completed"}


def failed(reason: str = "ReachedMaxRestarts", message: str = "jobset failed due to reaching max number of restarts",
           restarts: int = 2) -> dict[str, Any]:
    return {"restarts": restarts, "terminalState": "Failed", "conditions": [
        {"type": "Failed", "status": "True", "reason": reason, "message": message,
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}


class Steps:
    """Plays a controller: after the launcher has reported ``k`` statuses, run step ``k`` (in a thread)."""

    def __init__(self, steps: list[Callable[[], None]]):
        self.steps = steps
        self.seen: list[Any] = []
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __call__(self, status: Any) -> None:
        with self._cond:
            self.seen.append(status)
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            for k, step in enumerate(self.steps, start=1):
                with self._cond:
                    if not self._cond.wait_for(lambda k=k: len(self.seen) >= k, timeout=60):
                        raise TimeoutError(f"the launcher reported {len(self.seen)} statuses, step {k} waits for {k}")
                step()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            self.error = exc

    def __enter__(self) -> Steps:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=60)
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------------------------------------- create / attach


def test_launch_creates_the_jobset_and_a_retried_step_reattaches_to_it(env):
    assert launch_or_attach(env.api, env.core, env.ns, env.jobset()) == NAME
    first = env.stored()
    assert first["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "posttrain"
    assert first["spec"]["failurePolicy"] == env.jobset()["spec"]["failurePolicy"]
    assert launch_or_attach(env.api, env.core, env.ns, env.jobset()) == NAME  # 409, same run id: attach
    assert env.stored()["metadata"]["uid"] == first["metadata"]["uid"]
    assert env.api.calls["create_namespaced_custom_object"] == 2
    listed = env.admin_api.list_namespaced_custom_object(*JS, env.ns, "jobsets")["items"]
    assert [o["metadata"]["name"] for o in listed] == [NAME]


def test_attach_refuses_a_jobset_of_another_run(env):
    other = env.jobset()
    other["metadata"]["annotations"]["posttrain.io/run-id"] = "someone-else"
    env.kube.apply([other])
    with pytest.raises(JobSetConflict, match="someone-else"):
        launch_or_attach(env.api, env.core, env.ns, env.jobset())


def test_preflight_names_what_is_missing_and_creates_nothing(env, kube):
    env.admin_core.delete_namespaced_secret("s3-credentials", env.ns)
    with pytest.raises(PreflightError, match=f"Secret 's3-credentials' not found in namespace {env.ns}"):
        launch_or_attach(env.api, env.core, env.ns, env.jobset())
    with pytest.raises(PreflightError, match="LocalQueue 'nope'"):
        js = env.jobset()
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "nope"
        launch_or_attach(env.api, env.core, env.ns, js)
    kube.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "redis-credentials", "namespace": env.ns},
                 "stringData": {"password": "p@ss/word"}}])
    with pytest.raises(PreflightError, match="URL-safe"):
        launch_or_attach(env.api, env.core, env.ns, env.jobset(), preflight=True)
    client = kube.client(kube.token_for(env.ns, "not-bound"))  # a service account the tenant's Role is not bound to
    with pytest.raises(PreflightError, match="HTTP 403.*pipeline-runner Role"):
        launch_or_attach(k8s.CustomObjectsApi(client), k8s.CoreV1Api(client), env.ns, env.jobset())
    assert env.admin_api.list_namespaced_custom_object(*JS, env.ns, "jobsets")["items"] == []


# ---------------------------------------------------------------------------------------------- watch


def test_the_wait_follows_a_real_watch_through_queued_running_and_completed(env, kube):
    """Kueue holds the JobSet suspended (its Workload says why), admits it, the JobSet runs and completes.
    The launcher reads the JobSet once and learns every later transition from the watch stream."""
    js = env.jobset()
    js["spec"]["suspend"] = True  # what Kueue's webhook does until the Workload is admitted
    launch_or_attach(env.api, env.core, env.ns, js)
    uid = env.stored()["metadata"]["uid"]
    workload = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "metadata": {"name": f"jobset-{NAME}-1a2b3", "namespace": env.ns, "labels": {"kueue.x-k8s.io/job-uid": uid}},
                "spec": {"queueName": "posttrain", "podSets": [{"name": "learner", "count": 1, "template": {
                    "spec": {"containers": [{"name": "learner", "image": "x"}]}}}]}}
    kube.apply([workload])
    kube.set_status("kueue.x-k8s.io", "v1beta2", env.ns, "workloads", workload["metadata"]["name"], {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "lastTransitionTime": "2026-01-01T00:00:00Z",
         "message": "couldn't assign flavors to pod set generator: insufficient quota for nvidia.com/gpu"}]})
    reads_before = env.api.calls["get_namespaced_custom_object"]

    def admit() -> None:
        env.admin_api.patch_namespaced_custom_object(*JS, env.ns, "jobsets", NAME, {"spec": {"suspend": False}})

    steps = Steps([
        admit,
        lambda: env.set_status({"replicatedJobsStatus": counts(redis=(1, 1, 0, 0), learner=(0, 1, 0, 0),
                                                               generator=(0, 2, 0, 0))}),
        lambda: env.set_status({"replicatedJobsStatus": counts(redis=(1, 1, 0, 0), learner=(1, 1, 0, 0),
                                                               generator=(2, 2, 0, 0))}),
        lambda: env.set_status(COMPLETED),
    ])
    with steps:
        final = wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=300, timeout_s=600, on_status=steps)
    assert [s.phase for s in steps.seen] == ["Queued", "Starting", "Starting", "Running", "Completed"]
    assert "insufficient quota for nvidia.com/gpu" in steps.seen[0].message
    assert steps.seen[2].replicated_jobs["learner"].active == 1
    assert final.phase == "Completed" and final.reason == "AllJobsCompleted"
    assert env.api.calls["get_namespaced_custom_object"] - reads_before == 1  # one read; the rest came by watch


def test_a_failed_jobset_raises_with_the_learners_termination_reason_or_its_log(env, kube):
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    selector = {"jobset.sigs.k8s.io/jobset-name": NAME}
    gen, learner, quiet = f"{NAME}-generator-1-0-abcde", f"{NAME}-learner-0-0-fghij", f"{NAME}-learner-0-1-klmno"
    kube.pod(env.ns, gen, labels={**selector, "jobset.sigs.k8s.io/replicatedjob-name": "generator"}, container="generator")
    kube.set_pod_status(env.ns, gen, phase="Running", container="generator", last_terminated={
        "exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T00:05:00Z"})
    kube.pod(env.ns, learner, labels={**selector, "jobset.sigs.k8s.io/replicatedjob-name": "learner"}, container="learner")
    kube.set_pod_status(env.ns, learner, phase="Failed", container="learner", terminated={
        "exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:04:00Z",
        "message": "Traceback (most recent call last):\nValueError: sao.micro_batch_size (64) must be <= sao.batch_size (32)"})
    kube.pod(env.ns, quiet, labels={**selector, "jobset.sigs.k8s.io/replicatedjob-name": "learner"}, container="learner")
    kube.set_pod_status(env.ns, quiet, phase="Failed", container="learner", terminated={
        "exitCode": 3, "reason": "Error", "finishedAt": "2026-01-01T00:03:00Z", "message": ""})
    kube.kubelet.set_log(env.ns, quiet, "learner", "step 12 loss 0.31\nRuntimeError: CUDA error: an illegal memory access\n")
    kube.pod(env.ns, "unrelated-pod", labels={"app": "other"})
    kube.set_pod_status(env.ns, "unrelated-pod", phase="Failed", terminated={"exitCode": 2, "reason": "Error"})
    env.set_status(failed())
    with pytest.raises(JobSetFailed) as info:
        wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=10, timeout_s=60)
    err = info.value
    assert err.reason == "ReachedMaxRestarts"
    assert (err.learner_failure.exit_code, err.learner_failure.reason) == (1, "Error")
    assert "ValueError: sao.micro_batch_size (64)" in err.learner_failure.message
    assert [f.role for f in err.failures] == ["learner", "learner", "generator"]  # learner first; unrelated pod ignored
    assert "illegal memory access" in err.failures[1].message  # empty termination message: read from pods/log
    assert "learner failure: learner pod" in str(err)


def test_the_wait_is_bounded_and_a_deleted_jobset_ends_it(env):
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    with pytest.raises(JobSetTimeout, match=r"did not finish within 1.5 s; last status: .* Starting") as info:
        wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=1, timeout_s=1.5)
    assert info.value.last_status.phase == "Starting"
    steps = Steps([lambda: env.admin_api.delete_namespaced_custom_object(*JS, env.ns, "jobsets", NAME)])
    with steps, pytest.raises(JobSetGone, match=NAME):
        wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=60, timeout_s=120, on_status=steps)
    with pytest.raises(JobSetGone):
        wait_for_jobset(env.api, env.core, env.ns, "never-created", poll_s=1, timeout_s=5)


# ---------------------------------------------------------------------------------------------- an API server that stops answering


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP socket that accepts connections (the kernel's backlog) and never answers: a half-open API server."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def silent_clients(url: str) -> tuple[k8s.CustomObjectsApi, k8s.CoreV1Api]:
    cfg = k8s.Configuration()
    cfg.host, cfg.verify_ssl, cfg.retries = url, False, 1
    client = k8s.ApiClient(cfg)
    return k8s.CustomObjectsApi(client), k8s.CoreV1Api(client)


def test_an_api_server_that_stops_answering_gives_a_bounded_one_line_error(env, kube, silent_server):
    api, core = silent_clients(silent_server)
    with pytest.raises(KubeUnavailable) as info:
        launch_or_attach(api, core, env.ns, env.jobset(), request_timeout=0.25)
    assert "\n" not in str(info.value) and "did not answer while reading LocalQueue" in str(info.value)
    sleeps: list[float] = []
    with pytest.raises(KubeUnavailable) as info:
        wait_for_jobset(api, core, env.ns, NAME, poll_s=1, timeout_s=600, max_api_errors=2, request_timeout=0.25,
                        sleep=sleeps.append)
    assert "\n" not in str(info.value) and "3 API errors in a row while watching" in str(info.value)
    assert sleeps == [1.0, 1.0]  # bounded back-off between the attempts, then the error
    cause = termination_cause(api, core, pod_name="p", pod_namespace=env.ns, request_timeout=0.25,
                              workflow=Owner("argoproj.io/v1alpha1", "Workflow", "w", "u", env.ns))
    assert cause.cancel  # the SIGTERM handler does not hang on a silent server either

    # The real API server, stopped (SIGSTOP) while the launcher reads: the same bounded one-line error.
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    client = kube.client(env.token, retries=0)
    pid = kube.apiserver_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(KubeUnavailable) as info:
            wait_for_jobset(k8s.CustomObjectsApi(client), k8s.CoreV1Api(client), env.ns, NAME, poll_s=1, timeout_s=60,
                            max_api_errors=0, request_timeout=1)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "\n" not in str(info.value) and "no answer in time" in str(info.value)
    kube.wait_for("the API server to answer again", lambda: env.stored() is not None)


# ---------------------------------------------------------------------------------------------- delete, being deleted, failed


def test_delete_jobset_removes_it_once(env, kube):
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    assert delete_jobset(env.api, env.ns, NAME) is True
    kube.wait_for("the foreground deletion to finish", env.gone)
    assert delete_jobset(env.api, env.ns, NAME) is False


def test_a_jobset_being_deleted_is_waited_out_then_created_anew(env, kube, caplog):
    """A retried launcher never attaches to a JobSet with a deletionTimestamp: it waits (bounded), then creates."""
    held = env.jobset()
    held["metadata"]["finalizers"] = ["posttrain.io/test-hold"]  # keeps it in deletion until the test lets go
    kube.apply([held])
    old_uid = env.stored()["metadata"]["uid"]
    env.admin_api.delete_namespaced_custom_object(*JS, env.ns, "jobsets", NAME)
    assert env.stored()["metadata"].get("deletionTimestamp")
    with pytest.raises(JobSetError, match=r"still being deleted after 1 s .*posttrain.io/test-hold"):
        launch_or_attach(env.api, env.core, env.ns, env.jobset(), deletion_timeout_s=1)

    waiting = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "is being deleted" in record.getMessage():
                waiting.set()

    handler = Seen()
    logging.getLogger("posttrain.cluster.launcher").addHandler(handler)
    logging.getLogger("posttrain.cluster.launcher").setLevel(logging.INFO)

    def release() -> None:
        assert waiting.wait(60)
        env.admin_api.patch_namespaced_custom_object(*JS, env.ns, "jobsets", NAME, {"metadata": {"finalizers": None}})

    releaser = threading.Thread(target=release)
    releaser.start()
    try:
        assert launch_or_attach(env.api, env.core, env.ns, env.jobset(), deletion_timeout_s=60) == NAME
    finally:
        releaser.join(60)
        logging.getLogger("posttrain.cluster.launcher").removeHandler(handler)
    fresh = env.stored()
    assert fresh["metadata"]["uid"] != old_uid and not fresh["metadata"].get("deletionTimestamp")


def test_a_retry_after_a_genuine_failure_starts_a_fresh_jobset_or_says_why_not(env, kube):
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    old_uid = env.stored()["metadata"]["uid"]
    env.set_status(failed())
    assert launch_or_attach(env.api, env.core, env.ns, env.jobset()) == NAME
    fresh = env.stored()
    assert fresh["metadata"]["uid"] != old_uid
    assert not (fresh.get("status") or {}).get("conditions")  # a new JobSet, not the failed one
    # Without the right to delete it, the retry says so instead of failing again on the old status.
    env.set_status(failed())
    kube.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "no-delete", "namespace": env.ns},
                 "rules": [{"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["create", "get"]},
                           {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get"]},
                           {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]}]},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "no-delete", "namespace": env.ns},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-delete"},
                 "subjects": [{"kind": "ServiceAccount", "name": "no-delete", "namespace": env.ns}]}])
    client = kube.client(kube.token_for(env.ns, "no-delete"))
    with pytest.raises(JobSetError, match=r"failed earlier \(ReachedMaxRestarts\) and cannot be replaced: deleting it "
                                          r"was refused \(HTTP 403"):
        launch_or_attach(k8s.CustomObjectsApi(client), k8s.CoreV1Api(client), env.ns, env.jobset())
    # A completed JobSet is attached to (the retried step then finishes at once).
    env.set_status(COMPLETED)
    assert launch_or_attach(env.api, env.core, env.ns, env.jobset()) == NAME
    assert wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=5, timeout_s=30).phase == "Completed"


# ---------------------------------------------------------------------------------------------- ownership and garbage collection


def test_the_jobset_is_owned_by_the_runs_workflow_and_collected_with_it_not_with_the_launcher_pod(env, kube):
    workflow = env.workflow()
    pod = env.launcher_pod("train-sao-abc12", workflow)
    owner = run_owner(env.core, pod, env.ns, env.ns)
    assert owner == workflow
    launch_or_attach(env.api, env.core, env.ns, env.jobset(), owner=owner)
    assert env.stored()["metadata"]["ownerReferences"] == [workflow.reference()]

    # The launcher pod goes (node lost, drained, garbage-collected): the JobSet stays. The collector has
    # acted once a ConfigMap owned by that pod is gone.
    uid = env.admin_core.read_namespaced_pod(pod, env.ns).metadata.uid
    kube.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "owned-by-the-pod", "namespace": env.ns,
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}]}}])
    env.admin_core.delete_namespaced_pod(pod, env.ns, grace_period_seconds=0)
    kube.wait_for("the collector to delete the pod's ConfigMap",
                  lambda: not env.admin_core.list_namespaced_config_map(
                      env.ns, field_selector="metadata.name=owned-by-the-pod").items)
    assert env.stored() is not None

    # The run is deleted (its Workflow goes): the garbage collector deletes the JobSet.
    env.admin_api.delete_namespaced_custom_object("argoproj.io", "v1alpha1", env.ns, "workflows", workflow.name)
    kube.wait_for("the collector to delete the JobSet with its Workflow", env.gone)


def test_ownership_never_crosses_namespaces(env, kube):
    other = kube.namespace("launcher")
    (wf,) = kube.apply([{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                         "metadata": {"name": "run-elsewhere", "namespace": other}, "spec": {"entrypoint": "main"}}])
    workflow = Owner("argoproj.io/v1alpha1", "Workflow", "run-elsewhere", wf["metadata"]["uid"], other)
    kube.pod(other, "launcher", owner={**workflow.reference(), "controller": True})
    # POSTTRAIN_NAMESPACE moved the JobSet away from the launcher pod: no owner is set.
    assert run_owner(k8s.CoreV1Api(kube.admin()), "launcher", other, env.ns) is None
    with pytest.raises(ValueError, match="ownership never crosses namespaces"):
        launch_or_attach(env.api, env.core, env.ns, env.jobset(), owner=workflow)
    # Why: the collector takes an owner in another namespace for a missing one and deletes the dependent.
    crossing = env.jobset(run_id="crossing")
    crossing["metadata"]["ownerReferences"] = [workflow.reference()]
    kube.apply([crossing])
    kube.wait_for("the collector to delete the JobSet owned across namespaces",
                  lambda: env.gone(crossing["metadata"]["name"]))
    kube.delete_namespace(other)


# ---------------------------------------------------------------------------------------------- cancel vs eviction (SIGTERM)


def sigterm_inside(env: Env, **context: Any) -> Terminated:
    with pytest.raises(Terminated) as info, cancel_on_termination(env.api, env.core, env.ns, NAME, **context):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # interrupted by the handler
    assert info.value.code == 143
    return info.value


def test_a_cancelled_run_deletes_the_jobset_and_an_evicted_launcher_leaves_it_for_the_retry(env, kube):
    workflow = env.workflow()
    first = env.launcher_pod("train-sao-first", workflow)
    owner = run_owner(env.core, first, env.ns, env.ns)
    previous = signal.getsignal(signal.SIGTERM)
    launch_or_attach(env.api, env.core, env.ns, env.jobset(), owner=owner)

    # A drain evicts the launcher: SIGTERM, but the run goes on. The JobSet keeps running.
    env.evict(first)
    pod = env.admin_core.read_namespaced_pod(first, env.ns)
    assert pod.metadata.deletion_timestamp is not None
    assert any(c.type == "DisruptionTarget" and c.status == "True" for c in pod.status.conditions)
    term = sigterm_inside(env, pod_name=first, pod_namespace=env.ns, workflow=owner)
    assert not term.cause.cancel and "being deleted" in term.cause.reason and not term.jobset_deleted
    assert env.stored() is not None and signal.getsignal(signal.SIGTERM) is previous

    # The retried step (a new pod of the same run) re-attaches and follows it to the end.
    second = env.launcher_pod("train-sao-second", workflow)
    assert launch_or_attach(env.api, env.core, env.ns, env.jobset(), owner=run_owner(env.core, second, env.ns, env.ns)) == NAME
    assert env.stored()["metadata"]["ownerReferences"] == [workflow.reference()]  # the same owner, not added twice
    env.set_status(COMPLETED)
    assert wait_for_jobset(env.api, env.core, env.ns, NAME, poll_s=5, timeout_s=30).phase == "Completed"

    # The user terminates the run from KFP (activeDeadlineSeconds: 0), then the pod gets SIGTERM: deleted.
    env.set_status({"conditions": None, "terminalState": None})
    env.admin_api.patch_namespaced_custom_object("argoproj.io", "v1alpha1", env.ns, "workflows", workflow.name,
                                                 {"spec": {"activeDeadlineSeconds": 0}})
    term = sigterm_inside(env, pod_name=second, pod_namespace=env.ns, workflow=owner)
    assert term.cause.cancel and "terminated" in term.cause.reason and term.jobset_deleted
    kube.wait_for("the JobSet to be deleted", env.gone)


def test_without_an_owner_or_a_sign_of_eviction_sigterm_deletes_the_jobset(env, kube):
    launch_or_attach(env.api, env.core, env.ns, env.jobset())
    term = sigterm_inside(env)  # outside a pod: nothing else would ever delete it
    assert term.cause.cancel and term.jobset_deleted
    kube.wait_for("the JobSet to be deleted", env.gone)
    workflow = env.workflow()
    pod = env.launcher_pod("train-sao-ctrl-c", workflow)
    launch_or_attach(env.api, env.core, env.ns, env.jobset(), owner=workflow)
    term = sigterm_inside(env, pod_name=pod, pod_namespace=env.ns, workflow=workflow)  # pod not being deleted
    assert term.cause.cancel and "without a sign of eviction" in term.cause.reason


def test_outside_the_main_thread_nothing_is_installed(env):
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with cancel_on_termination(env.api, env.core, env.ns, NAME):
                pass
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            errors.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert errors == []


# ---------------------------------------------------------------------------------------------- the real step, in its own processes


def test_the_train_step_survives_an_eviction_reattaches_and_a_cancel_removes_the_jobset(env, kube, tmp_path):
    """``train_sao_cluster`` in its own process, as the tenant's service account through a kubeconfig, in a
    pod of the run's Workflow: evicted -> exit 143, JobSet kept; the retried step (another pod) re-attaches;
    the run is terminated -> the JobSet is deleted, exit 143."""
    from posttrain.kfp.prepare import prepare_dataset

    dataset = tmp_path / "dataset"
    prepare_dataset(str(REPO / "configs" / "sao_demo_cpu.yaml"), "sao", "", "", 2, RUN_ID, dataset)
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig", env.ns, env.token)
    workflow = env.workflow()

    def start(pod: str) -> tuple[subprocess.Popen[str], list[str]]:
        environ = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "POSTTRAIN_NAMESPACE")}
        environ.update(KUBECONFIG=str(kubeconfig), POSTTRAIN_RUNS_URI=str(tmp_path / "runs"), POD_NAME=pod,
                       POD_NAMESPACE=env.ns, PYTHONPATH=os.pathsep.join([str(REPO / "src"), environ.get("PYTHONPATH", "")]))
        script = ("import sys; from posttrain.kfp.train_cluster import train_sao_cluster; "
                  "train_sao_cluster(sys.argv[1], sys.argv[2], queue='posttrain', run_id=sys.argv[3], "
                  "learner_image='trainer:1', generator_image='generator:1', poll_s=5, timeout_s=600)")
        proc = subprocess.Popen([sys.executable, "-c", script, str(dataset), str(tmp_path / f"model-{pod}"), RUN_ID],
                                env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
        return proc, lines

    def until_following(proc: subprocess.Popen[str], lines: list[str]) -> None:
        """Until the step prints its JobSet line: created or attached, with its SIGTERM handler installed."""
        deadline = time.monotonic() + 120
        while not any(f"JobSet {env.ns}/{NAME}: queue posttrain" in line for line in list(lines)):
            assert proc.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "the launcher never followed its JobSet"
            time.sleep(0.2)

    def finish(proc: subprocess.Popen[str], lines: list[str]) -> tuple[int, str]:
        try:
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        time.sleep(0.2)  # the reader thread drains the pipe
        return code, "".join(lines)

    first, out1 = start(env.launcher_pod("train-sao-a1", workflow))
    until_following(first, out1)
    uid = env.stored()["metadata"]["uid"]
    assert env.stored()["metadata"]["ownerReferences"] == [workflow.reference()]
    env.evict("train-sao-a1")
    first.send_signal(signal.SIGTERM)
    code, out = finish(first, out1)
    assert code == 143, out[-3000:]
    assert "keeps running and a retried step re-attaches" in out
    assert env.stored()["metadata"]["uid"] == uid

    second, out2 = start(env.launcher_pod("train-sao-a2", workflow))
    until_following(second, out2)
    assert env.stored()["metadata"]["uid"] == uid  # attached, not created again
    env.admin_api.patch_namespaced_custom_object("argoproj.io", "v1alpha1", env.ns, "workflows", workflow.name,
                                                 {"spec": {"activeDeadlineSeconds": 0}})
    second.send_signal(signal.SIGTERM)
    code, out = finish(second, out2)
    assert code == 143, out[-3000:]
    assert "the run was terminated" in out
    kube.wait_for("the cancelled run's JobSet to be deleted", env.gone)
