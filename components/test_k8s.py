"""``components/k8s.py``: each helper compiles to the Kubernetes settings it promises."""

import pytest
import yaml
from kfp import compiler, dsl

from components import k8s
from posttrain.cluster.tenant import render_tenant


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def noop(x: str):
    """Does nothing (a task to decorate)."""
    print(x)


def compile_with(tmp_path, decorate):
    @dsl.pipeline(name="k8s-helpers")
    def pipe(x: str = "a"):
        decorate(noop(x=x))

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipe, str(path))
    ir, platform = yaml.safe_load_all(path.read_text())
    return ir["deploymentSpec"]["executors"]["exec-noop"]["container"], \
        platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-noop"]


def test_use_kueue_queue_labels_the_pod(tmp_path):
    _, k = compile_with(tmp_path, lambda t: k8s.use_kueue_queue(t, "team-b-queue"))
    assert k["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-b-queue",
                                          "kueue.x-k8s.io/priority-class": "posttrain-interactive"}
    _, k = compile_with(tmp_path, lambda t: k8s.use_kueue_queue(t, "team-b-queue", priority_class=""))
    assert k["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-b-queue"}


def test_use_kueue_queue_refuses_a_pipeline_parameter_and_bad_names(tmp_path):
    with pytest.raises(TypeError, match="fixed at compile time"):
        @dsl.pipeline(name="bad")
        def pipe(queue: str = "q"):
            k8s.use_kueue_queue(noop(x="a"), queue)
    with pytest.raises(ValueError, match="not a DNS-1123 label"):
        compile_with(tmp_path, lambda t: k8s.use_kueue_queue(t, "Team_A"))
    with pytest.raises(ValueError, match="priority_class: 'High' is not a DNS-1123 label"):
        compile_with(tmp_path, lambda t: k8s.use_kueue_queue(t, "q", priority_class="High"))


def test_request_gpus_sets_accelerator_memory_toleration_and_shm(tmp_path):
    """2 GPUs, cpu 4, memory 32Gi = 34.359738368 GB in KFP's decimal units."""
    container, k = compile_with(tmp_path, lambda t: k8s.request_gpus(t, 2, cpu="4", memory="32Gi", shm="8Gi"))
    res = container["resources"]
    assert res["accelerator"] == {"count": "2", "resourceCount": "2", "resourceType": "nvidia.com/gpu",
                                  "type": "nvidia.com/gpu"}
    assert res["cpuRequest"] == 4.0 and res["memoryLimit"] == res["memoryRequest"] == 34.359738368
    assert k["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    assert k["emptyDirMounts"] == [{"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "8Gi",
                                    "volumeName": "dshm"}]


def test_request_gpus_rejects_zero_gpus_and_bad_quantities(tmp_path):
    with pytest.raises(ValueError, match=r"gpus: must be an integer in \[1, 64\]"):
        compile_with(tmp_path, lambda t: k8s.request_gpus(t, 0))
    with pytest.raises(ValueError, match="memory: '64 GB' is not a Kubernetes quantity"):
        compile_with(tmp_path, lambda t: k8s.request_gpus(t, 1, memory="64 GB"))


def test_mount_workspace_uses_an_ephemeral_volume_or_a_claim(tmp_path):
    container, k = compile_with(tmp_path, lambda t: k8s.mount_workspace(t, size="50Gi"))
    assert k["genericEphemeralVolume"][0]["mountPath"] == "/workspace"
    assert k["genericEphemeralVolume"][0]["size"] == "50Gi"
    assert {"name": "POSTTRAIN_WORKSPACE", "value": "/workspace"} in container["env"]
    _, k = compile_with(tmp_path, lambda t: k8s.mount_workspace(t, claim="team-a-scratch"))
    assert k["pvcMount"][0]["mountPath"] == "/workspace"
    assert k["pvcMount"][0]["pvcNameParameter"]["runtimeValue"]["constant"] == "team-a-scratch"


def test_use_tenant_config_exposes_every_key_the_tenant_configmap_has(tmp_path):
    _, k = compile_with(tmp_path, k8s.use_tenant_config)
    configmap = next(o for o in render_tenant("team-a", 8, "64", "512Gi") if o["kind"] == "ConfigMap")
    required, optional = k["configMapAsEnv"]
    keys = [e["configMapKey"] for e in required["keyToEnv"]] + [e["configMapKey"] for e in optional["keyToEnv"]]
    assert keys == list(configmap["data"])
    # Tenants rendered before these keys existed lack them: their steps must still start.
    assert not required.get("optional") and optional["optional"] is True
    assert [e["configMapKey"] for e in optional["keyToEnv"]] == ["POSTTRAIN_ISTIO_SIDECAR", "POSTTRAIN_JOBSET_RESTART_JOB"]
    assert required["configMapName"] == optional["configMapName"] == configmap["metadata"]["name"]
    assert k["secretAsEnv"][0]["secretName"] == "s3-credentials"


def test_use_pod_identity_maps_name_and_namespace_from_the_downward_api(tmp_path):
    """The names the launcher's launcher_pod_from_env reads (to find the run's Workflow through its pod)."""
    from posttrain.cluster.launcher import POD_NAME_ENV, POD_NAMESPACE_ENV, launcher_pod_from_env

    _, k = compile_with(tmp_path, k8s.use_pod_identity)
    assert k["fieldPathAsEnv"] == [{"name": POD_NAME_ENV, "fieldPath": "metadata.name"},
                                   {"name": POD_NAMESPACE_ENV, "fieldPath": "metadata.namespace"}]
    assert launcher_pod_from_env({POD_NAME_ENV: "p", POD_NAMESPACE_ENV: "team-a"}) == ("p", "team-a")
    assert launcher_pod_from_env({"KFP_POD_NAME": "kfp-p", POD_NAMESPACE_ENV: "team-a"}) == ("kfp-p", "team-a")
