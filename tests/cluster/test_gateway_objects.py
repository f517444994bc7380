"""The rollout gateway on a cluster: its replicated job in the SAO JobSet, its Secret, Service and NetworkPolicy.

Schema checks run everywhere (the JobSet CRD strictly, the built-in kinds with kubernetes-validate).
The last test applies the objects to a real API server (``../shared/k8s/control-plane``: etcd,
kube-apiserver and kube-controller-manager on loopback) and lets its garbage collector delete them
with the JobSet; it skips with one line where that control plane cannot start. NetworkPolicies are
stored and validated there, not enforced (no CNI): what a CNI enforces is not shown here.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

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

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE = REPO.parent.parent / "shared" / "k8s" / "control-plane"
IMAGES = SAOImages(learner="registry.example.com/posttrain/trainer:1", generator="registry.example.com/posttrain/generator:1")
RUN_ID = "7d1c2a9e-1234-4bcd-9def-0123456789ab"


def jobset(*overrides: str) -> dict:
    cfg = load_config(None, ["gateway.mode=with_generators", *overrides])
    return sao_jobset_for_config(cfg, RUN_ID, "team-a", IMAGES, "posttrain", "s3://b/c.yaml", "redis-credentials")


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
    js = jobset("gateway.resources.gpus=2")
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
        js["spec"]["failurePolicy"]["rules"]
    labels = pod(js, "gateway")["metadata"]["labels"]
    assert gateway_pod_selector(name).items() <= labels.items()  # what the Service and the policy select


def test_gateway_only_runs_have_no_generator_pod_and_no_gateway_none():
    only = jobset("gateway.mode=only")
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


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real API server with the JobSet CRD; skipped with one line where it cannot start."""
    if not CONTROL_PLANE.is_file():
        pytest.skip(f"no control plane script at {CONTROL_PLANE}")
    where = tmp_path_factory.mktemp("k8s")
    started = subprocess.run([str(CONTROL_PLANE), "start", str(where), "--no-scheduler"], capture_output=True, text=True,
                             timeout=180)
    found = re.search(r"KUBECONFIG=(\S+)", started.stdout)
    if started.returncode != 0 or not found:
        pytest.skip(f"the control plane did not start: {(started.stderr or started.stdout).strip()[-300:]}")
    from kubernetes import client, config

    try:
        api_client = config.new_client_from_config(config_file=found.group(1))
        ext = client.ApiextensionsV1Api(api_client)
        for doc in yaml.safe_load_all((REPO / "manifests" / "crds" / "jobset.x-k8s.io_jobsets.yaml").read_text()):
            if doc:
                ext.create_custom_resource_definition(doc)
        deadline = time.monotonic() + 60
        while not any(c.type == "Established" and c.status == "True"
                      for c in ext.read_custom_resource_definition("jobsets.jobset.x-k8s.io").status.conditions or []):
            assert time.monotonic() < deadline, "the JobSet CRD was not established"
            time.sleep(0.5)
        client.CoreV1Api(api_client).create_namespace({"metadata": {"name": "team-a"}})
        yield api_client
    finally:
        subprocess.run([str(CONTROL_PLANE), "stop", str(where)], capture_output=True, timeout=120,
                       env={**os.environ})


@pytest.mark.integration
@pytest.mark.slow
def test_on_a_real_api_server_the_objects_are_stored_owned_by_the_jobset_and_collected_with_it(kube):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core, net, custom = client.CoreV1Api(kube), client.NetworkingV1Api(kube), client.CustomObjectsApi(kube)
    js = jobset()
    name = js["metadata"]["name"]
    assert ensure_gateway_secret(core, name, "team-a") is True
    token = core.read_namespaced_secret(gateway_object_name(name), "team-a").data["token"]
    assert ensure_gateway_secret(core, name, "team-a") is False  # a retried step keeps the token
    assert core.read_namespaced_secret(gateway_object_name(name), "team-a").data["token"] == token
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a", "jobsets", js)
    stored = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a", "jobsets", name)
    done = apply_gateway_objects(core, net, stored, {"posttrain.io/gateway-client": "true"})
    assert done == [f"Secret/{name}-gateway", f"Service/{name}-gateway", f"NetworkPolicy/{name}-gateway"]
    assert apply_gateway_objects(core, net, stored, {"posttrain.io/gateway-client": "true"}) == done  # idempotent
    uid = stored["metadata"]["uid"]
    reads = (core.read_namespaced_secret, core.read_namespaced_service, net.read_namespaced_network_policy)
    for read in reads:
        obj = read(f"{name}-gateway", "team-a")
        assert [(o.kind, o.uid) for o in obj.metadata.owner_references] == [("JobSet", uid)]
    service = core.read_namespaced_service(f"{name}-gateway", "team-a")
    assert service.spec.selector == gateway_pod_selector(name) and service.spec.cluster_ip
    policy = net.read_namespaced_network_policy(f"{name}-gateway", "team-a")
    assert policy.spec.ingress[0]._from[0].pod_selector.match_labels == {"posttrain.io/gateway-client": "true"}
    assert policy.spec.ingress[0]._from[0].namespace_selector is None
    custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a", "jobsets", name)
    deadline = time.monotonic() + 90  # the garbage collector deletes what the JobSet owned
    left = list(reads)
    while left:
        assert time.monotonic() < deadline, f"still there after the JobSet was deleted: {left}"
        for read in list(left):
            try:
                read(f"{name}-gateway", "team-a")
            except ApiException as exc:
                if exc.status == 404:
                    left.remove(read)
        time.sleep(0.5)
