"""What the asynchronous learner logs after each iteration, on top of its train step's own metrics.

Keys (all floats): the step's metrics (``loss/*``, ``mask/*``, ``value/*``, ``grpo/*``...);
``staleness/*`` (``StalenessStats`` over the run; ``staleness/batch_*``, this batch's rollouts,
from ``batch_staleness_metrics``); ``generator/<id>/*`` and ``generator/busy_fraction_mean``
(``posttrain.rollout.telemetry``); ``learner/step_s`` (seconds of the train step),
``learner/iteration``, ``learner/skipped_nonfinite`` (optimizer steps skipped for a non-finite
gradient norm over the run); ``throughput/rollouts_per_s`` and ``throughput/trained_action_tokens_per_s``
(cumulative since this process started), ``throughput/action_tokens_per_s`` (this batch's action
tokens over its step time); ``queue/dead_letters``, ``queue/length``; ``rollouts/correct_mean``;
``infra/*``: episodes that failed for the infrastructure, never trained (``infra/errors``, by cause
``infra/<cause>``, ``infra/share``, ``infra/reissued``, ``infra/abandoned``, ``infra/lost_in_flight``;
``posttrain.rollout.admission.infra_metrics``) and ``infra/dropped_by_learner`` (rollouts sent with
``outcome="infra_error"``, dropped on arrival);
the run's length accounting so far (``posttrain.rollout.lengths.length_metrics``: ``length/*``
started and trained by bucket, ``tokens/stale_masked_share``, ``tokens/dis_masked_share``).
The names match synchronous GRPO's, so runs of either compare directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from posttrain.learner.types import TrainStepResult
from posttrain.rollout.admission import AdmissionState, StalenessStats, infra_metrics
from posttrain.rollout.lengths import length_metrics
from posttrain.rollout.queue import QueueEntry, RolloutQueue
from posttrain.rollout.telemetry import generator_counters, generator_metrics


def learner_metrics(
    result: TrainStepResult,
    entries: Sequence[QueueEntry],
    *,
    iteration: int,
    counters: Mapping[str, float],
    staleness: StalenessStats,
    queue: RolloutQueue | None,
    generator_stats: Mapping[str, Mapping[str, float]],
    step_s: float,
    elapsed_s: float,
    admission: AdmissionState | None = None,
) -> dict[str, float]:
    """One iteration's metrics (module docstring).

    Args:
        result: The train step's result.
        entries: The batch.
        iteration: Learner iterations done, this one included.
        counters: Cumulative ``rollouts_trained``, ``action_tokens_trained``, ``skipped_nonfinite``
            and the length accounting (``rollout.lengths.count_batch``).
        staleness: Staleness statistics of consumed and dropped rollouts.
        queue: The stream consumer (dead letters, length); None: no stream (GKD at ``gkd.lmbda: 0``).
        generator_stats: Generator id -> its latest stats snapshot.
        step_s: Seconds the train step took.
        elapsed_s: Seconds since the learner started training in this process.
        admission: The admission counters now (``infra/*``); None leaves them out.
    """
    elapsed = max(elapsed_s, 1e-9)
    metrics = dict(result.metrics)
    metrics.update(staleness.as_metrics())
    metrics.update(generator_metrics(generator_stats))
    metrics.update(length_metrics({**counters, **generator_counters(generator_stats)}))
    action_tokens = sum(e.rollout.num_action_tokens for e in entries)
    metrics.update({
        "learner/step_s": step_s,
        "learner/iteration": float(iteration),
        "learner/skipped_nonfinite": counters.get("skipped_nonfinite", 0.0),
        "throughput/rollouts_per_s": counters["rollouts_trained"] / elapsed,
        "throughput/action_tokens_per_s": action_tokens / max(step_s, 1e-9),
        "throughput/trained_action_tokens_per_s": counters["action_tokens_trained"] / elapsed,
        "rollouts/correct_mean": sum(e.rollout.metrics.get("correct", 0.0) for e in entries) / max(len(entries), 1),
        "infra/dropped_by_learner": counters.get("infra_dropped", 0.0),
    })
    if queue is not None:
        metrics.update({"queue/dead_letters": float(queue.dead_letter_count()), "queue/length": float(queue.length())})
    if admission is not None:
        metrics.update(infra_metrics(admission))
    return metrics
