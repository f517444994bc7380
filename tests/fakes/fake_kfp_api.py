"""A loopback fake of the Kubeflow Pipelines v2beta1 REST API, for testing code that uses the real ``kfp.Client``.

It is a fake *API server*: ``kfp.Client(host=fake.url)`` talks HTTP to it exactly as to the KFP
``ml-pipeline`` service. State lives in memory; nothing is ever scheduled or run.

Served (what ``posttrain.cluster.schedule`` and ``kfp.Client`` need):

* ``GET /apis/v2beta1/healthz`` (``multi_user`` as constructed);
* experiments: ``GET`` list (``filter`` with ``display_name`` EQUALS, ``namespace``), ``POST``, ``GET {id}``;
* recurring runs: ``GET`` list (``experiment_id``, ``namespace``, ``filter`` on ``display_name``,
  ``page_size`` / ``page_token``), ``POST`` (checks: experiment exists, exactly one of
  ``pipeline_spec`` / ``pipeline_version_reference``, exactly one trigger, a 6-field cron,
  ``max_concurrency`` >= 1), ``GET {id}``, ``DELETE {id}``, ``POST {id}:enable`` / ``{id}:disable``;
* fault injection: ``fail_next(method, path_regex, status, times)``.

List responses use the same keys as the real server (``recurringRuns``, ``experiments``,
``next_page_token``); int64 fields come back as strings, as grpc-gateway writes them.
Every request is recorded in ``requests`` as ``(method, path, query, body)``.

Usage::

    with FakeKFPAPI() as fake:
        client = kfp.Client(host=fake.url, namespace="team-a")
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PREFIX = "/apis/v2beta1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _error(code: int, message: str) -> tuple[int, dict[str, Any]]:
    grpc = {400: 3, 404: 5, 409: 6, 500: 13}.get(code, 2)
    return code, {"error_message": message, "code": grpc, "message": message}


def _display_name_filter(raw: str | None) -> str | None:
    """The display name an EQUALS filter asks for, or None without a filter.

    Raises:
        ValueError: a filter on another key or with another operation (not modelled).
    """
    if not raw:
        return None
    preds = json.loads(raw).get("predicates", [])
    wanted = None
    for p in preds:
        if p.get("key") != "display_name" or p.get("operation") not in (1, "EQUALS"):
            raise ValueError(f"filter predicate not modelled by the fake: {p}")
        wanted = p.get("stringValue", p.get("string_value"))
    return wanted


class FakeKFPAPI:
    """In-memory KFP API server on 127.0.0.1 (see the module docstring).

    Args:
        multi_user: What ``/healthz`` reports.
    """

    def __init__(self, multi_user: bool = False) -> None:
        self.multi_user = multi_user
        self.experiments: dict[str, dict[str, Any]] = {}
        self.recurring_runs: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self._ids = itertools.count(1)
        self._faults: list[list[Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> FakeKFPAPI:
        """Start serving on a free loopback port."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                code, payload = fake._dispatch(self.command, self.path, body)
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-kfp-api").start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeKFPAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def fail_next(self, method: str, path_regex: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests matching ``method`` and ``path_regex`` with ``status``."""
        with self._lock:
            self._faults.append([method, re.compile(path_regex), status, times])

    def calls(self, method: str, path_regex: str) -> list[tuple[str, str, dict[str, list[str]], Any]]:
        """Recorded requests matching ``method`` and ``path_regex``."""
        rx = re.compile(path_regex)
        return [r for r in self.requests if r[0] == method and rx.search(r[1])]

    # -------------------------------------------------------------------------------- dispatch
    def _dispatch(self, method: str, raw_path: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        with self._lock:
            self.requests.append((method, path, query, copy.deepcopy(body)))
            for fault in self._faults:
                if fault[0] == method and fault[1].search(path) and fault[3] > 0:
                    fault[3] -= 1
                    return _error(fault[2], f"injected fault {fault[2]}")
            if not path.startswith(PREFIX):
                return _error(404, f"not found: {path}")
            rest = path[len(PREFIX):]
            try:
                if rest == "/healthz" and method == "GET":
                    return 200, {"multi_user": self.multi_user, "pipeline_store": "database"}
                if rest.startswith("/experiments"):
                    return self._experiments(method, rest[len("/experiments"):], query, body)
                if rest.startswith("/recurringruns"):
                    return self._recurring_runs(method, rest[len("/recurringruns"):], query, body)
            except ValueError as exc:
                return _error(400, str(exc))
            return _error(404, f"not found: {method} {path}")

    def _experiments(self, method: str, rest: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if rest == "" and method == "GET":
            name = _display_name_filter(query.get("filter", [None])[0])
            ns = query.get("namespace", [None])[0]
            items = [e for e in self.experiments.values()
                     if (name is None or e["display_name"] == name) and (not ns or e.get("namespace") == ns)]
            return 200, ({"experiments": items, "total_size": len(items)} if items else {})
        if rest == "" and method == "POST":
            if not body or not body.get("display_name"):
                raise ValueError("experiment.display_name is required")
            exp = {**body, "experiment_id": f"exp-{next(self._ids)}", "created_at": _now(), "storage_state": "AVAILABLE"}
            self.experiments[exp["experiment_id"]] = exp
            return 200, exp
        if rest.startswith("/") and method == "GET":
            exp = self.experiments.get(rest[1:])
            return (200, exp) if exp else _error(404, f"experiment {rest[1:]} not found")
        return _error(404, f"not found: {method} /experiments{rest}")

    def _recurring_runs(self, method: str, rest: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        if rest == "" and method == "GET":
            return 200, self._list_runs(query)
        if rest == "" and method == "POST":
            return self._create_run(body or {})
        match = re.fullmatch(r"/([^/:]+)(?::(enable|disable))?", rest)
        if not match:
            return _error(404, f"not found: {method} /recurringruns{rest}")
        run = self.recurring_runs.get(match[1])
        if run is None:
            return _error(404, f"recurring run {match[1]} not found")
        if match[2] and method == "POST":
            enabled = match[2] == "enable"
            run.update(mode="ENABLE" if enabled else "DISABLE", status="ENABLED" if enabled else "DISABLED",
                       updated_at=_now())
            return 200, {}
        if method == "GET":
            return 200, run
        if method == "DELETE":
            del self.recurring_runs[match[1]]
            return 200, {}
        return _error(404, f"not found: {method} /recurringruns{rest}")

    def _list_runs(self, query: dict[str, list[str]]) -> dict[str, Any]:
        name = _display_name_filter(query.get("filter", [None])[0])
        exp = query.get("experiment_id", [None])[0]
        ns = query.get("namespace", [None])[0]
        items = [r for r in self.recurring_runs.values()
                 if (name is None or r["display_name"] == name) and (not exp or r["experiment_id"] == exp)
                 and (not ns or r.get("namespace") == ns)]
        size = int(query.get("page_size", ["10"])[0] or 10)
        start = int(query.get("page_token", ["0"])[0] or 0)
        page = items[start:start + size]
        out: dict[str, Any] = {"total_size": len(items)}
        if page:
            out["recurringRuns"] = page
        if start + size < len(items):
            out["next_page_token"] = str(start + size)
        return out

    def _create_run(self, body: dict[str, Any]) -> tuple[int, Any]:
        exp = self.experiments.get(body.get("experiment_id", ""))
        if exp is None:
            raise ValueError(f"experiment_id {body.get('experiment_id')!r} does not exist")
        if not body.get("display_name"):
            raise ValueError("recurring_run.display_name is required")
        if bool(body.get("pipeline_spec")) == bool(body.get("pipeline_version_reference")):
            raise ValueError("exactly one of pipeline_spec and pipeline_version_reference is required")
        trigger = body.get("trigger") or {}
        if len(trigger) != 1:
            raise ValueError("trigger: exactly one of cron_schedule and periodic_schedule is required")
        if "cron_schedule" in trigger and len(trigger["cron_schedule"].get("cron", "").split()) != 6:
            raise ValueError(f"trigger.cron_schedule.cron {trigger['cron_schedule'].get('cron')!r}: need 6 fields")
        if int(body.get("max_concurrency") or 0) < 1:
            raise ValueError("max_concurrency must be >= 1")
        run = copy.deepcopy(body)
        enabled = run.get("mode", "ENABLE") == "ENABLE"
        run.update(
            recurring_run_id=f"rr-{next(self._ids)}",
            namespace=exp.get("namespace", ""),
            created_at=_now(),
            updated_at=_now(),
            status="ENABLED" if enabled else "DISABLED",
            max_concurrency=str(run["max_concurrency"]),
        )
        self.recurring_runs[run["recurring_run_id"]] = run
        return 200, run
