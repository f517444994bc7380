"""Tenant rendering: valid objects, quota in a cohort, least-privilege RBAC, prefixes, and a Redis ACL
rule that a real Valkey server enforces.

Run: .venv/bin/python -m pytest -q tests/cluster/test_tenant.py
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr, redirect_stdout

import pytest
import redis
import yaml

from posttrain.cluster.jobset import SAOImages, build_sao_jobset
from posttrain.cluster.tenant import (
    PASSWORD_PLACEHOLDER,
    redis_acl_rule,
    render_tenant,
    tenant_cli,
    to_yaml,
)
from posttrain.cluster.validate import validate_objects
from posttrain.services.embedded_redis import EmbeddedRedis


def render(**overrides):
    kwargs = dict(name="team-a", gpu_quota=8, cpu_quota="96", memory_quota="768Gi", borrowing_limit_gpus=4,
                  lending_limit_gpus=2, s3_bucket="ml-data")
    kwargs.update(overrides)
    return render_tenant(**kwargs)


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def test_rendered_tenant_validates_against_kubernetes_and_kueue_schemas():
    objs = render()
    assert [o["kind"] for o in objs] == [
        "Namespace", "ClusterQueue", "LocalQueue", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
        "NetworkPolicy", "NetworkPolicy", "Secret",
    ]
    assert validate_objects(objs) == []


def test_namespace_is_a_kubeflow_profile_namespace():
    ns = by_kind(render(owner="lead@example.com"), "Namespace")[0]
    assert ns["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kubeflow-profile"
    assert ns["metadata"]["annotations"] == {"owner": "lead@example.com"}


def test_cluster_queue_shares_a_cohort_with_borrowing_and_lending_limits():
    cq = by_kind(render(), "ClusterQueue")[0]
    assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert cq["spec"]["cohortName"] == "posttrain"
    gpu = cq["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]
    assert gpu == {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 4, "lendingLimit": 2}
    assert cq["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}
    lq = by_kind(render(), "LocalQueue")[0]
    assert (lq["metadata"]["namespace"], lq["spec"]["clusterQueue"]) == ("team-a", cq["metadata"]["name"])


def test_default_borrowing_limit_equals_the_quota_and_lending_is_unlimited():
    gpu = by_kind(render(borrowing_limit_gpus=None, lending_limit_gpus=None), "ClusterQueue")[0]["spec"]["resourceGroups"][1]
    assert gpu["flavors"][0]["resources"][0] == {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": 8}


def test_role_grants_what_the_launcher_calls_and_no_more():
    role = by_kind(render(), "Role")[0]
    rules = {(r["apiGroups"][0], r["resources"][0]): r for r in role["rules"]}
    assert {"create", "get", "watch", "delete"} <= set(rules[("jobset.x-k8s.io", "jobsets")]["verbs"])
    assert rules[("", "pods/log")]["verbs"] == ["get"]
    assert {"get", "list"} <= set(rules[("kueue.x-k8s.io", "workloads")]["verbs"])
    assert rules[("", "secrets")]["verbs"] == ["get"]
    assert rules[("", "secrets")]["resourceNames"] == ["redis-credentials", "s3-credentials"]
    # the rollout gateway's per-run token Secret, Service and NetworkPolicy: create only, no name to restrict to
    assert rules[("", "services")] == {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["create"]}
    assert rules[("networking.k8s.io", "networkpolicies")]["verbs"] == ["create"]
    binding = by_kind(render(), "RoleBinding")[0]
    assert {"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": "team-a"} in binding["subjects"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]


def test_role_covers_every_secret_and_config_map_the_jobset_refers_to():
    """The launcher's preflight reads these by name; a missing resourceName would be a 403 in the cluster."""
    objs = render()
    rules = by_kind(objs, "Role")[0]["rules"]
    allowed = {(r["resources"][0], n) for r in rules for n in r.get("resourceNames", [])}
    js = build_sao_jobset("r1", "team-a", SAOImages("t:1", "g:1"), 1, "posttrain", "s3://b/c.yaml", "redis-credentials")
    refs = set()
    for rjob in js["spec"]["replicatedJobs"]:
        for c in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            refs |= {("secrets", e["valueFrom"]["secretKeyRef"]["name"]) for e in c.get("env", []) if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
            refs |= {("secrets", s["secretRef"]["name"]) for s in c.get("envFrom", []) if "secretRef" in s}
            refs |= {("configmaps", s["configMapRef"]["name"]) for s in c.get("envFrom", []) if "configMapRef" in s}
    assert refs and refs <= allowed
    assert by_kind(objs, "LocalQueue")[0]["metadata"]["name"] == "posttrain"


def test_config_map_holds_the_tenant_prefixes():
    data = by_kind(render(mlflow_experiment="team-a/sao"), "ConfigMap")[0]["data"]
    assert data["S3_PREFIX"] == "s3://ml-data/tenants/team-a/"
    assert data["MLFLOW_EXPERIMENT_NAME"] == "team-a/sao"
    assert data["REDIS_KEY_PREFIX"] == "team-a"
    assert data["MLFLOW_TRACKING_URI"] == "http://mlflow.posttrain-system.svc.cluster.local:5000"


def test_sandbox_pods_get_no_egress_and_generators_only_reach_the_shared_services():
    policies = {p["metadata"]["name"]: p for p in by_kind(render(), "NetworkPolicy")}
    sandbox = policies["sandbox-deny-egress"]["spec"]
    assert sandbox == {"podSelector": {"matchLabels": {"posttrain.io/role": "sandbox"}}, "policyTypes": ["Egress"]}
    gen = policies["generator-egress"]["spec"]
    ports = sorted(p["port"] for rule in gen["egress"] for p in rule["ports"])
    assert ports == [53, 53, 53, 53, 5000, 6379, 6379, 8333]  # DNS: kube-dns pods and NodeLocal DNSCache
    assert gen["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "generator"


def test_redis_acl_template_carries_a_placeholder_never_a_password():
    objs = render()
    secret = by_kind(objs, "Secret")[0]
    assert secret["metadata"]["namespace"] == "posttrain-system"
    rule = secret["stringData"]["users.acl"]
    assert rule == f"user team-a on >{PASSWORD_PLACEHOLDER} ~team-a:* &team-a:* +@all -@admin -@dangerous"
    assert secret["metadata"]["annotations"]["posttrain.io/password-from"] == "team-a/redis-credentials:password"
    assert "data" not in secret  # nothing but the template


@pytest.mark.integration
def test_the_acl_rule_confines_a_tenant_to_its_prefix_on_a_real_valkey():
    """Loads the rendered rule (placeholder replaced) into Valkey and attacks it as team-a."""
    admin_pw, tenant_pw = "admin-pw-123", "0123abcd" * 4
    with EmbeddedRedis() as server:
        redis.Redis.from_url(server.url).config_set("requirepass", admin_pw)
        admin = redis.Redis.from_url(server.url, password=admin_pw)
        rule = redis_acl_rule("team-a", "team-a").replace(PASSWORD_PLACEHOLDER, tenant_pw)
        assert admin.execute_command("ACL", "SETUSER", *rule.split()[1:]) in (b"OK", "OK", True)
        admin.set("team-b:secret", "b")
        team_a = redis.Redis.from_url(server.url, username="team-a", password=tenant_pw)
        team_a.xadd("team-a:run-1:rollouts", {"rollout": b"\x01"})
        team_a.xgroup_create("team-a:run-1:rollouts", "learner", id="0")
        assert team_a.xreadgroup("learner", "c1", {"team-a:run-1:rollouts": ">"}, count=1)
        team_a.publish("team-a:weights", "v1")
        for attack in (lambda: team_a.get("team-b:secret"), lambda: team_a.set("posttrain:x", 1),
                       lambda: team_a.flushall(), lambda: team_a.keys("*"), lambda: team_a.config_get("requirepass"),
                       lambda: team_a.execute_command("ACL", "LIST"), lambda: team_a.publish("team-b:weights", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attack()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(server.url, username="team-a", password="wrong", retry=None).ping()
        assert admin.get("team-b:secret") == b"b"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "Team-A"}, "name"),
        ({"name": "a" * 41}, "name"),
        ({"gpu_quota": -1}, "gpu_quota"),
        ({"lending_limit_gpus": 9}, r"lending_limit_gpus \(9\) must be an integer between 0 and gpu_quota \(8\)"),
        ({"borrowing_limit_gpus": -2}, "borrowing_limit_gpus"),
        ({"cpu_quota": "lots"}, "cpu_quota"),
        ({"memory_quota": "1 TB"}, "memory_quota"),
        ({"s3_bucket": "Bad_Bucket"}, "s3_bucket"),
        ({"cohort": "Pool"}, "cohort"),
    ],
)
def test_bad_tenant_inputs_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        render(**overrides)


def test_to_yaml_is_a_multi_document_stream_that_round_trips():
    objs = render()
    assert list(yaml.safe_load_all(to_yaml(objs))) == objs


def test_tenant_cli_prints_the_yaml_and_rejects_bad_input_with_the_field_name():
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out):
        assert tenant_cli(["team-b", "--gpu-quota", "4", "--cpu-quota", "32"]) == 0
    docs = list(yaml.safe_load_all(out.getvalue()))
    assert docs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": docs[0]["metadata"]}
    assert docs[1]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0] == {"name": "cpu", "nominalQuota": "32"}
    with redirect_stderr(err):
        assert tenant_cli(["team-b", "--gpu-quota", "4", "--lending-limit-gpus", "5"]) == 2
    assert re.search(r"error: lending_limit_gpus \(5\)", err.getvalue())


def test_the_posttrain_command_renders_a_tenant_only_through_the_render_verb(capsys):
    """``posttrain tenant render NAME ...`` (what README and docs show) reaches the renderer with NAME;
    ``posttrain tenant NAME ...`` and a bare ``posttrain tenant --gpu-quota 8`` are refused (exit 2)
    instead of rendering a tenant named after the first word."""
    from posttrain.cli import main

    assert main(["tenant", "render", "team-c", "--gpu-quota", "2"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs[0]["metadata"]["name"] == "team-c"
    assert main(["tenant", "team-c", "--gpu-quota", "2"]) == 2
    assert "expected the sub-command 'render', got 'team-c'" in capsys.readouterr().err
    assert main(["tenant"]) == 2


def _selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def egress_allowed(policies, pod_labels, pod_ns, dest_ns_labels, dest_labels, port):
    """NetworkPolicy egress semantics for matchLabels selectors: allowed if no policy selects the pod, or one rule admits."""
    selecting = [p["spec"] for p in policies if _selects(p["spec"]["podSelector"], pod_labels)
                 and "Egress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for spec in selecting:
        for rule in spec.get("egress", []):
            for peer in rule.get("to", []):
                ns_ok = (_selects(peer["namespaceSelector"], dest_ns_labels) if "namespaceSelector" in peer
                         else dest_ns_labels.get("kubernetes.io/metadata.name") == pod_ns)
                if ns_ok and _selects(peer.get("podSelector", {}), dest_labels) and any(
                        p["port"] == port for p in rule.get("ports", [{"port": port}])):
                    return True
    return False


@pytest.mark.parametrize("mesh", [False, True])
def test_network_policies_hold_for_the_jobset_pods_with_and_without_a_mesh(mesh):
    """Both renderings: generators reach DNS, their Redis, S3, MLflow; istiod only where sidecars stay; nothing else."""
    objs = render(istio_sidecar=mesh)
    assert by_kind(objs, "ConfigMap")[0]["data"]["POSTTRAIN_ISTIO_SIDECAR"] == ("true" if mesh else "false")
    policies = by_kind(objs, "NetworkPolicy")
    assert validate_objects(objs) == []
    js = build_sao_jobset("run-1", "team-a", SAOImages("r.example/t:1", "r.example/g:1"), 2, "posttrain",
                          "s3://b/c.yaml", "redis-credentials", istio_sidecar=mesh)
    pods = {r["name"]: r["template"]["spec"]["template"]["metadata"]["labels"] for r in js["spec"]["replicatedJobs"]}
    assert (pods["generator"].get("sidecar.istio.io/inject") == "false") is (not mesh)
    ns = lambda name: {"kubernetes.io/metadata.name": name}  # noqa: E731
    gen = pods["generator"]
    assert egress_allowed(policies, gen, "team-a", ns("kube-system"), {"k8s-app": "kube-dns"}, 53)
    assert egress_allowed(policies, gen, "team-a", ns("team-a"), pods["redis"], 6379)
    for component, port in (("s3", 8333), ("mlflow", 5000), ("redis", 6379)):
        assert egress_allowed(policies, gen, "team-a", ns("posttrain-system"),
                              {"app.kubernetes.io/part-of": "posttrain", "app.kubernetes.io/component": component}, port)
    assert egress_allowed(policies, gen, "team-a", ns("istio-system"), {"app": "istiod"}, 15012) is mesh
    assert not egress_allowed(policies, gen, "team-a", ns("istio-system"), {"app": "istiod"}, 15017)
    assert not egress_allowed(policies, gen, "team-a", ns("team-b"), pods["redis"], 6379)
    assert not egress_allowed(policies, gen, "team-a", ns("default"), {"app": "web"}, 443)
    # The learner and Redis are selected by no egress policy in either rendering (the learner uploads to S3).
    assert egress_allowed(policies, pods["learner"], "team-a", ns("default"), {"app": "web"}, 443)


def test_tenant_cli_istio_sidecar_flag_renders_the_mesh_variant(capsys):
    assert tenant_cli(["team-a", "--gpu-quota", "8", "--istio-sidecar"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    gen = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "generator-egress")
    assert {"protocol": "TCP", "port": 15012} in [p for rule in gen["spec"]["egress"] for p in rule["ports"]]


def dns_allowed(spec, *, namespace=None, labels=None, ip=None, port):
    """Whether generator-egress lets DNS out to a pod (namespace + labels) or an address (ipBlock), on ``port``."""
    import ipaddress

    for rule in spec["egress"]:
        if not any(p["port"] == port for p in rule["ports"]):
            continue
        for peer in rule["to"]:
            if ip is not None and "ipBlock" in peer and ipaddress.ip_address(ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"]):
                return True
            if labels is not None and "namespaceSelector" in peer and _selects(
                    peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}) and _selects(peer["podSelector"], labels):
                return True
    return False


def test_dns_egress_covers_kube_dns_and_node_local_dns_cache_by_default_and_openshift_on_request(capsys):
    """Issue 31, item 8: only port 53 to k8s-app=kube-dns broke NodeLocal DNSCache (169.254.20.10, a host-network
    pod no pod selector matches) and OpenShift (DNS pods on 5353 in openshift-dns)."""
    spec = by_kind(render(), "NetworkPolicy")[1]["spec"]
    assert dns_allowed(spec, namespace="kube-system", labels={"k8s-app": "kube-dns"}, port=53)
    assert dns_allowed(spec, ip="169.254.20.10", port=53)
    assert not dns_allowed(spec, ip="169.254.20.11", port=53) and not dns_allowed(spec, ip="169.254.20.10", port=80)

    assert tenant_cli(["team-a", "--gpu-quota", "8", "--dns-preset", "openshift"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    spec = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "generator-egress")["spec"]
    assert dns_allowed(spec, namespace="openshift-dns", labels={"dns.operator.openshift.io/daemonset-dns": "default"},
                       port=5353)
    assert not dns_allowed(spec, namespace="kube-system", labels={"k8s-app": "kube-dns"}, port=53)
    assert not dns_allowed(spec, ip="169.254.20.10", port=53)

    assert tenant_cli(["team-a", "--gpu-quota", "8", "--dns-namespace", "dns", "--dns-pod-label", "app=coredns",
                       "--dns-port", "53", "--dns-port", "5353", "--dns-ip-block", "169.254.20.10/32",
                       "--dns-ip-block", "10.96.0.10/32"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    spec = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "generator-egress")["spec"]
    assert dns_allowed(spec, namespace="dns", labels={"app": "coredns"}, port=5353)
    assert dns_allowed(spec, ip="10.96.0.10", port=53)  # the kube-dns Service IP NodeLocal DNSCache binds (iptables mode)
    assert validate_objects(docs) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["--dns-port", "0"], r"dns.ports: \[0\] must be one or more port numbers"),
    (["--dns-ip-block", "169.254.20.10"], None),  # a bare address is a /32
    (["--dns-ip-block", "169.254.20.0/16"], "dns.ip_blocks: '169.254.20.0/16' is not a CIDR"),
    (["--dns-pod-label", "k8s-app"], "--dns-pod-label: 'k8s-app' is not KEY=VALUE"),
    (["--dns-namespace", "Kube_System"], "dns.namespace: 'Kube_System' must be a DNS-1123 label"),
])
def test_bad_dns_settings_name_the_field(argv, message, capsys):
    rc = tenant_cli(["team-a", "--gpu-quota", "8", *argv])
    out, err = capsys.readouterr()
    if message is None:
        assert rc == 0, err
        assert "cidr: 169.254.20.10/32" in out
    else:
        assert rc == 2 and re.search(message, err), err


def test_the_jobset_restart_job_setting_reaches_the_config_map(capsys):
    assert by_kind(render(), "ConfigMap")[0]["data"]["POSTTRAIN_JOBSET_RESTART_JOB"] == "false"
    assert tenant_cli(["team-a", "--gpu-quota", "8", "--jobset-restart-job"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert next(d for d in docs if d["kind"] == "ConfigMap")["data"]["POSTTRAIN_JOBSET_RESTART_JOB"] == "true"
