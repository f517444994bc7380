"""RBAC of a rendered tenant on a real API server, acting as the tenant's service accounts with real tokens.

``posttrain tenant render`` binds the Role ``posttrain-launcher`` to ``pipeline-runner`` and (KFP's
multi-user runner) ``default-editor``. Each check below is a real request with a token from the
TokenRequest API, as a pipeline pod would send it: what the launcher calls is allowed; other Secrets,
other namespaces, namespaces themselves, and verbs the launcher never uses are refused (403).
Mutating requests are sent as server-side dry runs: the server authorizes them fully and stores
nothing.

Run: .venv/bin/python -m pytest -q tests/cluster/test_rbac.py
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube_control_plane import secret
from posttrain.cluster.jobset import SAOImages, build_sao_jobset

DRY = {"dry_run": "All"}


@pytest.fixture(scope="module")
def tenants(kube):
    """Two tenants (the second is the 'other team'); the first has an extra Secret its launcher must not read."""
    mine, theirs = kube.tenant("rbac"), kube.tenant("other")
    kube.apply([secret(mine, "mlflow-db", {"password": "not-for-the-launcher"})])
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated", "namespace": mine}, "data": {"a": "b"}}
    kube.apply([cm])
    kube.pod(mine, "learner-0", container="learner")
    kube.kubelet.set_log(mine, "learner-0", "learner", "step 1 loss 0.5\n")
    kube.apply([{"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                 "metadata": {"name": "run-abc", "namespace": mine}, "spec": {"entrypoint": "main"}}])
    yield mine, theirs
    kube.delete_namespace(mine)
    kube.delete_namespace(theirs)


def as_account(kube, namespace: str, account: str) -> tuple[k8s.CoreV1Api, k8s.CustomObjectsApi, k8s.ApiClient]:
    client = kube.client(kube.token_for(namespace, account))
    return k8s.CoreV1Api(client), k8s.CustomObjectsApi(client), client


def jobset(namespace: str) -> dict[str, Any]:
    return build_sao_jobset("rbac-run", namespace, SAOImages("r.example/t:1", "r.example/g:1"), 2, "posttrain",
                            "s3://b/c.yaml", "redis-credentials")


JS = ("jobset.x-k8s.io", "v1alpha2")


def allowed_calls(core: k8s.CoreV1Api, api: k8s.CustomObjectsApi, ns: str) -> dict[str, Callable[[], Any]]:
    """What the launcher calls (``posttrain.cluster.launcher``, ``jobset_status``)."""
    return {
        "create jobset": lambda: api.create_namespaced_custom_object(*JS, ns, "jobsets", jobset(ns), **DRY),
        "list+watch jobsets": lambda: api.list_namespaced_custom_object(*JS, ns, "jobsets", watch=False),
        "patch jobset owners": lambda: api.create_namespaced_custom_object(*JS, ns, "jobsets", jobset(ns)) and
        api.patch_namespaced_custom_object(*JS, ns, "jobsets", jobset(ns)["metadata"]["name"],
                                           {"metadata": {"labels": {"x": "y"}}}),
        "delete jobset": lambda: api.delete_namespaced_custom_object(*JS, ns, "jobsets", jobset(ns)["metadata"]["name"],
                                                                     **DRY),
        "read redis-credentials": lambda: core.read_namespaced_secret("redis-credentials", ns),
        "read s3-credentials": lambda: core.read_namespaced_secret("s3-credentials", ns),
        "read posttrain-tenant": lambda: core.read_namespaced_config_map("posttrain-tenant", ns),
        "read localqueue": lambda: api.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "localqueues",
                                                                    "posttrain"),
        "list workloads": lambda: api.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads"),
        "list pods": lambda: core.list_namespaced_pod(ns),
        "read own pod": lambda: core.read_namespaced_pod("learner-0", ns),
        "read pod log": lambda: core.read_namespaced_pod_log("learner-0", ns, container="learner"),
        "read the run's workflow": lambda: api.get_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows",
                                                                            "run-abc"),
        # a run with the rollout gateway (posttrain.cluster.gateway): its token Secret, Service, NetworkPolicy
        "create the gateway's token secret": lambda: core.create_namespaced_secret(
            ns, secret(ns, "run-gateway", {"token": "t" * 32}), **DRY),
        "create the gateway's service": lambda: core.create_namespaced_service(ns, {
            "metadata": {"name": "run-gateway"}, "spec": {"ports": [{"port": 8600}]}}, **DRY),
        "create the gateway's network policy": lambda: k8s.NetworkingV1Api(core.api_client).create_namespaced_network_policy(
            ns, {"metadata": {"name": "run-gateway"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}, **DRY),
    }


def refused_calls(core: k8s.CoreV1Api, api: k8s.CustomObjectsApi, client: k8s.ApiClient, ns: str,
                  other: str) -> dict[str, Callable[[], Any]]:
    rbac = k8s.RbacAuthorizationV1Api(client)
    net = k8s.NetworkingV1Api(client)
    return {
        "read another secret": lambda: core.read_namespaced_secret("mlflow-db", ns),
        "list secrets": lambda: core.list_namespaced_secret(ns),
        "change a secret": lambda: core.patch_namespaced_secret("redis-credentials", ns, {"data": {}}, **DRY),
        "delete a secret": lambda: core.delete_namespaced_secret("redis-credentials", ns, **DRY),
        "read a service": lambda: core.list_namespaced_service(ns),
        "read another configmap": lambda: core.read_namespaced_config_map("unrelated", ns),
        "the other team's secret": lambda: core.read_namespaced_secret("redis-credentials", other),
        "the other team's jobsets": lambda: api.create_namespaced_custom_object(*JS, other, "jobsets", jobset(other), **DRY),
        "list namespaces": lambda: core.list_namespace(),
        "create a namespace": lambda: core.create_namespace({"metadata": {"name": "rogue"}}, **DRY),
        "delete its own namespace": lambda: core.delete_namespace(ns, **DRY),
        "create a pod": lambda: core.create_namespaced_pod(ns, {"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "image": "x"}]}}, **DRY),
        "delete a pod": lambda: core.delete_namespaced_pod("learner-0", ns, **DRY),
        "exec into a pod": lambda: core.connect_get_namespaced_pod_exec("learner-0", ns, command=["sh"]),
        "write jobset status": lambda: api.patch_namespaced_custom_object_status(
            *JS, ns, "jobsets", jobset(ns)["metadata"]["name"], {"status": {"restarts": 1}}),
        "delete its network policy": lambda: net.delete_namespaced_network_policy("generator-egress", ns, **DRY),
        "change its role": lambda: rbac.patch_namespaced_role("posttrain-launcher", ns, {"rules": []}, **DRY),
        "create a workload": lambda: api.create_namespaced_custom_object(
            "kueue.x-k8s.io", "v1beta2", ns, "workloads", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                                                           "metadata": {"name": "w"}, "spec": {}}, **DRY),
        "terminate the run's workflow": lambda: api.patch_namespaced_custom_object(
            "argoproj.io", "v1alpha1", ns, "workflows", "run-abc", {"spec": {"activeDeadlineSeconds": 0}}),
        "change the cluster queue": lambda: api.patch_cluster_custom_object(
            "kueue.x-k8s.io", "v1beta2", "clusterqueues", f"{ns}-cq", {"spec": {"cohortName": "mine"}}),
    }


@pytest.mark.parametrize("account", ["pipeline-runner", "default-editor"])
def test_the_tenant_service_accounts_may_do_what_the_launcher_calls_and_nothing_else(kube, tenants, account):
    mine, theirs = tenants
    core, api, client = as_account(kube, mine, account)
    for what, call in allowed_calls(core, api, mine).items():
        try:
            call()
        except ApiException as exc:
            pytest.fail(f"{account}: {what} was refused: HTTP {exc.status} {exc.reason}")
    api.delete_namespaced_custom_object(*JS, mine, "jobsets", jobset(mine)["metadata"]["name"])
    refused = []
    for what, call in refused_calls(core, api, client, mine, theirs).items():
        with pytest.raises(ApiException) as info:
            call()
        refused.append((what, info.value.status))
    assert all(status == 403 for _, status in refused), refused


def test_a_service_account_without_the_binding_may_do_none_of_it(kube, tenants):
    mine, _ = tenants
    core, api, _ = as_account(kube, mine, "someone-else")
    for what, call in allowed_calls(core, api, mine).items():
        with pytest.raises(ApiException) as info:
            call()
        assert info.value.status == 403, what
