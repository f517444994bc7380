"""Checks of the packaged SWE tasks and of task loading/validation (``posttrain.envs.swe.tasks``).

The per-task check runs every hidden test suite twice through the real sandbox and grader (on the
snapshot, then with the reference fix applied), about 1 s each: ~50 s for the whole set, hence
``slow``; ``test_one_task_fails_before_and_passes_after_its_fix`` keeps a fast sample.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from posttrain.envs.sandbox import SandboxLimits, sandbox_capabilities
from posttrain.envs.swe.tasks import (
    PatchError,
    SWETaskError,
    apply_patch,
    load_swe_task_specs,
    load_swe_tasks,
    load_task_spec,
    parse_patch,
)
from posttrain.envs.swe.tools import grade
from posttrain.envs.swe.workspace import LocalSandboxBackend

SPECS = load_swe_task_specs()
GRADING = SandboxLimits(cpu_time_s=60, wall_time_s=120)
needs_bwrap = pytest.mark.skipif(
    sandbox_capabilities().bwrap is None,
    reason=f"bwrap unavailable ({sandbox_capabilities().bwrap_error}); apt-get install bubblewrap",
)


def _grade_snapshot(spec, *, with_fix: bool):
    workspace = LocalSandboxBackend().open_workspace(spec.repo_dir)
    try:
        if with_fix:
            apply_patch(spec.fix_patch.read_text(), workspace.root, source=str(spec.fix_patch))
        return grade(workspace, spec.hidden_test_files(), GRADING)
    finally:
        workspace.close()


def test_at_least_twenty_varied_tasks_load_as_swe_records():
    tasks = load_swe_tasks()
    assert len(tasks) >= 20
    assert len({t.task_id for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.env_name == "swe"
        assert task.reference == task.task_id
        assert task.prompt.strip()
    assert len({t.metadata["category"] for t in tasks}) >= 8


def test_each_task_has_its_own_package_and_test_module_names():
    """Unique top-level names keep mypy/ruff runs over src/ free of duplicate-module clashes."""
    packages = [sorted(p.name for p in spec.repo_dir.iterdir()) for spec in SPECS]
    flat = [name for names in packages for name in names]
    assert len(flat) == len(set(flat))
    tests = [name for spec in SPECS for name in spec.hidden_test_files()]
    assert len(tests) == len(set(tests))


@needs_bwrap
def test_one_task_fails_before_and_passes_after_its_fix():
    spec = next(s for s in SPECS if s.task_id == "swe-001-page-count")
    before = _grade_snapshot(spec, with_fix=False)
    after = _grade_snapshot(spec, with_fix=True)
    assert not before.passed and before.failures >= 1
    assert after.passed and after.tests == 3, after.output


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=[s.task_id for s in SPECS])
def test_hidden_tests_fail_on_the_snapshot_and_pass_with_the_reference_fix(spec):
    before = _grade_snapshot(spec, with_fix=False)
    assert not before.passed, before.output
    assert before.failures + before.errors >= 1
    after = _grade_snapshot(spec, with_fix=True)
    assert after.passed, after.output


def _copy_task(tmp_path: Path, task_id: str = "swe-002-fahrenheit") -> Path:
    source = next(s for s in SPECS if s.task_id == task_id).task_dir
    target = tmp_path / task_id
    shutil.copytree(source, target)
    return target


def _rewrite_json(task_dir: Path, **changes):
    path = task_dir / "task.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"problem_statement": None}, "field 'problem_statement': missing"),
        ({"problem_statement": "  "}, "field 'problem_statement': must be a non-empty string"),
        ({"task_id": "other"}, "field 'task_id': 'other' differs from the directory name"),
        ({"difficulty": "easy"}, "unknown field(s) ['difficulty']"),
        ({"category": 3}, "field 'category': must be a non-empty string"),
    ],
)
def test_bad_task_json_names_the_file_and_field(tmp_path, change, message):
    task_dir = _copy_task(tmp_path)
    _rewrite_json(task_dir, **change)
    with pytest.raises(SWETaskError) as info:
        load_task_spec(task_dir)
    assert str(task_dir / "task.json") in str(info.value)
    assert message in str(info.value)


def test_invalid_json_names_the_line(tmp_path):
    task_dir = _copy_task(tmp_path)
    (task_dir / "task.json").write_text('{\n  "task_id": "x",\n}')
    with pytest.raises(SWETaskError, match=r"task.json: line 3: invalid JSON"):
        load_task_spec(task_dir)


def test_missing_hidden_tests_and_stale_fix_are_rejected(tmp_path):
    task_dir = _copy_task(tmp_path)
    for test_file in (task_dir / "hidden_tests").iterdir():
        test_file.unlink()
    with pytest.raises(SWETaskError, match="hidden_tests: missing, or holds no test_"):
        load_task_spec(task_dir)

    task_dir = _copy_task(tmp_path / "again")
    convert = task_dir / "repo" / "thermo" / "convert.py"
    convert.write_text(convert.read_text().replace("* 9 / 5\n", "* 1.8\n"))
    with pytest.raises(SWETaskError, match="fix.patch: thermo/convert.py: hunk 1 does not apply at line"):
        load_task_spec(task_dir)


def test_empty_root_is_rejected(tmp_path):
    with pytest.raises(SWETaskError, match="holds no task directory"):
        load_swe_task_specs(tmp_path)


PATCH = """diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -1,3 +1,3 @@
 a = 1
-b = 2
+b = 20
 c = 3
@@ -5,2 +5,3 @@
 e = 5
 f = 6
+g = 7
"""


def test_patch_applies_two_hunks_exactly(tmp_path):
    """Lines a..f; hunk 1 changes line 2, hunk 2 appends a line after line 6."""
    (tmp_path / "m.py").write_text("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\nf = 6\n")
    assert [fp.path for fp in parse_patch(PATCH)] == ["m.py"]
    assert apply_patch(PATCH, tmp_path) == ["m.py"]
    assert (tmp_path / "m.py").read_text() == "a = 1\nb = 20\nc = 3\nd = 4\ne = 5\nf = 6\ng = 7\n"


def test_patch_that_does_not_match_changes_nothing(tmp_path):
    original = "a = 1\nb = 3\nc = 3\nd = 4\ne = 5\nf = 6\n"
    (tmp_path / "m.py").write_text(original)
    with pytest.raises(PatchError, match="hunk 1 does not apply"):
        apply_patch(PATCH, tmp_path)
    assert (tmp_path / "m.py").read_text() == original


def test_malformed_patch_is_rejected():
    with pytest.raises(PatchError, match="no file"):
        parse_patch("just text\n")
    with pytest.raises(PatchError, match="header says"):
        parse_patch("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n")
    with pytest.raises(PatchError, match="creating or deleting"):
        parse_patch("--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n")
