"""The bash script a SWE-bench evaluation pod runs, and how each repository runs its tests.

The eval script follows the SWE-bench harness's steps (our own script): apply the model patch
(``git apply``, falling back to ``patch --fuzz``), reset the test files the test patch touches to
the base commit, apply the test patch, run the repository's test command on those test files, and
print the markers (``log_grading.MARK_*``) that the grader checks.

Not guaranteed:
    * The per-repository test commands (``REPO_SPECS``) cover the repositories in our data
      (django, sphinx) and fall back to ``pytest -rA``; other repositories may need an entry.
    * Test infrastructure: a patch may add or change files the tests load (``conftest.py``,
      ``pytest.ini``, the Django test settings); only the files the test patch touches are
      restored. Review resolved patches that touch them.

Example: ``print(build_eval_script(load_swe_instances()["django__django-11790"]))``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from posttrain.eval.swe.instances import SweInstance
from posttrain.eval.swe.log_grading import (
    MARK_END,
    MARK_PATCH_APPLIED,
    MARK_PATCH_FAILED,
    MARK_START,
    MARK_TEST_PATCH_FAILED,
    Framework,
)
from posttrain.eval.swe.patches import patch_paths


@dataclass(frozen=True)
class RepoSpec:
    """How to run one repository's tests in its SWE-bench image.

    Attributes:
        framework: Log format (``pytest`` or ``django``).
        test_command: Shell command; the test targets are appended.
        targets: ``files`` (test file paths) or ``django_modules`` (``tests/a/test_b.py`` -> ``a.test_b``).
        setup: Shell lines run before the tests (environment variables, config tweaks).
    """

    framework: Framework
    test_command: str
    targets: Literal["files", "django_modules"] = "files"
    setup: tuple[str, ...] = field(default=())


REPO_SPECS: dict[str, RepoSpec] = {
    "django/django": RepoSpec(
        framework="django",
        test_command="./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
        targets="django_modules",
        setup=("export LANG=en_US.UTF-8", "export LC_ALL=en_US.UTF-8", "export LANGUAGE=en_US:en"),
    ),
    "sphinx-doc/sphinx": RepoSpec(
        framework="pytest",
        test_command="tox --current-env -epy39 -v --",
        setup=("sed -i 's/pytest -rA/pytest/; s/pytest/pytest -rA/' tox.ini",),
    ),
}
"""Per-repository test commands for the repositories in our data; others use ``DEFAULT_SPEC``."""

DEFAULT_SPEC = RepoSpec(framework="pytest", test_command="python -m pytest -rA -p no:cacheprovider")
"""Fallback: plain pytest with the ``-rA`` summary."""

def eval_targets(test_patch: str, spec: RepoSpec) -> list[str]:
    """What to pass to the test command: the test files of ``test_patch`` (or Django module labels).

    Only Python test modules count (``test*.py`` / ``*_test.py`` / ``tests.py``); fixture files the
    test patch adds (``tests/roots/...rst``) are not targets.
    """
    files = [
        p
        for p in patch_paths(test_patch)
        if p.endswith(".py") and (Path(p).name.startswith("test") or Path(p).name.endswith("_test.py"))
    ]
    if spec.targets == "django_modules":
        return [p.removeprefix("tests/").removesuffix(".py").replace("/", ".") for p in files if p.startswith("tests/")]
    return files


def build_eval_script(instance: SweInstance, *, patch_dir: str = "/eval", workdir: str = "/testbed") -> str:
    """The bash script a SWE-bench evaluation pod runs (reads ``model.patch`` and ``test.patch`` from ``patch_dir``).

    Steps: activate the image's ``testbed`` conda environment when present; apply the model patch
    (``git apply``, else ``patch --fuzz=5``; failure prints ``MARK_PATCH_FAILED`` and exits 3);
    reset the files the test patch touches to ``base_commit``; apply the test patch (failure
    prints ``MARK_TEST_PATCH_FAILED``, exit 4); run the repository's setup lines and test command
    between ``MARK_START`` and ``MARK_END``.
    """
    spec = REPO_SPECS.get(instance.repo, DEFAULT_SPEC)
    targets = " ".join(shell_quote(t) for t in eval_targets(instance.test_patch, spec))
    reset = "\n".join(
        f"git checkout {shell_quote(instance.base_commit)} -- {shell_quote(p)} 2>/dev/null || true"
        for p in patch_paths(instance.test_patch)
    )
    setup = "\n".join(spec.setup)
    return f"""#!/bin/bash
# posttrain SWE eval script for {instance.instance_id}
set -u
if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; conda activate testbed; fi
cd {shell_quote(workdir)}
git config --global --add safe.directory {shell_quote(workdir)} 2>/dev/null || true
if [ -s {patch_dir}/model.patch ]; then
  if git apply --verbose --whitespace=nowarn {patch_dir}/model.patch || patch --batch --fuzz=5 -p1 -i {patch_dir}/model.patch; then
    echo "{MARK_PATCH_APPLIED}"
  else
    echo "{MARK_PATCH_FAILED}"; exit 3
  fi
else
  echo "{MARK_PATCH_APPLIED} (empty patch)"
fi
{reset}
if ! git apply --verbose --whitespace=nowarn {patch_dir}/test.patch; then echo "{MARK_TEST_PATCH_FAILED}"; exit 4; fi
{setup}
echo "{MARK_START}"
{spec.test_command} {targets}
rc=$?
echo "{MARK_END} rc=$rc"
exit 0
"""


def shell_quote(text: str) -> str:
    """``text`` as one single-quoted POSIX shell word (embedded quotes escaped)."""
    return "'" + text.replace("'", "'\"'\"'") + "'"
