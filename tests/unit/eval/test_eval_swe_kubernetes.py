"""The Kubernetes SWE backend against a loopback fake API server (``tests/fakes/fake_kube_api.py``).

The test plays the kubelet: after the pod is created, a hook marks it finished and sets its log.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.fake_kube_api import FakeKubeAPI
from posttrain.eval.swe.instances import SweGradingError, SweInstance, load_swe_instances
from posttrain.eval.swe.k8s_backend import EGRESS_POLICY_NAME, KubernetesSweBackend
from posttrain.eval.swe.log_grading import MARK_END, MARK_START

NS = "team-a"


@pytest.fixture()
def fake() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI() as api:
        yield api


@pytest.fixture(scope="module")
def instance() -> SweInstance:
    return load_swe_instances()["django__django-11790"]


def _kubelet(fake: FakeKubeAPI, log: str | None, phase: str = "Succeeded", reason: str = "") -> None:
    """After each pod POST, finish every pod that has no phase yet, with ``log``."""

    def hook(method: str, path: str) -> None:
        if method != "POST" or not path.endswith("/pods"):
            return
        for pod in fake.list("v1", "pods", NS):
            if not (pod.get("status") or {}).get("phase"):
                status = {"phase": phase, **({"reason": reason} if reason else {})}
                fake.patch_status("v1", "pods", pod["metadata"]["name"], NS, status)
                if log is not None:
                    fake.set_log(NS, pod["metadata"]["name"], log)

    fake.add_hook(hook)


def _backend(fake: FakeKubeAPI, **kw: object) -> KubernetesSweBackend:
    return KubernetesSweBackend(fake.api_client(), namespace=NS, poll_interval_s=0.05, image_prefix="mirror.local/",
                                labels={"kueue.x-k8s.io/queue-name": "team-a-eval"}, **kw)


def _passing_log(inst: SweInstance) -> str:
    lines = [f"{t} ... ok" for t in inst.fail_to_pass + inst.pass_to_pass]
    return "\n".join([">>>>> PATCH_APPLIED", MARK_START, *lines, f"{MARK_END} rc=0"])


def test_pod_runs_the_instance_image_with_limits_deadline_and_no_network(fake: FakeKubeAPI, instance: SweInstance) -> None:
    seen: list[dict] = []
    fake.add_hook(lambda m, p: seen.extend(fake.list("v1", "pods", NS)) if m == "POST" and p.endswith("/pods") else None)
    _kubelet(fake, _passing_log(instance))
    result = _backend(fake, cpu="3", memory="6Gi", timeout_s=900).run(instance, instance.patch)
    assert result.grade.resolved and result.backend == "kubernetes"

    pod = seen[0]
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["image"] == "mirror.local/swebench/sweb.eval.x86_64.django_1776_django-11790:latest"
    assert container["resources"]["limits"] == {"cpu": "3", "memory": "6Gi", "ephemeral-storage": "10Gi"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert spec["activeDeadlineSeconds"] == 900 and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["dnsPolicy"] == "None" and spec["dnsConfig"]["nameservers"] == ["127.0.0.1"]
    assert pod["metadata"]["labels"]["posttrain.io/role"] == "swe-eval"
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-eval"

    policy = fake.get("networking.k8s.io/v1", "networkpolicies", EGRESS_POLICY_NAME, NS)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["egress"] == []
    assert policy["spec"]["podSelector"]["matchLabels"] == {"posttrain.io/role": "swe-eval"}
    # the pod and its ConfigMap are gone afterwards
    assert fake.list("v1", "pods", NS) == [] and fake.list("v1", "configmaps", NS) == []


def test_configmap_carries_patches_and_script(fake: FakeKubeAPI, instance: SweInstance) -> None:
    captured: list[dict] = []
    fake.add_hook(lambda m, p: captured.extend(fake.list("v1", "configmaps", NS)) if m == "POST" and p.endswith("/configmaps") else None)
    _kubelet(fake, _passing_log(instance))
    _backend(fake).run(instance, "MODEL PATCH")
    data = captured[0]["data"]
    assert data["model.patch"] == "MODEL PATCH" and data["test.patch"] == instance.test_patch
    assert "./tests/runtests.py" in data["eval.sh"]


def test_failing_tests_in_the_log_grade_unresolved(fake: FakeKubeAPI, instance: SweInstance) -> None:
    log = _passing_log(instance).replace(f"{instance.fail_to_pass[0]} ... ok", f"{instance.fail_to_pass[0]} ... FAIL")
    _kubelet(fake, log, phase="Succeeded")
    grade = _backend(fake).run(instance, "").grade
    assert grade.status == "unresolved" and grade.fail_to_pass_failed == [instance.fail_to_pass[0]]


def test_pod_past_its_deadline_is_graded_timeout_and_deleted(fake: FakeKubeAPI, instance: SweInstance) -> None:
    """The kubelet reports DeadlineExceeded; a pod that never finishes times out on the caller side."""
    _kubelet(fake, "partial output", phase="Failed", reason="DeadlineExceeded")
    assert _backend(fake).run(instance, "").grade.status == "timeout"
    with FakeKubeAPI() as silent:  # no kubelet: the pod stays pending
        grade = _backend(silent, timeout_s=1, grace_s=0.2).run(instance, "").grade
        assert grade.status == "timeout"
        assert silent.list("v1", "pods", NS) == [] and silent.list("v1", "configmaps", NS) == []


def test_api_refusal_is_a_clear_error_and_cleans_up(fake: FakeKubeAPI, instance: SweInstance) -> None:
    fake.fail_next("POST", r"/pods$", 403)
    with pytest.raises(SweGradingError, match="HTTP 403"):
        _backend(fake).run(instance, "")
    assert fake.list("v1", "configmaps", NS) == []


def test_oversized_patch_is_refused_before_any_object_is_created(fake: FakeKubeAPI, instance: SweInstance) -> None:
    with pytest.raises(SweGradingError, match="over"):
        _backend(fake).run(instance, "x" * (1 << 20))
    assert fake.requests == []


def test_pod_and_network_policy_pass_the_kubernetes_schema(fake: FakeKubeAPI, instance: SweInstance) -> None:
    import kubernetes_validate

    backend = _backend(fake)
    kubernetes_validate.validate(backend.pod_manifest("swe-eval-x", instance, "swe-eval-x"), "1.30", strict=True)
    kubernetes_validate.validate(backend.network_policy(), "1.30", strict=True)
