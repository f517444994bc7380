"""The package's import graph runs down the layers of docs/architecture.md, and roles never import each other.

Every ``import`` and ``from ... import`` under ``src/posttrain`` counts, including those inside
functions and ``if TYPE_CHECKING:`` blocks: a lazy import is still an arrow between two rooms.

    layer 0  config, records, account
    layer 1  losses, advantages, data, envs, tracking, models, chat, storage, services, parallel
    layer 2  inference, rollout, weight_sync, runtime
    layer 3  episodes
    layer 4  learner | generator | eval        (roles: siblings that never import each other)
    layer 5  runners, kfp, cluster, cli         (composition: nothing imports it)
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "posttrain"

LAYERS: dict[str, int] = {
    "config": 0, "records": 0, "account": 0,
    "losses": 1, "advantages": 1, "data": 1, "envs": 1, "tracking": 1, "models": 1, "chat": 1,
    "storage": 1, "services": 1, "parallel": 1,
    "inference": 2, "rollout": 2, "weight_sync": 2, "runtime": 2,
    "episodes": 3,
    "learner": 4, "generator": 4, "eval": 4,
    "runners": 5, "kfp": 5, "cluster": 5, "cli": 5,
}
ROLES = {"learner", "generator", "eval"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every ``posttrain.*`` module or name that ``path`` imports (absolute or relative)."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "posttrain")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "posttrain":
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the ``posttrain`` modules it imports (names resolved to their module where one exists)."""
    files = {
        _module_name(p): p for p in SRC.rglob("*.py") if "tasks" not in p.relative_to(SRC).parts[1:-1]
    }
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        targets = set()
        for target in _imports(path):
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != name and target != "posttrain":
                targets.add(target)
        graph[name] = targets
    return graph


def _room(module: str) -> str:
    return module.split(".")[1]


def test_every_package_has_a_layer():
    rooms = {_room(m) for m in _graph() if m != "posttrain"}
    assert rooms <= set(LAYERS), f"packages without a layer: {sorted(rooms - set(LAYERS))}"


def test_imports_run_down_the_layers_and_roles_never_import_each_other():
    wrong = []
    for module, targets in _graph().items():
        if module == "posttrain":
            continue
        here = _room(module)
        for target in targets:
            there = _room(target)
            if there == here:
                continue
            if LAYERS[there] > LAYERS[here]:
                wrong.append(f"{module} -> {target} (layer {LAYERS[here]} imports layer {LAYERS[there]})")
            elif here in ROLES and there in ROLES:
                wrong.append(f"{module} -> {target} (role {here} imports role {there})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)
