"""Infrastructure-failure counts (issue 32): one shape, its metrics and its share bound, wherever episodes run.

An episode whose infrastructure failed (``posttrain.envs.base.InfraError``: the sandbox died, the
grader could not run, a tool was killed from outside) is never scored as the agent's result. Every
place that runs episodes counts such failures the same way, so the metrics (``infra/*``), the
summary's row and the stop rule read alike:

* the asynchronous runtime, in the admission counters (``AdmissionState``, shared by generators,
  the rollout gateway and the learner);
* synchronous GRPO, in one process (``InfraTally``: no admission there);
* evaluations, per sample (``InfraTally``, whose "finished" are the samples).

``InfraCounts`` is the shape they share; ``infra_metrics`` turns one into metrics and
``share_exceeded`` into the one-line reason a bound is passed.

Example: ``t = InfraTally(); t.completed(19); t.failed("tool_killed", reissued=False)``;
``share_exceeded(t, 0.01, 20)`` is ``"1 of 20 finished episodes failed for the infrastructure
(tool_killed 1): 5% > generator.max_infra_error_share=0.01"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


def infra_share(infra_total: int, completed_total: int) -> float:
    """Share of finished episodes that failed for the infrastructure: ``infra / (infra + completed)`` (0 when none)."""
    finished = infra_total + completed_total
    return infra_total / finished if finished else 0.0


class InfraCounts(Protocol):
    """The infrastructure-failure counters of a run (``AdmissionState`` and ``InfraTally`` have them).

    Attributes:
        infra_total: Episodes that failed for the infrastructure, never trained nor scored.
        completed_total: Episodes that finished with the agent's result (trained, or scored).
        infra_by_cause: ``infra_total`` split by cause (``tool_killed``, ``grader_killed``...).
        reissued_total: Failed episodes whose task was run again.
        abandoned_total: Failed episodes whose task was given up after the retries.
        lost_total: Episodes lost in flight (their generator died or restarted).
        client_retry_total: Failed episodes of external agents (the rollout gateway), whose retry
            is their client's: neither re-issued nor given up by the run.
    """

    @property
    def infra_total(self) -> int: ...  # noqa: D102 - the class docstring lists them

    @property
    def completed_total(self) -> int: ...  # noqa: D102

    @property
    def infra_by_cause(self) -> dict[str, int]: ...  # noqa: D102

    @property
    def reissued_total(self) -> int: ...  # noqa: D102

    @property
    def abandoned_total(self) -> int: ...  # noqa: D102

    @property
    def lost_total(self) -> int: ...  # noqa: D102

    @property
    def client_retry_total(self) -> int: ...  # noqa: D102


@dataclass
class InfraTally:
    """``InfraCounts`` kept in one process (synchronous GRPO, an evaluation); see ``InfraCounts`` for the fields."""

    infra_total: int = 0
    completed_total: int = 0
    infra_by_cause: dict[str, int] = field(default_factory=dict)
    reissued_total: int = 0
    abandoned_total: int = 0
    lost_total: int = 0
    client_retry_total: int = 0

    @property
    def infra_share(self) -> float:
        """``infra_share(infra_total, completed_total)``."""
        return infra_share(self.infra_total, self.completed_total)

    def completed(self, count: int = 1) -> None:
        """``count`` episodes finished with the agent's result."""
        self.completed_total += count

    def failed(self, cause: str, *, reissued: bool) -> None:
        """One episode failed for the infrastructure (``cause``); its task runs again (``reissued``) or is given up."""
        self.infra_total += 1
        self.infra_by_cause[cause] = self.infra_by_cause.get(cause, 0) + 1
        if reissued:
            self.reissued_total += 1
        else:
            self.abandoned_total += 1

    def add(self, other: InfraCounts) -> None:
        """Add ``other``'s counts to these (another rank's tally of the same iteration)."""
        self.infra_total += other.infra_total
        self.completed_total += other.completed_total
        for cause, n in other.infra_by_cause.items():
            self.infra_by_cause[cause] = self.infra_by_cause.get(cause, 0) + n
        self.reissued_total += other.reissued_total
        self.abandoned_total += other.abandoned_total
        self.lost_total += other.lost_total
        self.client_retry_total += other.client_retry_total

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> InfraTally:
        """The tally ``infra_metrics`` wrote (a checkpoint's counters), so a resumed run counts on; zeros when absent."""
        return cls(
            infra_total=int(metrics.get("infra/errors", 0.0)),
            completed_total=int(metrics.get("infra/completed", 0.0)),
            infra_by_cause={k[len("infra/"):]: int(v) for k, v in metrics.items() if is_cause_metric(k)},
            reissued_total=int(metrics.get("infra/reissued", 0.0)),
            abandoned_total=int(metrics.get("infra/abandoned", 0.0)),
            lost_total=int(metrics.get("infra/lost_in_flight", 0.0)),
            client_retry_total=int(metrics.get("infra/left_to_client", 0.0)),
        )


_FIXED = ("infra/errors", "infra/share", "infra/completed", "infra/reissued", "infra/abandoned",
          "infra/lost_in_flight", "infra/left_to_client", "infra/dropped_by_learner")
"""The ``infra/*`` metric names that are not causes."""


def is_cause_metric(name: str) -> bool:
    """Whether metric ``name`` is ``infra/<cause>`` (a count by cause), not one of the fixed ``infra/*`` names."""
    return name.startswith("infra/") and name not in _FIXED


def infra_metrics(counts: InfraCounts) -> dict[str, float]:
    """A run's infrastructure failures as metrics and summary counters.

    Keys: ``infra/errors`` (episodes that failed for the infrastructure, never trained),
    ``infra/share`` (of the finished episodes), ``infra/completed`` (finished with the agent's
    result), ``infra/<cause>`` for each cause seen, ``infra/reissued`` (tasks queued to run again),
    ``infra/abandoned`` (given up after the retries), ``infra/lost_in_flight`` (episodes their
    generator died or restarted under), ``infra/left_to_client`` (external agents' episodes closed
    with ``infra_error`` at the rollout gateway: their client retries, the run does not).
    """
    out = {
        "infra/errors": float(counts.infra_total),
        "infra/share": infra_share(counts.infra_total, counts.completed_total),
        "infra/completed": float(counts.completed_total),
        "infra/reissued": float(counts.reissued_total),
        "infra/abandoned": float(counts.abandoned_total),
        "infra/lost_in_flight": float(counts.lost_total),
        "infra/left_to_client": float(counts.client_retry_total),
    }
    out.update({f"infra/{cause}": float(n) for cause, n in sorted(counts.infra_by_cause.items())})
    return out


def causes_text(by_cause: Mapping[str, float]) -> str:
    """``grader_killed 1, tool_killed 2``: the counts by cause, sorted by cause."""
    return ", ".join(f"{cause} {n:.0f}" for cause, n in sorted(by_cause.items()))


def share_exceeded(counts: InfraCounts, max_share: float, min_finished: int, *,
                   setting: str = "generator.max_infra_error_share", what: str = "finished episodes") -> str | None:
    """The reason (one line) when more than ``max_share`` of the finished failed for the infrastructure, else None.

    Nothing is decided before ``min_finished`` episodes (or samples) finished, failed ones
    included, so one early failure does not stop a run; a ``max_share`` of 1 never stops.

    Args:
        counts: The counters.
        max_share: The bound, 0 to 1 (``generator.max_infra_error_share``, ``eval.max_infra_error_share``).
        min_finished: Finished before the bound applies (``generator.infra_min_episodes``).
        setting: The config field the line names.
        what: What is counted, for the line (``finished episodes``, ``samples``).

    Returns:
        ``"N of M <what> failed for the infrastructure (causes): S% > <setting>=X"``, or None.
    """
    finished = counts.infra_total + counts.completed_total
    share = infra_share(counts.infra_total, counts.completed_total)
    if finished < min_finished or share <= max_share:
        return None
    return (f"{counts.infra_total} of {finished} {what} failed for the infrastructure "
            f"({causes_text(counts.infra_by_cause)}): {share:.0%} > {setting}={max_share:g}")
