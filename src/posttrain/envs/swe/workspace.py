"""Where an SWE episode's repository lives: the ``SandboxBackend`` Protocol and its local implementation.

``SandboxBackend.open_workspace(snapshot)`` copies a task's repository snapshot into a new private
``Workspace`` (the Protocol in ``posttrain.envs.swe.tools``). ``LocalSandboxBackend`` makes a
``LocalWorkspace``: a private temporary directory on this machine, owned by a dedicated sandbox
uid when this process is root, whose commands run through ``posttrain.envs.sandbox``. A Kubernetes
backend running SWE-bench images in pods implements the same two Protocols.

Host-side file access (``view``, ``edit``, adding the hidden tests) never follows the agent's
links: paths are resolved inside the repository, ``..`` and symbolic links on the way are
refused, files must be single-link regular files, and new files are created with ``O_EXCL`` and
``O_NOFOLLOW``. The episode-level Guarantees are listed in ``posttrain.envs.swe.env``.

Example::

    workspace = LocalSandboxBackend().open_workspace(spec.repo_dir)
    print(workspace.run("git status", SandboxLimits()).stdout)
    workspace.close()
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from posttrain.envs.sandbox import (
    SANDBOX_WORKDIR,
    Isolation,
    SandboxLimits,
    SandboxResult,
    allocate_sandbox_uid,
    chown_tree,
    run_in_sandbox,
)
from posttrain.envs.swe.tools import Workspace, WorkspacePathError


class SandboxBackend(Protocol):
    """Where workspaces live: this machine (``LocalSandboxBackend``) or, later, Kubernetes pods."""

    def open_workspace(self, snapshot: Path) -> Workspace:
        """Copy the repository ``snapshot`` into a new private workspace and return it."""
        ...


class LocalWorkspace:
    """A workspace in a private temporary directory on this machine, commands via ``run_in_sandbox``.

    When this process is root the repository belongs to a dedicated sandbox uid (one per
    workspace), so sandboxed commands can write it and nothing else.
    """

    def __init__(self, snapshot: Path, *, isolation: Isolation = "auto", temp_root: Path | None = None) -> None:
        """Copy ``snapshot`` to ``<private tmp>/repo``.

        Raises:
            FileNotFoundError: ``snapshot`` is not a directory.
        """
        if not Path(snapshot).is_dir():
            raise FileNotFoundError(f"snapshot: {snapshot} is not a directory")
        self.isolation: Isolation = isolation
        self._base = Path(tempfile.mkdtemp(prefix="posttrain-swe-", dir=temp_root))
        os.chmod(self._base, 0o711)  # traversable, not listable: process mode needs to reach repo/
        self.root = self._base / "repo"
        shutil.copytree(snapshot, self.root, symlinks=True)
        self.uid = allocate_sandbox_uid()
        if self.uid is not None:
            chown_tree(self.root, self.uid)
        self._closed = False

    def _resolve(self, path: str) -> Path:
        """Host path of a repository-relative ``path`` (``/workspace/...`` accepted).

        Raises:
            WorkspacePathError: an empty path, one that leaves the repository, or one with a
                symbolic link in it.
        """
        text = path.strip() if isinstance(path, str) else ""
        if not text or "\0" in text:
            raise WorkspacePathError(f"path: {path!r} is empty or invalid")
        pure = PurePosixPath(text)
        if pure.is_absolute():
            for base in (PurePosixPath(SANDBOX_WORKDIR), PurePosixPath(str(self.root))):
                if pure == base or base in pure.parents:
                    pure = pure.relative_to(base)
                    break
            else:
                raise WorkspacePathError(f"{text}: outside the repository; use a path relative to its root")
        parts = [p for p in pure.parts if p not in ("", ".")]
        if ".." in parts:
            raise WorkspacePathError(f"{text}: '..' is not allowed in paths")
        current = self.root
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise WorkspacePathError(f"{text}: {part} is a symbolic link; view/edit do not follow links")
        return current

    def _regular_file(self, path: str, max_bytes: int | None) -> tuple[Path, os.stat_result]:
        """Resolve ``path`` and check it is a single-link regular file (of at most ``max_bytes``)."""
        host = self._resolve(path)
        try:
            st = os.lstat(host)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no such file") from None
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{path}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise WorkspacePathError(f"{path}: not a regular file")
        if st.st_nlink > 1:
            raise WorkspacePathError(f"{path}: has {st.st_nlink} hard links; refused")
        if max_bytes is not None and st.st_size > max_bytes:
            raise WorkspacePathError(
                f"{path}: {st.st_size} bytes, more than the {max_bytes} this tool handles; use bash (sed -n, head)"
            )
        return host, st

    def run(self, command: str, limits: SandboxLimits) -> SandboxResult:
        """Run ``bash -c command`` in the sandbox with the repository as current directory."""
        return run_in_sandbox(
            command, workdir=self.root, limits=limits, run_as_uid=self.uid, isolation=self.isolation
        )

    def read_file(self, path: str, max_bytes: int) -> bytes:
        """See ``Workspace.read_file``."""
        host, st = self._regular_file(path, max_bytes)
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
                raise WorkspacePathError(f"{path}: changed while being opened; refused")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(max_bytes + 1)
        finally:
            os.close(fd)
        if len(data) > max_bytes:
            raise WorkspacePathError(f"{path}: grew beyond {max_bytes} bytes while being read")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        """See ``Workspace.write_file`` (the owner of the file is kept)."""
        host, _ = self._regular_file(path, None)
        fd = os.open(host, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)

    def list_files(self, path: str, max_entries: int) -> list[str]:
        """See ``Workspace.list_files`` (links are listed, not followed; ``__pycache__`` skipped)."""
        host = self._resolve(path)
        if not host.exists():
            raise FileNotFoundError(f"{path}: no such directory")
        if not host.is_dir():
            raise NotADirectoryError(f"{path}: not a directory")
        entries: list[str] = []
        total = 0
        for current, dirs, files in os.walk(host):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = Path(current).relative_to(host)
            for name in [f"{d}/" for d in dirs] + sorted(files):
                total += 1
                if len(entries) < max_entries:
                    entries.append((rel / name).as_posix() + ("/" if name.endswith("/") else ""))
        if total > len(entries):
            entries.append(f"... ({total - len(entries)} more entries)")
        return entries

    def add_files(self, files: Mapping[str, bytes]) -> None:
        """See ``Workspace.add_files`` (new files and directories belong to the sandbox uid)."""
        for rel, data in files.items():
            parts = PurePosixPath(rel).parts
            if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
                raise WorkspacePathError(f"{rel}: must be a relative path inside the repository")
            current = self.root
            for part in parts[:-1]:
                current = current / part
                if current.is_symlink():
                    raise WorkspacePathError(f"{rel}: {part} is a symbolic link")
                if not current.exists():
                    current.mkdir(mode=0o755)
                    if self.uid is not None:
                        os.chown(current, self.uid, self.uid, follow_symlinks=False)
            target = current / parts[-1]
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            if self.uid is not None:
                os.chown(target, self.uid, self.uid, follow_symlinks=False)

    def close(self) -> None:
        """Delete the workspace directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        shutil.rmtree(self._base)


@dataclass(frozen=True)
class LocalSandboxBackend:
    """Workspaces on this machine, commands isolated by ``posttrain.envs.sandbox``.

    Attributes:
        isolation: ``auto``, ``bwrap`` or ``process`` (see ``sandbox.Isolation``).
        temp_root: Directory for workspaces (default: the system temporary directory).
    """

    isolation: Isolation = "auto"
    temp_root: Path | None = None

    def open_workspace(self, snapshot: Path) -> Workspace:
        """Copy ``snapshot`` into a new ``LocalWorkspace``."""
        return LocalWorkspace(snapshot, isolation=self.isolation, temp_root=self.temp_root)
