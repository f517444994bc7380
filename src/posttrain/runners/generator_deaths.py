"""Watch the generator processes ``posttrain run`` started, and name each one that dies while the run goes on.

A generator that dies (SIGKILL, OOM, a crash) does not stop an SAO run: the learner returns its
admission tickets, re-issues the episodes it had in flight and trains on the others' rollouts.
That used to be silent: the summary still said "generators 2" and no line named the dead one
(issue 32). ``GeneratorDeaths`` polls the processes from a thread while the learner runs and
prints one line per death (name, exit status or signal, seconds into the SAO stage, how many are
left, the log to read); ``summary_value`` gives the summary's ``generators`` entry.

Example::

    deaths = GeneratorDeaths(procs, ["g0", "g1"], logs_dir).start()
    ...  # the learner runs
    deaths.stop()  # before stopping the generators: those exits are expected
    deaths.summary_value()  # "2 started, 1 died: g0 (killed by SIGKILL)"
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

POLL_S = 1.0
"""Seconds between two looks at the generator processes."""


def describe_exit(code: int) -> str:
    """``exit status 1`` or ``killed by SIGKILL`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class GeneratorDeaths:
    """Polls generator processes from a daemon thread; reports each that exits before ``stop`` (module docstring).

    Args:
        procs: The generator processes, in index order.
        names: Their generator ids (``g0``...), one per process.
        logs_dir: Where their logs are (``<run>/logs``; ``generator-<name>.log``).
        poll_s: Seconds between looks.
        out: Prints one line (default: ``print`` with flush).

    Attributes:
        died: ``(name, how)`` of each generator that exited while watched, in the order seen.

    Raises:
        ValueError: ``procs`` and ``names`` differ in length.
    """

    def __init__(self, procs: Sequence[subprocess.Popen[bytes]], names: Sequence[str], logs_dir: Path,
                 poll_s: float = POLL_S, out: Callable[[str], None] | None = None) -> None:
        if len(procs) != len(names):
            raise ValueError(f"names: expected one per process ({len(procs)}), got {len(names)}")
        self.procs, self.names, self.logs_dir, self.poll_s = list(procs), list(names), logs_dir, poll_s
        self.out = out or (lambda line: print(line, flush=True))
        self.died: list[tuple[str, str]] = []
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="generator deaths", daemon=True)

    def start(self) -> GeneratorDeaths:
        """Start watching (the clock of the lines starts now)."""
        self._started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def check(self) -> None:
        """Report every watched process that has exited since the last look (one line each); nothing after ``stop``."""
        if self._closed:
            return
        reported = {name for name, _ in self.died}
        for proc, name in zip(self.procs, self.names, strict=True):
            code = proc.poll()
            if code is None or name in reported:
                continue
            how = describe_exit(code)
            self.died.append((name, how))
            left = sum(1 for p in self.procs if p.poll() is None)
            self.out(f"      generator {name} died ({how}) {time.monotonic() - self._started:.0f} s into SAO; the "
                     f"run goes on with {left} of {len(self.procs)} generators (its episodes in flight are re-issued;"
                     f" log: {self.logs_dir / f'generator-{name}.log'})")

    def stop(self) -> None:
        """Stop watching, after a last look; later exits (the run stopping its generators) are not deaths."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(5.0, 2 * self.poll_s))
        self.check()
        self._closed = True

    def summary_value(self) -> str:
        """The summary's ``generators`` entry: ``2`` when none died, else ``2 started, 1 died: g0 (killed by SIGKILL)``."""
        if not self.died:
            return str(len(self.procs))
        names = ", ".join(f"{name} ({how})" for name, how in self.died)
        return f"{len(self.procs)} started, {len(self.died)} died: {names}"
