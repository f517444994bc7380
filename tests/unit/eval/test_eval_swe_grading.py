"""SWE log grading (pytest and Django logs), the eval script, and the local sandboxed backend."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from posttrain.envs.swe.tasks import default_tasks_root
from posttrain.eval.swe.eval_script import REPO_SPECS, build_eval_script, eval_targets
from posttrain.eval.swe.instances import load_swe_instances
from posttrain.eval.swe.local_backend import GRADER_DIR, LocalSweBackend, local_instance_from_task_dir
from posttrain.eval.swe.log_grading import (
    MARK_END,
    MARK_PATCH_FAILED,
    MARK_START,
    grade_test_log,
    parse_django_log,
    parse_pytest_log,
)
from posttrain.eval.swe.patches import extract_patch

PYTEST_LOG = """
tests/test_a.py::test_one PASSED                                         [ 25%]
tests/test_a.py::test_two FAILED                                         [ 50%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_pycode_ast.py::test_unparse[a + b-a + b]
FAILED tests/test_a.py::test_two - AssertionError: boom
ERROR tests/test_b.py::test_setup
SKIPPED [1] tests/test_c.py:10: needs network
XFAIL tests/test_c.py::test_known - reason
XPASS tests/test_c.py::test_strict
"""

DJANGO_LOG = """Testing against Django installed in '/testbed/django'
test_ok (auth_tests.test_forms.UserCreationFormTest) ... ok
test_documented (auth_tests.test_forms.UserCreationFormTest)
UserCreationForm password validation uses all of the form's data. ... ok
test_broken (auth_tests.test_forms.AuthenticationFormTest) ... FAIL
test_noisy (auth_tests.test_forms.AuthenticationFormTest) ... some printed output
ok
test_skip (auth_tests.test_forms.X) ... skipped 'no db'
test_xf (auth_tests.test_forms.X) ... expected failure

======================================================================
ERROR: test_late (auth_tests.test_forms.Y)
----------------------------------------------------------------------
"""


def test_pytest_log_statuses_use_first_token_names_like_the_dataset() -> None:
    s = parse_pytest_log(PYTEST_LOG)
    assert s["tests/test_a.py::test_one"] == "PASSED"
    assert s["tests/test_a.py::test_two"] == "FAILED"
    assert s["tests/test_pycode_ast.py::test_unparse[a"] == "PASSED"  # as SWE-bench spells it
    assert s["tests/test_b.py::test_setup"] == "ERROR"
    assert s["tests/test_c.py::test_known"] == "XFAIL"
    assert s["tests/test_c.py::test_strict"] == "FAILED"  # XPASS counts as a failure
    assert not any(k.startswith("[") for k in s)


def test_django_log_statuses_including_docstring_and_split_lines() -> None:
    s = parse_django_log(DJANGO_LOG)
    assert s["test_ok (auth_tests.test_forms.UserCreationFormTest)"] == "PASSED"
    assert s["UserCreationForm password validation uses all of the form's data."] == "PASSED"
    assert s["test_broken (auth_tests.test_forms.AuthenticationFormTest)"] == "FAILED"
    assert s["test_noisy (auth_tests.test_forms.AuthenticationFormTest)"] == "PASSED"
    assert s["test_skip (auth_tests.test_forms.X)"] == "SKIPPED"
    assert s["test_xf (auth_tests.test_forms.X)"] == "XFAIL"
    assert s["test_late (auth_tests.test_forms.Y)"] == "ERROR"


def _wrap(body: str) -> str:
    return f">>>>> PATCH_APPLIED\n{MARK_START}\n{body}\n{MARK_END} rc=0\n"


def test_resolved_only_when_every_fail_to_pass_and_pass_to_pass_test_passes() -> None:
    log = _wrap(PYTEST_LOG)
    good = grade_test_log(log, ["tests/test_a.py::test_one"], ["tests/test_c.py::test_known"], "pytest")
    assert good.resolved and good.status == "resolved"
    bad = grade_test_log(log, ["tests/test_a.py::test_one"], ["tests/test_a.py::test_two"], "pytest")
    assert not bad.resolved and bad.pass_to_pass_failed == ["tests/test_a.py::test_two"]
    missing = grade_test_log(log, ["tests/test_a.py::test_never_ran"], [], "pytest")
    assert not missing.resolved and missing.fail_to_pass_failed == ["tests/test_a.py::test_never_ran"]


def test_patch_failure_and_missing_markers_are_never_resolved() -> None:
    assert grade_test_log(f"{MARK_PATCH_FAILED}\n", ["t"], [], "pytest").status == "patch_failed"
    assert grade_test_log("PASSED t\n", ["t"], [], "pytest").status == "no_test_run"
    with pytest.raises(ValueError, match="framework"):
        grade_test_log("", [], [], "junit")  # type: ignore[arg-type]


def test_all_tests_required_mode_when_lists_are_empty() -> None:
    assert grade_test_log(_wrap("PASSED t::a\nPASSED t::b"), [], [], "pytest").resolved
    assert not grade_test_log(_wrap("PASSED t::a\nSKIPPED t::b"), [], [], "pytest").resolved
    assert not grade_test_log(_wrap("no tests ran"), [], [], "pytest").resolved


def test_swe_bench_instances_load_with_tests_and_images() -> None:
    instances = load_swe_instances()
    assert len(instances) == 50
    inst = instances["django__django-11790"]
    assert inst.image == "swebench/sweb.eval.x86_64.django_1776_django-11790:latest"
    assert inst.env_image.startswith("sweb.env.x86_64.")
    assert all(i.fail_to_pass for i in instances.values())


def test_test_targets_and_eval_script_for_django_and_sphinx() -> None:
    instances = load_swe_instances()
    dj = instances["django__django-11790"]
    assert eval_targets(dj.test_patch, REPO_SPECS["django/django"]) == ["auth_tests.test_forms"]
    sx = instances["sphinx-doc__sphinx-11510"]
    assert eval_targets(sx.test_patch, REPO_SPECS["sphinx-doc/sphinx"]) == ["tests/test_directive_other.py"]
    script = build_eval_script(dj)
    assert f"git checkout '{dj.base_commit}' -- 'tests/auth_tests/test_forms.py'" in script
    assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 'auth_tests.test_forms'" in script
    assert script.index("model.patch") < script.index("test.patch") < script.index(MARK_START)
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)  # valid bash


def test_gold_patch_logs_grade_resolved_for_every_instance() -> None:
    """Synthetic 'all pass' logs in each framework's format resolve every instance (names round-trip)."""
    for inst in load_swe_instances().values():
        framework = REPO_SPECS[inst.repo].framework
        tests = inst.fail_to_pass + inst.pass_to_pass
        body = "\n".join(f"{t} ... ok" if framework == "django" else f"PASSED {t}" for t in tests)
        assert grade_test_log(_wrap(body), inst.fail_to_pass, inst.pass_to_pass, framework).resolved, inst.instance_id


def test_extract_patch_takes_last_diff_block_or_raw_diff() -> None:
    resp = "first\n```diff\n--- a/x\n+++ b/x\n```\nbetter:\n```diff\n--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n```\n"
    assert extract_patch(resp) == "--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_patch("Here:\ndiff --git a/z b/z\n--- a/z\n") == "diff --git a/z b/z\n--- a/z\n"
    assert extract_patch("I don't know") is None


TASK = default_tasks_root() / "swe-001-page-count"


@pytest.fixture(scope="module")
def local() -> LocalSweBackend:
    return LocalSweBackend(wall_time_s=60.0)


def test_local_backend_resolves_the_reference_fix(local: LocalSweBackend) -> None:
    result = local.run(local_instance_from_task_dir(TASK), (TASK / "fix.patch").read_text())
    assert result.grade.resolved, result.log[-2000:]
    assert result.backend == "local" and len(result.grade.fail_to_pass_passed) == 3


def test_local_backend_empty_and_broken_patches_are_unresolved(local: LocalSweBackend) -> None:
    inst = local_instance_from_task_dir(TASK)
    assert local.run(inst, "").grade.status == "unresolved"
    broken = "--- a/pager/pages.py\n+++ b/pager/pages.py\n@@ -1,1 +1,1 @@\n-this line is not there\n+x\n"
    assert local.run(inst, broken).grade.status == "patch_failed"


def test_patch_cannot_pass_by_adding_conftest_or_replacing_hidden_tests(local: LocalSweBackend) -> None:
    """Attack: a patch adds a root conftest.py that skips every test, and pre-creates the grader's
    test file with a passing test. The grader disables conftest files and overwrites its files."""
    inst = local_instance_from_task_dir(TASK)
    attack = (
        "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1,3 @@\n+import pytest\n+def pytest_runtest_call(item):\n+    pytest.skip('x')\n"
        f"--- /dev/null\n+++ b/{GRADER_DIR}/test_pager.py\n@@ -0,0 +1,2 @@\n+def test_partial_last_page_is_counted():\n+    pass\n"
    )
    result = local.run(inst, attack)
    assert ">>>>> PATCH_APPLIED" in result.log
    assert not result.grade.resolved
    assert ".posttrain_grader/test_pager.py::test_partial_last_page_is_counted" in result.grade.fail_to_pass_failed


def test_patch_turning_the_grader_dir_into_a_symlink_is_refused(local: LocalSweBackend, tmp_path: Path) -> None:
    """Attack: a patch makes the grader directory a symbolic link (git apply creates symlinks)."""
    inst = local_instance_from_task_dir(TASK)
    attack = f"diff --git a/{GRADER_DIR} b/{GRADER_DIR}\nnew file mode 120000\n--- /dev/null\n+++ b/{GRADER_DIR}\n@@ -0,0 +1 @@\n+/tmp\n\\ No newline at end of file\n"
    result = local.run(inst, attack)
    assert result.grade.status == "error" and "symbolic link" in result.grade.reason
