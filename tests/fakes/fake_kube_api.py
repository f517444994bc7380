"""A loopback fake of the Kubernetes REST API, for testing code that uses the real ``kubernetes`` client.

It is a fake *API server*: the code under test talks HTTP to it through
``kubernetes.client.CustomObjectsApi`` / ``CoreV1Api`` exactly as it would to a cluster. Objects live
in memory; there are no controllers, so a test plays the controller by editing stored objects
(``FakeKubeAPI.put`` / ``patch_status``) or from a hook run after every request.

Served (enough for ``posttrain.cluster``):

* ``/api/v1/...`` and ``/apis/<group>/<version>/...``, namespaced and cluster-scoped collections,
  items and subresources (``status``; ``pods/<name>/log`` returns text set by ``set_log``);
* GET item / list (``labelSelector`` with ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``; ``fieldSelector``
  ``metadata.name=``), POST (201, or 409 ``AlreadyExists``), PUT, PATCH (merge patch; strategic
  merge patch is treated as a merge patch; JSON patch ``add``/``replace``/``remove``), DELETE
  (returns the object; 404 ``NotFound`` when absent);
* fault injection: ``fail_next(method, path_regex, status, times)``.

Not modelled: watches, resourceVersion conflicts, admission, defaulting, garbage collection.

Usage::

    with FakeKubeAPI() as fake:
        api_client = fake.api_client()
        CustomObjectsApi(api_client).create_namespaced_custom_object(...)
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client

Key = tuple[str, str, str]  # (group/version, namespace or "", plural)

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def _status(code: int, reason: str, message: str, name: str = "", kind: str = "") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "kind": kind},
        "code": code,
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``None`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _json_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        parent: Any = obj
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.setdefault(part, {})
        last = parts[-1]
        if op["op"] in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif op["op"] == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                del parent[last]
        else:
            raise ValueError(f"unsupported JSON patch op {op['op']!r}")
    return obj


def _label_match(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = re.split(r"==?", term, maxsplit=1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class FakeKubeAPI:
    """In-memory Kubernetes API server on ``127.0.0.1:<free port>``.

    Attributes:
        requests: ``(method, path)`` of every request served, in order (query strings dropped).
    """

    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, dict[str, Any]]] = {}
        self._logs: dict[tuple[str, str], str] = {}
        self._faults: list[list[Any]] = []  # [method, compiled regex, status, remaining]
        self._hooks: list[Callable[[str, str], None]] = []
        self._lock = threading.RLock()
        self._rv = itertools.count(1)
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> FakeKubeAPI:
        """Start serving on a free loopback port (daemon thread)."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return None

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length)) if length else None

            def _handle(self) -> None:
                code, payload = fake._dispatch(self.command, self.path, self.headers.get("Content-Type", ""), self._body)
                if isinstance(payload, str):
                    data, ctype = payload.encode(), "text/plain"
                else:
                    data, ctype = json.dumps(payload).encode(), "application/json"
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                path = urlsplit(self.path).path
                for hook in list(fake._hooks):
                    hook(self.command, path)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-kube-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:40123``."""
        assert self._server is not None, "FakeKubeAPI not started"
        return f"http://127.0.0.1:{self._server.server_port}"

    def api_client(self) -> kubernetes.client.ApiClient:
        """A real ``kubernetes.client.ApiClient`` pointed at this server (no auth, no retries)."""
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        cfg.retries = 0
        return kubernetes.client.ApiClient(cfg)

    def write_kubeconfig(self, path: Path, namespace: str) -> Path:
        """Write a kubeconfig whose current context is this server and ``namespace`` (for a child process)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
        }), encoding="utf-8")
        return path

    # ---------------------------------------------------------------- test-side helpers
    def add_hook(self, hook: Callable[[str, str], None]) -> None:
        """Call ``hook(method, path)`` after each response is sent (plays a controller)."""
        self._hooks.append(hook)

    def fail_next(self, method: str, path_regex: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` matching requests with ``status`` (a Status body), then serve normally."""
        with self._lock:
            self._faults.append([method.upper(), re.compile(path_regex), status, times])

    def put(self, api_version: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` directly (create or replace), as a controller would; returns the stored copy."""
        meta = obj.setdefault("metadata", {})
        key = (api_version, meta.get("namespace", ""), plural)
        with self._lock:
            stored = self._stamp(copy.deepcopy(obj), key)
            self._objects.setdefault(key, {})[meta["name"]] = stored
            return copy.deepcopy(stored)

    def get(self, api_version: str, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        """A stored object, or None."""
        with self._lock:
            obj = self._objects.get((api_version, namespace, plural), {}).get(name)
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version: str, plural: str, namespace: str = "") -> list[dict[str, Any]]:
        """All stored objects of one collection."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects.get((api_version, namespace, plural), {}).values()]

    def patch_status(self, api_version: str, plural: str, name: str, namespace: str, status: dict[str, Any]) -> None:
        """Merge ``status`` into a stored object's ``.status`` (what a controller's status update does).

        Raises:
            KeyError: the object does not exist.
        """
        with self._lock:
            obj = self._objects[(api_version, namespace, plural)][name]
            obj["status"] = merge_patch(obj.get("status", {}), status)
            obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def set_log(self, namespace: str, pod: str, text: str) -> None:
        """Text served by ``GET /api/v1/namespaces/<ns>/pods/<pod>/log``."""
        with self._lock:
            self._logs[(namespace, pod)] = text

    # ---------------------------------------------------------------- request handling
    def _stamp(self, obj: dict[str, Any], key: Key) -> dict[str, Any]:
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{key[2]}-{meta['name']}")
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        if key[1]:
            meta["namespace"] = key[1]
        return obj

    def _dispatch(self, method: str, raw_path: str, content_type: str, read_body: Callable[[], Any]) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        body = read_body() if method in ("POST", "PUT", "PATCH") else None
        with self._lock:
            self.requests.append((method, path))
            for fault in self._faults:
                if fault[0] == method and fault[1].search(path) and fault[3] > 0:
                    fault[3] -= 1
                    return fault[2], _status(fault[2], "InternalError" if fault[2] >= 500 else "Forbidden", "injected fault")
            m = _PATH.match(path)
            if not m:
                return 404, _status(404, "NotFound", f"no route for {path}")
            gv = "v1" if m["core"] else f"{m['group']}/{m['version']}"
            key: Key = (gv, m["ns"] or "", m["plural"])
            name, sub = m["name"], m["sub"]
            coll = self._objects.setdefault(key, {})
            if name is None:
                return self._collection(method, key, coll, query, body)
            return self._item(method, key, coll, name, sub, content_type, body)

    def _collection(self, method: str, key: Key, coll: dict[str, Any], query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        gv, ns, plural = key
        if method == "GET":
            items = list(coll.values())
            for sel in query.get("labelSelector", []):
                items = [o for o in items if _label_match(o["metadata"].get("labels") or {}, sel)]
            for sel in query.get("fieldSelector", []):
                for term in sel.split(","):
                    field, _, value = term.partition("=")
                    if field == "metadata.name":
                        items = [o for o in items if o["metadata"]["name"] == value]
            kind = (items[0]["kind"] + "List") if items and "kind" in items[0] else "List"
            return 200, {"apiVersion": gv, "kind": kind, "metadata": {"resourceVersion": str(next(self._rv))}, "items": copy.deepcopy(items)}
        if method == "POST":
            if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                return 400, _status(400, "BadRequest", "body must be an object with metadata")
            meta = body["metadata"]
            if ns and meta.get("namespace", ns) != ns:
                return 400, _status(400, "BadRequest", f"the namespace of the object ({meta['namespace']}) does not match the namespace on the request ({ns})")
            if not meta.get("name"):
                if not meta.get("generateName"):
                    return 422, _status(422, "Invalid", "metadata.name or metadata.generateName is required")
                meta["name"] = meta["generateName"] + f"{next(self._rv):05d}"
            if meta["name"] in coll:
                return 409, _status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists', meta["name"], plural)
            body.pop("status", None)
            coll[meta["name"]] = self._stamp(body, key)
            return 201, copy.deepcopy(coll[meta["name"]])
        return 405, _status(405, "MethodNotAllowed", f"{method} not allowed on a collection")

    def _item(self, method: str, key: Key, coll: dict[str, Any], name: str, sub: str | None, content_type: str, body: Any) -> tuple[int, Any]:
        plural = key[2]
        obj = coll.get(name)
        if sub == "log" and method == "GET":
            text = self._logs.get((key[1], name))
            if obj is None or text is None:
                return 404, _status(404, "NotFound", f'pods "{name}" log not found', name, plural)
            return 200, text
        if obj is None:
            return 404, _status(404, "NotFound", f'{plural} "{name}" not found', name, plural)
        if method == "GET":
            return 200, copy.deepcopy(obj)
        if method == "DELETE":
            del coll[name]
            return 200, copy.deepcopy(obj)
        if method == "PUT":
            if not isinstance(body, dict):
                return 400, _status(400, "BadRequest", "body must be an object")
            if sub == "status":
                obj["status"] = body.get("status", {})
            else:
                body["metadata"] = {**obj["metadata"], **body.get("metadata", {})}
                body["status"] = obj.get("status", {})
                coll[name] = obj = body
            obj["metadata"]["resourceVersion"] = str(next(self._rv))
            return 200, copy.deepcopy(obj)
        if method == "PATCH":
            if "json-patch" in content_type:
                if not isinstance(body, list):
                    return 400, _status(400, "BadRequest", "JSON patch body must be a list")
                patched = _json_patch(obj, body)
            elif isinstance(body, dict):
                patched = merge_patch(obj, {"status": body.get("status", {})} if sub == "status" else body)
            else:
                return 400, _status(400, "BadRequest", "merge patch body must be an object")
            patched["metadata"]["name"] = name
            patched["metadata"]["resourceVersion"] = str(next(self._rv))
            coll[name] = patched
            return 200, copy.deepcopy(patched)
        return 405, _status(405, "MethodNotAllowed", f"{method} not allowed")


def pod_object(
    name: str,
    namespace: str,
    labels: dict[str, str],
    *,
    phase: str = "Running",
    container: str = "main",
    terminated: dict[str, Any] | None = None,
    last_terminated: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A minimal but complete Pod (enough for the client's ``V1Pod`` deserialisation).

    Args:
        terminated: ``state.terminated`` of the container, e.g. ``{"exitCode": 1, "reason": "Error",
            "message": "...", "finishedAt": "2026-01-01T00:00:00Z"}``; None means running.
        last_terminated: ``lastState.terminated`` (a previous crash of a restarted container).
    """
    state = {"terminated": {"startedAt": "2026-01-01T00:00:00Z", **terminated}} if terminated else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    last = {"terminated": {"startedAt": "2026-01-01T00:00:00Z", **last_terminated}} if last_terminated else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": container, "image": "img"}]},
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": container,
                    "image": "img",
                    "imageID": "img@sha256:" + "0" * 64,
                    "ready": terminated is None,
                    "restartCount": 1 if last_terminated else 0,
                    "state": state,
                    "lastState": last,
                }
            ],
        },
    }
