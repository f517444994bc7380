"""The rollout gateway on a cluster: its replicated job in the SAO JobSet, its Secret, Service and NetworkPolicy.

The launcher's Role may create these three (``tests/cluster/test_rbac.py``), not read or change them.

Schema checks run everywhere (the JobSet CRD strictly, the built-in kinds with kubernetes-validate).
The last test applies the objects to the session's real API server (``tests/kube_control_plane.py``:
etcd, kube-apiserver and kube-controller-manager on loopback) and lets its garbage collector delete
them with the JobSet; it skips with one line where that control plane cannot start. NetworkPolicies are
stored and validated there, not enforced (no CNI): what a CNI enforces is not shown here.
"""

from __future__ import annotations

import base64

import pytest

from posttrain.cluster.gateway import (
    GATEWAY_PORT,
    TOKEN_ENV,
    apply_gateway_objects,
    ensure_gateway_secret,
    gateway_network_policy,
    gateway_object_name,
    gateway_pod_selector,
    gateway_secret,
    gateway_service,
)
from posttrain.cluster.jobset import SAOImages, sao_jobset_for_config
from posttrain.cluster.validate import jobset_child_jobs, validate_builtin, validate_custom_resource
from posttrain.config import load_config

IMAGES = SAOImages(learner="registry.example.com/posttrain/trainer:1", generator="registry.example.com/posttrain/generator:1")
RUN_ID = "7d1c2a9e-1234-4bcd-9def-0123456789ab"


def jobset(*overrides: str, **options) -> dict:
    cfg = load_config(None, ["gateway.mode=with_generators", *overrides])
    return sao_jobset_for_config(cfg, RUN_ID, "team-a", IMAGES, "posttrain", "s3://b/c.yaml", "redis-credentials",
                                 **options)


def rjobs(js: dict) -> dict:
    return {r["name"]: r for r in js["spec"]["replicatedJobs"]}


def pod(js: dict, role: str) -> dict:
    return rjobs(js)[role]["template"]["spec"]["template"]


def test_the_jobset_with_a_gateway_passes_the_crd_schema_and_its_jobs_validate_strictly():
    js = jobset()
    assert validate_custom_resource(js) == []
    names = [j["metadata"]["name"] for j in jobset_child_jobs(js)]
    assert names[-1] == f"{js['metadata']['name']}-gateway-0"
    for job in jobset_child_jobs(js):
        assert validate_builtin(job) == []


def test_the_gateway_pod_serves_the_config_with_the_runs_token_and_restarts_alone():
    js = jobset("gateway.resources.gpus=2", restart_job=True)
    name = js["metadata"]["name"]
    spec = pod(js, "gateway")["spec"]
    (container,) = spec["containers"]
    assert container["command"] == ["posttrain", "gateway", "--config", "s3://b/c.yaml", "--host", "0.0.0.0", "--port",
                                    str(GATEWAY_PORT)]
    assert container["image"] == IMAGES.generator and container["resources"]["limits"]["nvidia.com/gpu"] == 2
    token = next(e for e in container["env"] if e["name"] == TOKEN_ENV)
    assert token["valueFrom"]["secretKeyRef"] == {"name": f"{name}-gateway", "key": "token"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": GATEWAY_PORT}
    assert spec["automountServiceAccountToken"] is False
    assert rjobs(js)["gateway"]["dependsOn"] == [{"name": "redis", "status": "Ready"}]
    assert {"name": "gatewayRestartsAlone", "action": "RestartJob", "targetReplicatedJobs": ["gateway"]} in \
        js["spec"]["failurePolicy"]["rules"]  # with the RestartJob gate; without it any failure restarts the group
    assert jobset()["spec"]["failurePolicy"]["rules"] == [{"name": "anyFailureRestartsTheGroup",
                                                          "action": "RestartJobSet"}]
    labels = pod(js, "gateway")["metadata"]["labels"]
    assert gateway_pod_selector(name).items() <= labels.items()  # what the Service and the policy select


def test_gateway_only_runs_have_no_generator_pod_and_no_gateway_none():
    only = jobset("gateway.mode=only", restart_job=True)
    assert set(rjobs(only)) == {"redis", "learner", "gateway"}
    assert all(r["targetReplicatedJobs"] != ["generator"] for r in only["spec"]["failurePolicy"]["rules"])
    assert validate_custom_resource(only) == []
    off = jobset("gateway.mode=disabled")
    assert set(rjobs(off)) == {"redis", "learner", "generator"}


def test_the_service_and_network_policy_select_the_gateway_pod_and_admit_only_agent_pods():
    js = jobset()
    name = js["metadata"]["name"]
    labels = pod(js, "gateway")["metadata"]["labels"]
    service = gateway_service(name, "team-a")
    policy = gateway_network_policy(name, "team-a", {"posttrain.io/gateway-client": "true"})
    for obj in (service, policy, gateway_secret(name, "team-a")):
        assert validate_builtin(obj) == []
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "protocol": "TCP", "port": GATEWAY_PORT, "targetPort": GATEWAY_PORT}]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    # one peer: pods of this namespace (no namespaceSelector) with the agent label, on the gateway's port
    assert rule == {"from": [{"podSelector": {"matchLabels": {"posttrain.io/gateway-client": "true"}}}],
                    "ports": [{"protocol": "TCP", "port": GATEWAY_PORT}]}
    with pytest.raises(ValueError):
        gateway_network_policy(name, "team-a", {})
    token = base64.b64decode(gateway_secret(name, "team-a")["data"]["token"]).decode()
    assert len(token) >= 32 and token != base64.b64decode(gateway_secret(name, "team-a")["data"]["token"]).decode()


@pytest.mark.integration
@pytest.mark.slow
def test_on_a_real_api_server_the_objects_are_stored_owned_by_the_jobset_and_collected_with_it(kube, kube_ns):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = kube.admin()
    core, net, custom = client.CoreV1Api(api), client.NetworkingV1Api(api), client.CustomObjectsApi(api)
    ns = kube_ns
    cfg = load_config(None, ["gateway.mode=with_generators"])
    js = sao_jobset_for_config(cfg, RUN_ID, ns, IMAGES, "posttrain", "s3://b/c.yaml", "redis-credentials")
    name = js["metadata"]["name"]
    workflow = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "run-1"},
        "spec": {"entrypoint": "main"}})
    run = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "run-1", "uid": workflow["metadata"]["uid"]}
    assert ensure_gateway_secret(core, name, ns, run) is True
    token = core.read_namespaced_secret(gateway_object_name(name), ns).data["token"]
    assert ensure_gateway_secret(core, name, ns, run) is False  # a retried step keeps the token
    assert core.read_namespaced_secret(gateway_object_name(name), ns).data["token"] == token
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", js)
    stored = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)
    done = apply_gateway_objects(core, net, stored, {"posttrain.io/gateway-client": "true"})
    assert done == [f"Service/{name}-gateway", f"NetworkPolicy/{name}-gateway"]
    assert apply_gateway_objects(core, net, stored, {"posttrain.io/gateway-client": "true"}) == done  # idempotent
    uid = stored["metadata"]["uid"]
    reads = (core.read_namespaced_service, net.read_namespaced_network_policy)
    for read in reads:
        obj = read(f"{name}-gateway", ns)
        assert [(o.kind, o.uid) for o in obj.metadata.owner_references] == [("JobSet", uid)]
    owners = core.read_namespaced_secret(f"{name}-gateway", ns).metadata.owner_references
    assert [(o.kind, o.name) for o in owners] == [("Workflow", "run-1")]
    service = core.read_namespaced_service(f"{name}-gateway", ns)
    assert service.spec.selector == gateway_pod_selector(name) and service.spec.cluster_ip
    policy = net.read_namespaced_network_policy(f"{name}-gateway", ns)
    assert policy.spec.ingress[0]._from[0].pod_selector.match_labels == {"posttrain.io/gateway-client": "true"}
    assert policy.spec.ingress[0]._from[0].namespace_selector is None
    custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name)

    def gone(read) -> bool:
        try:
            read(f"{name}-gateway", ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    kube.wait_for("the garbage collector to delete what the JobSet owned", lambda: all(gone(r) for r in reads),
                  timeout_s=90)
    assert not gone(core.read_namespaced_secret)  # the token outlives a replaced JobSet: the run owns it
    custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", "run-1")
    kube.wait_for("the garbage collector to delete the run's token", lambda: gone(core.read_namespaced_secret),
                  timeout_s=90)
