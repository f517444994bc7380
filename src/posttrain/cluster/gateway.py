"""The rollout gateway on a cluster: its replicated job in the SAO JobSet, its Secret, Service and NetworkPolicy.

With ``gateway.mode`` other than ``disabled`` the SAO JobSet (``posttrain.cluster.jobset``) gets a
``gateway`` replicated job: one pod on the generator image running ``posttrain gateway --config URI
--host 0.0.0.0 --port 8600``, ready when ``GET /health`` answers, restarted alone when it fails
(``restart_job``: the JobSet controller's ``RestartJob`` gate; otherwise with the group, as every role).
Beside the JobSet, three namespaced objects the pipeline step creates (its Role may create them,
not read or change them; ``posttrain.cluster.tenant``):

* Secret ``<jobset>-gateway`` (key ``token``): the run's bearer token, random, created before the
  JobSet and owned by the run's Workflow, like the JobSet (the gateway pod reads it as
  ``POSTTRAIN_GATEWAY_TOKEN``; the tenant's agents mount it). A retried step finds it and keeps
  its token; a JobSet replaced after a failure keeps it too.
* Service ``<jobset>-gateway``: ClusterIP, port 8600, selecting the gateway pod, owned by the
  JobSet. Agents use ``http://<jobset>-gateway.<namespace>.svc:8600`` as the gateway URL.
* NetworkPolicy ``<jobset>-gateway``, owned by the JobSet: ingress to the gateway pod only from
  pods of the run's namespace that carry ``gateway.agent_pod_labels``
  (``posttrain.io/gateway-client: "true"``), on port 8600. Every other pod, in this namespace or
  another, is refused.

Guarantees (where the CNI enforces NetworkPolicy): only the tenant's labelled agent pods reach the
gateway; without the run's token they get 401. Not guaranteed: a CNI that ignores NetworkPolicy
(the token still applies); kubelet health probes come from the node and are allowed by most CNIs
whatever the policy; the gateway keeps open episodes in memory, so one replica serves a run (a
restarted gateway pod loses its open episodes: their tickets come back when its heartbeat lapses).

Nothing here talks to a cluster except ``apply_gateway_objects`` (CoreV1Api, NetworkingV1Api).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the JobSet builder imports this module; only the apply functions need the client
    from kubernetes.client import CoreV1Api, NetworkingV1Api

GATEWAY_PORT = 8600
"""TCP port of the gateway's HTTP server in its pod and on its Service."""
TOKEN_KEY = "token"
"""Key of the bearer token inside the run's gateway Secret."""
TOKEN_ENV = "POSTTRAIN_GATEWAY_TOKEN"
"""Environment variable the gateway pod reads its token from (``gateway.token_env``'s default)."""
GATEWAY_TERMINATION_GRACE_S = 60
"""Seconds the gateway pod gets after SIGTERM: open episodes are abandoned and their tickets released."""


def gateway_object_name(jobset: str) -> str:
    """``<jobset>-gateway``: the name of the run's gateway Secret, Service and NetworkPolicy."""
    return f"{jobset}-gateway"


def gateway_labels(jobset: str, component: str = "gateway") -> dict[str, str]:
    """The labels the gateway pod carries (the JobSet builder's ``_labels`` for role ``gateway``)."""
    return {
        "app.kubernetes.io/name": "posttrain",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/instance": jobset,
        "app.kubernetes.io/part-of": "posttrain",
        "app.kubernetes.io/managed-by": "posttrain",
    }


def gateway_pod_selector(jobset: str) -> dict[str, str]:
    """The labels that select the run's gateway pod (and no other pod)."""
    return {"app.kubernetes.io/instance": jobset, "app.kubernetes.io/component": "gateway"}


def gateway_container(container: dict[str, Any], jobset: str, config_uri: str, token_env: str = TOKEN_ENV) -> dict[str, Any]:
    """The gateway's container, from a role container of the JobSet builder (image, env, resources).

    Adds the command, the token from the run's Secret, the HTTP port and a readiness probe on
    ``/health``.
    """
    out = dict(container)
    out["command"] = ["posttrain", "gateway", "--config", config_uri, "--host", "0.0.0.0", "--port", str(GATEWAY_PORT)]
    out["env"] = [*container.get("env", []), {"name": token_env, "valueFrom": {"secretKeyRef": {
        "name": gateway_object_name(jobset), "key": TOKEN_KEY}}}]
    out["ports"] = [{"name": "http", "containerPort": GATEWAY_PORT}]
    out["readinessProbe"] = {"httpGet": {"path": "/health", "port": GATEWAY_PORT}, "periodSeconds": 5}
    return out


def gateway_secret(jobset: str, namespace: str, token: str | None = None) -> dict[str, Any]:
    """The run's token Secret (a fresh random token unless ``token`` is given).

    Raises:
        ValueError: ``token`` shorter than 16 characters.
    """
    token = token if token is not None else secrets.token_urlsafe(32)
    if len(token) < 16:
        raise ValueError("token: at least 16 characters")
    return {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": gateway_object_name(jobset), "namespace": namespace,
                     "labels": gateway_labels(jobset, "gateway-token")},
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def gateway_service(jobset: str, namespace: str) -> dict[str, Any]:
    """The ClusterIP Service in front of the gateway pod (port ``GATEWAY_PORT``)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": gateway_object_name(jobset), "namespace": namespace, "labels": gateway_labels(jobset)},
        "spec": {
            "type": "ClusterIP",
            "selector": gateway_pod_selector(jobset),
            "ports": [{"name": "http", "protocol": "TCP", "port": GATEWAY_PORT, "targetPort": GATEWAY_PORT}],
        },
    }


def gateway_network_policy(jobset: str, namespace: str, agent_labels: Mapping[str, str]) -> dict[str, Any]:
    """Ingress to the gateway pod from the tenant's agent pods (same namespace, ``agent_labels``) only.

    Raises:
        ValueError: empty ``agent_labels`` (an empty selector admits every pod of the namespace).
    """
    if not agent_labels:
        raise ValueError("agent_labels: at least one label (an empty selector admits every pod)")
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": gateway_object_name(jobset), "namespace": namespace,
                     "labels": gateway_labels(jobset, "network-policy")},
        "spec": {
            "podSelector": {"matchLabels": gateway_pod_selector(jobset)},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": dict(agent_labels)}}],
                "ports": [{"protocol": "TCP", "port": GATEWAY_PORT}],
            }],
        },
    }


def ensure_gateway_secret(core: CoreV1Api, jobset: str, namespace: str,
                          owner: Mapping[str, Any] | None = None, request_timeout: float = 30.0) -> bool:
    """Create the run's token Secret unless it exists (a retried step keeps the token); True when created.

    Args:
        core: Core client.
        jobset: The JobSet's name.
        namespace: The run's namespace.
        owner: An ownerReference (the run's Workflow) the Secret gets, so it goes with the run; None: none.
        request_timeout: Seconds the API request may take.

    Raises:
        kubernetes.client.exceptions.ApiException: any error but 409 AlreadyExists.
    """
    from kubernetes.client.exceptions import ApiException

    from posttrain.cluster.jobset_status import kube_timeout

    body = gateway_secret(jobset, namespace)
    if owner is not None:
        body["metadata"]["ownerReferences"] = [dict(owner)]
    try:
        core.create_namespaced_secret(namespace, body, _request_timeout=kube_timeout(request_timeout))
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def apply_gateway_objects(core: CoreV1Api, net: NetworkingV1Api, jobset: Mapping[str, Any],
                          agent_labels: Mapping[str, str], request_timeout: float = 30.0) -> list[str]:
    """Create the gateway's Service and NetworkPolicy, owned by ``jobset`` (an existing one is kept).

    Args:
        core: Core client.
        net: Networking client.
        jobset: The JobSet as stored (its ``metadata.uid`` is the owner's).
        agent_labels: Labels of the tenant's agent pods (``gateway.agent_pod_labels``).
        request_timeout: Seconds each API request may take.

    Returns:
        ``Kind/name`` of each object created (or found).

    Raises:
        ValueError: the JobSet has no uid (not read back from the API server).
        kubernetes.client.exceptions.ApiException: any error but 409 on create.
    """
    from kubernetes.client.exceptions import ApiException

    from posttrain.cluster.jobset_status import kube_timeout

    meta = jobset["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid")
    if not uid:
        raise ValueError(f"JobSet {namespace}/{name}: no metadata.uid (read it back from the API server)")
    owner = {"apiVersion": jobset.get("apiVersion", "jobset.x-k8s.io/v1alpha2"), "kind": "JobSet", "name": name,
             "uid": uid}
    done = []
    for kind, body, create in (
        ("Service", gateway_service(name, namespace), core.create_namespaced_service),
        ("NetworkPolicy", gateway_network_policy(name, namespace, agent_labels), net.create_namespaced_network_policy),
    ):
        body["metadata"]["ownerReferences"] = [owner]
        try:
            create(namespace, body, _request_timeout=kube_timeout(request_timeout))
        except ApiException as exc:
            if exc.status != 409:
                raise
        done.append(f"{kind}/{body['metadata']['name']}")
    return done
