"""Load and validate SWE-style repository-repair tasks from disk.

A task is a directory named after its ``task_id``::

    <task_id>/
        task.json        {"task_id": ..., "problem_statement": ..., "category": ...}
        repo/            the repository snapshot the agent starts from (a small Python package)
        hidden_tests/    test_*.py files, copied into the workspace only at grading time
        fix.patch        the reference fix, a unified diff against repo/ (a/ and b/ prefixes)

The package ships its own tasks under ``posttrain/envs/swe/tasks/`` (``default_tasks_root()``).
``fix.patch`` is used only by the task checks (``tests/unit/envs/test_swe_tasks.py``), never shown
to the agent or used for grading.

Run ``python -m posttrain.envs.swe.tasks [ROOT]`` to validate a task directory and list it.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from posttrain.records import Task

ENV_NAME = "swe"
"""``Task.env_name`` of every SWE task."""

DATA_SOURCE = "posttrain-swe-mini"
"""``Task.data_source`` of the tasks shipped with the package."""

_TASK_JSON_KEYS = {"task_id": True, "problem_statement": True, "category": False}
_TASK_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class SWETaskError(ValueError):
    """A task directory is malformed; the message names the file and the field."""


class PatchError(ValueError):
    """A unified diff does not parse or does not apply; the message names the file and hunk."""


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff.

    Attributes:
        old_start: 1-based first line of the hunk in the old file (0 for an empty file).
        old_lines: Lines the hunk expects (context and removed), each with its newline.
        new_lines: Lines that replace them (context and added), each with its newline.
    """

    old_start: int
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    """The hunks of one file in a unified diff (``path`` relative to the repository root)."""

    path: str
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True)
class SWETaskSpec:
    """One validated task directory.

    Attributes:
        task_id: Stable id, equal to the directory name.
        problem_statement: What the agent is told (the bug report).
        category: Kind of bug (``off-by-one``, ``wrong-operator``...), may be empty.
        task_dir: The task directory.
        repo_dir: ``task_dir / "repo"``: the snapshot the agent starts from.
        hidden_tests_dir: ``task_dir / "hidden_tests"``.
        fix_patch: ``task_dir / "fix.patch"``: the reference fix.
    """

    task_id: str
    problem_statement: str
    category: str
    task_dir: Path
    repo_dir: Path
    hidden_tests_dir: Path
    fix_patch: Path

    def hidden_test_files(self) -> dict[str, bytes]:
        """Relative path -> content of every file under ``hidden_tests/`` (bytes)."""
        return {
            path.relative_to(self.hidden_tests_dir).as_posix(): path.read_bytes()
            for path in sorted(self.hidden_tests_dir.rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts
        }

    def to_task(self) -> Task:
        """The ``records.Task`` for this spec (``reference`` is the task directory name)."""
        return Task(
            task_id=self.task_id,
            env_name=ENV_NAME,
            prompt=self.problem_statement,
            reference=self.task_dir.name,
            data_source=DATA_SOURCE,
            metadata={"category": self.category},
        )


def default_tasks_root() -> Path:
    """Directory of the tasks shipped with the package (``posttrain/envs/swe/tasks``)."""
    return Path(__file__).resolve().parent / "tasks"


def parse_patch(text: str, *, source: str = "patch") -> list[FilePatch]:
    """Parse a unified diff (``diff -u`` / ``git diff`` output without renames or binary parts).

    Args:
        text: The diff text.
        source: Name used in error messages (the patch file's path).

    Returns:
        One ``FilePatch`` per ``---``/``+++`` pair, paths without their ``a/``/``b/`` prefix.

    Raises:
        PatchError: a hunk outside a file section, a malformed hunk header, line counts that
            disagree with the header, a file that is created or deleted, or no file at all.
    """
    files: list[FilePatch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    path: str | None = None
    hunks: list[Hunk] = []

    def flush() -> None:
        if path is not None:
            if not hunks:
                raise PatchError(f"{source}: file {path} has no hunk")
            files.append(FilePatch(path=path, hunks=tuple(hunks)))

    while i < len(lines):
        line = lines[i]
        if line.startswith("--- "):
            flush()
            hunks = []
            if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
                raise PatchError(f"{source}: line {i + 1}: '---' not followed by '+++'")
            old = line[4:].split("\t")[0].strip()
            new = lines[i + 1][4:].split("\t")[0].strip()
            if old == "/dev/null" or new == "/dev/null":
                raise PatchError(f"{source}: line {i + 1}: creating or deleting files is not supported")
            path = new[2:] if new.startswith("b/") else new
            i += 2
            continue
        match = _HUNK_RE.match(line)
        if match:
            if path is None:
                raise PatchError(f"{source}: line {i + 1}: hunk before any '---'/'+++' header")
            old_count = int(match.group(2) or "1")
            new_count = int(match.group(4) or "1")
            old_lines: list[str] = []
            new_lines: list[str] = []
            i += 1
            while i < len(lines) and (len(old_lines) < old_count or len(new_lines) < new_count):
                body = lines[i]
                if body.startswith("\\"):
                    i += 1  # "\ No newline at end of file"
                    continue
                tag, content = (body[0], body[1:]) if body not in ("\n", "") else (" ", "\n")
                if tag == " ":
                    old_lines.append(content)
                    new_lines.append(content)
                elif tag == "-":
                    old_lines.append(content)
                elif tag == "+":
                    new_lines.append(content)
                else:
                    raise PatchError(f"{source}: line {i + 1}: unexpected line in hunk: {body!r}")
                i += 1
            if len(old_lines) != old_count or len(new_lines) != new_count:
                raise PatchError(
                    f"{source}: hunk at line {match.group(0)!r} has {len(old_lines)}/{len(new_lines)} "
                    f"lines, header says {old_count}/{new_count}"
                )
            hunks.append(Hunk(int(match.group(1)), tuple(old_lines), tuple(new_lines)))
            continue
        i += 1  # "diff --git", "index ..." and other header lines
    flush()
    if not files:
        raise PatchError(f"{source}: no file in the patch")
    return files


def apply_file_patch(original: str, patch: FilePatch, *, source: str = "patch") -> str:
    """Apply one file's hunks to its text, exactly (no fuzz, no offset search).

    Raises:
        PatchError: a hunk's context or removed lines differ from the file at its position.
    """
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        start = max(hunk.old_start - 1, 0) if hunk.old_lines else hunk.old_start
        if start < cursor or lines[start : start + len(hunk.old_lines)] != list(hunk.old_lines):
            raise PatchError(f"{source}: {patch.path}: hunk {number} does not apply at line {hunk.old_start}")
        out += lines[cursor:start]
        out += hunk.new_lines
        cursor = start + len(hunk.old_lines)
    out += lines[cursor:]
    return "".join(out)


def apply_patch(patch_text: str, repo_root: Path, *, source: str = "patch") -> list[str]:
    """Apply a unified diff to the files under ``repo_root`` in place.

    Every file is checked before any is written, so a patch that fails leaves the tree unchanged.

    Returns:
        The relative paths that were changed.

    Raises:
        PatchError: the patch does not parse, names a file outside or missing from ``repo_root``,
            or does not apply exactly.
    """
    updates: dict[Path, str] = {}
    for file_patch in parse_patch(patch_text, source=source):
        rel = Path(file_patch.path)
        if rel.is_absolute() or ".." in rel.parts:
            raise PatchError(f"{source}: path {file_patch.path!r} leaves the repository")
        target = repo_root / rel
        if not target.is_file():
            raise PatchError(f"{source}: {file_patch.path}: no such file in {repo_root}")
        updates[target] = apply_file_patch(target.read_text(encoding="utf-8"), file_patch, source=source)
    for target, text in updates.items():
        target.write_text(text, encoding="utf-8")
    return [target.relative_to(repo_root).as_posix() for target in updates]


def load_task_spec(task_dir: Path) -> SWETaskSpec:
    """Read and validate one task directory.

    Raises:
        SWETaskError: a missing file or directory, ``task.json`` that is not a JSON object, a
            missing/unknown/non-string field, a ``task_id`` different from the directory name, no
            ``test_*.py`` in ``hidden_tests/``, or a ``fix.patch`` that does not apply to
            ``repo/``. The message names the file and the field.
    """
    task_json = task_dir / "task.json"
    if not task_json.is_file():
        raise SWETaskError(f"{task_json}: missing")
    try:
        raw = json.loads(task_json.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SWETaskError(f"{task_json}: line {exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(raw, dict):
        raise SWETaskError(f"{task_json}: expected a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_TASK_JSON_KEYS))
    if unknown:
        raise SWETaskError(f"{task_json}: unknown field(s) {unknown}; allowed: {sorted(_TASK_JSON_KEYS)}")
    for key, required in _TASK_JSON_KEYS.items():
        if required and key not in raw:
            raise SWETaskError(f"{task_json}: field '{key}': missing")
        if key in raw and (not isinstance(raw[key], str) or (required and not raw[key].strip())):
            raise SWETaskError(f"{task_json}: field '{key}': must be a non-empty string, got {raw[key]!r}")
    task_id = raw["task_id"]
    if not _TASK_ID_RE.match(task_id):
        raise SWETaskError(f"{task_json}: field 'task_id': {task_id!r} has characters outside [A-Za-z0-9_.-]")
    if task_id != task_dir.name:
        raise SWETaskError(f"{task_json}: field 'task_id': {task_id!r} differs from the directory name {task_dir.name!r}")
    repo_dir = task_dir / "repo"
    if not repo_dir.is_dir() or not any(repo_dir.rglob("*.py")):
        raise SWETaskError(f"{repo_dir}: missing, or holds no .py file")
    hidden = task_dir / "hidden_tests"
    if not hidden.is_dir() or not any(hidden.glob("test_*.py")):
        raise SWETaskError(f"{hidden}: missing, or holds no test_*.py file")
    fix_patch = task_dir / "fix.patch"
    if not fix_patch.is_file():
        raise SWETaskError(f"{fix_patch}: missing")
    try:
        for file_patch in parse_patch(fix_patch.read_text(encoding="utf-8"), source=str(fix_patch)):
            target = repo_dir / file_patch.path
            if not target.is_file():
                raise SWETaskError(f"{fix_patch}: patches {file_patch.path}, which repo/ does not have")
            apply_file_patch(target.read_text(encoding="utf-8"), file_patch, source=str(fix_patch))
    except PatchError as exc:
        raise SWETaskError(str(exc)) from exc
    return SWETaskSpec(
        task_id=task_id,
        problem_statement=raw["problem_statement"].strip(),
        category=raw.get("category", ""),
        task_dir=task_dir,
        repo_dir=repo_dir,
        hidden_tests_dir=hidden,
        fix_patch=fix_patch,
    )


def load_swe_task_specs(root: Path | None = None) -> list[SWETaskSpec]:
    """Validate every task directory under ``root`` (default: the packaged tasks), sorted by id.

    Raises:
        SWETaskError: ``root`` is not a directory, holds no task, or a task is malformed.
    """
    root = default_tasks_root() if root is None else Path(root)
    if not root.is_dir():
        raise SWETaskError(f"{root}: not a directory of SWE tasks")
    specs = [load_task_spec(d) for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith((".", "_"))]
    if not specs:
        raise SWETaskError(f"{root}: holds no task directory")
    return specs


def load_swe_tasks(root: Path | None = None) -> list[Task]:
    """The ``records.Task`` of every task under ``root`` (default: the packaged tasks).

    ``Task.env_name`` is ``"swe"`` and ``Task.reference`` the task directory name, which
    ``SWEEnvironment`` looks up under the same root.

    Raises:
        SWETaskError: see ``load_swe_task_specs``.
    """
    return [spec.to_task() for spec in load_swe_task_specs(root)]


def _main(argv: list[str]) -> int:
    """Validate the tasks under ``argv[1]`` (default: the packaged ones) and print one per line."""
    root = Path(argv[1]) if len(argv) > 1 else None
    try:
        specs = load_swe_task_specs(root)
    except SWETaskError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 1
    for spec in specs:
        print(f"{spec.task_id}\t{spec.category}\t{spec.problem_statement[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
