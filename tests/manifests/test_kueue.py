"""Kueue as shipped: priority classes applied by the base kustomization, waitForPodsReady configured, and
the default SAO run fitting the example tenant's nominal quota (so it never has to borrow).

Run: .venv/bin/python -m pytest -q tests/manifests/test_kueue.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from posttrain.cluster.jobset import (
    DEFAULT_TERMINATION_GRACE_S,
    JOB_DELETION_SLACK_S,
    LEARNER_TERMINATION_GRACE_S,
    POD_START_BUDGET_S,
    REDIS_READY_BUDGET_S,
    RENDEZVOUS_TIMEOUT_S,
    SAOImages,
    restart_recovery_s,
    sao_jobset_for_config,
)
from posttrain.cluster.tenant import INTERACTIVE_PRIORITY, SCHEDULED_PRIORITY, TENANT_LABEL, render_tenant
from posttrain.config import load_config
from posttrain.config.resources import quantity_bytes

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def applied_objects(kustomization_dir: Path) -> list[dict]:
    """Every object ``kubectl apply -k <dir>`` would apply (resources followed recursively; no patches are used)."""
    spec = yaml.safe_load((kustomization_dir / "kustomization.yaml").read_text())
    out: list[dict] = []
    for entry in spec["resources"]:
        target = (kustomization_dir / entry).resolve()
        if target.is_dir():
            out += applied_objects(target)
        else:
            out += [d for d in yaml.safe_load_all(target.read_text()) if d]
    return out


def test_the_base_kustomization_applies_both_workload_priority_classes():
    """``kubectl apply -k manifests/base`` (docs/kubeflow.md step 3) creates the classes the pipelines name."""
    classes = {o["metadata"]["name"]: o["value"] for o in applied_objects(MANIFESTS / "base")
               if o["kind"] == "WorkloadPriorityClass"}
    assert classes.keys() == {INTERACTIVE_PRIORITY, SCHEDULED_PRIORITY}
    assert classes[INTERACTIVE_PRIORITY] > classes[SCHEDULED_PRIORITY]


def test_compiled_pipelines_default_to_a_priority_class_that_is_applied():
    classes = {o["metadata"]["name"] for o in applied_objects(MANIFESTS / "base") if o["kind"] == "WorkloadPriorityClass"}
    for name in ("post_training", "sao"):
        ir = next(yaml.load_all((ROOT / "pipelines" / "compiled" / f"{name}.yaml").read_text(), Loader=yaml.CSafeLoader))
        assert ir["root"]["inputDefinitions"]["parameters"]["priority_class"]["defaultValue"] in classes


def kueue_configuration() -> dict:
    (cm,) = applied_objects(MANIFESTS / "kueue-system")
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "kueue-manager-config",
                                                                                 "kueue-system")
    return yaml.safe_load(cm["data"]["controller_manager_config.yaml"])


def seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    assert duration[-1] in units and duration[:-1].isdigit(), duration
    return int(duration[:-1]) * units[duration[-1]]


def test_kueue_configuration_waits_for_pods_ready_below_the_learner_rendezvous_limit():
    """Kueue evicts and requeues a JobSet whose pods cannot all start before torchrun gives up (30 min)."""
    cfg = kueue_configuration()
    assert (cfg["apiVersion"], cfg["kind"]) == ("config.kueue.x-k8s.io/v1beta2", "Configuration")
    wait = cfg["waitForPodsReady"]
    assert REDIS_READY_BUDGET_S + POD_START_BUDGET_S <= seconds(wait["timeout"]) < RENDEZVOUS_TIMEOUT_S
    assert wait["blockAdmission"] is False
    assert wait["requeuingStrategy"]["backoffLimitCount"] >= 1


@pytest.mark.parametrize("restart_job", [False, True])
def test_kueue_recovery_timeout_outlasts_a_restart_of_the_slowest_pod(restart_job):
    """Issue 31, item 4: with recoveryTimeout 10 min, a learner restart (600 s SIGTERM grace for the checkpoint,
    the failed Job's deletion, Redis and the new pods starting) would have made Kueue evict the whole group,
    Redis's emptyDir with it. The arithmetic: max grace 600 + deletion 120 + Redis 120 + pod start 900 = 1740 s
    <= recoveryTimeout 30m = 1800 s."""
    js = sao_jobset_for_config(load_config(None, []), "run-1", "team-a", SAOImages("t:1", "g:1"), "posttrain",
                               "s3://b/c.yaml", "redis-credentials", restart_job=restart_job)
    graces = [r["template"]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_S)
              for r in js["spec"]["replicatedJobs"]]
    assert max(graces) == LEARNER_TERMINATION_GRACE_S == 600
    budget = restart_recovery_s(js)
    assert budget == 600 + JOB_DELETION_SLACK_S + REDIS_READY_BUDGET_S + POD_START_BUDGET_S == 1740
    recovery = seconds(kueue_configuration()["waitForPodsReady"]["recoveryTimeout"])
    assert budget <= recovery == 1800


def test_kueue_manages_jobsets_and_plain_pods_only_in_tenant_namespaces():
    cfg = kueue_configuration()
    assert {"jobset.x-k8s.io/jobset", "pod"} <= set(cfg["integrations"]["frameworks"])
    (expr,) = cfg["managedJobsNamespaceSelector"]["matchExpressions"]
    assert expr == {"key": TENANT_LABEL, "operator": "Exists"}
    namespace = next(o for o in render_tenant("team-a", 8, "96", "768Gi") if o["kind"] == "Namespace")
    assert TENANT_LABEL in namespace["metadata"]["labels"]


def cpu_millis(value) -> int:
    text = str(value)
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


def jobset_requests(js: dict) -> dict[str, int]:
    """Sum of container requests over every pod of the JobSet (replicas x parallelism): cpu in millicores, memory in bytes."""
    total = {"cpu": 0, "memory": 0, "nvidia.com/gpu": 0}
    for rjob in js["spec"]["replicatedJobs"]:
        pods = rjob["replicas"] * rjob["template"]["spec"]["parallelism"]
        for c in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            req = c["resources"]["requests"]
            total["cpu"] += pods * cpu_millis(req["cpu"])
            total["memory"] += pods * quantity_bytes(req["memory"])
            total["nvidia.com/gpu"] += pods * int(req.get("nvidia.com/gpu", 0))
    return total


def nominal_quota(cluster_queue: dict) -> dict[str, int]:
    quota = {}
    for group in cluster_queue["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for res in flavor["resources"]:
                value = res["nominalQuota"]
                quota[res["name"]] = {"cpu": cpu_millis, "memory": quantity_bytes}.get(res["name"], int)(value)
    return quota


def default_pipeline_config() -> str:
    ir = next(yaml.load_all((ROOT / "pipelines" / "compiled" / "post_training.yaml").read_text(), Loader=yaml.CSafeLoader))
    return ir["root"]["inputDefinitions"]["parameters"]["config"]["defaultValue"]


@pytest.mark.parametrize("config", ["pipeline default", "config defaults"])
def test_the_default_sao_run_fits_the_example_tenants_nominal_quota(config):
    """learner 6 GPUs + 2 generators x 1 = 8 GPUs; 50 cores; 392Gi: within team-a's 8 GPUs, 96 cores, 768Gi."""
    cfg = load_config(ROOT / default_pipeline_config()) if config == "pipeline default" else load_config(None)
    js = sao_jobset_for_config(cfg, "run-1", "team-a", SAOImages("r.example/t:1", "r.example/g:1"), "posttrain",
                               "s3://b/c.yaml", "redis-credentials")
    asked = jobset_requests(js)
    (cq,) = [d for d in yaml.safe_load_all((MANIFESTS / "overlays/team-a/cluster-queue.yaml").read_text()) if d]
    quota = nominal_quota(cq)
    for resource, amount in asked.items():
        assert amount <= quota[resource], f"{resource}: the default SAO run asks {amount}, nominal quota {quota[resource]}"
    assert asked["nvidia.com/gpu"] == 8
