"""Run untrusted, model-written commands in a sandbox with resource limits.

``run_in_sandbox`` starts one command (an argv list, a shell line, or Python source) in a fresh
sandbox, waits for it with CPU, wall-clock, memory, output, file-size and process limits, kills
everything it started, and returns a ``SandboxResult``. Environments (the SWE repository-repair
environment, the math Python tool) call it for every tool call.

Run ``python -m posttrain.envs.sandbox 'echo hello; id'`` to see what this machine provides;
``python -m posttrain.envs.sandbox --exec -- ARGV...`` runs one command in a sandbox and passes its
output and exit status through (for tool runners outside this package: ``examples/external_agent``).

One file on purpose (over the project's 500 lines): this is the security boundary between
model-written commands and the host. Each guarantee below is kept by several pieces at once (the
``prlimit`` line and the wrapper chain in ``run_in_sandbox``, the mount list of ``_bwrap_argv``,
the uid switch of ``_setpriv_argv``, the clean-up of ``_pump`` and ``reap_uid``), so a reviewer
checks a guarantee by reading them together against the lists below; spread over several files,
no single file would show whether a guarantee holds.

How. The command is wrapped in util-linux programs, outermost first:

1. ``prlimit``: RLIMIT_CPU (seconds of CPU per process), RLIMIT_AS (address space per process),
   RLIMIT_NPROC (processes of the sandbox uid), RLIMIT_FSIZE (largest file written),
   RLIMIT_NOFILE, RLIMIT_CORE = 0.
2. ``bwrap`` (bubblewrap, Debian package ``bubblewrap``) in **bwrap mode**: new mount, PID, IPC,
   UTS, cgroup and (unless ``allow_network``) network namespaces. The root file system is empty
   apart from ``/usr`` (and the ``/bin``, ``/lib``... links into it) read-only, the ld.so cache,
   the Python interpreter's prefixes read-only (so ``python`` and the venv's packages work; the
   ``posttrain`` package directory itself is hidden under an empty tmpfs, so task data such as
   hidden tests is not readable), a private ``/proc`` and minimal ``/dev``, a size-limited
   tmpfs at ``/tmp`` (also ``HOME``), and the work directory read-write at ``/workspace``
   (the current directory). In **process mode** (no usable bwrap) there is no mount isolation;
   ``unshare --net`` supplies the network namespace where the kernel allows it.
3. ``setpriv``: when the caller is root, the command runs as a dedicated unprivileged uid/gid
   (random in ``SANDBOX_UID_RANGE``, no supplementary groups, no capabilities, empty bounding
   set); always ``no_new_privs``, so set-uid programs grant nothing.

Popen starts the chain in a new session with a clean environment (``PATH``, ``HOME``, ``LANG``,
``LC_ALL``, ``TMPDIR``, ``USER``, ``LOGNAME``, ``PYTHONDONTWRITEBYTECODE``, ``PYTHONUNBUFFERED``
plus what the caller passes in ``env``). stdout and stderr are read as they come with a byte cap
each; bytes past the cap are read and discarded, never buffered.

Guarantees (bwrap mode, caller is root: this project's machines and CI):
    * The call returns within ``wall_time_s`` plus about a second of clean-up, whatever the command
      does; on the wall limit the process group is SIGKILLed, and so is every process of the
      sandbox uid (the PID namespace dies with its init as well). No process started by the
      command survives the call, including ones that ``setsid``, daemonise or fork-bomb.
    * A process dies once it has used ``cpu_time_s`` of CPU (SIGXCPU, reported as ``cpu_time``).
    * The sandbox uid runs at most ``max_processes`` processes/threads at once (RLIMIT_NPROC,
      enforced because the uid is not root and holds no capability); a fork bomb is bounded.
    * Each process's address space is at most ``memory_bytes`` (allocation fails cleanly).
    * The parent holds at most ``max_output_bytes`` of stdout plus the same of stderr.
    * No file in the sandbox grows beyond ``max_file_bytes``; ``/tmp`` holds at most ``tmp_bytes``.
    * Host files outside ``/usr``, the interpreter prefixes and the work directory are not
      visible: not ``/root``, ``/home``, ``/etc`` (beyond the ld.so cache), other temporary
      directories, the caller's source tree, or the ``posttrain`` package's data.
    * No network, not even loopback, unless ``allow_network`` (separate network namespace).
    * The parent's environment variables are not visible; ``HOME``, ``/tmp`` and the private work
      directory are new for every call and deleted afterwards.
    * No capabilities, no set-uid privilege gain, no core dumps.
    * A command that SIGKILL ended without the sandbox's wall or CPU limit doing it (the OOM
      killer, an eviction, ``kill -9`` from outside) is reported as ``killed_reason="external"``,
      apart from the command's own failures; callers treat it as an infrastructure failure
      (``SandboxError`` too is one: ``posttrain.envs.base.InfraError``), never as the agent's.

Not guaranteed:
    * Kernel exploits: this is namespaces plus rlimits, not a virtual machine and not seccomp.
      Readable parts of ``/usr`` and ``/proc`` (CPU model, kernel version) are visible.
    * Total memory: RLIMIT_AS is per process, so all processes together may use up to
      ``max_processes * memory_bytes``; there is no cgroup. Same for CPU time per process.
    * Disk: only the size of each file is capped; the work directory has no total quota.
    * Writes to the work directory persist (that is its purpose); callers that read it later
      (the SWE tools) must resolve paths themselves and refuse symbolic and hard links.
    * Process mode (no bwrap): the host file system is visible with the permissions of the
      sandbox uid (world-readable files, including hidden test files, can be read); network
      isolation only where ``unshare --net`` works (``network_isolated`` says which); no PID
      namespace (processes are still reaped by uid when the caller is root). The Python
      interpreter must be readable by the sandbox uid (``/root/...`` interpreters are not).
    * Who sent a SIGKILL: a command that kills itself with SIGKILL, or exits 137, looks like an
      outside kill (``external``) and its episode is not trained (neither rewarded nor
      penalised); it is counted by cause, and a run whose share of such failures passes
      ``generator.max_infra_error_share`` stops. The same holds for a program that ignores
      SIGXCPU and gets SIGKILL at the CPU hard limit in bwrap mode, where its CPU seconds are
      not visible; in process mode they are (``cpu_s``), so it reads as ``cpu_time`` there. That
      check sums the CPU of the command and the children it waited for, so an outside kill after
      that sum passed ``cpu_time_s`` reads as ``cpu_time``.
    * Caller not root: the command runs as the caller's uid (in a user namespace); RLIMIT_NPROC
      then counts the caller's own processes too, so the cap is set to their current number plus
      ``max_processes`` (approximate). Clean-up kills the process group, and in bwrap mode the PID
      namespace; in process mode a process that calls ``setsid`` outlives the call. The unit
      tests run as root and do not cover this path (it was checked by hand as a non-root uid).
"""

from __future__ import annotations

import functools
import math
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from posttrain.envs.base import InfraError

Isolation = Literal["auto", "bwrap", "process"]
"""``bwrap``: require bubblewrap; ``process``: rlimits, uid and network namespace only; ``auto``:
bwrap when it works here, else process mode."""

SANDBOX_WORKDIR = "/workspace"
"""Where the work directory appears inside a bwrap sandbox (the command's current directory)."""

SANDBOX_UID_RANGE = range(1_000_000, 2_000_000)
"""Dedicated uids (= gids) for sandboxed commands when the caller is root; no account uses them."""

_CODE_PATH_IN_SANDBOX = "/run/sandbox/main.py"
_READ_CHUNK = 65536
_DRAIN_AFTER_KILL_S = 1.0
_REAP_ROUNDS = 100


class SandboxError(InfraError):
    """The sandbox could not be set up, or processes of the sandbox outlived the clean-up.

    An infrastructure failure (``posttrain.envs.base.InfraError``, cause ``sandbox_error``): an
    episode it ends is never trained.
    """

    cause = "sandbox_error"


class SandboxUnavailableError(SandboxError):
    """The isolation asked for (``bwrap``) does not work on this machine; the message says why (cause ``sandbox_unavailable``)."""

    cause = "sandbox_unavailable"


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed command.

    Attributes:
        cpu_time_s: CPU seconds per process (RLIMIT_CPU soft limit; rounded up to whole seconds).
        wall_time_s: Wall-clock seconds before everything is killed.
        memory_bytes: Address space per process (RLIMIT_AS), bytes.
        max_output_bytes: Bytes of stdout kept, and separately of stderr; the rest is discarded.
        max_processes: Processes plus threads the sandbox uid may run at once (RLIMIT_NPROC).
        max_file_bytes: Largest file the command may write (RLIMIT_FSIZE), bytes.
        max_open_files: Open file descriptors per process (RLIMIT_NOFILE).
        tmp_bytes: Size of the ``/tmp`` tmpfs in bwrap mode, bytes.
    """

    cpu_time_s: float = 10.0
    wall_time_s: float = 30.0
    memory_bytes: int = 1 << 30
    max_output_bytes: int = 64 << 10
    max_processes: int = 64
    max_file_bytes: int = 64 << 20
    max_open_files: int = 256
    tmp_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        """Reject non-positive limits, naming the field."""
        for name in (
            "cpu_time_s",
            "wall_time_s",
            "memory_bytes",
            "max_output_bytes",
            "max_processes",
            "max_file_bytes",
            "max_open_files",
            "tmp_bytes",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name}: must be > 0, got {value}")


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed command did.

    Attributes:
        stdout: Captured stdout (UTF-8, undecodable bytes replaced), at most ``max_output_bytes``.
        stderr: Captured stderr, same cap.
        exit_code: The command's exit status; ``128 + N`` when signal N killed it.
        timed_out: True when the wall-clock or CPU limit ended it.
        truncated: True when stdout or stderr went past the cap.
        killed_reason: ``wall_time`` or ``cpu_time`` when a limit killed it; ``external`` when
            SIGKILL ended it and neither limit explains it (``killed_externally``); else ``None``.
        isolation: ``bwrap`` or ``process``: the mode actually used.
        network_isolated: True when the command ran in its own network namespace.
        filesystem_isolated: True when the host file system was hidden (bwrap mode).
        wall_s: Seconds from start to the end of clean-up.
        cpu_s: CPU seconds (user + system) of the command and the children it waited for, from
            ``wait4``, in process mode; ``None`` in bwrap mode (the command runs under bwrap's own
            init, whose children's time does not reach this process) or when not reaped here.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    killed_reason: str | None
    isolation: str
    network_isolated: bool
    filesystem_isolated: bool
    wall_s: float
    cpu_s: float | None = None

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its limits."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def killed_externally(self) -> bool:
        """SIGKILL ended the command and none of its own limits did: an infrastructure failure (issue 32).

        The OOM killer, a node or pod eviction, or an operator's ``kill -9`` look like this. So
        does a command that SIGKILLs itself or exits 137 (indistinguishable from the outside; see
        the module's "Not guaranteed").
        """
        return self.killed_reason == "external"


@dataclass(frozen=True)
class SandboxCapabilities:
    """What isolation this machine offers (probed once per process).

    Attributes:
        running_as_root: Whether this process's effective uid is 0.
        bwrap: Path of a working ``bwrap``, or ``None``.
        bwrap_error: Why bwrap mode is unavailable (``None`` when it works).
        netns_prefix: argv prefix that puts a command in a new network namespace in process mode
            (``unshare --net``...), or empty when none works.
        netns_error: Why process mode has no network namespace (``None`` when it has one).
    """

    running_as_root: bool
    bwrap: str | None
    bwrap_error: str | None
    netns_prefix: tuple[str, ...] = field(default=())
    netns_error: str | None = None


def _tool(name: str) -> str:
    """Absolute path of a required util-linux program.

    Raises:
        SandboxUnavailableError: the program is not installed.
    """
    path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxUnavailableError(f"{name} not found; install util-linux (apt-get install util-linux)")
    return path


def _interpreter_prefixes() -> list[str]:
    """Directories the sandbox needs read-only for ``sys.executable`` and its packages."""
    candidates = [sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)]
    prefixes: list[str] = []
    for raw in candidates:
        path = str(Path(raw).resolve())
        if path == "/usr" or path.startswith("/usr/"):
            continue
        if any(path == p or path.startswith(p + "/") for p in prefixes):
            continue
        prefixes = [p for p in prefixes if not p.startswith(path + "/")] + [path]
    return prefixes


def _ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a", "/a/b"]``: the directories bwrap must create before a mount."""
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def _bwrap_argv(
    bwrap: str,
    *,
    root: bool,
    allow_network: bool,
    workdir: str,
    tmp_bytes: int,
    code_file: str | None,
    env: Mapping[str, str],
) -> list[str]:
    """The ``bwrap`` command line (without the command) for one sandbox."""
    argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if not root:
        argv += ["--unshare-user"]
    if not allow_network:
        argv += ["--unshare-net"]
    if root:
        # Kept only so setpriv can switch to the sandbox uid; setuid to non-root clears them all.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    etc = ["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"]
    if allow_network:
        etc += ["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates"]
    argv += ["--perms", "0755", "--dir", "/etc"]
    for path in etc:
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    # /tmp before the interpreter prefixes: a virtualenv that lives under /tmp (a checkout there) is
    # bound on top of the tmpfs instead of being hidden by it.
    argv += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    created: set[str] = {"/usr", "/etc", "/tmp"}
    prefixes = _interpreter_prefixes()
    for prefix in prefixes:
        for parent in _ancestors(prefix + "/x"):
            if parent not in created:
                argv += ["--perms", "0755", "--dir", parent]
                created.add(parent)
        argv += ["--ro-bind", prefix, prefix]
    package_dir = str(Path(__file__).resolve().parents[1])
    if any(package_dir.startswith(p + "/") for p in prefixes):
        argv += ["--tmpfs", package_dir]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--bind", workdir, SANDBOX_WORKDIR]
    if code_file is not None:
        argv += ["--perms", "0755", "--dir", "/run", "--perms", "0755", "--dir", "/run/sandbox"]
        argv += ["--ro-bind", code_file, _CODE_PATH_IN_SANDBOX]
    argv += ["--chdir", SANDBOX_WORKDIR, "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def _setpriv_argv(uid: int | None) -> list[str]:
    """``setpriv`` prefix: switch to ``uid`` (root callers) and set ``no_new_privs``."""
    argv = [_tool("setpriv")]
    if uid is not None:
        argv += ["--reuid", str(uid), "--regid", str(uid), "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all"]
    return argv + ["--no-new-privs", "--"]


def _probe(argv: list[str], cwd: str) -> str | None:
    """Run a probe command; ``None`` when it exits 0, else the reason."""
    try:
        done = subprocess.run(
            argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode != 0:
        return f"{' '.join(argv[:2])}... exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
    return None


@functools.cache
def sandbox_capabilities() -> SandboxCapabilities:
    """Probe which isolation works on this machine (cached for the process).

    Runs the project's Python interpreter once through the bwrap wrapper and ``true`` once through
    each network-namespace wrapper.

    Returns:
        The ``SandboxCapabilities``; never raises for a missing feature, it reports it.
    """
    root = os.geteuid() == 0
    uid = SANDBOX_UID_RANGE.start if root else None
    with tempfile.TemporaryDirectory(prefix="posttrain-sandbox-probe-") as tmp:
        os.chmod(tmp, 0o755)
        bwrap = shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")
        bwrap_error: str | None = None
        if bwrap is None:
            bwrap_error = "bwrap not found (apt-get install bubblewrap)"
        else:
            try:
                argv = _bwrap_argv(
                    bwrap, root=root, allow_network=False, workdir=tmp, tmp_bytes=1 << 20, code_file=None,
                    env={"PATH": "/usr/bin:/bin"},
                )
                # Probe with the project's interpreter, not just ``true``: a layout that hides the
                # interpreter is unusable for the python tool and SWE grading.
                bwrap_error = _probe(argv + _setpriv_argv(uid) + [sys.executable, "-I", "-c", "pass"], tmp)
            except SandboxUnavailableError as exc:
                bwrap_error = str(exc)
            if bwrap_error is not None:
                bwrap = None
        unshare = shutil.which("unshare", path="/usr/bin:/bin")
        prefix: tuple[str, ...] = ()
        netns_error: str | None = "unshare not found (apt-get install util-linux)"
        if unshare is not None:
            candidate = [unshare, "--net", "--"] if root else [unshare, "--user", "--map-current-user", "--net", "--"]
            netns_error = _probe(candidate + ["true"], tmp)
            if netns_error is None:
                prefix = tuple(candidate)
    return SandboxCapabilities(
        running_as_root=root, bwrap=bwrap, bwrap_error=bwrap_error, netns_prefix=prefix, netns_error=netns_error
    )


def allocate_sandbox_uid() -> int | None:
    """Pick a dedicated uid for a sandbox (root callers), or ``None`` when not running as root.

    A uid is drawn at random from ``SANDBOX_UID_RANGE``, so concurrent sandboxes almost never share
    a process budget or can signal each other.
    """
    if os.geteuid() != 0:
        return None
    return random.SystemRandom().randrange(SANDBOX_UID_RANGE.start, SANDBOX_UID_RANGE.stop)


def _chown_one(entry: str, uid: int) -> None:
    """``lchown`` one entry to ``uid``:``uid``; skip multiply-linked regular files."""
    st = os.lstat(entry)
    if st.st_uid == uid and st.st_gid == uid:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return
    os.chown(entry, uid, uid, follow_symlinks=False)


def chown_tree(path: Path, uid: int) -> None:
    """Give ``path`` and everything under it to ``uid``:``uid`` without following links.

    Symbolic links are changed themselves (``lchown``) and never descended into; regular files
    with more than one hard link are left alone, so a link to a host file never changes that file.

    Raises:
        OSError: an entry could not be changed.
    """
    _chown_one(str(path), uid)
    for current, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            _chown_one(os.path.join(current, name), uid)


def _live_pids_of_uid(uid: int) -> list[int]:
    """Pids whose real uid is ``uid`` and that are not zombies (from ``/proc``)."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                status = handle.read()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the process exited while we looked: nothing to kill
        state = uid_line = ""
        for line in status.splitlines():
            if line.startswith("State:"):
                state = line.split()[1]
            elif line.startswith("Uid:"):
                uid_line = line.split()[1]
        if uid_line == str(uid) and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def reap_uid(uid: int) -> None:
    """SIGKILL every process of the dedicated sandbox ``uid`` until none is left (root only).

    Uses ``kill(-1, SIGKILL)`` issued *as* ``uid``: the kernel signals every process of the uid
    while holding the task list lock, so a fork bomb cannot outrun it.

    Raises:
        SandboxError: processes were still alive after ``_REAP_ROUNDS`` rounds.
    """
    if uid not in SANDBOX_UID_RANGE:
        raise SandboxError(f"uid: refusing to reap {uid}, outside SANDBOX_UID_RANGE")
    kill = _tool("kill")
    pids: list[int] = []
    for _ in range(_REAP_ROUNDS):
        pids = _live_pids_of_uid(uid)
        if not pids:
            return
        subprocess.run(
            [*_setpriv_argv(uid), kill, "-KILL", "-1"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False,
        )
        time.sleep(0.01)
    raise SandboxError(f"processes of sandbox uid {uid} survived {_REAP_ROUNDS} kill rounds: {pids[:10]}")


def _count_own_tasks(uid: int) -> int:
    """Number of threads (tasks) the given uid runs now: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while counting: it no longer counts
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group started for ``proc`` (a no-op once the group is empty)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return  # every member has already exited


def _write_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (relative path -> content) under ``root``.

    Raises:
        ValueError: an absolute path or one that leaves ``root`` (names the path).
    """
    for rel, content in files.items():
        rel_path = Path(rel)
        if rel_path.is_absolute() or ".." in rel_path.parts or not rel_path.parts:
            raise ValueError(f"files: path {rel!r} must be relative and stay inside the work directory")
        target = root / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)


def _clean_env(home: str, tmpdir: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The only environment variables the command sees.

    Raises:
        ValueError: a name or value that is not a string, is empty, or holds ``=``/NUL.
    """
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"env: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"env[{key!r}]: value must be a string without NUL")
        env[key] = value
    return env


def _poll(proc: subprocess.Popen[bytes], cpu: list[float]) -> int | None:
    """``proc.poll()`` that keeps the child's CPU seconds (``os.wait4``) in ``cpu`` when it reaps it.

    The CPU time tells a kill by RLIMIT_CPU's hard limit (SIGKILL after the soft limit's SIGXCPU
    was ignored) from a SIGKILL from outside.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: fall back to Popen's own bookkeeping
        return proc.poll()
    if pid == 0:
        return None
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu.append(usage.ru_utime + usage.ru_stime)
    return proc.returncode


def _wait(proc: subprocess.Popen[bytes], cpu: list[float], timeout_s: float) -> None:
    """Reap ``proc`` within ``timeout_s`` seconds, keeping its CPU seconds (``_poll``).

    Raises:
        subprocess.TimeoutExpired: still running after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while _poll(proc, cpu) is None:
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout_s)
        time.sleep(0.005)


def _killed_reason(exit_code: int, wall_timed_out: bool, cpu_s: float | None, cpu_soft_s: int) -> str | None:
    """``wall_time``, ``cpu_time``, ``external`` (a SIGKILL no limit of the sandbox explains) or None.

    RLIMIT_CPU sends SIGXCPU at the soft limit and SIGKILL one second later (the hard limit) to a
    process that ignores it; that SIGKILL comes after at least ``cpu_soft_s`` CPU seconds.
    """
    if wall_timed_out:
        return "wall_time"
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu_time"
    if exit_code == 128 + signal.SIGKILL:
        if cpu_s is not None and cpu_s >= cpu_soft_s:
            return "cpu_time"
        return "external"
    return None


def _pump(
    proc: subprocess.Popen[bytes], limits: SandboxLimits, uid: int | None, cpu: list[float]
) -> tuple[bytes, bytes, bool, bool]:
    """Read both pipes with a byte cap until they close; kill on the wall limit.

    ``cpu`` receives the command's CPU seconds when this reaps it (``_poll``).

    Returns:
        ``(stdout, stderr, wall_timed_out, truncated)``.
    """
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cap = limits.max_output_bytes
    truncated = False
    timed_out = False
    deadline = time.monotonic() + limits.wall_time_s
    drain_deadline: float | None = None
    selector = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream.fileno(), selectors.EVENT_READ)
    try:
        while selector.get_map():
            now = time.monotonic()
            if drain_deadline is None and (now >= deadline or _poll(proc, cpu) is not None):
                # Wall limit hit, or the command exited: nothing it started may keep running (or
                # keep the pipes open), so kill the group and the uid, then read what is left.
                timed_out = now >= deadline and _poll(proc, cpu) is None
                _kill_group(proc)
                if uid is not None:
                    reap_uid(uid)
                drain_deadline = time.monotonic() + _DRAIN_AFTER_KILL_S
            if drain_deadline is not None and now >= drain_deadline:
                break
            wait_until = drain_deadline if drain_deadline is not None else deadline
            for key, _ in selector.select(timeout=max(0.0, min(0.05, wait_until - now))):
                fd = int(key.fd)
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    continue  # spurious wake-up: nothing to read yet
                if not chunk:
                    selector.unregister(fd)
                    continue
                buffer = buffers[fd]
                room = cap - len(buffer)
                if len(chunk) > room:
                    truncated = True
                if room > 0:
                    buffer += chunk[:room]
    finally:
        selector.close()
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), timed_out, truncated


def run_in_sandbox(
    command: Sequence[str] | str | None = None,
    *,
    code: str | None = None,
    files: Mapping[str, str | bytes] | None = None,
    workdir: Path | str | None = None,
    limits: SandboxLimits | None = None,
    cpu_time_s: float | None = None,
    wall_time_s: float | None = None,
    memory_bytes: int | None = None,
    max_output_bytes: int | None = None,
    max_processes: int | None = None,
    allow_network: bool = False,
    env: Mapping[str, str] | None = None,
    isolation: Isolation = "auto",
    run_as_uid: int | None = None,
) -> SandboxResult:
    """Run one untrusted command in a fresh sandbox and return what it did.

    Args:
        command: argv list, or a string run with ``bash -c``. Exactly one of ``command``/``code``.
        code: Python source, run with the current interpreter (``python -s main.py``).
        files: Relative path -> content, written into the work directory before the run.
        workdir: Existing host directory to run in (read-write, ``/workspace`` inside bwrap);
            when ``None`` a private empty directory is made and deleted afterwards.
        limits: Base limits; the five keyword arguments below override single fields.
        cpu_time_s: CPU seconds per process.
        wall_time_s: Wall-clock seconds for the whole call.
        memory_bytes: Address space per process, bytes.
        max_output_bytes: Bytes kept of stdout, and of stderr.
        max_processes: Processes/threads of the sandbox at once.
        allow_network: Share the host network namespace (off by default).
        env: Extra environment variables for the command.
        isolation: ``auto``, ``bwrap`` or ``process`` (see ``Isolation``).
        run_as_uid: Dedicated uid in ``SANDBOX_UID_RANGE`` to run as (root callers; a persistent
            workspace keeps one uid); default: a fresh one per call.

    Returns:
        The ``SandboxResult``; a non-zero exit or a limit hit is reported there, not raised.

    Raises:
        ValueError: neither or both of ``command``/``code``, an empty command, a bad ``files`` path
            or ``env`` entry, a missing ``workdir``, or a ``run_as_uid`` outside the range.
        SandboxUnavailableError: ``isolation="bwrap"`` but bwrap does not work here.
        SandboxError: the sandbox could not be started, or its processes could not be killed.
    """
    if (command is None) == (code is None):
        raise ValueError("command/code: pass exactly one of them")
    if isinstance(command, str):
        command = ["bash", "-c", command]
    if command is not None and (len(command) == 0 or not all(isinstance(a, str) for a in command)):
        raise ValueError(f"command: must be a non-empty list of strings, got {command!r}")
    overrides: dict[str, Any] = {
        "cpu_time_s": cpu_time_s,
        "wall_time_s": wall_time_s,
        "memory_bytes": memory_bytes,
        "max_output_bytes": max_output_bytes,
        "max_processes": max_processes,
    }
    limits = replace(limits or SandboxLimits(), **{k: v for k, v in overrides.items() if v is not None})
    if isolation not in ("auto", "bwrap", "process"):
        raise ValueError(f"isolation: must be auto, bwrap or process, got {isolation!r}")
    caps = sandbox_capabilities()
    if isolation == "bwrap" and caps.bwrap is None:
        raise SandboxUnavailableError(f"isolation='bwrap' requested but unavailable: {caps.bwrap_error}")
    mode = "bwrap" if isolation != "process" and caps.bwrap is not None else "process"
    root = os.geteuid() == 0
    if run_as_uid is not None and (not root or run_as_uid not in SANDBOX_UID_RANGE):
        raise ValueError(f"run_as_uid: needs a root caller and a uid in SANDBOX_UID_RANGE, got {run_as_uid}")
    uid = run_as_uid if run_as_uid is not None else allocate_sandbox_uid()

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="posttrain-sandbox-"))
    try:
        if workdir is None:
            work = scratch / "work"
            work.mkdir()
        else:
            work = Path(workdir).resolve()
            if not work.is_dir():
                raise ValueError(f"workdir: {workdir} is not a directory")
        if files:
            _write_files(work, files)
        code_file: str | None = None
        if code is not None:
            code_path = scratch / "main.py"
            code_path.write_text(code, encoding="utf-8")
            code_path.chmod(0o644)
            code_file = str(code_path)
        home = scratch / "home"
        home.mkdir()
        if uid is not None:
            chown_tree(scratch, uid)
            if workdir is not None:
                chown_tree(work, uid)
        os.chmod(scratch, 0o755 if mode == "process" else 0o700)

        if mode == "bwrap":
            inner_code = _CODE_PATH_IN_SANDBOX
            sandbox_env = _clean_env("/tmp", "/tmp", env)
        else:
            inner_code = str(code_file)
            sandbox_env = _clean_env(str(home), str(home), env)
        inner = [sys.executable, "-s", inner_code] if code is not None else list(command or [])

        nproc = limits.max_processes
        if uid is None:
            nproc += _count_own_tasks(os.getuid())
        cpu_soft = max(1, math.ceil(limits.cpu_time_s))
        argv = [
            _tool("prlimit"),
            f"--cpu={cpu_soft}:{cpu_soft + 1}",
            f"--as={limits.memory_bytes}",
            f"--nproc={nproc}",
            f"--fsize={limits.max_file_bytes}",
            f"--nofile={limits.max_open_files}",
            "--core=0",
            "--",
        ]
        if mode == "bwrap":
            assert caps.bwrap is not None
            argv += _bwrap_argv(
                caps.bwrap, root=root, allow_network=allow_network, workdir=str(work),
                tmp_bytes=limits.tmp_bytes, code_file=code_file, env=sandbox_env,
            )
            network_isolated = not allow_network
        else:
            network_isolated = not allow_network and bool(caps.netns_prefix)
            if network_isolated:
                argv += list(caps.netns_prefix)
        argv += _setpriv_argv(uid) + inner

        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(work),
                env=sandbox_env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox ({argv[0]}): {exc}") from exc
        cpu: list[float] = []
        try:
            stdout, stderr, wall_timed_out, truncated = _pump(proc, limits, uid, cpu)
        finally:
            _kill_group(proc)
            if uid is not None:
                reap_uid(uid)
            try:
                _wait(proc, cpu, timeout_s=10)
            except subprocess.TimeoutExpired as exc:
                raise SandboxError(f"sandbox process {proc.pid} did not exit after SIGKILL") from exc
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
    finally:
        shutil.rmtree(scratch)

    exit_code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    cpu_s = cpu[0] if cpu and mode == "process" else None
    killed_reason = _killed_reason(exit_code, wall_timed_out, cpu_s, cpu_soft)
    return SandboxResult(
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=stderr.decode("utf-8", errors="replace"),
        exit_code=exit_code,
        timed_out=killed_reason in ("wall_time", "cpu_time"),
        truncated=truncated,
        killed_reason=killed_reason,
        isolation=mode,
        network_isolated=network_isolated,
        filesystem_isolated=mode == "bwrap",
        wall_s=time.monotonic() - started,
        cpu_s=cpu_s,
    )


EXEC_LIMIT_EXIT = 124
"""Exit status of ``--exec`` when a wall-clock or CPU limit ended the command (as ``timeout(1)``)."""


def _exec(argv: list[str]) -> int:
    """``--exec [--wall-time S] [--cpu-time S] -- ARGV...``: run ARGV in a sandbox, pass its output and exit status through.

    For callers outside this package (an agent's tool runner) that run one command per call:
    stdout and stderr go to this process's, the exit status is the command's, or
    ``EXEC_LIMIT_EXIT`` when a limit killed it.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m posttrain.envs.sandbox --exec")
    parser.add_argument("--wall-time", type=float, default=SandboxLimits.wall_time_s, help="wall-clock seconds")
    parser.add_argument("--cpu-time", type=float, default=SandboxLimits.cpu_time_s, help="CPU seconds per process")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    result = run_in_sandbox(command, wall_time_s=args.wall_time, cpu_time_s=args.cpu_time)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.killed_reason is not None:
        sys.stderr.write(f"sandbox: killed ({result.killed_reason} limit)\n")
        return EXEC_LIMIT_EXIT
    return result.exit_code


def _main(argv: list[str]) -> int:
    """Print this machine's sandbox capabilities, then run ``argv[1]`` (a shell line) in it; ``--exec``: see ``_exec``."""
    if len(argv) > 1 and argv[1] == "--exec":
        return _exec(argv[2:])
    caps = sandbox_capabilities()
    print(f"capabilities: {caps}")
    if len(argv) > 1:
        result = run_in_sandbox(argv[1])
        print(f"result: exit_code={result.exit_code} timed_out={result.timed_out} isolation={result.isolation} "
              f"network_isolated={result.network_isolated} filesystem_isolated={result.filesystem_isolated}")
        print(result.stdout, end="")
        print(result.stderr, end="", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
