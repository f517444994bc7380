"""Self-made repair tasks graded on this machine: the patch and the tests run in the code sandbox.

``LocalSweBackend.run(instance, model_patch)`` copies the task's repository, applies the patch
and runs the test command inside ``posttrain.envs.sandbox`` (no network, resource limits), then
grades the log (``log_grading.grade_test_log``). ``local_instance_from_task_dir`` builds the
instance of a task directory of ``posttrain.envs.swe.tasks``.

Guarantees:
    * The patch step and the tests run in ``run_in_sandbox`` (its own guarantees: no network, CPU,
      wall, memory, process and file limits) on a private copy of the repository; the task's
      hidden test files are written by this process between the two steps, after refusing
      directories the patch turned into symbolic links, so a patch can neither replace them nor
      redirect their writing outside the copy.
    * A patch that does not apply, or a test run past its limit, is graded unresolved with the
      reason, never resolved.

Not guaranteed:
    * Test infrastructure: a patch may add or change files the tests load; only the hidden test
      files are restored (pytest runs them with ``--noconftest``, its own empty ``pytest.ini`` and
      plugin autoload disabled). Review resolved patches that touch test infrastructure.

Example: ``LocalSweBackend().run(local_instance_from_task_dir(task_dir), patch).grade.resolved``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from posttrain.eval.swe.eval_script import shell_quote
from posttrain.eval.swe.instances import SweGradingError, SweInfraError
from posttrain.eval.swe.log_grading import (
    MARK_END,
    MARK_PATCH_APPLIED,
    MARK_PATCH_FAILED,
    MARK_START,
    Framework,
    SweGrade,
    SweRunResult,
    grade_test_log,
)


class LocalRepairInstance(msgspec.Struct, kw_only=True, frozen=True):
    """A self-made repository-repair task graded on this machine.

    Attributes:
        instance_id: Task id.
        repo_dir: Directory with the repository at its broken state (copied, never modified).
        test_command: argv run in the repository root after the patch (``python -m pytest -rA tests``).
        fail_to_pass: Tests that must pass after the patch; empty together with ``pass_to_pass``
            means every test that runs must pass.
        pass_to_pass: Tests that must keep passing.
        hidden_files: Relative path -> content written after the patch (the grading tests).
        framework: Log format of the test command.
    """

    instance_id: str
    repo_dir: str
    test_command: list[str]
    fail_to_pass: list[str]
    pass_to_pass: list[str] = msgspec.field(default_factory=list)
    hidden_files: dict[str, str] = msgspec.field(default_factory=dict)
    framework: Framework = "pytest"


class LocalSweBackend:
    """Applies the patch and runs the tests in ``posttrain.envs.sandbox`` on a private copy of the repo.

    Two sandboxed commands: ``git apply`` of the model's patch, then (after this process has
    written the hidden test files, refusing any path whose directories the patch turned into
    symbolic links) the test command.

    Args:
        wall_time_s: Wall-clock limit of the test run (seconds); the patch step gets 60 s.
        cpu_time_s: CPU seconds per process.
        memory_bytes: Address space per process (bytes).
        isolation: Sandbox isolation mode (``auto``, ``bwrap``, ``process``).
    """

    def __init__(
        self,
        *,
        wall_time_s: float = 300.0,
        cpu_time_s: float = 240.0,
        memory_bytes: int = 2 << 30,
        isolation: Literal["auto", "bwrap", "process"] = "auto",
    ) -> None:
        self.wall_time_s = wall_time_s
        self.cpu_time_s = cpu_time_s
        self.memory_bytes = memory_bytes
        self.isolation = isolation

    def _sandbox(self, script: str, work: Path, wall_time_s: float, files: Mapping[str, str] | None = None) -> Any:
        from posttrain.envs.sandbox import SandboxError, run_in_sandbox

        try:
            return run_in_sandbox(
                ["bash", "-c", script],
                files=dict(files or {}),
                workdir=work,
                wall_time_s=wall_time_s,
                cpu_time_s=min(self.cpu_time_s, wall_time_s),
                memory_bytes=self.memory_bytes,
                max_output_bytes=1 << 20,
                isolation=self.isolation,
            )
        except SandboxError as exc:  # an infrastructure failure: retried, then left out (posttrain.eval.infra)
            raise SweInfraError(f"sandbox failed: {exc}", exc.cause) from exc

    def run(self, instance: LocalRepairInstance, model_patch: str) -> SweRunResult:
        """Evaluate ``model_patch`` on a fresh copy of ``instance.repo_dir``.

        Raises:
            SweGradingError: the repository directory is missing, or a hidden file path is absolute or
                climbs out (``..``).
            SweInfraError: the sandbox could not start (an infrastructure failure, with its cause).
        """
        started = time.monotonic()
        repo = Path(instance.repo_dir)
        if not repo.is_dir():
            raise SweGradingError(f"{instance.instance_id}: repo_dir {repo} is not a directory")
        for rel in instance.hidden_files:
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not p.parts:
                raise SweGradingError(f"{instance.instance_id}: hidden file path {rel!r} is unsafe")
        scratch = Path(tempfile.mkdtemp(prefix="posttrain-swe-"))
        try:
            work = scratch / "repo"
            shutil.copytree(repo, work, symlinks=True)
            apply = self._sandbox(
                f"""if [ ! -s .posttrain_model.patch ]; then echo "{MARK_PATCH_APPLIED} (empty patch)"; rm -f .posttrain_model.patch; exit 0; fi
if git apply --verbose --whitespace=nowarn .posttrain_model.patch; then echo "{MARK_PATCH_APPLIED}"; rc=0; else echo "{MARK_PATCH_FAILED}"; rc=3; fi
rm -f .posttrain_model.patch
exit $rc""",
                work,
                60.0,
                files={".posttrain_model.patch": model_patch},
            )
            log = apply.stdout + apply.stderr
            if MARK_PATCH_APPLIED not in apply.stdout:
                grade = SweGrade(resolved=False, status="patch_failed", reason="the model's patch does not apply")
            else:
                problem = write_hidden_files(work, instance.hidden_files)
                if problem:
                    grade = SweGrade(resolved=False, status="error", reason=problem)
                else:
                    command = " ".join(shell_quote(a) for a in instance.test_command)
                    tests = self._sandbox(
                        f'echo "{MARK_START}"\n{command}\nrc=$?\necho "{MARK_END} rc=$rc"\n', work, self.wall_time_s
                    )
                    log += tests.stdout + ("\n" + tests.stderr if tests.stderr else "")
                    if tests.timed_out:
                        grade = SweGrade(
                            resolved=False, status="timeout", reason=f"tests ran past their limit ({tests.killed_reason})"
                        )
                    else:
                        grade = grade_test_log(log, instance.fail_to_pass, instance.pass_to_pass, instance.framework)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return SweRunResult(
            instance_id=instance.instance_id, grade=grade, log=log[-200_000:], wall_s=time.monotonic() - started, backend="local"
        )


GRADER_DIR = ".posttrain_grader"
"""Directory (inside the repository copy) that receives a self-made task's hidden tests."""


def local_instance_from_task_dir(task_dir: Path) -> LocalRepairInstance:
    """A ``LocalRepairInstance`` for a self-made task directory (``posttrain.envs.swe.tasks`` layout).

    The hidden tests go to ``GRADER_DIR`` with an empty ``pytest.ini``; pytest runs with
    ``--noconftest``, ``-c`` that file and plugin autoload disabled, so configuration or
    ``conftest.py`` files a patch adds do not change how the tests run. Every hidden test must pass.

    Raises:
        SweGradingError: the task directory is malformed.
    """
    from posttrain.envs.swe.tasks import SWETaskError, load_task_spec

    try:
        spec = load_task_spec(Path(task_dir))
    except SWETaskError as exc:
        raise SweGradingError(str(exc)) from exc
    hidden = {f"{GRADER_DIR}/{rel}": data.decode("utf-8") for rel, data in spec.hidden_test_files().items()}
    hidden[f"{GRADER_DIR}/pytest.ini"] = "[pytest]\n"
    return LocalRepairInstance(
        instance_id=spec.task_id,
        repo_dir=str(spec.repo_dir),
        test_command=[
            "env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", sys.executable, "-s", "-m", "pytest", "-rA",
            "-p", "no:cacheprovider", "--noconftest", "-c", f"{GRADER_DIR}/pytest.ini", "--rootdir", GRADER_DIR, GRADER_DIR,
        ],
        fail_to_pass=[],
        pass_to_pass=[],
        hidden_files=hidden,
        framework="pytest",
    )


def write_hidden_files(work: Path, files: Mapping[str, str]) -> str | None:
    """Write the hidden test files into ``work``; return why not when the patch made a path unsafe.

    Every directory on the way must be a real directory (not a symbolic link the patch created),
    and an existing file at the target is unlinked first, so nothing is written outside ``work``.
    """
    for rel, text in files.items():
        current = work
        for part in Path(rel).parts[:-1]:
            current = current / part
            if current.is_symlink():
                return f"hidden file {rel!r}: {current.relative_to(work)} is a symbolic link after the patch"
            current.mkdir(exist_ok=True)
        target = work / rel
        if target.is_symlink() or target.exists():
            if target.is_dir() and not target.is_symlink():
                return f"hidden file {rel!r}: the patch made it a directory"
            target.unlink()
        target.write_text(text, encoding="utf-8")
    return None
