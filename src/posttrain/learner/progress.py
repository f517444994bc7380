"""Bounded progress: a learner that trains no token for ``learner.max_iterations_without_progress`` iterations stops.

One rule for every RL learner: SAO and asynchronous GRPO (``learner.setup.Learner``, in ``learner.loop``) and
synchronous GRPO (``runners.grpo_sync``). An iteration makes progress when it publishes a policy version that at
least one action token trained. It makes none, with its cause, when:

* ``uniform``: every GRPO group of its batch had equal rewards (zero advantage: the groups are dropped and no
  version is published), as on a task whose reward is always 0;
* ``stale``: every rollout read was dropped before a batch formed (older than ``max_staleness``); each batch's
  worth of drops (``batch_rollouts``) counts as one iteration;
* ``masked``: a version was published, but every action token of its update was masked (older than tau, or
  outside the DIS band), so only momentum and weight decay moved the weights;
* ``skipped``: no version for another reason (a policy step skipped for a non-finite gradient norm, which
  ``max_nonfinite_iterations`` usually stops first).

SAO's critic-only warm-up iterations publish no version by design and are not counted. Every quarter of the
bound without progress, the learner prints one status line with the shares of uniform groups, stale drops and
masked tokens over the iterations without progress so far; at the bound it checkpoints and stops with
``LearnerStopped`` (exit status 1), whose one line names the cause and the same shares.

Example::

    watch = ProgressWatch(limit=4, report=print)
    for _ in range(4):
        watch.observe(IterationOutcome(published=False, rollouts=8, groups=4, uniform_groups=4))
    watch.reason  # "no progress for 4 learner iterations in a row (...): every group uniform ... in all 4; ..."

Run the tests: ``python -m pytest -q tests/unit/learner/test_progress.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from posttrain.learner.types import TrainStepResult

SETTING = "learner.max_iterations_without_progress"
"""The config field that holds the bound, named in every line."""

CAUSES = {
    "uniform": "every group uniform (equal rewards, zero advantage)",
    "stale": "every rollout dropped as stale",
    "masked": "every action token masked (staleness bound or DIS band)",
    "skipped": "no version published (policy step skipped)",
}
"""What each cause of an iteration without progress means, as the lines write it."""


@dataclass(frozen=True)
class IterationOutcome:
    """What one learner iteration did, as far as progress goes.

    Attributes:
        published: The iteration published a policy version (``TrainStepResult.policy_updated``).
        rollouts: Rollouts in its batch (0: every rollout read was dropped before a batch formed).
        dropped: Rollouts dropped (stale, or malformed groups) while it was assembled.
        groups: GRPO groups in its batch (0 for SAO).
        uniform_groups: Of those, groups whose rewards were all equal.
        update_tokens: Action tokens that entered the policy update (tokens; 0 without one).
        masked_tokens: Of those, tokens that got no gradient: older than tau or outside the DIS band (tokens).
    """

    published: bool
    rollouts: int
    dropped: int = 0
    groups: int = 0
    uniform_groups: int = 0
    update_tokens: float = 0.0
    masked_tokens: float = 0.0

    @property
    def trained_tokens(self) -> float:
        """Action tokens that got policy gradient (tokens)."""
        return self.update_tokens - self.masked_tokens if self.published else 0.0

    @property
    def progress(self) -> bool:
        """True when the iteration published a version that at least one token trained."""
        return self.published and self.trained_tokens > 0

    @property
    def cause(self) -> str | None:
        """Why it made no progress (a key of ``CAUSES``), or None when it did."""
        if self.progress:
            return None
        if self.rollouts == 0:
            return "stale"
        if not self.published:
            return "uniform" if self.groups and self.uniform_groups == self.groups else "skipped"
        return "masked"


def outcome_of(result: TrainStepResult, rollouts: int, dropped: int = 0) -> IterationOutcome:
    """The outcome of a train step (SAO's or GRPO's, asynchronous or synchronous) on a batch of ``rollouts``.

    Token counts come from the step's per-rollout accounting where it has one (SAO's ``row_tokens``: trained,
    stale-masked and DIS-masked tokens); otherwise from GRPO's metrics: ``grpo/action_tokens_kept`` entered the
    update and ``mask/frac_total`` of them were DIS-masked (absent without the DIS mask: none). Groups come from
    ``grpo/groups`` and ``grpo/uniform_groups_frac``. GKD's update tokens are ``gkd/trained_tokens`` (its fixed
    sequences train too).

    Args:
        result: The train step's result.
        rollouts: Rollouts in the batch (0 for GKD at ``gkd.lmbda: 0``, whose rows are all fixed).
        dropped: Rollouts dropped while the batch was assembled.
    """
    m = result.metrics
    groups = int(m.get("grpo/groups", 0))
    uniform = round(m.get("grpo/uniform_groups_frac", 0.0) * groups)
    if result.row_tokens is not None:
        masked = sum(float(r["stale_masked_tokens"] or 0.0) + float(r["dis_masked_tokens"] or 0.0)
                     for r in result.row_tokens)
        update = masked + sum(float(r["trained_tokens"] or 0.0) for r in result.row_tokens)
    elif result.policy_updated:
        # GRPO: the kept groups' action tokens; GKD: every trained token, its fixed sequences' included.
        update = float(m.get("grpo/action_tokens_kept", m.get("gkd/trained_tokens", result.action_tokens_trained)))
        masked = float(m.get("mask/frac_total", 0.0)) * update
    else:
        update = masked = 0.0
    return IterationOutcome(published=result.policy_updated, rollouts=rollouts, dropped=dropped, groups=groups,
                            uniform_groups=uniform, update_tokens=update, masked_tokens=masked)


def _share(part: float, whole: float, what: str) -> str:
    """``100% (64 of 64 groups)``, or ``n/a (no groups)`` when ``whole`` is 0."""
    if whole <= 0:
        return f"n/a (no {what})"
    return f"{100 * part / whole:.0f}% ({part:.0f} of {whole:.0f} {what})"


class ProgressWatch:
    """Counts learner iterations in a row without progress, reports them and says when to stop (module docstring).

    Every rank of a sharded learner observes the same batches (GRPO's groups and SAO's token counts are reduced
    over the ranks); drops are rank 0's, and the asynchronous learner broadcasts rank 0's stop reason.

    Args:
        limit: Iterations in a row without progress that stop the run (``learner.max_iterations_without_progress``,
            >= 1).
        report: Prints a status line (rank 0: the console); None prints nothing (other ranks, tests).
        setting: The config field named in the lines.

    Attributes:
        in_a_row: Iterations in a row without progress, up to the last one observed.
        causes: How many of those had each cause (``CAUSES``).
        reason: The stop reason (one line) once ``in_a_row`` reaches ``limit``; None before.
        last: The last outcome observed.
        status_lines: Status lines reported so far.

    Raises:
        ValueError: ``limit`` < 1.
    """

    def __init__(self, limit: int, report: Callable[[str], None] | None = None, setting: str = SETTING) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        self.limit, self.report, self.setting = limit, report, setting
        self.report_every = max(1, limit // 4)
        self.in_a_row = 0
        self.causes: Counter[str] = Counter()
        self._sums = [0.0] * 6  # rollouts, dropped, groups, uniform groups, update tokens, masked tokens
        self.reason: str | None = None
        self.last: IterationOutcome | None = None
        self.status_lines = 0

    def observe(self, outcome: IterationOutcome) -> None:
        """Count one iteration: progress ends a streak; otherwise extend it, report every quarter, set ``reason``."""
        self.last = outcome
        cause = outcome.cause
        if cause is None:
            self.in_a_row, self.causes, self._sums = 0, Counter(), [0.0] * 6
            return
        self.in_a_row += 1
        self.causes[cause] += 1
        o = outcome
        for i, value in enumerate((o.rollouts, o.dropped, o.groups, o.uniform_groups, o.update_tokens, o.masked_tokens)):
            self._sums[i] += value
        if self.in_a_row >= self.limit:
            self.reason = (f"no progress for {self.in_a_row} learner iterations in a row ({self.setting}="
                           f"{self.limit}): {self._causes()}; {self.shares()}; stopped after a final checkpoint")
        elif self.report is not None and self.in_a_row % self.report_every == 0:
            self.status_lines += 1
            self.report(f"learner: no progress for {self.in_a_row} iterations in a row ({self._causes()}); "
                        f"{self.shares()}; stops at {self.limit} ({self.setting})")

    def shares(self) -> str:
        """The shares of uniform groups, stale drops and masked tokens over the iterations without progress."""
        rollouts, dropped, groups, uniform, update, masked = self._sums
        return (f"uniform groups {_share(uniform, groups, 'groups')}, stale drops "
                f"{_share(dropped, dropped + rollouts, 'rollouts')}, masked tokens {_share(masked, update, 'update tokens')}")

    def _causes(self) -> str:
        """``every group uniform (...) in all 20``, or each cause with its count, most frequent first."""
        if len(self.causes) == 1:
            cause, = self.causes
            return f"{CAUSES[cause]} in all {self.in_a_row}"
        return ", ".join(f"{CAUSES[c]} in {n}" for c, n in self.causes.most_common())

    def metrics(self) -> dict[str, float]:
        """The last iteration's shares and the streak, for the metrics sink (``progress/*``).

        ``progress/iterations_without_progress`` (the streak), ``progress/stale_dropped_frac`` (of the rollouts
        read), ``progress/masked_tokens_frac`` (of the update's action tokens) and, with groups,
        ``progress/uniform_groups_frac``; empty before the first observation.
        """
        o = self.last
        if o is None:
            return {}
        out = {"progress/iterations_without_progress": float(self.in_a_row),
               "progress/stale_dropped_frac": o.dropped / max(o.dropped + o.rollouts, 1),
               "progress/masked_tokens_frac": o.masked_tokens / o.update_tokens if o.update_tokens else 0.0}
        if o.groups:
            out["progress/uniform_groups_frac"] = o.uniform_groups / o.groups
        return out


def print_line(line: str) -> None:
    """Print ``line`` on the console at once (the ``report`` of rank 0)."""
    print(line, flush=True)
