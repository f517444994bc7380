"""Attacks on each guarantee of ``posttrain.envs.sandbox`` (one test per guarantee).

Where a guarantee holds in both isolation modes the test runs in each mode this machine offers:
``bwrap`` (mount/PID/network namespaces) and ``process`` (rlimits, dedicated uid, network
namespace, no mount isolation). Commands are bash, which both modes can run.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

import posttrain
from outside_kill import OutsideKiller
from posttrain.envs.sandbox import (
    SandboxLimits,
    run_in_sandbox,
    sandbox_capabilities,
)

CAPS = sandbox_capabilities()
MODES = [
    pytest.param("bwrap", marks=pytest.mark.skipif(CAPS.bwrap is None, reason=f"bwrap unavailable: {CAPS.bwrap_error}")),
    "process",
]
needs_bwrap = pytest.mark.skipif(CAPS.bwrap is None, reason=f"bwrap unavailable: {CAPS.bwrap_error}")


def _processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker`` (excluding zombies)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


@pytest.mark.parametrize("isolation", MODES)
def test_fork_bomb_is_bounded_the_call_returns_and_nothing_survives(isolation):
    marker = f"bomb-{uuid.uuid4().hex}"
    result = run_in_sandbox(
        f": {marker}; b() {{ b | b & }}; b; sleep 1; echo still-here",
        isolation=isolation, max_processes=32, wall_time_s=4, cpu_time_s=2,
    )
    assert result.isolation == isolation
    assert "Resource temporarily unavailable" in result.stderr  # the process cap was reached
    assert _processes_with(marker) == []
    assert subprocess.run(["true"], check=False).returncode == 0  # the host can still fork


@pytest.mark.parametrize("isolation", MODES)
def test_huge_output_is_truncated_at_the_cap_without_buffering_it(isolation):
    """64 MB on stdout and 1 MB on stderr with a 10,000-byte cap: exactly 10,000 bytes of each
    kept; the parent's peak RSS grows by far less than the 64 MB written."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result = run_in_sandbox(
        "head -c 67108864 /dev/zero | tr '\\0' x; head -c 1048576 /dev/zero | tr '\\0' e >&2",
        isolation=isolation, max_output_bytes=10_000, wall_time_s=20,
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.exit_code == 0 and not result.timed_out
    assert result.truncated
    assert result.stdout == "x" * 10_000
    assert result.stderr == "e" * 10_000
    assert grown_kib < 16 * 1024


@needs_bwrap
def test_host_files_are_invisible_in_bwrap_mode(tmp_path):
    """A world-readable secret in another temporary directory, /root's entries, /etc/hostname and
    the posttrain source tree: none is readable inside."""
    secret_dir = Path(tempfile.mkdtemp(prefix="posttrain-secret-"))
    try:
        secret = secret_dir / "secret.txt"
        secret.write_text("TOP-SECRET-VALUE")
        secret.chmod(0o644)
        source = Path(posttrain.__file__).resolve().parent
        result = run_in_sandbox(
            f"cat {secret}; ls -A /root; cat /etc/hostname /etc/passwd /etc/shadow; ls {source}; ls {source}/envs/swe/tasks",
            isolation="bwrap",
        )
    finally:
        secret.unlink()
        secret_dir.rmdir()
    assert result.filesystem_isolated
    assert "TOP-SECRET-VALUE" not in result.stdout
    host_root_entries = set(os.listdir("/root")) - {".pyenv"}
    assert host_root_entries.isdisjoint(result.stdout.split())
    assert "root:" not in result.stdout
    assert "swe-001-page-count" not in result.stdout and "records.py" not in result.stdout


def test_private_host_files_are_unreadable_in_process_mode(tmp_path):
    """Process mode has no mount isolation: it guarantees only that files the sandbox uid may not
    read (a 0600 root-owned secret, /root with mode 0700) stay unreadable."""
    if not CAPS.running_as_root:
        pytest.skip("process mode protects private files only when the caller is root (dedicated uid)")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    secret.chmod(0o600)
    result = run_in_sandbox(f"cat {secret}; ls -A /root", isolation="process")
    assert not result.filesystem_isolated
    assert "TOP-SECRET-VALUE" not in result.stdout
    assert "Permission denied" in result.stderr


class _LoopbackServer:
    """A TCP server on 127.0.0.1 that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.mark.parametrize("isolation", MODES)
def test_loopback_server_of_the_host_is_unreachable(isolation):
    server = _LoopbackServer()
    try:
        command = f"echo hi > /dev/tcp/127.0.0.1/{server.port} && echo CONNECTED"
        result = run_in_sandbox(command, isolation=isolation)
        if not result.network_isolated:
            pytest.skip(f"no network namespace in {isolation} mode here: {CAPS.netns_error}")
        assert "CONNECTED" not in result.stdout
        assert server.connections == 0
        # Control: the same command with the network allowed does connect, so the test can fail.
        allowed = run_in_sandbox(command, isolation=isolation, allow_network=True)
        assert not allowed.network_isolated
        assert "CONNECTED" in allowed.stdout
    finally:
        server.close()


@pytest.mark.parametrize("isolation", MODES)
def test_infinite_loop_is_killed_by_the_cpu_limit(isolation):
    result = run_in_sandbox("while :; do :; done", isolation=isolation, cpu_time_s=1, wall_time_s=20)
    assert result.timed_out
    assert result.killed_reason == "cpu_time"


@pytest.mark.parametrize("isolation", MODES)
def test_sleeping_command_is_killed_at_the_wall_limit(isolation):
    result = run_in_sandbox("sleep 60", isolation=isolation, wall_time_s=1)
    assert result.timed_out
    assert result.killed_reason == "wall_time"
    assert result.exit_code == 128 + 9


@pytest.mark.parametrize("isolation", MODES)
def test_a_command_killed_from_outside_is_an_external_kill_not_its_own_failure(isolation):
    """Issue 32. ``sleep`` SIGKILLed by another process (as the OOM killer or an eviction would): exit
    137 as before, but reported as ``external`` (an infrastructure failure), not as a limit hit and
    not as a plain non-zero exit the caller would show the agent. Before the fix: killed_reason None."""
    marker = f"victim-{uuid.uuid4().hex}"
    killer = OutsideKiller(marker, timeout_s=60)
    result = run_in_sandbox(f"sleep 60; : {marker}", isolation=isolation, wall_time_s=60)
    assert killer.join(), "the victim never appeared"
    assert (result.exit_code, result.killed_reason, result.killed_externally) == (137, "external", True)
    assert not result.timed_out


def test_a_sigkill_at_the_cpu_hard_limit_is_the_cpu_limit_not_an_outside_kill():
    """Process mode: a program that ignores SIGXCPU gets SIGKILL at the hard limit (soft + 1 s of CPU):
    its own CPU limit (``cpu_time``; its CPU seconds show it), not ``external``. (In bwrap mode its
    CPU seconds are not visible and it reads as ``external``: the sandbox's "Not guaranteed".)"""
    code = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass\n"
    result = run_in_sandbox(code=code, isolation="process", cpu_time_s=1, wall_time_s=30)
    assert (result.exit_code, result.killed_reason, result.timed_out) == (137, "cpu_time", True)
    assert result.cpu_s is not None and result.cpu_s >= 1


@pytest.mark.parametrize("isolation", MODES)
def test_memory_hog_fails_cleanly(isolation):
    """A string doubled without end passes 64 MiB after ~26 doublings; the allocation fails,
    the shell exits non-zero, well before any time limit."""
    result = run_in_sandbox(
        's=x; while :; do s="$s$s"; done', isolation=isolation, memory_bytes=64 << 20, wall_time_s=20
    )
    assert result.exit_code != 0
    assert not result.timed_out


@needs_bwrap
def test_python_memory_hog_gets_memory_error():
    result = run_in_sandbox(code="x = bytearray(2 << 30)", isolation="bwrap", memory_bytes=512 << 20)
    assert result.exit_code == 1
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize("isolation", MODES)
def test_parent_environment_variables_are_not_visible(isolation, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_SECRET", "hunter2")
    result = run_in_sandbox("env", isolation=isolation, env={"EXTRA": "1"})
    assert "hunter2" not in result.stdout
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    assert "EXTRA" in names
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "USER", "LOGNAME", "PYTHONDONTWRITEBYTECODE",
                     "PYTHONUNBUFFERED", "EXTRA", "PWD", "SHLVL", "_"}


@pytest.mark.parametrize("isolation", MODES)
def test_daemonised_process_does_not_survive_the_call(isolation):
    marker = f"daemon-{uuid.uuid4().hex}"
    result = run_in_sandbox(
        f"setsid bash -c 'sleep 30; : {marker}' < /dev/null > /dev/null 2>&1 & echo started",
        isolation=isolation,
    )
    assert result.stdout.strip() == "started"
    assert _processes_with(marker) == []


@pytest.mark.parametrize("isolation", MODES)
def test_home_and_scratch_are_private_and_deleted(isolation, monkeypatch):
    # The sandbox's scratch goes under a temp root of this test's own, so that another process's sandbox (a parallel
    # test worker, another checkout's suite) stays out of the count; world-traversable like /tmp, for the sandbox uid.
    own = Path(tempfile.mkdtemp(prefix="sandbox-count-"))
    own.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("posttrain-sandbox-")}
    first = run_in_sandbox('echo kept > "$HOME/note"; cat "$HOME/note"', isolation=isolation)
    second = run_in_sandbox('cat "$HOME/note"', isolation=isolation)
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("posttrain-sandbox-")}
    assert first.stdout.strip() == "kept"
    assert second.exit_code != 0 and "kept" not in second.stdout
    assert after <= before
    own.rmdir()  # empty: both sandboxes deleted their scratch


@pytest.mark.parametrize("isolation", MODES)
def test_no_privileges_inside(isolation):
    """Capabilities all zero, no_new_privs set, and (root callers) a non-root uid."""
    result = run_in_sandbox("id -u; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status", isolation=isolation)
    lines = result.stdout.split("\n")
    if CAPS.running_as_root:
        assert lines[0] != "0"
    assert "CapEff:\t0000000000000000" in result.stdout
    assert "CapPrm:\t0000000000000000" in result.stdout
    assert "NoNewPrivs:\t1" in result.stdout


@pytest.mark.parametrize("isolation", MODES)
def test_file_size_limit_stops_a_disk_filler(isolation):
    """Writing 10 MiB with a 1 MiB cap: the writer dies of SIGXFSZ (128 + 25 = 153) and the file
    stops at exactly 1,048,576 bytes."""
    limits = SandboxLimits(max_file_bytes=1 << 20)
    result = run_in_sandbox("head -c 10485760 /dev/zero > big; echo rc=$?; stat -c %s big",
                            isolation=isolation, limits=limits)
    assert result.stdout.split() == ["rc=153", "1048576"]


def test_workdir_changes_persist_and_files_are_written_first(tmp_path):
    work = tmp_path / "repo"
    work.mkdir()
    result = run_in_sandbox("cat in.txt; echo out > out.txt", workdir=work, files={"in.txt": "in"})
    assert result.stdout == "in"
    assert (work / "out.txt").read_text() == "out\n"


@needs_bwrap
def test_python_code_runs_with_the_project_interpreter_in_bwrap_mode():
    result = run_in_sandbox(code="import os, sys; print(os.getcwd(), sys.version_info[:2])", isolation="bwrap")
    assert result.ok, result.stderr
    assert result.stdout.startswith("/workspace (3, 11)")


def test_invalid_arguments_are_rejected_with_the_field_named():
    with pytest.raises(ValueError, match="command/code"):
        run_in_sandbox("true", code="pass")
    with pytest.raises(ValueError, match="files"):
        run_in_sandbox("true", files={"../escape": "x"})
    with pytest.raises(ValueError, match="SandboxLimits.wall_time_s"):
        SandboxLimits(wall_time_s=0)
    with pytest.raises(ValueError, match="env"):
        run_in_sandbox("true", env={"A=B": "x"})


@pytest.mark.parametrize("isolation", MODES)
def test_rlimits_are_applied_inside(isolation):
    """ulimit -c/-n/-u/-f report core 0, 100 files, 50 processes and 1024 blocks (bash's -f unit
    is 1024 bytes: 1 MiB / 1024 = 1024)."""
    limits = SandboxLimits(max_open_files=100, max_processes=50, max_file_bytes=1 << 20)
    result = run_in_sandbox("ulimit -c; ulimit -n; ulimit -u; ulimit -f", isolation=isolation, limits=limits)
    assert result.stdout.split() == ["0", "100", "50", "1024"]


@needs_bwrap
def test_tmp_is_a_size_limited_tmpfs():
    result = run_in_sandbox(
        "head -c 2097152 /dev/zero > /tmp/fill; echo rc=$?; stat -c %s /tmp/fill",
        isolation="bwrap", limits=SandboxLimits(tmp_bytes=1 << 20),
    )
    assert "No space left on device" in result.stderr
    assert result.stdout.split() == ["rc=1", "1048576"]


def test_an_interpreter_under_tmp_is_bound_after_the_tmp_tmpfs(monkeypatch):
    """A checkout under /tmp (its virtualenv at /tmp/checkout/.venv) must stay visible: bwrap applies
    mounts in order, so the /tmp tmpfs comes first and the prefix is bound on top of it (before the
    fix the tmpfs hid the interpreter and every sandboxed python exited 127)."""
    from posttrain.envs import sandbox

    monkeypatch.setattr(sandbox, "_interpreter_prefixes", lambda: ["/tmp/checkout/.venv"])
    argv = sandbox._bwrap_argv("bwrap", root=False, allow_network=False, workdir="/w", tmp_bytes=1 << 20,
                               code_file=None, env={})
    tmpfs = next(i for i in range(len(argv) - 1) if argv[i] == "--tmpfs" and argv[i + 1] == "/tmp")
    bind = next(i for i in range(len(argv) - 2) if argv[i] == "--ro-bind" and argv[i + 1] == "/tmp/checkout/.venv")
    assert tmpfs < bind
    assert argv.count("/tmp") == 1  # the tmpfs target only: /tmp is not re-created over it


def test_exec_mode_passes_output_and_exit_status_through_and_reports_a_limit_as_124():
    """``python -m posttrain.envs.sandbox --exec -- ARGV`` (the example agent's tool runner)."""
    import subprocess
    import sys

    run = [sys.executable, "-m", "posttrain.envs.sandbox", "--exec", "--wall-time", "2", "--"]
    done = subprocess.run([*run, "bash", "-c", "echo out; echo err >&2; exit 3"], capture_output=True, text=True,
                          timeout=60)
    assert (done.stdout, done.stderr, done.returncode) == ("out\n", "err\n", 3)
    slow = subprocess.run([*run, "sleep", "30"], capture_output=True, text=True, timeout=60)
    assert slow.returncode == 124 and "wall_time" in slow.stderr
