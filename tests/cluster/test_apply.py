"""Server-side apply on a real API server: every manifest directory, every tenant rendering, every SAO JobSet.

The session's control plane (``tests/kube_control_plane.py``) has the JobSet and Kueue CRDs of the
pinned releases installed, so the server checks schemas and CEL rules and prunes unknown fields as a
cluster would. Each apply is compared with what the server stored: everything we wrote must still
be there (a field the server pruned is a field the cluster never sees). The JobSet webhook is not
running here; ``tests/cluster/test_jobset_webhook.py`` checks its rules offline.

Run: .venv/bin/python -m pytest -q tests/cluster/test_apply.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kube_control_plane import kustomize
from posttrain.cluster.jobset import PodResources, SAOImages, build_sao_jobset, sao_jobset_for_config
from posttrain.cluster.tenant import DNS_PRESETS, DnsEgress, render_tenant
from posttrain.cluster.validate import jobset_child_jobs
from posttrain.config import load_config

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
IMAGES = SAOImages("registry.example.com/posttrain/trainer:1", "registry.example.com/posttrain/generator:1")


def missing(written: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of ``written`` that ``stored`` lacks or holds with another value (the server may add fields)."""
    if written in ([], {}) and stored is None:
        return []  # an empty list or map is stored as absent (omitempty): same meaning
    if isinstance(written, dict):
        if not isinstance(stored, dict):
            return [path or "."]
        return [p for k, v in written.items() for p in missing(v, stored.get(k), f"{path}.{k}")]
    if isinstance(written, list):
        if not isinstance(stored, list) or len(stored) != len(written):
            return [path]
        return [p for i, (w, s) in enumerate(zip(written, stored, strict=True)) for p in missing(w, s, f"{path}[{i}]")]
    if isinstance(written, (int, float)) and isinstance(stored, str):
        return [] if str(written) == stored else [path]  # quantities come back as strings
    return [] if written == stored else [path]


def apply_and_compare(kube, objs: list[dict[str, Any]], namespace: str | None = None, *, dry_run: bool = False) -> None:
    """Apply; every field written must come back. Secrets come back with ``data`` for ``stringData``."""
    for obj, stored in zip(objs, kube.apply(objs, namespace=namespace, dry_run=dry_run), strict=True):
        written = {k: v for k, v in obj.items() if k != "stringData"}
        assert missing(written, stored) == [], f"{obj['kind']} {obj['metadata']['name']}: pruned or changed"


def version(obj: dict[str, Any]) -> dict[str, Any]:
    """What a second apply must not change: the object without its status and the metadata controllers write."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("resourceVersion", "managedFields", "finalizers")}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


def test_every_manifest_directory_applies_server_side_and_a_second_apply_changes_nothing(kube):
    """``kubectl apply -k`` of base (kueue, rbac, redis, storage, mlflow), kueue-system, every overlay and
    network (into a tenant namespace): accepted, nothing pruned, and re-applying leaves every object as it was."""
    core = k8s.CoreV1Api(kube.admin())
    core.create_namespace({"metadata": {"name": "kueue-system"}})  # Kueue's install owns it
    tenant = kube.namespace("network")
    directories = [("base", None), ("kueue-system", None), ("network", tenant)]
    directories += [(f"overlays/{d.name}", None) for d in sorted((MANIFESTS / "overlays").iterdir()) if d.is_dir()]
    applied = 0
    for directory, namespace in directories:
        objs = kustomize(MANIFESTS / directory)
        assert objs, directory
        apply_and_compare(kube, objs, namespace)
        before = [version(kube.get(o, namespace)) for o in objs]
        kube.apply(objs, namespace=namespace)
        assert [version(kube.get(o, namespace)) for o in objs] == before, directory
        applied += len(objs)
    every_file = [p for p in MANIFESTS.rglob("*.yaml") if "crds" not in p.parts and p.name != "kustomization.yaml"]
    assert applied == sum(len([d for d in yaml.safe_load_all(p.read_text()) if d]) for p in every_file)  # none left out
    kube.delete_namespace(tenant)


RENDERINGS = {
    "default": {},
    "mesh-gated-openshift": {"istio_sidecar": True, "jobset_restart_job": True, "dns": DNS_PRESETS["openshift"],
                             "owner": "lead@example.com", "lending_limit_gpus": 2, "borrowing_limit_gpus": 0},
    "nodelocal-and-service-ip": {"dns": DnsEgress(ip_blocks=("169.254.20.10/32", "10.96.0.10/32"))},
    "cpu-only": {"gpu_quota": 0, "mlflow_experiment": "team/sao", "s3_bucket": "ml-data"},
}


@pytest.mark.parametrize("rendering", RENDERINGS, ids=list(RENDERINGS))
def test_every_tenant_rendering_applies_server_side_with_nothing_pruned(kube, rendering):
    name = f"r-{rendering}"[:40].rstrip("-")
    kwargs = dict(RENDERINGS[rendering])
    objs = render_tenant(name, kwargs.pop("gpu_quota", 8), "96", "768Gi", **kwargs)
    try:
        apply_and_compare(kube, objs)
    finally:
        kube.delete_namespace(name)


JOBSETS = {
    "default": {},
    "learner-restarts-alone": {"restart_job": True},
    "priority-and-mesh": {"priority_class": "posttrain-scheduled", "istio_sidecar": True},
    "2x4-learner": {"learner_nodes": 2, "learner_resources": PodResources(cpu="32", memory="256Gi", gpus=4, shm="32Gi")},
    "1024-generators-longest-name": {"run_id": "z" * 200, "num_generators": 1024},
    "64-learner-nodes-cpu": {"learner_nodes": 64, "learner_resources": PodResources(cpu="4", memory="16Gi")},
}


def test_every_sao_jobset_and_its_child_jobs_are_accepted_by_the_api_server(kube, kube_tenant):
    """The JobSet (server-side apply, dry run: nothing starts) and the Jobs the JobSet controller would create
    from it (batch/v1, dry run) pass the real CRD schema, its CEL rules and the built-in Job validation."""
    for variant, options in {**JOBSETS, "default-config": None}.items():
        if options is None:
            js = sao_jobset_for_config(load_config(None, []), "run-cfg", kube_tenant, IMAGES, "posttrain",
                                       "s3://b/c.yaml", "redis-credentials")
        else:
            args = {"run_id": "3f1c-run", **options}
            run_id = args.pop("run_id")
            js = build_sao_jobset(run_id, kube_tenant, IMAGES, args.pop("num_generators", 4), "posttrain",
                                  "s3://posttrain/tenants/x/sao.yaml", "redis-credentials", **args)
        try:
            apply_and_compare(kube, [js], dry_run=True)
            kube.apply(jobset_child_jobs(js), namespace=kube_tenant, dry_run=True)
        except ApiException as exc:
            pytest.fail(f"{variant}: the API server refused it: {exc.body}")


def test_the_api_server_enforces_the_jobset_crd_rules_the_webhook_check_also_covers(kube, kube_tenant):
    """The CEL rules are the server's: an InOrder startup policy beside dependsOn, and a changed failure policy."""
    js = build_sao_jobset("cel-run", kube_tenant, IMAGES, 2, "posttrain", "s3://b/c.yaml", "redis-credentials")
    bad = {**js, "spec": {**js["spec"], "startupPolicy": {"startupPolicyOrder": "InOrder"}}}
    with pytest.raises(ApiException) as info:
        kube.apply([bad], dry_run=True)
    assert info.value.status == 422 and "StartupPolicy and DependsOn APIs are mutually exclusive" in info.value.body
    kube.apply([js])
    changed = {**js, "spec": {**js["spec"], "failurePolicy": {**js["spec"]["failurePolicy"], "maxRestarts": 7}}}
    with pytest.raises(ApiException) as info:
        kube.apply([changed])
    assert info.value.status == 422 and "Value is immutable" in info.value.body
