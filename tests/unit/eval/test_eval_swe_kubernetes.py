"""The Kubernetes SWE backend against a real API server (the cluster tier's control plane).

There is no kubelet or scheduler there, so the test plays them through the API: a thread watching
the namespace binds each new pod to the fake kubelet's node, serves its log from the fake kubelet's
log endpoint and writes the pod's final phase (``kube.kubelet_finishing_pods``). The backend runs
as a service account of the namespace with a Role that allows what it calls.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from posttrain.eval.swe.instances import SweGradingError, SweInstance, load_swe_instances
from posttrain.eval.swe.k8s_backend import EGRESS_POLICY_NAME, KubernetesSweBackend
from posttrain.eval.swe.log_grading import MARK_END, MARK_START

RULES = [
    {"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["create", "get", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
]


@pytest.fixture
def swe(kube, kube_ns) -> Iterator[tuple[object, str, k8s.ApiClient]]:
    """The namespace, and a client as a service account allowed what the backend calls."""
    kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "swe-eval", "namespace": kube_ns},
         "rules": RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "swe-eval", "namespace": kube_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "swe-eval"},
         "subjects": [{"kind": "ServiceAccount", "name": "swe-eval", "namespace": kube_ns}]},
    ])
    yield kube, kube_ns, kube.client(kube.token_for(kube_ns, "swe-eval"))


@pytest.fixture(scope="module")
def instance() -> SweInstance:
    return load_swe_instances()["django__django-11790"]


def _backend(client: k8s.ApiClient, ns: str, **kw: object) -> KubernetesSweBackend:
    return KubernetesSweBackend(client, namespace=ns, poll_interval_s=0.05, image_prefix="mirror.local/",
                                labels={"kueue.x-k8s.io/queue-name": "team-a-eval"}, **kw)


def _passing_log(inst: SweInstance) -> str:
    lines = [f"{t} ... ok" for t in inst.fail_to_pass + inst.pass_to_pass]
    return "\n".join([">>>>> PATCH_APPLIED", MARK_START, *lines, f"{MARK_END} rc=0"])


def _left(kube, ns: str) -> tuple[list[str], list[str]]:
    """The backend's pods and ConfigMaps still in the namespace (they carry its role label)."""
    core = k8s.CoreV1Api(kube.admin())
    selector = "posttrain.io/role=swe-eval"
    pods = [p.metadata.name for p in core.list_namespaced_pod(ns, label_selector=selector).items]
    cms = [c.metadata.name for c in core.list_namespaced_config_map(ns, label_selector=selector).items]
    return pods, cms


def test_pod_runs_the_instance_image_with_limits_deadline_and_no_network(swe, instance: SweInstance) -> None:
    kube, ns, client = swe
    seen: list[dict] = []
    configmaps: list[dict] = []

    def log(pod: dict) -> str:  # the ConfigMap still exists while its pod runs
        cm = k8s.CoreV1Api(kube.admin()).read_namespaced_config_map(pod["metadata"]["name"], ns)
        configmaps.append(cm.data)
        return _passing_log(instance)

    with kube.kubelet_finishing_pods(ns, log=log, seen=seen):
        result = _backend(client, ns, cpu="3", memory="6Gi", timeout_s=900).run(instance, "MODEL PATCH")
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
    data = configmaps[0]
    assert data["model.patch"] == "MODEL PATCH" and data["test.patch"] == instance.test_patch
    assert "./tests/runtests.py" in data["eval.sh"]

    policy = k8s.NetworkingV1Api(kube.admin()).read_namespaced_network_policy(EGRESS_POLICY_NAME, ns)
    assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.egress and not policy.spec.ingress
    assert policy.spec.pod_selector.match_labels == {"posttrain.io/role": "swe-eval"}
    assert _left(kube, ns) == ([], [])  # the pod and its ConfigMap are gone afterwards


def test_failing_tests_in_the_log_grade_unresolved(swe, instance: SweInstance) -> None:
    kube, ns, client = swe
    log = _passing_log(instance).replace(f"{instance.fail_to_pass[0]} ... ok", f"{instance.fail_to_pass[0]} ... FAIL")
    with kube.kubelet_finishing_pods(ns, log=lambda pod: log):
        grade = _backend(client, ns).run(instance, "").grade
    assert grade.status == "unresolved" and grade.fail_to_pass_failed == [instance.fail_to_pass[0]]


def test_pod_past_its_deadline_is_graded_timeout_and_deleted(swe, instance: SweInstance) -> None:
    """The kubelet reports DeadlineExceeded; a pod that never runs (no kubelet) times out on the caller side."""
    kube, ns, client = swe
    with kube.kubelet_finishing_pods(ns, phase="Failed", reason="DeadlineExceeded", log=lambda pod: "partial output"):
        assert _backend(client, ns).run(instance, "").grade.status == "timeout"
    grade = _backend(client, ns, timeout_s=1, grace_s=0.2).run(instance, "").grade  # stays Pending
    assert grade.status == "timeout"
    assert _left(kube, ns) == ([], [])


def test_api_refusal_is_a_clear_error_and_cleans_up(swe, instance: SweInstance) -> None:
    kube, ns, _ = swe
    kube.apply([{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                 "metadata": {"name": "no-pods", "namespace": ns},
                 "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get", "delete"]},
                           {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]}]},
                {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                 "metadata": {"name": "no-pods", "namespace": ns},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-pods"},
                 "subjects": [{"kind": "ServiceAccount", "name": "no-pods", "namespace": ns}]}])
    client = kube.client(kube.token_for(ns, "no-pods"))
    with pytest.raises(SweGradingError, match="HTTP 403"):
        _backend(client, ns).run(instance, "")
    assert _left(kube, ns) == ([], [])


def test_oversized_patch_is_refused_before_any_object_is_created(swe, instance: SweInstance) -> None:
    kube, ns, client = swe
    with pytest.raises(SweGradingError, match="over"):
        _backend(client, ns).run(instance, "x" * (1 << 20))
    assert _left(kube, ns) == ([], [])
    assert k8s.NetworkingV1Api(kube.admin()).list_namespaced_network_policy(ns).items == []


def test_pod_and_network_policy_are_accepted_by_the_api_server(swe, instance: SweInstance) -> None:
    kube, ns, client = swe
    backend = _backend(client, ns)
    kube.apply([backend.pod_manifest("swe-eval-x", instance, "swe-eval-x"), backend.network_policy()], dry_run=True)
