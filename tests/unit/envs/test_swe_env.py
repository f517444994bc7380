"""Episodes of the SWE environment driven by scripted actions (``posttrain.envs.swe.env``).

Commands and grading run in the real sandbox. Without bubblewrap the sandbox falls back to process
mode, whose dedicated uid cannot run an interpreter installed under /root (as here), so the
module is skipped there with the reason.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from outside_kill import OutsideKiller
from posttrain.envs.base import Environment, Episode, InfraError
from posttrain.envs.sandbox import SandboxError, SandboxLimits, SandboxUnavailableError, sandbox_capabilities
from posttrain.envs.swe.env import SWEEnvironment, SWELimits
from posttrain.envs.swe.tasks import load_swe_tasks, parse_patch
from posttrain.envs.swe.workspace import LocalSandboxBackend
from posttrain.envs.tool_calls import ToolCall, format_tool_call
from posttrain.records import Task

TASKS = {t.task_id: t for t in load_swe_tasks()}
PAGE_TASK = TASKS["swe-001-page-count"]
pytestmark = pytest.mark.skipif(
    sandbox_capabilities().bwrap is None,
    reason=f"bwrap unavailable ({sandbox_capabilities().bwrap_error}); apt-get install bubblewrap",
)


def call(name: str, **arguments) -> str:
    return format_tool_call(ToolCall(name, arguments))


def step(episode, action: str):
    return asyncio.run(episode.step(action))


@pytest.fixture
def env():
    return SWEEnvironment()


@pytest.fixture
def episode(env):
    episode = env.start(PAGE_TASK)
    yield episode
    episode.close()


def test_environment_and_episode_satisfy_the_protocols(env, episode):
    assert isinstance(env, Environment)
    assert isinstance(episode, Episode)
    assert env.name == "swe"


def test_initial_messages_describe_tools_format_and_problem(episode):
    system, user = episode.messages()
    assert system["role"] == "system" and user["role"] == "user"
    for tool in ("bash", "view", "edit", "submit"):
        assert f"- {tool}:" in system["content"]
    assert "<tool_call>" in system["content"]
    assert PAGE_TASK.prompt in user["content"]
    assert "pager/pages.py" in user["content"]
    assert "test_pager" not in system["content"] + user["content"]


def test_view_edit_submit_with_the_reference_change_earns_reward_one(env):
    """One view, one edit per hunk of fix.patch, then submit: all 3 hidden tests pass."""
    episode = env.start(PAGE_TASK)
    try:
        viewed = step(episode, "Let me look.\n" + call("view", path="pager/pages.py", start_line=4, end_line=8))
        assert not viewed.done
        assert "     8\t    return total_items // per_page" in viewed.observation
        patch = parse_patch(env.spec(PAGE_TASK.reference).fix_patch.read_text())
        for file_patch in patch:
            for hunk in file_patch.hunks:
                edited = step(episode, call("edit", path=file_patch.path, old_str="".join(hunk.old_lines),
                                            new_str="".join(hunk.new_lines)))
                assert "edited pager/pages.py" in edited.observation
        final = step(episode, call("submit"))
    finally:
        episode.close()
    assert final.done and final.reward == 1.0 and final.finish_reason == "stop"
    assert final.metrics["correct"] == 1.0 and final.metrics["hidden_tests"] == 3.0
    assert final.metrics["view_calls"] == 1.0 and final.metrics["edit_calls"] == 1.0


def test_wrong_edit_earns_reward_zero(episode):
    wrong = call("edit", path="pager/pages.py", old_str="return total_items // per_page",
                 new_str="return total_items // per_page + 1")
    assert "edited" in step(episode, wrong).observation
    final = step(episode, call("submit"))
    assert final.done and final.reward == 0.0 and final.finish_reason == "stop"
    assert final.metrics["hidden_failures"] >= 1.0


def test_malformed_tool_call_gets_an_error_observation_and_the_episode_goes_on(episode):
    result = step(episode, '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>')
    assert not result.done
    assert result.observation.startswith('<tool_result name="error">')
    assert "malformed tool call: tool call 1: invalid JSON" in result.observation
    assert episode.metrics["malformed_actions"] == 1.0


def test_three_malformed_actions_in_a_row_end_with_tool_error(episode):
    assert not step(episode, "no call at all").done
    assert not step(episode, call("frobnicate")).done
    ended = step(episode, call("view", path=3))
    assert ended.done and ended.reward == 0.0 and ended.finish_reason == "tool_error"
    with pytest.raises(RuntimeError, match="already finished"):
        step(episode, call("submit"))


def test_a_well_formed_action_resets_the_malformed_count(episode):
    step(episode, "thinking only")
    step(episode, "still thinking")
    assert not step(episode, call("bash", command="true")).done
    assert not step(episode, "and again").done


def test_invalid_arguments_are_reported_with_their_name(episode):
    result = step(episode, call("view", file="x.py"))
    assert "view: unknown argument(s) ['file']" in result.observation
    result = step(episode, call("edit", path="pager/pages.py", old_str="x"))
    assert "edit: missing required argument 'new_str'" in result.observation


def test_bash_runs_in_the_repository_root(episode):
    result = step(episode, call("bash", command="ls; python -c 'import pager; print(pager.page_count(9, 3))'"))
    assert "exit code: 0" in result.observation
    assert "pager" in result.observation and "\n3\n" in result.observation + "\n"


def test_edit_failures_are_explained_and_do_not_count_as_malformed(episode):
    missing = step(episode, call("edit", path="pager/pages.py", old_str="no such text", new_str="x"))
    assert "old_str not found in pager/pages.py" in missing.observation
    twice = step(episode, call("edit", path="pager/pages.py", old_str="    if ", new_str="    if not "))
    assert "occurs 2 times" in twice.observation and "[6, 13]" in twice.observation
    absent = step(episode, call("view", path="nope.py"))
    assert "nope.py: no such file" in absent.observation
    same = step(episode, call("edit", path="pager/pages.py", old_str="def page_slice", new_str="def page_slice"))
    assert "identical" in same.observation
    assert episode.metrics["malformed_actions"] == 0.0
    assert episode.metrics["tool_failures"] == 4.0


def test_paths_outside_the_repository_and_links_are_refused(episode):
    outside = step(episode, call("view", path="/etc/passwd"))
    assert "outside the repository" in outside.observation
    dotdot = step(episode, call("view", path="../../../etc/passwd"))
    assert "'..' is not allowed" in dotdot.observation
    step(episode, call("bash", command="ln -s /etc/passwd link.txt; mkdir d; ln -s /etc d/etc"))
    assert "symbolic link" in step(episode, call("view", path="link.txt")).observation
    assert "symbolic link" in step(episode, call("edit", path="d/etc/passwd", old_str="root", new_str="x")).observation
    assert Path("/etc/passwd").read_text().startswith("root:")  # the host file was never touched


def test_directory_view_lists_files_and_absolute_workspace_paths_work(episode):
    listing = step(episode, call("view", path="."))
    assert "pager/" in listing.observation and "pager/pages.py" in listing.observation
    absolute = step(episode, call("view", path="/workspace/pager/__init__.py"))
    assert "Split item lists into pages" in absolute.observation


def test_hidden_tests_are_not_reachable_from_the_sandbox(episode):
    """Neither at their host path nor anywhere in the workspace or /tmp before submit."""
    hidden = episode.spec.hidden_tests_dir / "test_pager.py"
    result = step(episode, call("bash", command=f"cat {hidden}"))
    assert "No such file or directory" in result.observation
    assert "Ten items, three per page" not in result.observation
    # Exact name: a checkout under /tmp has its read-only virtualenv there (networkx ships test_pagerank.py).
    found = step(episode, call("bash", command="find /workspace /tmp -name 'test_pager.py'"))
    assert "test_pager.py" not in found.observation


CHEAT_CONFTEST = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


def test_planted_conftest_fake_pytest_and_sitecustomize_do_not_fool_the_grader(episode):
    """Without fixing the bug, plant a conftest that turns every failure into a pass, a fake
    ``pytest`` package that exits 0 and a sitecustomize; the controls show each cheat works on a
    naive ``python -m pytest`` in the repository, yet grading still runs the real tests."""
    root = episode.workspace.root
    episode.workspace.add_files({
        "conftest.py": CHEAT_CONFTEST.encode(),
        "test_fail.py": b"def test_fails():\n    assert False\n",
        "pytest/__init__.py": b"",
        "pytest/__main__.py": b"import sys\nsys.exit(0)\n",
        "sitecustomize.py": b"open('SITE_RAN', 'w').close()\n",
    })
    fake = step(episode, call("bash", command="python -m pytest -q test_fail.py; echo rc=$?"))
    assert "rc=0" in fake.observation  # the fake pytest package shadows the real one
    cheat = step(episode, call("bash", command="python -P -m pytest -q -p no:cacheprovider test_fail.py; echo rc=$?"))
    assert "1 passed" in cheat.observation and "rc=0" in cheat.observation  # the conftest cheat works
    (root / "SITE_RAN").unlink(missing_ok=True)
    final = step(episode, call("submit"))
    assert final.reward == 0.0
    assert final.metrics["hidden_tests"] == 3.0 and final.metrics["hidden_failures"] >= 1.0
    assert not (root / "SITE_RAN").exists()


def test_exiting_zero_during_import_does_not_pass(episode):
    step(episode, call("edit", path="pager/__init__.py", old_str='"""Split item lists into pages."""',
                       new_str='"""Split item lists into pages."""\nimport os\nos._exit(0)'))
    final = step(episode, call("submit"))
    assert final.reward == 0.0 and final.metrics["hidden_tests"] == 0.0


def test_a_bash_call_killed_from_outside_is_an_infra_error_not_an_exit_code_shown_to_the_agent(episode):
    """Issue 32: SIGKILL of a ``bash`` call from outside used to come back as ``exit code: 137``, the
    policy's mistake; it is now ``InfraError`` (cause ``tool_killed``), which ends the episode untrained."""
    marker = f"victim-{uuid.uuid4().hex}"
    killer = OutsideKiller(marker, timeout_s=60)
    with pytest.raises(InfraError, match="bash tool call killed from outside") as failure:
        step(episode, call("bash", command=f"sleep 60; : {marker}"))
    assert killer.join() and failure.value.cause == "tool_killed"


def test_a_grading_run_killed_from_outside_is_an_infra_error_not_reward_zero():
    """Issue 32: the reference fix, then repository code that sleeps while pytest imports it, and the
    grading run SIGKILLed from outside. Before: ``reward 0.0, finish_reason stop, hidden_tests 0``,
    trained. Now: ``InfraError`` cause ``grader_killed``."""
    env = SWEEnvironment(limits=SWELimits(grading=SandboxLimits(cpu_time_s=60, wall_time_s=60)))
    episode = env.start(PAGE_TASK)
    try:
        _apply_reference_fix(env, episode)
        step(episode, call("edit", path="pager/__init__.py", old_str='"""Split item lists into pages."""',
                           new_str='"""Split item lists into pages."""\nimport time\ntime.sleep(60)'))
        killer = OutsideKiller("--junitxml", timeout_s=60)  # the grading run's own command line
        with pytest.raises(InfraError, match="grading run was killed from outside") as failure:
            step(episode, call("submit"))
        assert killer.join() and failure.value.cause == "grader_killed"
    finally:
        episode.close()


class _NoPythonBackend:
    """Local workspaces whose commands find no ``python`` (as a sandbox whose interpreter is missing)."""

    def open_workspace(self, snapshot: Path):
        workspace = LocalSandboxBackend().open_workspace(snapshot)
        run = workspace.run
        workspace.run = lambda command, limits: run(f"PATH=/nonexistent {command}", limits)  # type: ignore[method-assign]
        return workspace


def test_a_grader_that_cannot_start_is_an_infra_error_even_for_the_reference_fix():
    """Issue 32: the grader's ``python`` not found (exit 127) gave the reference fix reward 0.0; it is now
    ``InfraError`` cause ``grader_not_started``, naming the exit code."""
    env = SWEEnvironment(backend=_NoPythonBackend())
    episode = env.start(PAGE_TASK)
    try:
        _apply_reference_fix(env, episode)
        with pytest.raises(InfraError, match=r"the grader did not start \(exit code 127\)") as failure:
            step(episode, call("submit"))
        assert failure.value.cause == "grader_not_started"
    finally:
        episode.close()


def test_sandbox_failures_are_infrastructure_errors_with_their_cause():
    """No bubblewrap where ``isolation="bwrap"`` is asked for, or a sandbox that cannot start: infra errors."""
    assert issubclass(SandboxError, InfraError) and SandboxError("x").cause == "sandbox_error"
    assert SandboxUnavailableError("no bwrap").cause == "sandbox_unavailable"


def _apply_reference_fix(env: SWEEnvironment, episode) -> None:
    for file_patch in parse_patch(env.spec(PAGE_TASK.reference).fix_patch.read_text()):
        for hunk in file_patch.hunks:
            step(episode, call("edit", path=file_patch.path, old_str="".join(hunk.old_lines),
                               new_str="".join(hunk.new_lines)))


def test_extra_calls_beyond_the_per_action_cap_are_not_run():
    env = SWEEnvironment(limits=SWELimits(max_calls_per_action=2))
    episode = env.start(PAGE_TASK)
    try:
        result = step(episode, call("bash", command="echo 1") + call("bash", command="echo 2")
                      + call("submit"))
    finally:
        episode.close()
    assert not result.done
    assert "only the first 2 of 3 tool calls were run" in result.observation


def test_close_deletes_the_workspace(env):
    episode = env.start(PAGE_TASK)
    root = episode.workspace.root
    assert (root / "pager" / "pages.py").is_file()
    episode.close()
    episode.close()
    assert not root.exists()


def test_start_rejects_foreign_tasks_and_bad_references(env, tmp_path):
    with pytest.raises(ValueError, match="task.env_name"):
        env.start(Task(task_id="x", env_name="gsm8k", prompt="p", reference="swe-001-page-count"))
    with pytest.raises(ValueError, match="task.reference"):
        env.start(Task(task_id="x", env_name="swe", prompt="p", reference="../etc"))


def test_backend_is_pluggable(tmp_path):
    """A backend that records which snapshots it opened, wrapping the local one."""
    opened = []

    class RecordingBackend:
        def open_workspace(self, snapshot: Path):
            opened.append(snapshot)
            return LocalSandboxBackend(temp_root=tmp_path).open_workspace(snapshot)

    episode = SWEEnvironment(backend=RecordingBackend()).start(PAGE_TASK)
    try:
        assert opened == [episode.spec.repo_dir]
        assert str(episode.workspace.root).startswith(str(tmp_path))
    finally:
        episode.close()
