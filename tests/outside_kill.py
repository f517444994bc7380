"""Kill a sandboxed process from outside, as the OOM killer, an eviction or an operator's ``kill -9`` would.

Shared by the infrastructure-failure tests (issue 32): a thread waits for a process whose command
line holds a marker and SIGKILLs it. Commands carry the marker in their own command line (a shell
``: MARKER`` word; Python code re-executes itself with the marker as an argument, ``victim_code``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path


def pids_with(marker: str) -> list[int]:
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


def victim_code(marker: str, sleep_s: int = 60) -> str:
    """Python source that replaces its process by one sleeping ``sleep_s`` s with ``marker`` in its command line."""
    return ("import os, sys\n"
            f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep({sleep_s})', {marker!r}])\n")


class OutsideKiller:
    """A thread that SIGKILLs the first process whose command line holds ``marker`` (within ``timeout_s``).

    Attributes:
        killed: Pids it killed (empty if none appeared in time).
    """

    def __init__(self, marker: str, timeout_s: float = 120.0) -> None:
        self.marker, self.timeout_s = marker, timeout_s
        self.killed: list[int] = []
        self._thread = threading.Thread(target=self._run, name=f"kill {marker}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for pid in pids_with(self.marker):
                if pid == os.getpid():
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
                except ProcessLookupError:
                    continue
            if self.killed:
                return
            time.sleep(0.02)

    def join(self) -> list[int]:
        """Wait for the thread; the pids it killed."""
        self._thread.join()
        return self.killed
