"""The learner's watch on its generators: return dead ones' tickets, report, and stop when none is alive.

At every learner iteration ``GeneratorWatch.check`` reads the generators' heartbeats
(``posttrain.rollout.liveness``; three Redis round trips). Each check first returns the admission
tickets of generators whose heartbeat lapsed, so a dead generator never stalls a run for its lease
time. While the learner waits for rollouts (``next_batch`` gave nothing) with no live generator, it logs a status line (when the silence starts, then every
``status_every_s`` seconds), and after ``timeout_s`` seconds without one it returns the reason the
learner must stop; the learner then checkpoints and ends with ``LearnerStopped`` (one line).

Example: ``GeneratorWatch(live=lambda: [], return_dead=lambda: 0, timeout_s=60).check()`` returns
None at first and the stop reason once 60 s have passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from posttrain.rollout.infra import InfraCounts, share_exceeded

if TYPE_CHECKING:  # the learner's types import torch; this module does not
    from posttrain.learner.types import LearnerSummary

log = logging.getLogger("posttrain.learner")

INTERRUPTED = "interrupted (Ctrl-C)"
"""How a stop reason caused by SIGINT begins; such a stop exits with status 130 (128 + SIGINT)."""


class LearnerStopped(RuntimeError):
    """The learner stopped before its last version, after a final checkpoint (the message is one line).

    Attributes:
        exit_code: Process exit status for the CLI (1: no live generator, or no progress for
            ``learner.max_iterations_without_progress`` iterations; 143: SIGTERM; 130: SIGINT, Ctrl-C).
        summary: What the learner had done when it stopped (the counters its final checkpoint holds, with
            those it started from: ``LearnerSummary.this_life``), so that the stopped life's time account
            charges the tokens it trained; None when unknown (e.g. raised by a wrapper that lost it).
    """

    def __init__(self, message: str, exit_code: int, summary: LearnerSummary | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.summary = summary


class InfraShareBound:
    """Stops the run once too many of its episodes failed for the infrastructure (issue 32).

    Infrastructure failures are never trained; their tasks run again. A sandbox or grader that
    breaks for good would turn the run into retries, so once at least ``min_episodes`` episodes
    finished (sent or failed for the infrastructure) and the failed share passes ``max_share``, the
    learner checkpoints and stops with one line naming the share, the setting and the causes.

    Synchronous GRPO uses the same bound on its own tally (``posttrain.rollout.infra.InfraTally``).

    Args:
        state: Returns the counters: the admission counters (``AdmissionController.state``), or
            any ``posttrain.rollout.infra.InfraCounts``.
        max_share: ``generator.max_infra_error_share`` (0 to 1; 1 never stops).
        min_episodes: ``generator.infra_min_episodes``.
        logs: Where the failed tasks are named, for the line.
    """

    def __init__(self, state: Callable[[], InfraCounts], max_share: float, min_episodes: int,
                 logs: str = "generator logs") -> None:
        self._state, self.max_share, self.min_episodes, self.logs = state, max_share, min_episodes, logs

    def check(self) -> str | None:
        """The stop reason (one line) when the bound is passed, else None."""
        reason = share_exceeded(self._state(), self.max_share, self.min_episodes)
        if reason is None:
            return None
        return f"{reason}; stopped after a final checkpoint ({self.logs} name the tasks)"


class GeneratorWatch:
    """Tracks how long the run has had no live generator (module docstring).

    Args:
        live: Returns the ids of live generators.
        return_dead: Returns dead generators' tickets; returns how many.
        timeout_s: Seconds with no live generator before the learner stops
            (``learner.no_generator_timeout_s``).
        status_every_s: Seconds between status lines while none is alive.
        clock: Seconds clock (``time.monotonic``; tests pass a hand-driven one).

    Attributes:
        leases_returned: Tickets of dead generators returned so far.
        status_lines: Status lines logged so far.

    Raises:
        ValueError: ``timeout_s`` or ``status_every_s`` not > 0.
    """

    def __init__(self, live: Callable[[], list[str]], return_dead: Callable[[], int], timeout_s: float,
                 status_every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0 or not status_every_s > 0:
            raise ValueError(f"timeout_s/status_every_s: must be > 0 seconds, got {timeout_s}/{status_every_s}")
        self._live, self._return_dead, self._clock = live, return_dead, clock
        self.timeout_s, self.status_every_s = timeout_s, status_every_s
        self._first_status_s = min(status_every_s, timeout_s / 2)
        self._none_since: float | None = clock()  # no generator is known alive at start
        self._next_status = self._none_since + self._first_status_s
        self.leases_returned = 0
        self.status_lines = 0
        self._seen_alive: set[str] = set()

    def check(self, waiting: bool = True) -> str | None:
        """Return dead generators' tickets, then the stop reason if none has been alive for ``timeout_s``, else None.

        Args:
            waiting: The learner found no batch. A learner still training (on a backlog of
                entries) is not waiting for generators: its silence clock restarts.
        """
        returned = self._return_dead()
        if returned:
            self.leases_returned += returned
            log.warning("learner: %d episodes of generators whose heartbeat lapsed were lost in flight: their "
                        "tickets returned, their tasks re-issued", returned)
        alive = self._live()
        for name in sorted(self._seen_alive - set(alive)):  # a death is never silent (issue 32)
            log.warning("learner: generator %s stopped renewing its heartbeat (it died or stopped); %d generator(s) "
                        "alive", name, len(alive))
        self._seen_alive = set(alive)
        now = self._clock()
        if alive or not waiting:
            if self._none_since is not None and self.status_lines:
                log.warning("learner: %d generator(s) alive again (%s)", len(alive), ", ".join(alive))
            self._none_since = None
            self.status_lines = 0
            return None
        if self._none_since is None:
            self._none_since, self._next_status = now, now + self._first_status_s
        silent = now - self._none_since
        if silent >= self.timeout_s:
            return (f"no live generator for {silent:.0f} s (learner.no_generator_timeout_s={self.timeout_s:g}); "
                    "stopped after a final checkpoint")
        if now >= self._next_status:
            self.status_lines += 1
            self._next_status = now + self.status_every_s
            print(f"learner: waiting for rollouts: no live generator for {silent:.0f} s; stopping at "
                  f"{self.timeout_s:g} s (learner.no_generator_timeout_s)", flush=True)
        return None
