"""Every Kubernetes API call in ``src/posttrain`` carries a ``_request_timeout`` the client honours.

Without one, a half-open connection (an API server that accepts and never answers) blocks the
call forever. The value must be a ``(connect, read)`` pair (``kube_timeout`` or a tuple): the
``kubernetes`` client silently ignores a ``float`` (``client/rest.py`` converts only an ``int`` or a
pair), which is how every call of the launcher had no timeout at all although it passed 30.0 (found
by ``tests/cluster/test_launcher.py``'s silent-server test, which hung in the TLS handshake).

Run: .venv/bin/python -m pytest -q tests/cluster/test_request_timeouts.py
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from posttrain.cluster.jobset_status import kube_timeout

SRC = Path(__file__).resolve().parents[2] / "src" / "posttrain"
API_METHOD = re.compile(
    r"^(create|read|list|patch|delete|replace|get|connect)_(namespaced|cluster|node|namespace|custom_resource|"
    r"persistent|pod|service|config|secret)\w*$"
)
"""Names of the generated ``kubernetes.client`` API methods (``read_namespaced_pod``, ``get_namespaced_custom_object``...)."""


def api_calls(tree: ast.AST) -> list[tuple[ast.Call, str]]:
    """Calls of a client API method, directly or passed as the callable of a wrapper (``_api(what, core.read_...)``,
    ``Watch().stream(api.list_...)``)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and API_METHOD.match(node.func.attr):
            found.append((node, node.func.attr))
        for arg in node.args:
            if isinstance(arg, ast.Attribute) and API_METHOD.match(arg.attr):
                found.append((node, arg.attr))
    return found


def honoured(value: ast.expr) -> bool:
    """A ``(connect, read)`` tuple, a ``kube_timeout(...)`` call, or an attribute holding one (``self._timeout``)."""
    if isinstance(value, ast.Tuple) and len(value.elts) == 2:
        return True
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "kube_timeout":
        return True
    return isinstance(value, ast.Attribute) and value.attr == "_timeout"


FILES = sorted(p for p in SRC.rglob("*.py") if "kubernetes" in p.read_text(encoding="utf-8"))


def test_the_scan_finds_the_modules_that_talk_to_kubernetes():
    names = {p.relative_to(SRC).as_posix() for p in FILES}
    assert {"cluster/launcher.py", "cluster/jobset_status.py", "eval/swe/k8s_backend.py"} <= names
    assert sum(len(api_calls(ast.parse(p.read_text(encoding="utf-8")))) for p in FILES) >= 15


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(SRC).as_posix())
def test_every_api_call_has_a_request_timeout_the_client_honours(path):
    problems = []
    for call, method in api_calls(ast.parse(path.read_text(encoding="utf-8"))):
        timeout = next((k.value for k in call.keywords if k.arg == "_request_timeout"), None)
        if timeout is None:
            problems.append(f"line {call.lineno}: {method} without _request_timeout")
        elif not honoured(timeout):
            problems.append(f"line {call.lineno}: {method} _request_timeout is not a (connect, read) pair")
    assert problems == []


def test_kube_timeout_is_a_pair_and_refuses_nonsense():
    assert kube_timeout(30) == (30.0, 30.0)
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        kube_timeout(0)
