"""Render everything one team (tenant) needs on the shared cluster, as Kubernetes objects or YAML.

A tenant is a Kubeflow profile namespace with its own GPU/CPU quota in a Kueue cohort, an RBAC role
for the pipeline steps that launch JobSets, network policies, and per-tenant names for shared
services: an S3 prefix, an MLflow experiment and a Redis user restricted to its key prefix.
``docs/tenants.md`` explains the isolation model and its limits.

``render_tenant`` returns, in apply order:

1. Namespace (labels of a Kubeflow profile namespace, ``posttrain.io/tenant``);
2. ClusterQueue ``<name>-cq`` (``kueue.x-k8s.io/v1beta2``) in the shared cohort (``spec.cohortName``),
   GPU quota with ``borrowingLimit``/``lendingLimit``, CPU and memory quota;
3. LocalQueue ``posttrain`` in the namespace, pointing at that ClusterQueue;
4. ServiceAccount ``pipeline-runner``, Role ``posttrain-launcher`` (JobSets, pods and logs, Kueue
   workloads and queues, the named Secrets/ConfigMap the launcher checks), RoleBinding;
5. ConfigMap ``posttrain-tenant`` (S3 prefix, MLflow experiment and URI, Redis key prefix, whether
   SAO JobSet pods keep Istio sidecars: ``POSTTRAIN_ISTIO_SIDECAR``, whether the cluster's JobSet
   controller has the ``RestartJob`` gate: ``POSTTRAIN_JOBSET_RESTART_JOB``);
6. NetworkPolicies: sandbox pods get no egress; generators reach only DNS, Redis, S3 and MLflow
   (and istiod when ``istio_sidecar``). Where DNS answers is the cluster's business (``DnsEgress``):
   by default kube-dns pods on port 53 plus NodeLocal DNSCache's link-local address
   ``169.254.20.10``; ``DNS_PRESETS["openshift"]`` is OpenShift's DNS (port 5353);
7. Secret template ``redis-acl-<name>`` in the platform namespace with the tenant's Redis ACL rule;
   the password is a placeholder (``${REDIS_PASSWORD}``) filled from the tenant's
   ``redis-credentials`` Secret when the ACL is loaded: no password is ever rendered.

Run: ``posttrain tenant render team-a --gpu-quota 8`` (the CLI calls ``tenant_cli``), or
``python -m posttrain.cluster.tenant team-a --gpu-quota 8 [--out-dir DIR]``.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from posttrain.cluster.jobset import (
    REDIS_PASSWORD_KEY,
    REDIS_PORT,
    S3_CREDENTIALS_SECRET,
    TENANT_CONFIG_MAP,
)
from posttrain.config.resources import is_quantity

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
PLATFORM_NAMESPACE = "posttrain-system"
"""Namespace of the shared services (Valkey, S3, MLflow) from ``manifests/base``."""
LOCAL_QUEUE = "posttrain"
"""LocalQueue name in every tenant namespace (the pipeline's default ``queue_name``)."""
SERVICE_ACCOUNT = "pipeline-runner"
LAUNCHER_ROLE = "posttrain-launcher"
REDIS_CREDENTIALS_SECRET = "redis-credentials"
"""Secret in the tenant namespace, key ``password``: the tenant's Redis password (URL-safe)."""
PASSWORD_PLACEHOLDER = "${REDIS_PASSWORD}"
GPU_FLAVOR = "posttrain-gpu"
CPU_FLAVOR = "posttrain-cpu"
SANDBOX_ROLE_LABEL = "posttrain.io/role"
TENANT_LABEL = "posttrain.io/tenant"
DEFAULT_MLFLOW_URI = f"http://mlflow.{PLATFORM_NAMESPACE}.svc.cluster.local:5000"
DEFAULT_S3_ENDPOINT = f"http://s3.{PLATFORM_NAMESPACE}.svc.cluster.local:8333"
PLATFORM_PORTS = {"redis": REDIS_PORT, "s3": 8333, "mlflow": 5000}
"""Component label -> service port of the shared services generators may reach."""
INTERACTIVE_PRIORITY = "posttrain-interactive"
"""Kueue WorkloadPriorityClass (value 1000, ``manifests/kueue/workload-priority-classes.yaml``) of runs a
person starts: the pipelines' default ``priority_class``."""
SCHEDULED_PRIORITY = "posttrain-scheduled"
"""Kueue WorkloadPriorityClass (value 100) of recurring runs (``posttrain schedule``); interactive runs
preempt them within a ClusterQueue (``withinClusterQueue: LowerPriority``)."""
ISTIO_NAMESPACE = "istio-system"
"""Namespace of istiod in a Kubeflow install."""
ISTIOD_PORT = 15012
"""istiod's port for sidecars: xDS configuration and workload certificates (TLS)."""
ISTIO_SIDECAR_KEY = "POSTTRAIN_ISTIO_SIDECAR"
"""Tenant ConfigMap key: ``"false"`` (default) makes the SAO launcher opt the JobSet's pods out of
sidecar injection; ``"true"`` keeps the sidecars (``--istio-sidecar``)."""
JOBSET_RESTART_JOB_KEY = "POSTTRAIN_JOBSET_RESTART_JOB"
"""Tenant ConfigMap key: ``"false"`` (default; what a stock JobSet v0.12 accepts) makes a failed
learner restart the whole SAO group; ``"true"`` (``--jobset-restart-job``, only where the JobSet
controller runs with ``--feature-gates=RestartJob=true``) recreates the learner Job alone, so Redis
keeps its stream (``posttrain.cluster.jobset.build_sao_jobset(restart_job=...)``)."""
NODE_LOCAL_DNS_IP = "169.254.20.10"
"""The link-local address NodeLocal DNSCache listens on (its documented default): pods on clusters
that run it send DNS there, to a host-network pod that no pod selector matches."""

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class DnsEgress:
    """Where the tenant's pods send DNS queries, for the generators' egress NetworkPolicy.

    Attributes:
        namespace: Namespace of the cluster DNS pods (``kube-system``; OpenShift: ``openshift-dns``).
        pod_labels: Labels selecting them (``k8s-app: kube-dns`` for CoreDNS and kube-dns; OpenShift:
            ``dns.operator.openshift.io/daemonset-dns: default``).
        ports: Their container ports, TCP and UDP each (53; OpenShift's DNS pods listen on 5353:
            NetworkPolicy sees the port after the Service's translation).
        ip_blocks: CIDRs DNS also goes to, e.g. NodeLocal DNSCache's ``169.254.20.10/32`` (the
            default) and, where kube-proxy runs in iptables mode with NodeLocal DNSCache, the kube-dns
            Service IP (which the cache binds on every node); empty to leave them out.

    Raises:
        ValueError: a field is invalid (the message names it).
    """

    namespace: str = "kube-system"
    pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    ports: tuple[int, ...] = (53,)
    ip_blocks: tuple[str, ...] = (f"{NODE_LOCAL_DNS_IP}/32",)

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, str) or len(self.namespace) > 63 or not _DNS1123_LABEL.match(self.namespace):
            raise ValueError(f"dns.namespace: {self.namespace!r} must be a DNS-1123 label")
        if not self.pod_labels:
            raise ValueError("dns.pod_labels: at least one label must select the DNS pods")
        for key, value in self.pod_labels.items():
            if len(key) > 316 or not _LABEL_KEY.match(key) or not isinstance(value, str) or not _LABEL_VALUE.match(value):
                raise ValueError(f"dns.pod_labels: {key}={value!r} is not a valid label")
        if not self.ports or any(not isinstance(p, int) or not 1 <= p <= 65535 for p in self.ports):
            raise ValueError(f"dns.ports: {list(self.ports)!r} must be one or more port numbers in [1, 65535]")
        blocks = []
        for cidr in self.ip_blocks:
            try:
                blocks.append(str(ipaddress.ip_network(cidr, strict=True)))  # a bare address becomes a /32 (/128)
            except ValueError as exc:
                raise ValueError(f"dns.ip_blocks: {cidr!r} is not a CIDR such as 169.254.20.10/32 ({exc})") from None
        object.__setattr__(self, "ip_blocks", tuple(blocks))  # the API server accepts only CIDR notation

    def egress_rules(self) -> list[dict[str, Any]]:
        """The NetworkPolicy egress rules: the DNS pods on ``ports``, and each ``ip_blocks`` CIDR on the same ports."""
        ports = [{"protocol": proto, "port": port} for port in self.ports for proto in ("UDP", "TCP")]
        rules: list[dict[str, Any]] = [{
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
                    "podSelector": {"matchLabels": dict(self.pod_labels)}}],
            "ports": ports,
        }]
        if self.ip_blocks:
            rules.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in self.ip_blocks],
                          "ports": [dict(port) for port in ports]})
        return rules


DNS_PRESETS: dict[str, DnsEgress] = {
    "kube-dns": DnsEgress(),
    "openshift": DnsEgress(namespace="openshift-dns", pod_labels={"dns.operator.openshift.io/daemonset-dns": "default"},
                           ports=(5353,), ip_blocks=()),
}
"""Named DNS settings (``posttrain tenant render --dns-preset``): CoreDNS/kube-dns with NodeLocal
DNSCache covered (the default), and OpenShift's DNS operator."""


def _labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "posttrain",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "posttrain",
        TENANT_LABEL: name,
    }


def redis_key_prefix(name: str) -> str:
    """Redis key prefix of a tenant: every key the tenant may touch starts with ``<prefix>:``."""
    return name


def s3_prefix(name: str, bucket: str) -> str:
    """S3 prefix of a tenant: ``s3://<bucket>/tenants/<name>/``."""
    return f"s3://{bucket}/tenants/{name}/"


def redis_acl_rule(user: str, key_prefix: str, password: str = PASSWORD_PLACEHOLDER) -> str:
    """Redis/Valkey ACL rule (aclfile line) for one tenant.

    The user may run any command except ``@admin`` and ``@dangerous`` ones (``FLUSHALL``, ``KEYS``,
    ``CONFIG``, ``ACL``...), only on keys matching ``<key_prefix>:*`` and only on Pub/Sub channels
    matching ``<key_prefix>:*``.

    Args:
        user: ACL user name (the tenant name).
        key_prefix: The tenant's key prefix.
        password: Literal password or the placeholder the loader substitutes.

    Returns:
        e.g. ``user team-a on >${REDIS_PASSWORD} ~team-a:* &team-a:* +@all -@admin -@dangerous``.
    """
    return f"user {user} on >{password} ~{key_prefix}:* &{key_prefix}:* +@all -@admin -@dangerous"


def network_policies(
    namespace: str | None, platform_namespace: str = PLATFORM_NAMESPACE, *, istio_sidecar: bool = False,
    dns: DnsEgress | None = None,
) -> list[dict[str, Any]]:
    """The tenant-namespace NetworkPolicies.

    * ``sandbox-deny-egress``: pods labelled ``posttrain.io/role: sandbox`` (model-written commands)
      get no egress at all, not even DNS (``policyTypes: [Egress]`` and no ``egress`` rule).
    * ``generator-egress``: generator pods may reach only cluster DNS (``dns``), the run's own Redis
      in the same namespace, and the shared Redis, S3 and MLflow in ``platform_namespace``; with
      ``istio_sidecar`` also istiod (``ISTIO_NAMESPACE``, pods ``app: istiod``, TCP ``ISTIOD_PORT``),
      without which an injected sidecar never gets its configuration and the pod never becomes Ready.
      Sidecar-to-sidecar traffic keeps the application ports, so the other rules hold in both cases.

    Args:
        namespace: Namespace to put in the objects, or None for namespace-less templates
            (``manifests/network/``, applied with ``kubectl apply -n <ns>``).
        platform_namespace: Namespace of the shared services.
        istio_sidecar: The tenant's JobSet pods keep Istio sidecars (default False: they opt out,
            ``posttrain.cluster.jobset.ISTIO_INJECT``).
        dns: Where DNS answers; None: ``DnsEgress()`` (kube-dns on 53 and NodeLocal DNSCache).

    Enforcement needs a CNI that implements NetworkPolicy (Calico, Cilium...).
    """
    meta_ns = {"namespace": namespace} if namespace else {}
    dns_rules = (dns or DnsEgress()).egress_rules()
    own_redis = {
        "to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "posttrain",
                                                "app.kubernetes.io/component": "redis"}}}],
        "ports": [{"protocol": "TCP", "port": REDIS_PORT}],
    }
    platform = [
        {
            "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": platform_namespace}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "posttrain",
                                                    "app.kubernetes.io/component": component}}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }
        for component, port in PLATFORM_PORTS.items()
    ]
    istiod = {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ISTIO_NAMESPACE}},
                "podSelector": {"matchLabels": {"app": "istiod"}}}],
        "ports": [{"protocol": "TCP", "port": ISTIOD_PORT}],
    }
    common_labels = {"app.kubernetes.io/name": "posttrain", "app.kubernetes.io/part-of": "posttrain",
                     "app.kubernetes.io/component": "network-policy"}
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "sandbox-deny-egress", **meta_ns, "labels": common_labels},
            "spec": {
                "podSelector": {"matchLabels": {SANDBOX_ROLE_LABEL: "sandbox"}},
                # No egress rules at all (deny all). Not ``egress: []``: the API server stores an empty list
                # as absent, so every server-side apply of it changed the object again (generation + 1).
                "policyTypes": ["Egress"],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "generator-egress", **meta_ns, "labels": common_labels},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "posttrain",
                                                "app.kubernetes.io/component": "generator"}},
                "policyTypes": ["Egress"],
                "egress": [*dns_rules, own_redis, *platform, *([istiod] if istio_sidecar else [])],
            },
        },
    ]


def _check_quantity(field: str, value: str | int) -> str:
    text = str(value)
    if not is_quantity(text):
        raise ValueError(f"{field}: {value!r} is not a Kubernetes quantity such as '64', '500m' or '512Gi'")
    return text


def render_tenant(
    name: str,
    gpu_quota: int,
    cpu_quota: str | int,
    memory_quota: str,
    cohort: str = "posttrain",
    borrowing_limit_gpus: int | None = None,
    lending_limit_gpus: int | None = None,
    s3_bucket: str = "posttrain",
    mlflow_experiment: str | None = None,
    *,
    owner: str | None = None,
    platform_namespace: str = PLATFORM_NAMESPACE,
    mlflow_tracking_uri: str = DEFAULT_MLFLOW_URI,
    s3_endpoint_url: str = DEFAULT_S3_ENDPOINT,
    gpu_flavor: str = GPU_FLAVOR,
    cpu_flavor: str = CPU_FLAVOR,
    istio_sidecar: bool = False,
    jobset_restart_job: bool = False,
    dns: DnsEgress | None = None,
) -> list[dict[str, Any]]:
    """Render a tenant's objects (see the module docstring for the list).

    Args:
        name: Tenant = namespace = Redis user name; DNS-1123 label of at most 40 characters.
        gpu_quota: Nominal ``nvidia.com/gpu`` quota of the tenant's ClusterQueue (devices).
        cpu_quota: Nominal CPU quota (cores, quantity).
        memory_quota: Nominal memory quota (bytes, quantity, e.g. ``"512Gi"``).
        cohort: Kueue cohort shared by all tenants; idle nominal quota is lent inside it.
        borrowing_limit_gpus: GPUs the tenant may borrow beyond ``gpu_quota`` from idle cohort quota;
            None means ``gpu_quota`` (at most double).
        lending_limit_gpus: GPUs of the tenant's idle quota others may borrow (<= ``gpu_quota``);
            None means all of it.
        s3_bucket: Bucket holding ``tenants/<name>/``.
        mlflow_experiment: MLflow experiment name; default ``<name>``.
        owner: Kubeflow profile owner (e-mail) for the namespace ``owner`` annotation, or None.
        platform_namespace: Namespace of the shared services (and of the ACL Secret template).
        mlflow_tracking_uri: MLflow URI given to pods (must be in the server's ``--allowed-hosts``).
        s3_endpoint_url: S3 endpoint given to pods.
        gpu_flavor: ResourceFlavor of GPU nodes (``manifests/kueue``).
        cpu_flavor: ResourceFlavor for CPU and memory.
        istio_sidecar: Keep Istio sidecars in the tenant's SAO JobSet pods (ConfigMap
            ``POSTTRAIN_ISTIO_SIDECAR: "true"``, and generator egress to istiod); default False:
            the pods opt out of injection and need no istiod rule.
        jobset_restart_job: The cluster's JobSet controller runs with the ``RestartJob`` feature
            gate (ConfigMap ``POSTTRAIN_JOBSET_RESTART_JOB: "true"``): SAO learners restart alone.
            Default False, what a stock JobSet v0.12 accepts.
        dns: Where the cluster's DNS answers (``DnsEgress``, ``DNS_PRESETS``); None: the default.

    Returns:
        Plain dicts in apply order.

    Raises:
        ValueError: a field is invalid; the message names it.
    """
    if not isinstance(name, str) or len(name) > 40 or not _DNS1123_LABEL.match(name):
        raise ValueError(f"name: {name!r} must be a DNS-1123 label (lowercase a-z0-9 '-') of at most 40 characters")
    if not _DNS1123_LABEL.match(cohort) or len(cohort) > 63:
        raise ValueError(f"cohort: {cohort!r} must be a DNS-1123 label")
    if not isinstance(gpu_quota, int) or gpu_quota < 0:
        raise ValueError(f"gpu_quota: must be a non-negative integer, got {gpu_quota!r}")
    borrow = gpu_quota if borrowing_limit_gpus is None else borrowing_limit_gpus
    if not isinstance(borrow, int) or borrow < 0:
        raise ValueError(f"borrowing_limit_gpus: must be a non-negative integer, got {borrowing_limit_gpus!r}")
    if lending_limit_gpus is not None and (
        not isinstance(lending_limit_gpus, int) or not 0 <= lending_limit_gpus <= gpu_quota
    ):
        raise ValueError(
            f"lending_limit_gpus ({lending_limit_gpus!r}) must be an integer between 0 and gpu_quota ({gpu_quota})"
        )
    cpu = _check_quantity("cpu_quota", cpu_quota)
    memory = _check_quantity("memory_quota", memory_quota)
    if not _BUCKET.match(s3_bucket):
        raise ValueError(f"s3_bucket: {s3_bucket!r} is not a valid S3 bucket name (3-63 of a-z 0-9 . -)")
    experiment = mlflow_experiment or name
    if not experiment.strip():
        raise ValueError("mlflow_experiment: must not be blank")
    if not _DNS1123_LABEL.match(platform_namespace):
        raise ValueError(f"platform_namespace: {platform_namespace!r} must be a DNS-1123 label")

    cluster_queue = f"{name}-cq"
    prefix = redis_key_prefix(name)
    gpu_resource: dict[str, Any] = {"name": "nvidia.com/gpu", "nominalQuota": gpu_quota, "borrowingLimit": borrow}
    if lending_limit_gpus is not None:
        gpu_resource["lendingLimit"] = lending_limit_gpus

    namespace_meta: dict[str, Any] = {
        "name": name,
        "labels": {
            "app.kubernetes.io/part-of": "kubeflow-profile",
            "pipelines.kubeflow.org/enabled": "true",
            TENANT_LABEL: name,
        },
    }
    if owner:
        namespace_meta["annotations"] = {"owner": owner}

    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": namespace_meta},
        {
            "apiVersion": KUEUE_API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue, "labels": _labels(name, "queue")},
            "spec": {
                "cohortName": cohort,
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
                "queueingStrategy": "BestEffortFIFO",
                "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [{"name": cpu_flavor, "resources": [
                            {"name": "cpu", "nominalQuota": cpu},
                            {"name": "memory", "nominalQuota": memory},
                        ]}],
                    },
                    {
                        "coveredResources": ["nvidia.com/gpu"],
                        "flavors": [{"name": gpu_flavor, "resources": [gpu_resource]}],
                    },
                ],
            },
        },
        {
            "apiVersion": KUEUE_API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": name, "labels": _labels(name, "queue")},
            "spec": {"clusterQueue": cluster_queue},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": name, "labels": _labels(name, "rbac")},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": LAUNCHER_ROLE, "namespace": name, "labels": _labels(name, "rbac")},
            "rules": [
                {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
                 "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
                {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets/status"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
                {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues"], "verbs": ["get", "list"]},
                # The launcher reads the run's Workflow (the JobSet's owner) to tell a cancel from an eviction.
                {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["get"]},
                # The launcher's preflight check reads only these, by name.
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                 "resourceNames": [REDIS_CREDENTIALS_SECRET, S3_CREDENTIALS_SECRET]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [TENANT_CONFIG_MAP]},
                # A run with the rollout gateway: its token Secret, Service and NetworkPolicy
                # (posttrain.cluster.gateway); created only, never read, changed or deleted by the launcher.
                {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["create"]},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": LAUNCHER_ROLE, "namespace": name, "labels": _labels(name, "rbac")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LAUNCHER_ROLE},
            "subjects": [
                {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": name},
                # KFP in multi-user Kubeflow runs pipeline pods as default-editor.
                {"kind": "ServiceAccount", "name": "default-editor", "namespace": name},
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": TENANT_CONFIG_MAP, "namespace": name, "labels": _labels(name, "config")},
            "data": {
                "POSTTRAIN_TENANT": name,
                "POSTTRAIN_LOCAL_QUEUE": LOCAL_QUEUE,
                "S3_PREFIX": s3_prefix(name, s3_bucket),
                "AWS_ENDPOINT_URL": s3_endpoint_url,
                "MLFLOW_S3_ENDPOINT_URL": s3_endpoint_url,
                "MLFLOW_TRACKING_URI": mlflow_tracking_uri,
                "MLFLOW_EXPERIMENT_NAME": experiment,
                "REDIS_KEY_PREFIX": prefix,
                "REDIS_USERNAME": name,
                ISTIO_SIDECAR_KEY: "true" if istio_sidecar else "false",
                JOBSET_RESTART_JOB_KEY: "true" if jobset_restart_job else "false",
            },
        },
        *network_policies(name, platform_namespace, istio_sidecar=istio_sidecar, dns=dns),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": f"redis-acl-{name}",
                "namespace": platform_namespace,
                "labels": {**_labels(name, "redis-acl"), "posttrain.io/redis-acl": "true"},
                "annotations": {
                    "posttrain.io/template": "true",
                    "posttrain.io/password-from": f"{name}/{REDIS_CREDENTIALS_SECRET}:{REDIS_PASSWORD_KEY}",
                    "posttrain.io/placeholder": PASSWORD_PLACEHOLDER,
                },
            },
            "stringData": {"users.acl": redis_acl_rule(name, prefix)},
        },
    ]
    return objects


def to_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """Multi-document YAML (``---`` separated), keys in the order the renderer wrote them."""
    return "".join("---\n" + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False) for obj in objects)


_FILE_NAMES = {
    "Namespace": "namespace.yaml",
    "ClusterQueue": "cluster-queue.yaml",
    "LocalQueue": "local-queue.yaml",
    "ServiceAccount": "service-account.yaml",
    "Role": "role.yaml",
    "RoleBinding": "role-binding.yaml",
    "ConfigMap": "config-map.yaml",
    "NetworkPolicy": "network-policy.yaml",
    "Secret": "redis-acl-secret-template.yaml",
}


def write_kustomize_dir(objects: Sequence[dict[str, Any]], out_dir: Path, command: str) -> list[Path]:
    """Write one file per object kind plus a ``kustomization.yaml`` listing them.

    Args:
        objects: Output of ``render_tenant``.
        out_dir: Directory to write into (created if missing; existing files of the same names are replaced).
        command: The command that regenerates them, written into each file's header comment.

    Returns:
        The files written, ``kustomization.yaml`` last.

    Raises:
        ValueError: an object's kind has no file name.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        file_name = _FILE_NAMES.get(obj["kind"])
        if file_name is None:
            raise ValueError(f"kind {obj['kind']!r} has no file name in _FILE_NAMES")
        by_file.setdefault(file_name, []).append(obj)
    header = f"# Generated by `{command}`; change the command, not this file.\n"
    written = []
    for file_name, objs in by_file.items():
        path = out_dir / file_name
        path.write_text(header + to_yaml(objs))
        written.append(path)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(by_file),
    }
    path = out_dir / "kustomization.yaml"
    path.write_text(header + yaml.safe_dump(kustomization, sort_keys=False))
    written.append(path)
    return written


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="posttrain tenant render",
        description="Render a tenant's Namespace, Kueue queues, RBAC, ConfigMap, NetworkPolicies and Redis ACL "
        "template as multi-document YAML (see docs/tenants.md).",
    )
    p.add_argument("name", help="tenant name = namespace = Redis user (DNS-1123 label, <= 40 chars)")
    p.add_argument("--gpu-quota", type=int, required=True, help="nominal nvidia.com/gpu quota (devices)")
    p.add_argument("--cpu-quota", default="64", help="nominal CPU quota (cores; default 64)")
    p.add_argument("--memory-quota", default="512Gi", help="nominal memory quota (default 512Gi)")
    p.add_argument("--cohort", default="posttrain", help="Kueue cohort shared by the tenants (default posttrain)")
    p.add_argument("--borrowing-limit-gpus", type=int, default=None, help="GPUs borrowable beyond the quota (default = quota)")
    p.add_argument("--lending-limit-gpus", type=int, default=None, help="idle GPUs others may borrow (default all)")
    p.add_argument("--s3-bucket", default="posttrain", help="bucket holding tenants/<name>/ (default posttrain)")
    p.add_argument("--mlflow-experiment", default=None, help="MLflow experiment (default: the tenant name)")
    p.add_argument("--owner", default=None, help="Kubeflow profile owner e-mail (namespace annotation)")
    p.add_argument("--platform-namespace", default=PLATFORM_NAMESPACE, help="namespace of the shared services")
    p.add_argument("--istio-sidecar", action="store_true",
                   help="keep Istio sidecars in SAO JobSet pods and let generators reach istiod (default: pods opt out)")
    p.add_argument("--jobset-restart-job", action="store_true",
                   help="the JobSet controller runs with --feature-gates=RestartJob=true: a failed SAO learner restarts "
                        "alone and Redis keeps its stream (default: the whole group restarts, as stock JobSet v0.12 allows)")
    p.add_argument("--dns-preset", choices=sorted(DNS_PRESETS), default="kube-dns",
                   help="where the cluster's DNS answers (default kube-dns: k8s-app=kube-dns in kube-system on 53, plus "
                        f"NodeLocal DNSCache's {NODE_LOCAL_DNS_IP}); openshift: openshift-dns on 5353")
    p.add_argument("--dns-namespace", default=None, help="namespace of the DNS pods (overrides the preset)")
    p.add_argument("--dns-pod-label", action="append", default=None, metavar="KEY=VALUE",
                   help="label selecting the DNS pods; repeat for several (overrides the preset's)")
    p.add_argument("--dns-port", action="append", type=int, default=None, metavar="PORT",
                   help="DNS pods' port, TCP and UDP; repeat for several (overrides the preset's)")
    p.add_argument("--dns-ip-block", action="append", default=None, metavar="CIDR",
                   help="CIDR DNS also goes to (NodeLocal DNSCache, a kube-dns Service IP); repeat for several; "
                        "'none' for no CIDR (overrides the preset's)")
    p.add_argument("--out-dir", type=Path, default=None, help="write a kustomize directory instead of printing YAML")
    return p


def dns_from_args(args: argparse.Namespace) -> DnsEgress:
    """The ``DnsEgress`` of ``--dns-preset`` with the ``--dns-*`` overrides applied.

    Raises:
        ValueError: a label without ``=``, or an invalid value (the message names the field).
    """
    preset = DNS_PRESETS[args.dns_preset]
    labels = preset.pod_labels
    if args.dns_pod_label:
        bad = [item for item in args.dns_pod_label if "=" not in item]
        if bad:
            raise ValueError(f"--dns-pod-label: {bad[0]!r} is not KEY=VALUE")
        labels = dict(item.split("=", 1) for item in args.dns_pod_label)
    blocks = preset.ip_blocks
    if args.dns_ip_block:
        blocks = tuple(b for b in args.dns_ip_block if b.lower() != "none")
    return DnsEgress(namespace=args.dns_namespace or preset.namespace, pod_labels=labels,
                     ports=tuple(args.dns_port) if args.dns_port else preset.ports, ip_blocks=blocks)


def tenant_cli(argv: Sequence[str]) -> int:
    """``posttrain tenant render NAME --gpu-quota N ...``: print the tenant's YAML to stdout.

    Args:
        argv: Arguments after ``tenant render`` (e.g. ``["team-a", "--gpu-quota", "8"]``).

    Returns:
        0 on success, 2 on invalid values (the message, naming the field, goes to stderr). Usage
        errors (a missing ``--gpu-quota``) exit through argparse: ``SystemExit(2)``.
    """
    args = _parser().parse_args(list(argv))
    try:
        dns = dns_from_args(args)
        objects = render_tenant(
            args.name, args.gpu_quota, args.cpu_quota, args.memory_quota, cohort=args.cohort,
            borrowing_limit_gpus=args.borrowing_limit_gpus, lending_limit_gpus=args.lending_limit_gpus,
            s3_bucket=args.s3_bucket, mlflow_experiment=args.mlflow_experiment, owner=args.owner,
            platform_namespace=args.platform_namespace, istio_sidecar=args.istio_sidecar,
            jobset_restart_job=args.jobset_restart_job, dns=dns,
        )
    except ValueError as exc:
        print(f"posttrain tenant render: error: {exc}", file=sys.stderr)
        return 2
    if args.out_dir is not None:
        rest = [a for i, a in enumerate(argv) if not (a == "--out-dir" or a.startswith("--out-dir=")
                                                      or (i > 0 and argv[i - 1] == "--out-dir"))]
        command = "posttrain tenant render " + shlex.join(rest) + " --out-dir <dir>"
        for path in write_kustomize_dir(objects, args.out_dir, command):
            print(path)
    else:
        sys.stdout.write(to_yaml(objects))
    return 0


if __name__ == "__main__":
    raise SystemExit(tenant_cli(sys.argv[1:]))
