"""SWE-bench Verified on Kubernetes: one pod per instance, in the instance's evaluation image.

``KubernetesSweBackend.run(instance, model_patch)`` creates a ConfigMap with the model patch, the
test patch and the eval script (``eval_script.build_eval_script``), then a pod from the
instance's SWE-bench evaluation image (``swebench/sweb.eval.x86_64.<id>:latest``, the repository
at ``/testbed``; an optional registry prefix for mirrors), waits for it, grades its log
(``log_grading.grade_test_log``) and deletes both objects. The pod has CPU/memory/
ephemeral-storage limits, an ``activeDeadlineSeconds`` time limit, no service-account token, no
DNS, and a label selected by a deny-all NetworkPolicy (created once per namespace), so it has no
egress.

Guarantees:
    * The model's patch and the tests never run on the caller's machine; the pod cannot reach
      the network if the cluster enforces NetworkPolicy (and has no resolver either way), cannot
      use the API server (no token), and is killed by the kubelet after ``timeout_s``; the caller
      stops waiting after ``timeout_s`` plus a grace and deletes the pod and its ConfigMap in
      every case.

Not guaranteed:
    * Egress denial depends on the cluster's CNI enforcing NetworkPolicy.
    * Image pulls: the evaluation images (GBs each) must be pullable by the cluster.
    * The limits of the eval script itself (``eval_script``'s Not guaranteed list).

Run: ``python -m posttrain.eval.swe.k8s_backend INSTANCE_ID`` prints the eval script and pod spec
of the gold patch for inspection (nothing is created).
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.eval.swe.eval_script import DEFAULT_SPEC, REPO_SPECS, build_eval_script
from posttrain.eval.swe.instances import SweGradingError, SweInstance, load_swe_instances
from posttrain.eval.swe.log_grading import SweGrade, SweRunResult, grade_test_log

MAX_CONFIGMAP_BYTES = 900 * 1024
"""Largest patch + script payload put in one ConfigMap (the API limit is 1 MiB per object)."""

EGRESS_POLICY_NAME = "posttrain-swe-eval-deny-all"
"""NetworkPolicy that denies all ingress and egress of SWE eval pods."""
POD_ROLE_LABEL = ("posttrain.io/role", "swe-eval")
"""Label (key, value) on every SWE eval pod; the NetworkPolicy selects it."""

def _k8s_name(prefix: str, instance_id: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", instance_id.lower()).strip("-")[:40].strip("-")
    return f"{prefix}-{slug}-{uuid.uuid4().hex[:8]}"


def swe_pod_manifest(
    name: str,
    instance: SweInstance,
    configmap: str,
    *,
    namespace: str = "default",
    image_prefix: str = "",
    resources: Mapping[str, str] | None = None,
    timeout_s: int = 1800,
    labels: Mapping[str, str] | None = None,
    image_pull_secrets: Sequence[str] = (),
) -> dict[str, Any]:
    """The evaluation pod of one instance: runs ``/eval/eval.sh`` from ``configmap`` in its image.

    Requests equal limits (``resources``: cpu, memory, ephemeral-storage); ``activeDeadlineSeconds``
    is ``timeout_s``; no service-account token, no service links, no DNS resolver
    (``dnsPolicy: None`` with 127.0.0.1), never restarted; labelled for the deny-all NetworkPolicy.
    """
    res = dict(resources or {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "10Gi"})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "posttrain",
                "app.kubernetes.io/component": "swe-eval",
                POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1],
                **dict(labels or {}),
            },
            "annotations": {"posttrain.io/instance-id": instance.instance_id},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": timeout_s,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "terminationGracePeriodSeconds": 5,
            "imagePullSecrets": [{"name": s} for s in image_pull_secrets],
            "containers": [
                {
                    "name": "eval",
                    "image": image_prefix + instance.image,
                    "command": ["bash", "/eval/eval.sh"],
                    "resources": {"requests": dict(res), "limits": dict(res)},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["NET_RAW"]}},
                    "volumeMounts": [{"name": "eval", "mountPath": "/eval", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "eval", "configMap": {"name": configmap}}],
        },
    }


class KubernetesSweBackend:
    """Runs each SWE-bench instance's tests in its own pod (see the module docstring).

    Args:
        api_client: A ``kubernetes.client.ApiClient``; None loads in-cluster config, else kubeconfig.
        namespace: Namespace for the pods, ConfigMaps and the NetworkPolicy.
        image_prefix: Prepended to every image name (a registry mirror, ``registry.local/``).
        cpu: CPU request and limit per pod (Kubernetes quantity).
        memory: Memory request and limit per pod.
        ephemeral_storage: Ephemeral-storage request and limit per pod.
        timeout_s: Pod ``activeDeadlineSeconds``, and how long the caller waits (plus ``grace_s``).
        grace_s: Extra seconds the caller waits for the kubelet to report the deadline.
        poll_interval_s: Seconds between pod status reads.
        request_timeout_s: Seconds each Kubernetes API request may take (``_request_timeout``).
        labels: Extra pod labels (``kueue.x-k8s.io/queue-name``, tenant labels...).
        image_pull_secrets: Secret names for pulling the images.
        create_network_policy: Create the deny-all NetworkPolicy if it is missing.

    Raises:
        SweGradingError: no ``api_client`` and neither in-cluster config nor a kubeconfig.
        ValueError: ``timeout_s < 1``.
    """

    def __init__(
        self,
        api_client: Any = None,
        *,
        namespace: str = "default",
        image_prefix: str = "",
        cpu: str = "2",
        memory: str = "4Gi",
        ephemeral_storage: str = "10Gi",
        timeout_s: int = 1800,
        grace_s: float = 60.0,
        poll_interval_s: float = 2.0,
        labels: Mapping[str, str] | None = None,
        image_pull_secrets: Sequence[str] = (),
        create_network_policy: bool = True,
        request_timeout_s: float = 30.0,
    ) -> None:
        import kubernetes

        if api_client is None:
            try:
                kubernetes.config.load_incluster_config()
            except kubernetes.config.ConfigException:
                try:
                    kubernetes.config.load_kube_config()
                except (kubernetes.config.ConfigException, OSError) as exc:
                    raise SweGradingError(f"no Kubernetes access: not in a cluster and no usable kubeconfig ({exc})") from exc
            api_client = kubernetes.client.ApiClient()
        if timeout_s < 1:
            raise ValueError(f"timeout_s: must be >= 1, got {timeout_s}")
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.net = kubernetes.client.NetworkingV1Api(api_client)
        self.namespace = namespace
        self.image_prefix = image_prefix
        self.resources = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage}
        self.timeout_s = timeout_s
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s
        self.labels = dict(labels or {})
        self.image_pull_secrets = list(image_pull_secrets)
        self.create_network_policy = create_network_policy
        self.request_timeout_s = request_timeout_s
        # A (connect, read) pair: the kubernetes client ignores a float timeout (it accepts an int or a pair).
        self._timeout = (float(request_timeout_s), float(request_timeout_s))
        self._policy_ready = False

    def network_policy(self) -> dict[str, Any]:
        """The deny-all (ingress and egress) NetworkPolicy for SWE eval pods."""
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": EGRESS_POLICY_NAME,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "posttrain", "app.kubernetes.io/component": "swe-eval"},
            },
            "spec": {
                "podSelector": {"matchLabels": {POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1]}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [],
                "egress": [],
            },
        }

    def pod_manifest(self, name: str, instance: SweInstance, configmap: str) -> dict[str, Any]:
        """The pod that runs ``eval.sh`` from ``configmap`` in the instance's image (``swe_pod_manifest``)."""
        return swe_pod_manifest(
            name,
            instance,
            configmap,
            namespace=self.namespace,
            image_prefix=self.image_prefix,
            resources=self.resources,
            timeout_s=self.timeout_s,
            labels=self.labels,
            image_pull_secrets=self.image_pull_secrets,
        )

    def _ensure_policy(self) -> None:
        from kubernetes.client.exceptions import ApiException

        if self._policy_ready or not self.create_network_policy:
            return
        try:
            self.net.create_namespaced_network_policy(self.namespace, self.network_policy(),
                                                      _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 409:
                raise SweGradingError(f"create NetworkPolicy {EGRESS_POLICY_NAME}: HTTP {exc.status} {exc.reason}") from exc
        self._policy_ready = True

    def run(self, instance: SweInstance, model_patch: str) -> SweRunResult:
        """Evaluate ``model_patch`` on ``instance`` in a fresh pod; always deletes the pod and ConfigMap.

        Raises:
            SweGradingError: the payload is too large for a ConfigMap, or the API refused to create
                the objects. A pod that fails, times out or prints no test run is graded, not raised.
        """
        import urllib3
        from kubernetes.client.exceptions import ApiException

        started = time.monotonic()
        script = build_eval_script(instance)
        data = {"model.patch": model_patch, "test.patch": instance.test_patch, "eval.sh": script}
        size = sum(len(v.encode()) for v in data.values())
        if size > MAX_CONFIGMAP_BYTES:
            raise SweGradingError(f"{instance.instance_id}: patch payload is {size} bytes, over {MAX_CONFIGMAP_BYTES}")
        self._ensure_policy()
        name = _k8s_name("swe-eval", instance.instance_id)
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "labels": {POD_ROLE_LABEL[0]: POD_ROLE_LABEL[1]}},
            "data": data,
        }
        framework = REPO_SPECS.get(instance.repo, DEFAULT_SPEC).framework
        try:
            self.core.create_namespaced_config_map(self.namespace, cm, _request_timeout=self._timeout)
            try:
                self.core.create_namespaced_pod(self.namespace, self.pod_manifest(name, instance, name),
                                                _request_timeout=self._timeout)
                phase = self._wait(name)
                log = self._log(name)
                if phase == "timeout" or "DeadlineExceeded" in phase:
                    grade = SweGrade(resolved=False, status="timeout", reason=f"pod ran past {self.timeout_s} s")
                else:
                    grade = grade_test_log(log, instance.fail_to_pass, instance.pass_to_pass, framework)
            finally:
                self._delete("pod", name)
        except ApiException as exc:
            raise SweGradingError(f"{instance.instance_id}: Kubernetes API HTTP {exc.status} {exc.reason}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise SweGradingError(f"{instance.instance_id}: Kubernetes API did not answer within "
                                  f"{self.request_timeout_s:g} s ({type(exc).__name__})") from exc
        finally:
            self._delete("configmap", name)
        return SweRunResult(
            instance_id=instance.instance_id, grade=grade, log=log[-200_000:], wall_s=time.monotonic() - started,
            backend="kubernetes",
        )

    def _wait(self, name: str) -> str:
        """Poll until the pod is Succeeded/Failed; return its phase (with the reason) or ``timeout``."""
        deadline = time.monotonic() + self.timeout_s + self.grace_s
        while time.monotonic() < deadline:
            pod = self.core.read_namespaced_pod(name, self.namespace, _request_timeout=self._timeout)
            phase = pod.status.phase if pod.status else None
            if phase in ("Succeeded", "Failed"):
                reason = pod.status.reason or ""
                return f"{phase}:{reason}" if reason else phase
            time.sleep(self.poll_interval_s)
        return "timeout"

    def _log(self, name: str) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            return str(self.core.read_namespaced_pod_log(name, self.namespace, container="eval",
                                                         _request_timeout=self._timeout))
        except ApiException as exc:
            return f"(no log: HTTP {exc.status} {exc.reason})"

    def _delete(self, kind: str, name: str) -> None:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "pod":
                self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0,
                                                _request_timeout=self._timeout)
            else:
                self.core.delete_namespaced_config_map(name, self.namespace, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise SweGradingError(f"delete {kind} {name}: HTTP {exc.status} {exc.reason}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise SweGradingError(f"delete {kind} {name}: Kubernetes API did not answer ({type(exc).__name__})") from exc


def main(argv: list[str] | None = None) -> int:
    """Print the eval script and pod manifest for an instance's gold patch (creates nothing)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m posttrain.eval.swe.k8s_backend INSTANCE_ID", file=sys.stderr)
        return 2
    instances = load_swe_instances()
    if args[0] not in instances:
        print(f"error: unknown instance {args[0]!r}", file=sys.stderr)
        return 1
    inst = instances[args[0]]
    print(build_eval_script(inst))
    print(json.dumps(swe_pod_manifest("swe-eval-preview", inst, "swe-eval-preview"), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
