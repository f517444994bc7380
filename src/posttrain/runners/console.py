"""What ``posttrain run`` shows on the console, and where everything else it prints goes.

The console shows the run's stages (``[1/5] prepare ...``), a progress line every few policy
versions, the summary table, posttrain's own warnings and every error (one line for bad input, as
``posttrain.cli`` prints them). Everything else goes to ``<run>/logs/run.log`` (``RUN_LOG``):

* records of other libraries' loggers (MLflow, alembic, transformers, torch, vLLM) at INFO and
  above, and Python ``warnings`` (``logging.captureWarnings``); MLflow and vLLM are told not to
  install their own console handlers (``MLFLOW_CONFIGURE_LOGGING``, ``VLLM_CONFIGURE_LOGGING``), so
  their records reach the file too;
* inside ``engine_output_to_log``, whatever is written to file descriptors 1 and 2, by this process
  or by the child processes an inference engine spawns (vLLM's EngineCore writes its warnings
  there, outside Python's logging of this process).

Generator processes write to ``<run>/logs/generator-g<i>.log`` (``posttrain.runners.sao``).

Every time the console shows (a stage's ``at N s``, a progress line's, the summary's ``wall time``)
is read from one clock, ``seconds_since_start``: seconds since the process started, so the
interpreter's start, the imports and MLflow's set-up are counted too.
Run the tests: ``python -m pytest -q tests/unit/runners/test_console.py``.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RUN_LOG = Path("logs") / "run.log"
"""The run's log file, relative to the run directory ``<output_dir>/<run_name>``."""

_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class ConsoleFilter(logging.Filter):
    """Let through posttrain's own records at WARNING and above, and any other logger's at ERROR and above."""

    def filter(self, record: logging.LogRecord) -> bool:
        """True when ``record`` belongs on the console (see the class docstring)."""
        own = record.name == "posttrain" or record.name.startswith("posttrain.")
        return record.levelno >= (logging.WARNING if own else logging.ERROR)


class _LazyFileHandler(logging.FileHandler):
    """A ``FileHandler`` that creates its file, and the directories above it, at the first record only.

    A run refused before any work (a missing data file found by the technique's runner) then leaves
    no run directory behind.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path, encoding="utf-8", delay=True)

    def _open(self) -> io.TextIOWrapper:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


_SELF_CONFIGURING = ("mlflow", "vllm")
"""Libraries that attach their own console handler to their logger (and stop propagation) when imported."""


def route_logs(run_dir: Path, verbose: bool = False) -> Path:
    """Send library log records and warnings to ``<run_dir>/logs/run.log``; keep the console for the run's own lines.

    Replaces the root logger's handlers with a file handler (INFO, or DEBUG with ``verbose``) and a
    stderr handler behind ``ConsoleFilter`` (with ``verbose``, ``posttrain -v run``, unfiltered: every
    record on the console as well). Sets ``MLFLOW_CONFIGURE_LOGGING=false`` and
    ``VLLM_CONFIGURE_LOGGING=0`` unless the environment sets them: both libraries otherwise attach
    their own stdout/stderr handlers when imported; if they were imported already, their loggers' own
    handlers are removed and they propagate to the root again. Generator
    processes inherit the two variables; their output goes to their own log files.

    Returns:
        The log file's path (created with its directory at the first record; appended to by a re-run).
    """
    path = run_dir / RUN_LOG
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for name in _SELF_CONFIGURING:  # already imported (a component, a test): undo their own console handlers
        if isinstance(logger := logging.Logger.manager.loggerDict.get(name), logging.Logger):
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate, logger.level = True, logging.NOTSET
    to_file = _LazyFileHandler(path)
    to_file.setLevel(logging.DEBUG if verbose else logging.INFO)
    to_file.setFormatter(logging.Formatter(_FORMAT))
    to_console = logging.StreamHandler(sys.stderr)
    if not verbose:
        to_console.addFilter(ConsoleFilter())
    to_console.setFormatter(logging.Formatter("posttrain: %(levelname)s %(name)s: %(message)s"))
    root.addHandler(to_file)
    root.addHandler(to_console)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # Off, then on: an earlier routing in this process may have been undone by a ``warnings.catch_warnings``
    # block restoring ``showwarning`` behind logging's back, and ``captureWarnings(True)`` alone then does nothing.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    return path


@contextmanager
def engine_output_to_log(path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``path`` (appending) for the duration; restore them after.

    For the span of an inference engine's life: vLLM's EngineCore and worker processes inherit the
    descriptors and print their start-up reports and warnings there. An exception raised inside
    still propagates (``posttrain.cli`` prints it on the restored console); Python's ``sys.stdout``
    and ``sys.stderr`` are flushed at both edges so no line crosses to the wrong side.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


_IMPORTED_AT = time.monotonic()
"""``time.monotonic()`` when this module was imported: the start of the clock where the process's own start is unknown."""


def process_started() -> float:
    """The ``time.monotonic()`` reading of the moment this process started (its exec).

    On Linux from ``/proc/self/stat`` (start time in clock ticks since boot) against
    ``CLOCK_BOOTTIME``, both counted from the same boot; elsewhere, or if ``/proc`` cannot be read,
    the moment this module was imported (which misses the interpreter's start and earlier imports).
    """
    try:
        stat = Path("/proc/self/stat").read_text(encoding="ascii")
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22, starttime; fields after the command name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT
    return time.monotonic() - max(age, 0.0)


def seconds_since_start() -> float:
    """Seconds (wall clock) since this process started (``process_started``): the run's one clock on the console."""
    return time.monotonic() - process_started()


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 batch``, ``12 batches``: ``count`` and the noun in its number (``nouns`` defaults to ``noun`` + ``s``)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
