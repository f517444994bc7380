"""SWE-style repository repair: the agent fixes a bug in a small repository; hidden tests give the reward.

``SWEEnvironment(tasks_root)`` (``name = "swe"``) starts one ``SWEEpisode`` per ``Task``: the
task's repository snapshot is copied into a private workspace, the agent reads the problem
statement and calls tools in the shared tool-call format (``posttrain.envs.tool_calls``):
``bash`` (a command in the sandbox, cwd = the repository), ``view``, ``edit`` and ``submit``.
After ``submit`` the hidden tests are copied in and run (``tools.grade``); the reward is 1.0 when
they all pass, else 0.0.

Episode rules (what ``step`` does with one action):
    * Calls run in order, at most ``SWELimits.max_calls_per_action`` per action (extra calls are
      not run; the observation says so). A ``submit`` grades at once; calls after it are ignored.
    * A *malformed action* is one whose tool calls do not parse, that holds no tool call, or that
      holds a call with an unknown tool or invalid arguments. It gets an error observation.
      After ``SWELimits.max_consecutive_malformed`` malformed actions in a row the episode ends:
      ``finish_reason="tool_error"``, reward 0.0. A well-formed action resets the count.
    * A well-formed call that fails (file not found, ``old_str`` not unique, a failing command)
      is an ordinary observation, never an episode end.
    * Finish reasons set here: ``stop`` (submitted) and ``tool_error``. The agent loop enforces
      turn, token and wall-time budgets and reports ``length``/``timeout`` itself.
    * An infrastructure failure is raised as ``InfraError`` (``posttrain.envs.base``), never
      blamed on the agent: the sandbox cannot start or clean up (``SandboxError``), a ``bash``
      call killed from outside (``tool_killed``), a grading run killed from outside
      (``grader_killed``) or one whose python or pytest could not start (``grader_not_started``,
      e.g. exit 127). The agent loop ends such an episode as ``outcome="infra_error"``.

Guarantees (with ``LocalSandboxBackend``; the sandbox's and the grader's own lists apply too):
    * Each episode works on its own copy of the snapshot, owned by its own sandbox uid; the
      task directory (snapshot, hidden tests, ``fix.patch``) is never writable by the agent and,
      in bwrap mode, not visible to it. ``close`` deletes the copy.
    * The hidden tests enter the workspace only inside ``submit``; no process of the agent is
      alive between tool calls, so nothing can watch for them.
    * The reward is 1.0 only through ``tools.grade``; nothing the agent prints sets it.
    * An episode cannot hang the caller: every command has CPU and wall limits, and a run of
      malformed actions ends the episode.

Not guaranteed:
    * Total episode time, turns and tokens: the agent loop's job.
    * Total disk use of a workspace (each file is capped, their number is not).
    * In process mode (no bwrap) the agent can read world-readable host files, the hidden
      tests included; use bwrap for training.

Execution backends are pluggable (``posttrain.envs.swe.workspace``):
``SandboxBackend.open_workspace(snapshot) -> Workspace``. ``LocalSandboxBackend`` uses
``posttrain.envs.sandbox`` on this machine (see its Guarantees); a Kubernetes backend running
SWE-bench images in pods implements the same two Protocols.

Run ``python -m posttrain.envs.swe.env TASK_ID`` to play the reference fix of one packaged task
through an episode and print the reward.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.envs.base import InfraError, StepResult
from posttrain.envs.sandbox import SandboxLimits
from posttrain.envs.swe.tasks import ENV_NAME, SWETaskSpec, default_tasks_root, load_task_spec
from posttrain.envs.swe.tools import (
    ToolArgumentError,
    ToolUseError,
    Workspace,
    describe_tools,
    grade,
    run_bash,
    run_edit,
    run_view,
    validate_arguments,
)
from posttrain.envs.swe.workspace import LocalSandboxBackend, SandboxBackend
from posttrain.envs.tool_calls import (
    TOOL_CALL_FORMAT_PROMPT,
    ToolCallError,
    format_tool_result,
    parse_tool_calls,
)
from posttrain.records import Task


@dataclass(frozen=True)
class SWELimits:
    """Limits of one SWE episode (turn/token/time budgets belong to the agent loop).

    Attributes:
        bash: Sandbox limits of one ``bash`` call.
        grading: Sandbox limits of the hidden-test run after ``submit``.
        max_observation_chars: Characters of one tool's output shown to the agent (head and tail
            kept around a truncation marker).
        max_calls_per_action: Tool calls run per action; the rest are skipped with a note.
        max_consecutive_malformed: Malformed actions in a row that end the episode (``tool_error``).
        max_file_bytes: Largest file ``view``/``edit`` handle, bytes.
        max_list_entries: Entries a directory ``view`` lists.
    """

    bash: SandboxLimits = field(default_factory=lambda: SandboxLimits(cpu_time_s=10, wall_time_s=30))
    grading: SandboxLimits = field(default_factory=lambda: SandboxLimits(cpu_time_s=60, wall_time_s=120))
    max_observation_chars: int = 8000
    max_calls_per_action: int = 8
    max_consecutive_malformed: int = 3
    max_file_bytes: int = 1 << 20
    max_list_entries: int = 200

    def __post_init__(self) -> None:
        """Reject non-positive counts, naming the field."""
        for name in ("max_observation_chars", "max_calls_per_action", "max_consecutive_malformed",
                     "max_file_bytes", "max_list_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"SWELimits.{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_observation_chars < 64:
            raise ValueError(f"SWELimits.max_observation_chars: must be >= 64, got {self.max_observation_chars}")


SYSTEM_PROMPT = """You are a software engineer fixing a bug in a Python repository. The repository is \
your current working directory. Find the cause of the problem described by the user, change the \
code so the problem is gone, and keep the existing behaviour otherwise. Hidden tests decide whether \
your fix is right; they are run after you call submit.

Tools:
{tools}

{format}
Call submit exactly once, when you are done."""
"""System prompt template; ``{tools}`` and ``{format}`` are filled in by ``SWEEpisode.messages``."""


class SWEEpisode:
    """One repair attempt on one task; see the module docstring for the rules of ``step``."""

    def __init__(self, task: Task, spec: SWETaskSpec, workspace: Workspace, limits: SWELimits) -> None:
        """Wrap an opened ``workspace`` for ``task`` (``SWEEnvironment.start`` builds this)."""
        self.task = task
        self.spec = spec
        self.workspace = workspace
        self.limits = limits
        self.finished = False
        self._consecutive_malformed = 0
        self.metrics: dict[str, float] = {
            "tool_calls": 0.0,
            "bash_calls": 0.0,
            "view_calls": 0.0,
            "edit_calls": 0.0,
            "tool_failures": 0.0,
            "malformed_actions": 0.0,
            "submitted": 0.0,
            "correct": 0.0,
        }
        listing = []
        for path in sorted(spec.repo_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                listing.append(path.relative_to(spec.repo_dir).as_posix())
        self._listing = listing[: limits.max_list_entries]

    def messages(self) -> list[dict[str, str]]:
        """System prompt (tools and call format) and the user's problem statement with the file list."""
        system = SYSTEM_PROMPT.format(tools=describe_tools(), format=TOOL_CALL_FORMAT_PROMPT)
        files = "\n".join(self._listing)
        user = f"{self.task.prompt}\n\nRepository files:\n{files}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def step(self, action_text: str) -> StepResult:
        """Run the action's tool calls (in a worker thread, the sandbox blocks) and return the result.

        Raises:
            RuntimeError: the episode has already finished.
            InfraError: the infrastructure failed (module docstring): not the agent's doing.
        """
        return await asyncio.to_thread(self.step_sync, action_text)

    def step_sync(self, action_text: str) -> StepResult:
        """Blocking body of ``step`` (also handy in scripts and tests)."""
        if self.finished:
            raise RuntimeError(f"step: episode of task {self.task.task_id} has already finished")
        try:
            calls = parse_tool_calls(action_text)
        except ToolCallError as exc:
            return self._malformed(f"error: malformed tool call: {exc}")
        if not calls:
            return self._malformed(f"error: no tool call found. {TOOL_CALL_FORMAT_PROMPT}")
        self.metrics["tool_calls"] += len(calls)
        notes: list[str] = []
        limit = self.limits.max_calls_per_action
        if len(calls) > limit:
            notes.append(f"note: only the first {limit} of {len(calls)} tool calls were run")
            calls = calls[:limit]
        observations: list[str] = []
        malformed = False
        for call in calls:
            try:
                arguments = validate_arguments(call.name, call.arguments)
            except ToolArgumentError as exc:
                malformed = True
                observations.append(self._result(call.name, f"error: {exc}"))
                continue
            if call.name == "submit":
                return self._submit()
            observations.append(self._result(call.name, self._run_tool(call.name, arguments)))
        if malformed:
            self.metrics["malformed_actions"] += 1
            self._consecutive_malformed += 1
            if self._consecutive_malformed >= self.limits.max_consecutive_malformed:
                return self._end_tool_error()
        else:
            self._consecutive_malformed = 0
        return StepResult(observation="\n".join(notes + observations))

    def _result(self, name: str, output: str) -> str:
        """One tool's observation block, capped at ``max_observation_chars``."""
        return format_tool_result(name, output, self.limits.max_observation_chars)

    def _run_tool(self, name: str, arguments: dict[str, object]) -> str:
        """Run one validated non-submit tool; a failure becomes ``error: ...`` text."""
        self.metrics[f"{name}_calls"] += 1
        try:
            if name == "bash":
                return run_bash(self.workspace, arguments, self.limits.bash)
            if name == "view":
                return run_view(self.workspace, arguments, self.limits.max_file_bytes, self.limits.max_list_entries)
            return run_edit(self.workspace, arguments, self.limits.max_file_bytes)
        except (ToolUseError, OSError) as exc:
            self.metrics["tool_failures"] += 1
            return f"error: {exc}"

    def _malformed(self, message: str) -> StepResult:
        """Count a malformed action; end the episode when too many came in a row."""
        self.metrics["malformed_actions"] += 1
        self._consecutive_malformed += 1
        if self._consecutive_malformed >= self.limits.max_consecutive_malformed:
            return self._end_tool_error()
        return StepResult(observation=self._result("error", message))

    def _end_tool_error(self) -> StepResult:
        """Finish with reward 0.0 and ``finish_reason="tool_error"``."""
        self.finished = True
        return StepResult(observation=None, done=True, reward=0.0, finish_reason="tool_error", metrics=dict(self.metrics))

    def _submit(self) -> StepResult:
        """Grade the workspace with the hidden tests and finish."""
        self.finished = True
        result = grade(self.workspace, self.spec.hidden_test_files(), self.limits.grading)
        if result.infra_cause is not None:
            raise InfraError(f"task {self.task.task_id}: {result.infra_detail}", result.infra_cause)
        reward = 1.0 if result.passed else 0.0
        self.metrics.update(
            submitted=1.0,
            correct=reward,
            hidden_tests=float(result.tests),
            hidden_failures=float(result.failures + result.errors),
            grading_timed_out=float(result.timed_out),
        )
        return StepResult(observation=None, done=True, reward=reward, finish_reason="stop", metrics=dict(self.metrics))

    def close(self) -> None:
        """Delete the workspace (idempotent)."""
        self.workspace.close()


class SWEEnvironment:
    """Repository-repair tasks in a sandbox; ``Task.reference`` names the task directory.

    Args:
        tasks_root: Directory of task directories (default: the tasks shipped with the package).
        backend: Where workspaces live (default: ``LocalSandboxBackend()``).
        limits: Episode limits (default: ``SWELimits()``).
    """

    name = ENV_NAME

    def __init__(
        self,
        tasks_root: Path | str | None = None,
        *,
        backend: SandboxBackend | None = None,
        limits: SWELimits | None = None,
    ) -> None:
        """Remember where tasks live; nothing is loaded until ``start``."""
        self.tasks_root = default_tasks_root() if tasks_root is None else Path(tasks_root)
        self.backend: SandboxBackend = backend if backend is not None else LocalSandboxBackend()
        self.limits = limits if limits is not None else SWELimits()
        self._specs: dict[str, SWETaskSpec] = {}

    def spec(self, reference: str) -> SWETaskSpec:
        """The validated task directory ``tasks_root / reference`` (cached).

        Raises:
            ValueError: ``reference`` is not a plain directory name.
            SWETaskError: the task directory is missing or malformed.
        """
        if not reference or "/" in reference or reference in (".", "..") or "\\" in reference:
            raise ValueError(f"task.reference: {reference!r} must be the name of a task directory")
        if reference not in self._specs:
            self._specs[reference] = load_task_spec(self.tasks_root / reference)
        return self._specs[reference]

    def start(self, task: Task) -> SWEEpisode:
        """Open a workspace with the task's repository and return the episode.

        Raises:
            ValueError: ``task.env_name`` is not ``swe`` or ``task.reference`` is not a directory name.
            SWETaskError: the task directory is missing or malformed.
        """
        if task.env_name != ENV_NAME:
            raise ValueError(f"task.env_name: SWEEnvironment runs {ENV_NAME!r} tasks, got {task.env_name!r} "
                             f"(task {task.task_id})")
        spec = self.spec(task.reference)
        return SWEEpisode(task, spec, self.backend.open_workspace(spec.repo_dir), self.limits)


def _main(argv: list[str]) -> int:
    """Play the reference fix of packaged task ``argv[1]`` (view, edit per hunk, submit)."""
    from posttrain.envs.swe.tasks import parse_patch
    from posttrain.envs.tool_calls import ToolCall, format_tool_call

    if len(argv) != 2:
        print("usage: python -m posttrain.envs.swe.env TASK_ID", file=sys.stderr)
        return 2
    env = SWEEnvironment()
    spec = env.spec(argv[1])
    episode = env.start(spec.to_task())
    try:
        for file_patch in parse_patch(spec.fix_patch.read_text(encoding="utf-8")):
            for hunk in file_patch.hunks:
                call = ToolCall("edit", {"path": file_patch.path, "old_str": "".join(hunk.old_lines),
                                         "new_str": "".join(hunk.new_lines)})
                print(episode.step_sync(format_tool_call(call)).observation)
        result = episode.step_sync(format_tool_call(ToolCall("submit")))
    finally:
        episode.close()
    print(f"reward={result.reward} finish_reason={result.finish_reason} metrics={result.metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
