"""Infrastructure failures in evaluations: retried, then left out of the accuracy, counted by cause, bounded.

A sample whose episode or grading failed for the infrastructure (``posttrain.envs.base.InfraError``:
a sandbox that died or could not start, a grader or answer checker killed from outside; the agent
loop's ``EpisodeInfraError``) says nothing about the model, so an evaluation never scores it as a
wrong answer (issue 32):

1. it runs again with the same seed (``with_infra_retries``), at most ``eval.infra_retries`` times;
2. if it still fails it is left out of the accuracy and counted by cause in an ``InfraTally``
   (``posttrain.rollout.infra``) whose ``infra_total`` counts the samples left out,
   ``completed_total`` the samples graded and ``reissued_total`` the retries that ran;
3. when the samples left out pass ``eval.max_infra_error_share`` of all samples, no accuracy is
   reported: ``refusal`` gives the one line (``AccuracyRefused`` carries it where an accuracy was
   expected), since the samples that ran may not stand for the set.

Example: ``refusal(tally, 0.1, "held-out eval")`` is ``"held-out eval: 3 of 20 samples failed for the
infrastructure (tool_killed 3): 15% > eval.max_infra_error_share=0.1; no accuracy reported ..."``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from posttrain.envs.base import InfraError
from posttrain.episodes.runner import EpisodeInfraError
from posttrain.rollout.infra import InfraTally, share_exceeded

T = TypeVar("T")

INFRA_STATUS = "infra_error"
"""Status (and grading method) of a sample left out because its infrastructure failed."""

InfraFailure = InfraError | EpisodeInfraError
"""What an evaluation treats as an infrastructure failure: the environment's or the agent loop's."""


class AccuracyRefused(RuntimeError):
    """Too many samples failed for the infrastructure for an accuracy to mean anything (the message is one line)."""


async def with_infra_retries(attempt: Callable[[], Awaitable[T]], retries: int,
                             tally: InfraTally) -> T | InfraFailure:
    """Await ``attempt()``; after an infrastructure failure run it again, at most ``retries`` times.

    Args:
        attempt: Runs the sample once (same seed each time: its result is the model's, whatever the run).
        retries: ``eval.infra_retries``.
        tally: Counts each retry in ``reissued_total`` (the caller counts the sample's final outcome).

    Returns:
        The result, or the last ``InfraError`` / ``EpisodeInfraError`` when every run failed.
    """
    for run in range(retries + 1):
        try:
            return await attempt()
        except (InfraError, EpisodeInfraError) as exc:
            if run == retries:
                return exc
            tally.reissued_total += 1
    raise AssertionError("unreachable: the last run returns")


def scores(tally: InfraTally) -> dict[str, float]:
    """The evaluation's infrastructure counts as flat scores (``eval_<label>/infra_*`` in MLflow, KFP metrics).

    ``infra_errors`` (samples left out), ``infra_share`` (of all samples), ``infra_retried`` (runs
    again that were made), ``infra_<cause>`` for each cause seen.
    """
    out = {"infra_errors": float(tally.infra_total), "infra_share": tally.infra_share,
           "infra_retried": float(tally.reissued_total)}
    out.update({f"infra_{cause}": float(n) for cause, n in sorted(tally.infra_by_cause.items())})
    return out


def refusal(tally: InfraTally, max_share: float, what: str) -> str | None:
    """The one line refusing an accuracy when more than ``max_share`` of the samples were left out, else None.

    Args:
        tally: Samples left out (``infra_total``, by cause) and graded (``completed_total``).
        max_share: ``eval.max_infra_error_share`` (1 never refuses).
        what: Names the evaluation at the start of the line (``held-out eval``, ``gsm8k``).
    """
    reason = share_exceeded(tally, max_share, 1, setting="eval.max_infra_error_share", what="samples")
    if reason is None:
        return None
    return (f"{what}: {reason}; no accuracy reported (the samples that ran may not stand for the set; "
            "fix the sandbox or grader and evaluate again)")
