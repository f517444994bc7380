"""A real Kubernetes control plane for the cluster tier: one per test session, shared by every test.

``../shared/k8s/control-plane`` (from the repository root; ``$POSTTRAIN_K8S_CONTROL_PLANE`` names
another script) starts etcd, kube-apiserver v1.36 and kube-controller-manager on loopback: schemas
and CEL rules of the installed CRDs, RBAC, server-side apply, watches, the Job controller and the
garbage collector are the real ones. There is no kubelet and no JobSet or Kueue controller, so a
test plays them where it must, through the API, as they would:

* a pod's status (phase, container states) is written through the ``status`` subresource;
* ``FakeKubelet`` answers the API server's ``pods/log`` requests for pods bound to its Node (a
  tiny HTTPS server on loopback registered as the Node's kubelet endpoint);
* a JobSet's or a Workload's status transitions are written through their ``status`` subresource.

The tests that need it take the ``kube`` fixture; where the script, or etcd, is missing they skip
with one line saying so and the rest of the suite runs. The session installs, once: the JobSet and
Kueue CRDs of ``manifests/crds`` plus Kueue's Workload and Argo's Workflow CRDs
(``tests/data/crds``), the platform namespace ``posttrain-system``, and the fake kubelet's Node.
Each test works in namespaces of its own (``kube.namespace()`` / ``kube.tenant()``), deleted at its
end without waiting.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import itertools
import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
SCRIPT_ENV = "POSTTRAIN_K8S_CONTROL_PLANE"
"""Path of the control-plane script (default: ``../shared/k8s/control-plane`` from the repository root)."""
CRD_FILES = [
    *sorted((REPO / "manifests" / "crds").glob("*.yaml")),
    REPO / "tests" / "data" / "crds" / "kueue.x-k8s.io_workloads.yaml",
    REPO / "tests" / "data" / "crds" / "argoproj.io_workflows.yaml",
]
NODE = "posttrain-test-node"
"""The Node the fake kubelet serves; bind a pod to it (``spec.nodeName``) to read its log."""
FIELD_MANAGER = "posttrain-tests"
REQUEST_TIMEOUT_S = 30
WAIT_S = 60.0
"""Bound of every wait in the helpers (CRDs established, garbage collection...)."""

urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the control plane's self-signed cert


def control_plane_script() -> Path | None:
    """The control-plane script, or None when it is not there."""
    explicit = os.environ.get(SCRIPT_ENV)
    path = Path(explicit) if explicit else REPO.parent / "shared" / "k8s" / "control-plane"
    return path if path.is_file() else None


def etcd_missing() -> str | None:
    """Why etcd cannot be had here, or None (installed, or installable: root with apt-get)."""
    if shutil.which("etcd"):
        return None
    if os.geteuid() == 0 and shutil.which("apt-get"):
        return None
    return "etcd is not installed (Debian package etcd-server) and this user cannot install it"


class FakeKubelet:
    """The log endpoint of a kubelet (``GET /containerLogs/<ns>/<pod>/<container>``), over TLS on loopback.

    The API server proxies ``pods/log`` of a pod bound to ``NODE`` here. Texts are set per container
    with ``set_log``; anything else is 404, as a kubelet answers for an unknown container.
    """

    def __init__(self, cert: Path, key: Path):
        self._logs: dict[tuple[str, str, str], str] = {}
        self._lock = threading.Lock()
        kubelet = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return None

            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                parts = urlsplit(self.path).path.strip("/").split("/")
                text = None
                if len(parts) == 4 and parts[0] == "containerLogs":
                    with kubelet._lock:
                        text = kubelet._logs.get((parts[1], parts[2], parts[3]))
                body = (text if text is not None else "container not found").encode()
                self.send_response(200 if text is not None else 404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="fake-kubelet", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The TLS port the Node advertises."""
        return int(self._server.server_address[1])

    def set_log(self, namespace: str, pod: str, container: str, text: str) -> None:
        """What ``pods/log`` returns for that container."""
        with self._lock:
            self._logs[(namespace, pod, container)] = text

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


class ControlPlane:
    """A started control plane and the helpers the tests share (see the module docstring).

    Attributes:
        directory: Where its data, logs and kubeconfig live.
        server: The API server's URL.
        kubelet: The fake kubelet of ``NODE``.
    """

    def __init__(self, script: Path, directory: Path, bin_cache: Path | None = None):
        self.script = script
        self.directory = directory
        self.bin_cache = bin_cache
        self.server = ""
        self._token = ""
        self._resources: dict[tuple[str, str], tuple[str, bool]] = {}
        self._names = itertools.count(1)
        self.kubelet: FakeKubelet | None = None
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start it (bounded by the script's own waits) and install what every test needs.

        Raises:
            RuntimeError: the script failed (its last lines in the message).
        """
        self._link_binaries(self.bin_cache, self.directory / "bin")
        proc = subprocess.run([str(self.script), "start", str(self.directory), "--no-scheduler"],
                              capture_output=True, text=True, timeout=600, check=False)
        self._started = True  # stop() must run even if start failed half-way
        if proc.returncode != 0:
            raise RuntimeError(f"{self.script} start failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
        self._link_binaries(self.directory / "bin", self.bin_cache)
        config = yaml.safe_load((self.directory / "kubeconfig").read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self._token = config["users"][0]["user"]["token"]
        self.install_crds(CRD_FILES)
        core = k8s.CoreV1Api(self.admin())
        core.create_namespace({"metadata": {"name": "posttrain-system"}}, _request_timeout=REQUEST_TIMEOUT_S)
        certs = self.directory / "certs"
        self.kubelet = FakeKubelet(certs / "apiserver.crt", certs / "apiserver.key")
        core.create_node({"metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}},
                         _request_timeout=REQUEST_TIMEOUT_S)
        core.patch_node_status(NODE, {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet.port}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet"}],
        }}, _request_timeout=REQUEST_TIMEOUT_S)

    @staticmethod
    def _link_binaries(source: Path | None, dest: Path | None) -> None:
        """Hard-link (else copy) the unpacked binaries and their ``.sum`` files from ``source`` to ``dest``.

        The script unpacks its ``.xz`` binaries into ``DIR/bin`` unless a matching ``.sum`` is there
        (about 3 s of CPU); a cache beside the session directories saves that on the next session.
        """
        if source is None or dest is None or not source.is_dir():
            return

        def sums(d: Path) -> dict[str, str]:
            return {p.name: p.read_text() for p in d.glob("*.sum")} if d.is_dir() else {}

        if sums(source) == sums(dest):
            return
        dest.mkdir(parents=True, exist_ok=True)
        # Each file appears whole, binaries before their .sum, by a rename over the old name: the cache is shared by
        # every session on the machine (parallel test workers, other checkouts), and writing into a file another
        # session had linked would change (or, while it runs, fail on: ETXTBSY) that session's binary.
        files = [p for p in source.iterdir() if ".tmp" not in p.name]
        for path in sorted(files, key=lambda p: p.name.endswith(".sum")):
            staged = dest / f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}"
            try:
                os.link(path, staged)
            except OSError:
                shutil.copy2(path, staged)
            os.replace(staged, dest / path.name)

    def stop(self) -> None:
        """Stop every process ``start`` started (idempotent)."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        if self._started:
            # A test cluster needs no graceful shutdown (the script waits up to 20 s for one): end the
            # processes the script started, by the ids it recorded, then let it clean up.
            pids_file = self.directory / "pids"
            pids = [int(p) for p in pids_file.read_text().split()] if pids_file.is_file() else []
            for pid in reversed(pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.1)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            subprocess.run([str(self.script), "stop", str(self.directory)], capture_output=True, timeout=120, check=False)
            self._started = False

    def apiserver_pid(self) -> int:
        """The kube-apiserver's process id (the second line the script records)."""
        return int((self.directory / "pids").read_text().split()[1])

    # ------------------------------------------------------------------ clients
    def client(self, token: str | None = None, *, retries: int = 1) -> k8s.ApiClient:
        """A ``kubernetes`` ApiClient for this server, as the admin or with a service-account ``token``."""
        cfg = k8s.Configuration()
        cfg.host = self.server
        cfg.verify_ssl = False
        cfg.api_key = {"authorization": token or self._token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        cfg.retries = retries
        return k8s.ApiClient(cfg)

    def admin(self) -> k8s.ApiClient:
        """An admin client (``system:masters``)."""
        return self.client()

    def token_for(self, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
        """A real token of the service account (TokenRequest API), as a pod of it would mount."""
        core = k8s.CoreV1Api(self.admin())
        with contextlib.suppress(ApiException):
            core.create_namespaced_service_account(namespace, {"metadata": {"name": service_account}},
                                                   _request_timeout=REQUEST_TIMEOUT_S)
        request = core.create_namespaced_service_account_token(
            service_account, namespace, {"spec": {"expirationSeconds": seconds}}, _request_timeout=REQUEST_TIMEOUT_S)
        return str(request.status.token)

    def write_kubeconfig(self, path: Path, namespace: str, token: str | None = None) -> Path:
        """A kubeconfig whose current context is this server and ``namespace`` (for ``kube_clients`` or a child process)."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "test", "user": {"token": token or self._token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
        }))
        return path

    # ------------------------------------------------------------------ server-side apply
    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        """``(plural, namespaced)`` of a kind, from the server's discovery (refreshed when unknown)."""
        key = (api_version, kind)
        if key not in self._resources:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            found = self.admin().call_api(path, "GET", response_type="object", auth_settings=["BearerToken"],
                                          _return_http_data_only=True, _request_timeout=REQUEST_TIMEOUT_S)
            for res in found["resources"]:
                if "/" not in res["name"]:
                    self._resources[(api_version, res["kind"])] = (res["name"], res["namespaced"])
        if key not in self._resources:
            raise KeyError(f"the API server serves no {kind} in {api_version}")
        return self._resources[key]

    def path(self, obj: Mapping[str, Any], namespace: str | None = None) -> str:
        """The REST path of ``obj`` (its own namespace, else ``namespace``)."""
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = self._resource(api_version, kind)
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            ns = obj["metadata"].get("namespace") or namespace
            if not ns:
                raise ValueError(f"{kind} {obj['metadata']['name']}: namespaced, and no namespace given")
            base += f"/namespaces/{ns}"
        return f"{base}/{plural}/{obj['metadata']['name']}"

    def apply(self, objs: Iterable[Mapping[str, Any]], *, namespace: str | None = None, dry_run: bool = False,
              token: str | None = None) -> list[dict[str, Any]]:
        """Server-side apply each object (field manager ``posttrain-tests``, forced), as the admin or ``token``.

        Args:
            objs: Objects in apply order.
            namespace: For namespaced objects that carry none (``kubectl apply -n``).
            dry_run: ``dryRun=All``: admission and validation run, nothing is stored.
            token: Apply as this service-account token instead of the admin.

        Returns:
            The server's answer per object.

        Raises:
            kubernetes.client.exceptions.ApiException: the server refused one (its message names the field).
        """
        api = self.client(token)
        out = []
        for obj in objs:
            query = [("fieldManager", FIELD_MANAGER), ("force", "true")] + ([("dryRun", "All")] if dry_run else [])
            out.append(api.call_api(self.path(obj, namespace), "PATCH", body=dict(obj), query_params=query,
                                    header_params={"Content-Type": "application/apply-patch+yaml",
                                                   "Accept": "application/json"},
                                    response_type="object", auth_settings=["BearerToken"], _return_http_data_only=True,
                                    _request_timeout=REQUEST_TIMEOUT_S))
        return out

    def get(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object, or None."""
        try:
            return self.admin().call_api(self.path(obj, namespace), "GET", response_type="object",
                                         auth_settings=["BearerToken"], _return_http_data_only=True,
                                         _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def install_crds(self, files: Iterable[Path]) -> None:
        """Apply CRD files and wait (bounded) until each is Established."""
        ext = k8s.ApiextensionsV1Api(self.admin())
        names = []
        for path in files:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    self.apply([doc])
                    names.append(doc["metadata"]["name"])
        deadline = time.monotonic() + WAIT_S
        for name in names:
            while True:
                crd = ext.read_custom_resource_definition(name, _request_timeout=REQUEST_TIMEOUT_S)
                if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"CRD {name} not Established after {WAIT_S} s")
                time.sleep(0.1)
        self._resources.clear()

    # ------------------------------------------------------------------ namespaces and tenants
    def namespace(self, prefix: str = "t") -> str:
        """A fresh namespace (labelled as a tenant), deleted by ``cleanup``."""
        name = f"{prefix}-{next(self._names)}-{uuid.uuid4().hex[:5]}"
        k8s.CoreV1Api(self.admin()).create_namespace(
            {"metadata": {"name": name, "labels": {"posttrain.io/tenant": name}}}, _request_timeout=REQUEST_TIMEOUT_S)
        return name

    def tenant(self, prefix: str = "team", *, secrets: bool = True, **render: Any) -> str:
        """A fresh tenant: ``render_tenant`` applied server-side, plus its two Secrets (``secrets``).

        Returns:
            The tenant (namespace) name.
        """
        from posttrain.cluster.tenant import render_tenant

        name = f"{prefix}-{next(self._names)}-{uuid.uuid4().hex[:5]}"
        self.apply(render_tenant(name, render.pop("gpu_quota", 8), render.pop("cpu_quota", "96"),
                                 render.pop("memory_quota", "768Gi"), **render))
        if secrets:
            self.apply([
                secret(name, "redis-credentials", {"password": "0123abcd" * 8}),
                secret(name, "s3-credentials", {"AWS_ACCESS_KEY_ID": name, "AWS_SECRET_ACCESS_KEY": "x" * 32}),
            ])
        return name

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (and the cluster-scoped ClusterQueue a tenant render made); do not wait."""
        core = k8s.CoreV1Api(self.admin())
        with contextlib.suppress(ApiException):
            core.delete_namespace(name, _request_timeout=REQUEST_TIMEOUT_S)
        with contextlib.suppress(ApiException):
            k8s.CustomObjectsApi(self.admin()).delete_cluster_custom_object(
                "kueue.x-k8s.io", "v1beta2", "clusterqueues", f"{name}-cq", _request_timeout=REQUEST_TIMEOUT_S)

    # ------------------------------------------------------------------ playing the missing controllers
    def set_status(self, group: str, version: str, namespace: str, plural: str, name: str,
                   status: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``status`` into a custom resource through its ``status`` subresource (what its controller does)."""
        return k8s.CustomObjectsApi(self.admin()).patch_namespaced_custom_object_status(
            group, version, namespace, plural, name, {"status": dict(status)}, _request_timeout=REQUEST_TIMEOUT_S)

    def pod(self, namespace: str, name: str, *, labels: Mapping[str, str] | None = None, container: str = "main",
            owner: Mapping[str, Any] | None = None, node: str | None = NODE) -> dict[str, Any]:
        """Create a pod bound to the fake kubelet's node (a pod a controller would have made and the scheduler placed)."""
        meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if owner is not None:
            meta["ownerReferences"] = [dict(owner)]
        spec: dict[str, Any] = {"containers": [{"name": container, "image": "registry.example.com/x:1"}]}
        if node:
            spec["nodeName"] = node
        return k8s.CoreV1Api(self.admin()).api_client.sanitize_for_serialization(
            k8s.CoreV1Api(self.admin()).create_namespaced_pod(
                namespace, {"metadata": meta, "spec": spec}, _request_timeout=REQUEST_TIMEOUT_S))

    def set_pod_status(self, namespace: str, name: str, *, phase: str, container: str = "main",
                       terminated: Mapping[str, Any] | None = None, last_terminated: Mapping[str, Any] | None = None,
                       reason: str | None = None) -> None:
        """Write a pod's status as its kubelet would (phase, one container's current and last state)."""
        started = "2026-01-01T00:00:00Z"
        state = ({"terminated": {"startedAt": started, **terminated}} if terminated
                 else {"running": {"startedAt": started}})
        status: dict[str, Any] = {"phase": phase, "containerStatuses": [{
            "name": container, "image": "registry.example.com/x:1", "imageID": "", "ready": terminated is None,
            "restartCount": 1 if last_terminated else 0, "state": state,
            "lastState": {"terminated": {"startedAt": started, **last_terminated}} if last_terminated else {},
        }]}
        if reason:
            status["reason"] = reason
        k8s.CoreV1Api(self.admin()).patch_namespaced_pod_status(name, namespace, {"status": status},
                                                                _request_timeout=REQUEST_TIMEOUT_S)

    @contextlib.contextmanager
    def finishing_jobsets(self, namespace: str, condition: str = "Completed") -> Iterator[list[str]]:
        """Play the JobSet controller: every JobSet created in ``namespace`` gets a ``condition`` status at once.

        A thread watches the namespace's JobSets (a real watch) and writes the status the controller
        would write when the JobSet ends (``Completed`` or ``Failed``, message ``learner completed`` /
        ``learner failed``). Yields the names it finished.
        """
        from kubernetes import watch

        api = k8s.CustomObjectsApi(self.admin())
        stop = threading.Event()
        finished: list[str] = []
        ready = threading.Event()

        def run() -> None:
            version = api.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets",
                                                        _request_timeout=REQUEST_TIMEOUT_S)["metadata"]["resourceVersion"]
            ready.set()
            while not stop.is_set():
                stream = watch.Watch().stream(api.list_namespaced_custom_object, "jobset.x-k8s.io", "v1alpha2", namespace,
                                              "jobsets", resource_version=version, timeout_seconds=1,
                                              _request_timeout=(REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S))
                for event in stream:
                    obj = event["raw_object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "ADDED":
                        name = obj["metadata"]["name"]
                        self.set_status("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", name, {
                            "restarts": 0, "terminalState": condition,
                            "conditions": [{"type": condition, "status": "True", "reason": "Test",
                                            "message": f"learner {condition.lower()}",
                                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
                        finished.append(name)

        thread = threading.Thread(target=run, name="jobset-controller", daemon=True)
        thread.start()
        ready.wait(WAIT_S)
        try:
            yield finished
        finally:
            stop.set()
            thread.join(WAIT_S)

    @contextlib.contextmanager
    def kubelet_finishing_pods(self, namespace: str, *, phase: str = "Succeeded", reason: str = "",
                               log: Callable[[dict[str, Any]], str | None] = lambda pod: None,
                               seen: list[dict[str, Any]] | None = None) -> Iterator[list[dict[str, Any]]]:
        """Play the scheduler and kubelet for new pods in ``namespace``: bind each to ``NODE``, serve ``log(pod)``
        as its containers' log, and write ``phase`` (with ``reason``) into its status.

        A thread watches the namespace's pods (a real watch). Yields (and fills ``seen`` with) the
        pods as created, before the kubelet's changes.
        """
        from kubernetes import watch

        core = k8s.CoreV1Api(self.admin())
        stop = threading.Event()
        created: list[dict[str, Any]] = [] if seen is None else seen
        ready = threading.Event()

        def run() -> None:
            version = core.list_namespaced_pod(namespace, _request_timeout=REQUEST_TIMEOUT_S).metadata.resource_version
            ready.set()
            while not stop.is_set():
                stream = watch.Watch().stream(core.list_namespaced_pod, namespace, resource_version=version,
                                              timeout_seconds=1, _request_timeout=(REQUEST_TIMEOUT_S, REQUEST_TIMEOUT_S))
                for event in stream:
                    pod = event["raw_object"]
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] != "ADDED" or pod["spec"].get("nodeName"):
                        continue
                    created.append(pod)
                    name = pod["metadata"]["name"]
                    core.create_namespaced_pod_binding(name, namespace, {
                        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}},
                        _request_timeout=REQUEST_TIMEOUT_S, _preload_content=False)
                    text = log(pod)
                    if text is not None and self.kubelet is not None:
                        for container in pod["spec"]["containers"]:
                            self.kubelet.set_log(namespace, name, container["name"], text)
                    status: dict[str, Any] = {"phase": phase}
                    if reason:
                        status["reason"] = reason
                    core.patch_namespaced_pod_status(name, namespace, {"status": status},
                                                     _request_timeout=REQUEST_TIMEOUT_S)

        thread = threading.Thread(target=run, name="kubelet", daemon=True)
        thread.start()
        ready.wait(WAIT_S)
        try:
            yield created
        finally:
            stop.set()
            thread.join(WAIT_S)

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        """Poll ``predicate`` every 0.1 s until true; fail the test after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def secret(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """A Secret object with ``data`` base64-encoded."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Every object ``kubectl apply -k <directory>`` applies, in order (``resources`` followed recursively).

    Raises:
        ValueError: a kustomization uses anything but ``resources`` (patches, generators, a namespace
            override...), which this reader does not implement.
    """
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(spec) - {"apiVersion", "kind", "resources"}
    if unsupported:
        raise ValueError(f"{directory}/kustomization.yaml: {sorted(unsupported)} not supported by this reader")
    out: list[dict[str, Any]] = []
    for entry in spec["resources"]:
        target = (directory / entry).resolve()
        out += kustomize(target) if target.is_dir() else [d for d in yaml.safe_load_all(target.read_text()) if d]
    return out


_PLANE: ControlPlane | None = None
_SKIP: str | None = None
_FAILED: str | None = None
_LOCK = threading.Lock()


def shared_control_plane(tmp_root: Callable[[], Path], bin_cache: Path | None = None) -> ControlPlane:
    """Start the session's control plane on first use (skipping with one line where it cannot run).

    Both ``tests/`` and ``components/`` import the fixture; this keeps it one per process.
    """
    global _PLANE, _SKIP, _FAILED
    with _LOCK:
        if _SKIP is not None:
            pytest.skip(_SKIP)
        if _FAILED is not None:  # started once and failed: do not try again for every test
            pytest.fail(_FAILED)
        if _PLANE is not None:
            return _PLANE
        script = control_plane_script()
        if script is None:
            where = os.environ.get(SCRIPT_ENV) or REPO.parent / "shared" / "k8s" / "control-plane"
            _SKIP = f"no Kubernetes control plane: {where} does not exist (set {SCRIPT_ENV})"
            pytest.skip(_SKIP)
        missing = etcd_missing()
        if missing is not None:
            _SKIP = f"no Kubernetes control plane: {missing}"
            pytest.skip(_SKIP)
        plane = ControlPlane(script, tmp_root(), bin_cache)
        atexit.register(plane.stop)
        try:
            plane.start()
        except Exception as exc:  # any failure to start: stop what started, then skip (no etcd) or fail once
            plane.stop()
            if re.search(r"etcd not found|install etcd-server failed", str(exc)):
                _SKIP = f"no Kubernetes control plane: {str(exc).splitlines()[-1]}"
                pytest.skip(_SKIP)
            _FAILED = f"the Kubernetes control plane did not start: {exc}"
            raise
        _PLANE = plane
        return plane


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The session's real control plane (see the module docstring); stopped at the end of the session."""
    base = tmp_path_factory.getbasetemp()  # pytest-N, or pytest-N/popen-gwK in a pytest-xdist worker
    cache = (base.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else base.parent) / "posttrain-control-plane-bin"
    plane = shared_control_plane(lambda: tmp_path_factory.mktemp("control-plane"), cache)
    yield plane
    plane.stop()


@pytest.fixture
def kube_ns(kube: ControlPlane) -> Iterator[str]:
    """A fresh namespace for one test."""
    name = kube.namespace()
    yield name
    kube.delete_namespace(name)


@pytest.fixture
def kube_tenant(kube: ControlPlane) -> Iterator[str]:
    """A fresh tenant for one test: ``render_tenant`` applied server-side, its Secrets created."""
    name = kube.tenant()
    yield name
    kube.delete_namespace(name)

