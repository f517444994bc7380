"""Every manifest under manifests/ parses, validates against its schema, and fits with the code.

Built-in kinds: kubernetes-validate strict for Kubernetes 1.33; custom resources: the vendored
JobSet/Kueue CRD schemas (manifests/crds). Also: one kind per file, labels on every object, kustomize
layout, the team-a overlay and the network policies equal what the renderer writes, and the
cross-references (flavors, ports, selectors, MLflow host names) agree.

Run: .venv/bin/python -m pytest -q tests/manifests/test_manifests.py
"""

from __future__ import annotations

import fnmatch
import io
import shlex
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from posttrain.cluster.jobset import VALKEY_IMAGE, SAOImages, build_sao_jobset
from posttrain.cluster.tenant import PLATFORM_PORTS, network_policies, render_tenant, tenant_cli
from posttrain.cluster.validate import load_yaml_documents, validate_objects, validate_path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
FILES = sorted(p for p in MANIFESTS.rglob("*.yaml") if "crds" not in p.parts and p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(MANIFESTS.rglob("kustomization.yaml"))


def rel(path: Path) -> str:
    return str(path.relative_to(MANIFESTS))


def objects(*names: str) -> list[dict]:
    return [d for n in names for d in load_yaml_documents(MANIFESTS / n)]


def test_there_are_manifests_for_every_topic():
    topics = {p.relative_to(MANIFESTS).parts[0] for p in FILES}
    assert {"base", "kueue", "redis", "storage", "mlflow", "rbac", "network", "overlays"} <= topics


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_manifest_file_validates(path):
    assert validate_path(path) == []


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_one_object_kind_per_file_with_name_and_component_labels(path):
    docs = load_yaml_documents(path)
    assert docs, f"{rel(path)} is empty"
    assert len({d["kind"] for d in docs}) == 1, f"{rel(path)} mixes kinds"
    for doc in docs:
        if doc["kind"] == "Namespace" and "overlays" in path.parts:
            continue  # a tenant namespace is labelled as a Kubeflow profile instead
        labels = doc["metadata"].get("labels", {})
        assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(labels), f"{rel(path)}: {doc['metadata']['name']}"
        template = doc.get("spec", {}).get("template")
        if template is not None:  # workloads: the pods carry them too
            assert {"app.kubernetes.io/name", "app.kubernetes.io/component"} <= set(template["metadata"]["labels"])


def test_kustomizations_list_existing_resources_and_cover_every_manifest():
    listed: set[Path] = set()
    for kfile in KUSTOMIZATIONS:
        spec = yaml.safe_load(kfile.read_text())
        assert spec["kind"] == "Kustomization"
        for entry in spec["resources"]:
            target = (kfile.parent / entry).resolve()
            if target.is_dir():
                assert (target / "kustomization.yaml").exists(), f"{rel(kfile)}: {entry} has no kustomization.yaml"
            else:
                assert target.is_file(), f"{rel(kfile)}: {entry} does not exist"
                assert target.parent == kfile.parent, f"{rel(kfile)}: {entry} is outside the kustomization root"
                listed.add(target)
    assert {p.resolve() for p in FILES} == listed


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (for `kubectl kustomize`) is not installed")
@pytest.mark.parametrize("target", ["base", "overlays/team-a", "network"])
def test_kustomize_build_output_validates(target):
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert built and validate_objects(built) == []


def test_team_a_overlay_is_exactly_what_the_renderer_writes(tmp_path):
    """The overlay is generated; its header holds the command. Re-running it must reproduce every file."""
    header = (MANIFESTS / "overlays/team-a/kustomization.yaml").read_text().splitlines()[0]
    command = header.split("`")[1]
    assert command.startswith("posttrain tenant render ") and command.endswith(" --out-dir <dir>")
    argv = shlex.split(command)[3:-2]
    with redirect_stdout(io.StringIO()):
        assert tenant_cli([*argv, "--out-dir", str(tmp_path)]) == 0
    committed = sorted(p.name for p in (MANIFESTS / "overlays/team-a").iterdir())
    assert committed == sorted(p.name for p in tmp_path.iterdir())
    for name in committed:
        assert (tmp_path / name).read_text() == (MANIFESTS / "overlays/team-a" / name).read_text(), name


def test_network_manifests_are_what_the_renderer_writes():
    assert objects("network/sandbox-deny-egress.yaml", "network/generator-egress.yaml") == network_policies(None)


def test_tenant_flavors_and_priority_classes_exist_in_the_base():
    flavors = {d["metadata"]["name"] for d in objects("kueue/resource-flavors.yaml")}
    cq = next(o for o in render_tenant("t", 1, "1", "1Gi") if o["kind"] == "ClusterQueue")
    assert {f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]} <= flavors
    assert {d["metadata"]["name"] for d in objects("kueue/workload-priority-classes.yaml")} == {
        "posttrain-interactive", "posttrain-scheduled"}


def _pod_labels(path: str) -> dict[str, str]:
    return objects(path)[0]["spec"]["template"]["metadata"]["labels"]


def test_generator_egress_policy_matches_the_platform_services():
    """Each allowed (selector, port) of generator-egress hits a platform pod and its Service's target port."""
    services = {"redis": ("redis/statefulset.yaml", "redis/service.yaml"),
                "s3": ("storage/deployment.yaml", "storage/service.yaml"),
                "mlflow": ("mlflow/deployment.yaml", "mlflow/service.yaml")}
    policy = network_policies("team-a")[1]
    for component, port in PLATFORM_PORTS.items():
        workload, service = services[component]
        rule = next(r for r in policy["spec"]["egress"] if r["ports"][0]["port"] == port and "namespaceSelector" in r["to"][0])
        assert rule["to"][0]["podSelector"]["matchLabels"].items() <= _pod_labels(workload).items()
        container = objects(workload)[0]["spec"]["template"]["spec"]["containers"][0]
        assert port in [p["containerPort"] for p in container["ports"]]
        svc = objects(service)[0]
        assert svc["metadata"]["namespace"] == "posttrain-system"
        assert svc["spec"]["selector"].items() <= _pod_labels(workload).items()


def test_redis_statefulset_uses_aof_and_the_password_from_a_secret():
    sts = objects("redis/statefulset.yaml")[0]
    spec = sts["spec"]["template"]["spec"]
    args = spec["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    for c in spec["containers"] + spec["initContainers"]:
        env = {e["name"]: e for e in c["env"]}
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "redis-auth", "key": "password"}
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_shared_valkey_runs_the_same_image_and_user_as_the_per_run_one():
    spec = objects("redis/statefulset.yaml")[0]["spec"]["template"]["spec"]
    js = build_sao_jobset("r", "t", SAOImages("l:1", "g:1"), 1, "q", "c.yaml", "s")
    redis_pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert {c["image"] for c in spec["containers"] + spec["initContainers"]} == {VALKEY_IMAGE}
    assert spec["securityContext"]["runAsUser"] == redis_pod["securityContext"]["runAsUser"] == 999
    assert spec["containers"][0]["command"] == redis_pod["containers"][0]["command"] == ["valkey-server"]


def test_mlflow_allows_the_host_names_clients_use():
    """MLflow 3 answers 403 to Host headers not in --allowed-hosts (research §9.3): the tenant ConfigMap's URI must match."""
    args = objects("mlflow/deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    patterns = args[args.index("--allowed-hosts") + 1].split(",")
    config = next(o for o in render_tenant("t", 1, "1", "1Gi") if o["kind"] == "ConfigMap")["data"]
    host = urlsplit(config["MLFLOW_TRACKING_URI"]).netloc
    for candidate in (host, "mlflow.posttrain-system:5000", "mlflow:5000", "localhost:5000"):
        assert any(fnmatch.fnmatch(candidate, p) for p in patterns), candidate
    assert not any(fnmatch.fnmatch("evil.example.com", p) for p in patterns)
    assert args[args.index("--artifacts-destination") + 1].startswith("s3://")
    storage_svc = objects("storage/service.yaml")[0]
    endpoint = urlsplit(config["AWS_ENDPOINT_URL"])
    assert endpoint.hostname.split(".")[0] == storage_svc["metadata"]["name"]
    assert endpoint.port == storage_svc["spec"]["ports"][0]["port"]
