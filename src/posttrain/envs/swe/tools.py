"""The SWE environment's tools (``bash``, ``view``, ``edit``, ``submit``) and the grader behind submit.

Tools act on a ``Workspace``: a private copy of the task's repository inside some execution
backend (``workspace.LocalSandboxBackend`` here; a Kubernetes pod backend implements the same Protocol).
Each tool takes the validated JSON arguments of one tool call (see ``posttrain.envs.tool_calls``)
and returns the text the agent reads; a call that is well formed but fails raises
``ToolUseError`` (reported to the agent, not counted as malformed), a call with unknown tool
name or bad arguments raises ``ToolArgumentError`` (malformed).

Grading (``grade``) copies the hidden tests into a fresh ``_grader_<random>/`` directory of the
workspace after the agent has submitted, and runs pytest on them in the sandbox. The grader's
python writes a start line to stderr before pytest (and so any of the agent's code) runs.

Infrastructure failures are not the agent's (issue 32): a ``bash`` call that SIGKILL ended without
its own limits doing it raises ``InfraError`` (cause ``tool_killed``) instead of showing the agent
``exit code: 137``; a grading run killed that way is ``grader_killed``, and one that never wrote
its start line (no python or pytest in the sandbox, exit 127; bubblewrap failing to start) is
``grader_not_started``. ``grade`` reports them in ``GradeResult.infra_cause``; the environment
raises them.

Guarantees:
    * The hidden tests are not in the workspace before ``grade`` runs; the agent's processes are
      all dead by then (the sandbox kills everything after each command).
    * Grading ignores ``conftest.py``, ``pytest.ini``, ``sitecustomize.py`` and a ``pytest``
      package that the agent left in the repository: pytest's configuration and conftest search
      stop at the grader directory (``-c``/``--rootdir``), plugin auto-loading is off,
      ``python -s -P`` keeps the current directory off ``sys.path`` and the grader's conftest
      *appends* the repository to ``sys.path``, after the installed packages.
    * A pass needs exit code 0 *and* a JUnit report that counts at least one test, with no
      failure, error or skip, so code that calls ``os._exit(0)`` during collection does not pass.
    * The agent's code cannot make its failure look like a grader that did not start: the start
      line is written before pytest imports anything of the repository, and nothing the agent
      leaves in it runs earlier (see the list above).
    * ``view`` and ``edit`` (which run in the trusted process) refuse paths that leave the
      repository, symbolic links anywhere in the path, files with several hard links, non-regular
      files and files larger than the configured cap.

Not guaranteed:
    * Repository code that SIGKILLs its own test process during grading looks like an outside kill
      (``grader_killed``): the episode is not trained rather than rewarded 0 (see
      ``posttrain.envs.sandbox``'s "Not guaranteed").
    * A "fix" that special-cases the hidden tests' inputs, or repository code that forges the
      JUnit report during the test run, is not detected: the grader trusts the code under test
      as far as the test outcome goes (hidden tests are never shown, which makes this hard).
"""

from __future__ import annotations

import secrets
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from posttrain.envs.base import InfraError
from posttrain.envs.sandbox import SandboxLimits, SandboxResult


class ToolArgumentError(ValueError):
    """A malformed call: unknown tool, a missing, unknown or mistyped argument."""


class ToolUseError(RuntimeError):
    """A well-formed call that failed (no such file, ``old_str`` not found...)."""


class WorkspacePathError(ToolUseError):
    """A path the tools refuse: outside the repository, through a link, not a regular file, too big."""


class Workspace(Protocol):
    """A private, writable copy of one repository inside an execution backend.

    Paths are relative to the repository root (``/workspace/...`` is accepted too).
    """

    def run(self, command: str, limits: SandboxLimits) -> SandboxResult:
        """Run a shell command line with the repository root as current directory."""
        ...

    def read_file(self, path: str, max_bytes: int) -> bytes:
        """Return a regular file's bytes.

        Raises:
            FileNotFoundError: no such file.
            IsADirectoryError: ``path`` is a directory.
            WorkspacePathError: a refused path, or a file larger than ``max_bytes`` bytes.
        """
        ...

    def write_file(self, path: str, data: bytes) -> None:
        """Overwrite an existing regular file (same refusals as ``read_file``)."""
        ...

    def list_files(self, path: str, max_entries: int) -> list[str]:
        """Relative paths under directory ``path``, sorted; directories end in ``/``.

        At most ``max_entries`` entries, then one ``... (N more entries)`` line.

        Raises:
            FileNotFoundError: no such directory.
            NotADirectoryError: ``path`` is a file.
        """
        ...

    def add_files(self, files: Mapping[str, bytes]) -> None:
        """Create new files (relative path -> bytes), making directories as needed.

        Raises:
            FileExistsError: a file already exists.
        """
        ...

    def close(self) -> None:
        """Delete the workspace; idempotent."""
        ...


@dataclass(frozen=True)
class ToolParam:
    """One argument of a tool: JSON type (``string`` or ``integer``), whether required, meaning."""

    name: str
    type: str
    required: bool
    description: str


@dataclass(frozen=True)
class ToolSpec:
    """A tool's name, what it does and its arguments (rendered into the system prompt)."""

    name: str
    description: str
    params: tuple[ToolParam, ...] = ()


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "bash",
            "Run a bash command line in the repository root and return its exit code, stdout and "
            "stderr. Each call is a fresh shell with no network; files you write persist.",
            (ToolParam("command", "string", True, "the command line, e.g. \"python -m pytest -q\""),),
        ),
        ToolSpec(
            "view",
            "Show a file with line numbers (optionally only lines start_line..end_line), or list a "
            "directory.",
            (
                ToolParam("path", "string", True, "file or directory, relative to the repository root"),
                ToolParam("start_line", "integer", False, "first line to show (1-based)"),
                ToolParam("end_line", "integer", False, "last line to show (inclusive)"),
            ),
        ),
        ToolSpec(
            "edit",
            "Replace the one occurrence of old_str in a file by new_str. old_str must match the file "
            "exactly (indentation included) and occur exactly once.",
            (
                ToolParam("path", "string", True, "file, relative to the repository root"),
                ToolParam("old_str", "string", True, "exact text to replace (non-empty, unique in the file)"),
                ToolParam("new_str", "string", True, "replacement text"),
            ),
        ),
        ToolSpec("submit", "Finish: your changes are graded by hidden tests. Call it once, when done."),
    )
}
"""The SWE tools by name."""

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def describe_tools() -> str:
    """The tool list for the system prompt: one block per tool with its arguments."""
    blocks = []
    for spec in TOOLS.values():
        lines = [f"- {spec.name}: {spec.description}"]
        for param in spec.params:
            need = "required" if param.required else "optional"
            lines.append(f"    {param.name} ({param.type}, {need}): {param.description}")
        if not spec.params:
            lines.append("    (no arguments)")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def validate_arguments(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Check one call against ``TOOLS``.

    Returns:
        The arguments as a plain dict.

    Raises:
        ToolArgumentError: unknown tool, a missing required argument, an unknown argument, or
            a value of the wrong JSON type; the message names the argument.
    """
    spec = TOOLS.get(name)
    if spec is None:
        raise ToolArgumentError(f"unknown tool {name!r}; available tools: {', '.join(TOOLS)}")
    known = {p.name: p for p in spec.params}
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise ToolArgumentError(f"{name}: unknown argument(s) {unknown}; allowed: {sorted(known) or 'none'}")
    for param in spec.params:
        if param.name not in arguments:
            if param.required:
                raise ToolArgumentError(f"{name}: missing required argument '{param.name}'")
            continue
        if not _JSON_TYPES[param.type](arguments[param.name]):
            raise ToolArgumentError(
                f"{name}: argument '{param.name}' must be a {param.type}, got {type(arguments[param.name]).__name__}"
            )
    return dict(arguments)


def format_command_result(result: SandboxResult) -> str:
    """The text an agent reads after a ``bash`` call: exit code, stdout, stderr and limit notes."""
    parts = [f"exit code: {result.exit_code}"]
    if result.killed_reason == "wall_time":
        parts.append("note: killed, the command ran past its wall-clock limit")
    elif result.killed_reason == "cpu_time":
        parts.append("note: killed, the command used up its CPU-time limit")
    if result.truncated:
        parts.append("note: output was cut at the sandbox's output limit")
    if result.stdout:
        parts.append("stdout:\n" + result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    return "\n".join(parts)


def run_bash(workspace: Workspace, arguments: Mapping[str, Any], limits: SandboxLimits) -> str:
    """``bash``: run ``arguments["command"]`` in the workspace with ``limits``.

    Raises:
        ToolUseError: an empty command.
        InfraError: the command was killed from outside (cause ``tool_killed``), or the sandbox
            failed (``SandboxError``).
    """
    command = arguments["command"]
    if not command.strip():
        raise ToolUseError("bash: command is empty")
    result = workspace.run(command, limits)
    if result.killed_externally:
        raise InfraError(f"bash tool call killed from outside (exit code {result.exit_code}, no limit of its own "
                         f"reached, {result.wall_s:.1f} s)", "tool_killed")
    return format_command_result(result)


def _numbered(lines: list[str], first: int) -> str:
    """Lines prefixed with their 1-based numbers (6 wide, then a tab), as ``cat -n`` does."""
    return "\n".join(f"{first + i:6d}\t{line.rstrip(chr(10))}" for i, line in enumerate(lines))


def _decode(path: str, data: bytes) -> str:
    """UTF-8 text of a file, or ``ToolUseError`` naming it."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolUseError(f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})") from exc


def run_view(workspace: Workspace, arguments: Mapping[str, Any], max_bytes: int, max_entries: int = 200) -> str:
    """``view``: a numbered file (or a line range of it), or a directory listing.

    Raises:
        ToolUseError: no such path, a refused path, a range outside the file, or a binary file.
    """
    path = arguments["path"]
    start = arguments.get("start_line")
    end = arguments.get("end_line")
    try:
        data = workspace.read_file(path, max_bytes)
    except FileNotFoundError as exc:
        raise ToolUseError(f"{path}: no such file or directory") from exc
    except IsADirectoryError:
        if start is not None or end is not None:
            raise ToolUseError(f"{path}: is a directory; start_line/end_line apply to files") from None
        entries = workspace.list_files(path, max_entries)
        return "\n".join(entries) if entries else f"{path}: empty directory"
    lines = _decode(path, data).splitlines(keepends=True)
    if not lines:
        return f"{path}: empty file"
    first = 1 if start is None else start
    last = len(lines) if end is None else min(end, len(lines))
    if first < 1 or first > len(lines):
        raise ToolUseError(f"view: start_line {first} is outside the file's lines 1..{len(lines)}")
    if last < first:
        raise ToolUseError(f"view: end_line {end} is before start_line {first}")
    return _numbered(lines[first - 1 : last], first)


def run_edit(workspace: Workspace, arguments: Mapping[str, Any], max_bytes: int) -> str:
    """``edit``: replace the single occurrence of ``old_str`` by ``new_str`` in ``path``.

    Returns:
        A confirmation with the edited region, numbered, and three lines of context.

    Raises:
        ToolUseError: no such file, a refused path, an empty ``old_str``, ``old_str`` equal to
            ``new_str``, ``old_str`` not found, or found more than once (with the line numbers).
    """
    path, old, new = arguments["path"], arguments["old_str"], arguments["new_str"]
    if not old:
        raise ToolUseError("edit: old_str is empty; give the exact text to replace")
    if old == new:
        raise ToolUseError("edit: old_str and new_str are identical; nothing would change")
    try:
        text = _decode(path, workspace.read_file(path, max_bytes))
    except FileNotFoundError as exc:
        raise ToolUseError(f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ToolUseError(f"{path}: is a directory") from exc
    count = text.count(old)
    if count == 0:
        raise ToolUseError(
            f"edit: old_str not found in {path}; it must match the file exactly, including "
            "indentation and blank lines (view the file and copy the text)"
        )
    if count > 1:
        at, lines_at = 0, []
        while (at := text.find(old, at)) != -1:
            lines_at.append(text.count("\n", 0, at) + 1)
            at += 1
        raise ToolUseError(
            f"edit: old_str occurs {count} times in {path} (at lines {lines_at}); add surrounding "
            "lines to old_str so it matches exactly once"
        )
    offset = text.index(old)
    updated = text[:offset] + new + text[offset + len(old) :]
    workspace.write_file(path, updated.encode("utf-8"))
    first = text.count("\n", 0, offset) + 1
    last = first + new.count("\n")
    lines = updated.splitlines(keepends=True)
    lo, hi = max(1, first - 3), min(len(lines), last + 3)
    return f"edited {path}; lines {lo}-{hi} now read:\n" + _numbered(lines[lo - 1 : hi], lo)


@dataclass(frozen=True)
class GradeResult:
    """Outcome of running the hidden tests.

    Attributes:
        passed: True when every hidden test passed (see the module's guarantees).
        tests: Tests pytest reported (from the JUnit report; 0 when there is none).
        failures: Failed tests.
        errors: Tests with errors (including collection errors).
        skipped: Skipped tests (a skip counts against passing).
        exit_code: pytest's exit code in the sandbox.
        timed_out: True when the grading run hit a time limit.
        output: pytest's output (capped by the sandbox), for logs.
        infra_cause: ``grader_killed`` or ``grader_not_started`` when the grading run failed for
            the infrastructure (module docstring; ``passed`` is then False and means nothing),
            else ``None``.
        infra_detail: One line on that failure (exit code, the end of stderr).
    """

    passed: bool
    tests: int
    failures: int
    errors: int
    skipped: int
    exit_code: int
    timed_out: bool
    output: str
    infra_cause: str | None = None
    infra_detail: str = ""


_GRADER_START = "posttrain grader started"
"""What the grader's python writes to stderr, before pytest, once it runs (with the grader's directory)."""

_GRADER_CONFTEST = b'''"""Grader set-up: the repository goes on sys.path after the installed packages."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))
'''

_JUNIT_MAX_BYTES = 1 << 20


def _junit_counts(report: bytes) -> tuple[int, int, int, int]:
    """``(tests, failures, errors, skipped)`` summed over the report's ``testsuite`` elements.

    An unparsable report counts as no tests (which fails grading).
    """
    try:
        root = ElementTree.fromstring(report)
    except ElementTree.ParseError:
        return 0, 0, 0, 0
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = [0, 0, 0, 0]
    for suite in suites:
        for index, key in enumerate(("tests", "failures", "errors", "skipped")):
            value = suite.get(key, "0")
            totals[index] += int(value) if value.isdigit() else 0
    return totals[0], totals[1], totals[2], totals[3]


def grade(workspace: Workspace, hidden_tests: Mapping[str, bytes], limits: SandboxLimits) -> GradeResult:
    """Copy the hidden tests into the workspace and run them with pytest in the sandbox.

    Args:
        workspace: The agent's workspace, after ``submit``.
        hidden_tests: Relative path -> content of the hidden test files.
        limits: Sandbox limits of the test run.

    Returns:
        The ``GradeResult``; ``passed`` is the reward condition unless ``infra_cause`` is set.

    Raises:
        ValueError: ``hidden_tests`` is empty or holds a ``conftest.py``/``pytest.ini`` of its own.
        posttrain.envs.sandbox.SandboxError: the sandbox could not run at all.
    """
    if not hidden_tests:
        raise ValueError("hidden_tests: empty")
    reserved = {"conftest.py", "pytest.ini", "report.xml"} & set(hidden_tests)
    if reserved:
        raise ValueError(f"hidden_tests: {sorted(reserved)} are reserved for the grader")
    grader = f"_grader_{secrets.token_hex(8)}"
    files = {f"{grader}/{rel}": data for rel, data in hidden_tests.items()}
    files[f"{grader}/conftest.py"] = _GRADER_CONFTEST
    files[f"{grader}/pytest.ini"] = b"[pytest]\n"
    workspace.add_files(files)
    start_line = f"{_GRADER_START} {grader}"
    # ``python -m pytest`` with a start line first: written before pytest imports anything of the
    # repository, so its absence means the grader never ran (its python or pytest is missing).
    starter = f"import sys, pytest; sys.stderr.write('{start_line}\\n'); sys.stderr.flush(); " \
              "raise SystemExit(pytest.console_main())"
    command = (
        f'PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -s -P -c "{starter}" -q -p no:cacheprovider '
        f"-c {grader}/pytest.ini --rootdir {grader} --junitxml {grader}/report.xml {grader}"
    )
    result = workspace.run(command, limits)
    try:
        report = workspace.read_file(f"{grader}/report.xml", _JUNIT_MAX_BYTES)
    except (FileNotFoundError, ToolUseError):
        report = b""  # no (readable) report: counted as no tests, so grading fails
    tests, failures, errors, skipped = _junit_counts(report)
    passed = (
        result.exit_code == 0
        and not result.timed_out
        and tests > 0
        and failures == 0
        and errors == 0
        and skipped == 0
    )
    infra_cause, infra_detail = _grading_infra_failure(result, start_line)
    return GradeResult(
        passed=passed and infra_cause is None,
        tests=tests,
        failures=failures,
        errors=errors,
        skipped=skipped,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        output=(result.stdout + result.stderr)[-4000:],
        infra_cause=infra_cause,
        infra_detail=infra_detail,
    )


def _grading_infra_failure(result: SandboxResult, start_line: str) -> tuple[str | None, str]:
    """``(cause, detail)`` when the grading run failed for the infrastructure, else ``(None, "")``."""
    tail = " ".join(result.stderr.strip().splitlines()[-2:])[-300:]
    if result.killed_externally:
        return "grader_killed", (f"the grading run was killed from outside (exit code {result.exit_code}, no limit of "
                                 f"its own reached, {result.wall_s:.1f} s)")
    if start_line not in result.stderr:
        return "grader_not_started", (f"the grader did not start (exit code {result.exit_code}"
                                      f"{', timed out' if result.timed_out else ''}): {tail or 'no output'}")
    return None, ""
