"""Length accounting of an asynchronous run: episodes started and trained by length bucket, masked tokens.

Agentic SAO exists so that long, tool-heavy episodes train as well as short ones; dropping stale
work is biased against exactly those (issue 21: 1.5% of the episodes with 9+ tool calls trained
against 89% of those with 0-2 under the first staleness rule). These numbers make the bias visible
in every run:

* **buckets** of tool calls (``CALL_BUCKETS``: 0-2, 3-5, 6-8, 9+) and of action tokens
  (``TOKEN_BUCKETS``: 0-63, 64-127, 128-255, 256-511, 512+);
* an episode **started** and ended one of three ways: the learner trained it (it was in a batch),
  the learner dropped it (too stale; ``learner.batch_source``), or a generator cancelled it in
  flight (``staleness_rule: episode`` only; ``generator.inflight``). Episodes still running when
  the run stopped, and failed ones, are not counted;
* a rollout's tool calls are its ``metrics["tool_calls"]`` when the environment reports it, else
  ``num_turns - 1``; a cancelled episode's are the turns it had sampled (each turn of an unfinished
  episode made a tool call), a lower bound of what it would have made. A cancelled episode's
  action tokens are not known: it counts in the tool-call buckets and in ``cancelled``, not in the
  token buckets;
* action tokens of the policy updates: how many got policy gradient, how many the staleness bound
  masked, how many the DIS band masked (``TrainStepResult.row_tokens``).

``count_batch`` adds one learner iteration to a flat dict of floats (the learner's checkpointed
counters), ``length_metrics`` turns those counters (and the generators' summed
``stale_aborted_calls_*``) into the logged and reported numbers.

Example: ``tests/unit/rollout/test_lengths.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence

from posttrain.records import Rollout

CALL_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 2), (3, 5), (6, 8), (9, None))
"""Tool-call buckets, inclusive bounds (None: no upper bound)."""
TOKEN_BUCKETS: tuple[tuple[int, int | None], ...] = ((0, 63), (64, 127), (128, 255), (256, 511), (512, None))
"""Action-token buckets, inclusive bounds (None: no upper bound)."""


def bucket_label(value: int, buckets: Sequence[tuple[int, int | None]]) -> str:
    """The label (``"3-5"``, ``"9+"``) of the bucket holding ``value`` (>= 0).

    Raises:
        ValueError: ``value`` is negative or below the first bucket.
    """
    for lo, hi in buckets:
        if value >= lo and (hi is None or value <= hi):
            return f"{lo}+" if hi is None else f"{lo}-{hi}"
    raise ValueError(f"value: {value} lies in no bucket of {list(buckets)}")


def labels(buckets: Sequence[tuple[int, int | None]]) -> list[str]:
    """Every bucket's label, shortest first."""
    return [bucket_label(lo, buckets) for lo, _ in buckets]


def tool_calls(rollout: Rollout) -> int:
    """Tool calls of a finished episode: ``metrics["tool_calls"]``, else ``num_turns - 1`` (at least 0)."""
    if "tool_calls" in rollout.metrics:
        return int(rollout.metrics["tool_calls"])
    return max(0, rollout.num_turns - 1)


def count_batch(counters: MutableMapping[str, float], trained: Iterable[Rollout], dropped: Iterable[Rollout],
                row_tokens: Sequence[Mapping[str, float | None]] | None = None) -> None:
    """Add one learner iteration's rollouts to ``counters`` (keys under ``length/`` and ``tokens/``).

    Args:
        counters: The learner's counters (float values; missing keys start at 0).
        trained: The batch's rollouts.
        dropped: The rollouts dropped while it was assembled.
        row_tokens: The train step's per-rollout token accounting (``TrainStepResult.row_tokens``),
            None when the step has none (asynchronous GRPO): the ``tokens/`` keys are left alone.
    """
    for outcome, rollouts in (("trained", trained), ("dropped", dropped)):
        for r in rollouts:
            calls = tool_calls(r)
            for key in (f"length/{outcome}_calls_{bucket_label(calls, CALL_BUCKETS)}",
                        f"length/{outcome}_tokens_{bucket_label(r.num_action_tokens, TOKEN_BUCKETS)}"):
                counters[key] = counters.get(key, 0.0) + 1.0
            counters[f"length/{outcome}_calls_sum"] = counters.get(f"length/{outcome}_calls_sum", 0.0) + calls
    for row in row_tokens or ():
        for key, field in (("tokens/trained", "trained_tokens"), ("tokens/stale_masked", "stale_masked_tokens"),
                           ("tokens/dis_masked", "dis_masked_tokens")):
            counters[key] = counters.get(key, 0.0) + float(row[field] or 0.0)


def length_metrics(counters: Mapping[str, float]) -> dict[str, float]:
    """The run's length accounting from the learner's counters and the generators' summed stats.

    Args:
        counters: ``count_batch``'s keys, plus the generators' ``generator_stale_aborted_calls_<bucket>``
            and ``generator_stale_aborted_calls_sum`` (``posttrain.rollout.telemetry.generator_counters``);
            missing keys count 0.

    Returns:
        For every tool-call bucket ``b``: ``length/started_calls_<b>``, ``length/trained_calls_<b>``
        and ``length/trained_share_calls_<b>`` (trained / started, 0 with none started); the same for
        the token buckets (``..._tokens_<b>``, cancelled episodes left out); ``length/cancelled``
        (episodes generators cancelled); ``length/calls_mean_started`` and
        ``length/calls_mean_trained``; ``tokens/stale_masked_share`` and ``tokens/dis_masked_share``
        (of the action tokens in policy updates; 0 with none).
    """
    def get(key: str) -> float:
        return float(counters.get(key, 0.0))

    out: dict[str, float] = {}
    cancelled = 0.0
    for b in labels(CALL_BUCKETS):
        trained = get(f"length/trained_calls_{b}")
        aborted = get(f"generator_stale_aborted_calls_{b}")
        cancelled += aborted
        started = trained + get(f"length/dropped_calls_{b}") + aborted
        out[f"length/started_calls_{b}"], out[f"length/trained_calls_{b}"] = started, trained
        out[f"length/trained_share_calls_{b}"] = trained / started if started else 0.0
    for b in labels(TOKEN_BUCKETS):
        trained = get(f"length/trained_tokens_{b}")
        started = trained + get(f"length/dropped_tokens_{b}")
        out[f"length/started_tokens_{b}"], out[f"length/trained_tokens_{b}"] = started, trained
        out[f"length/trained_share_tokens_{b}"] = trained / started if started else 0.0
    out["length/cancelled"] = cancelled
    n_trained = sum(out[f"length/trained_calls_{b}"] for b in labels(CALL_BUCKETS))
    n_started = sum(out[f"length/started_calls_{b}"] for b in labels(CALL_BUCKETS))
    calls_trained = get("length/trained_calls_sum")
    calls_started = calls_trained + get("length/dropped_calls_sum") + get("generator_stale_aborted_calls_sum")
    out["length/calls_mean_started"] = calls_started / n_started if n_started else 0.0
    out["length/calls_mean_trained"] = calls_trained / n_trained if n_trained else 0.0
    update = get("tokens/trained") + get("tokens/stale_masked") + get("tokens/dis_masked")
    out["tokens/stale_masked_share"] = get("tokens/stale_masked") / update if update else 0.0
    out["tokens/dis_masked_share"] = get("tokens/dis_masked") / update if update else 0.0
    return out


def summary_rows(metrics: Mapping[str, float]) -> list[tuple[str, str]]:
    """The run summary's rows of ``length_metrics``: trained / started per bucket, mean calls, masked shares."""
    def buckets(kind: str, names: list[str]) -> str:
        return ", ".join(f"{b}: {metrics[f'length/trained_{kind}_{b}']:.0f}/{metrics[f'length/started_{kind}_{b}']:.0f}"
                         for b in names)

    return [
        ("episodes trained/started by tool calls", buckets("calls", labels(CALL_BUCKETS))),
        ("episodes trained/started by action tokens", buckets("tokens", labels(TOKEN_BUCKETS))),
        ("episodes cancelled in flight (counted in started)", f"{metrics['length/cancelled']:.0f}"),
        ("mean tool calls, started vs trained",
         f"{metrics['length/calls_mean_started']:.2f} vs {metrics['length/calls_mean_trained']:.2f}"),
        ("action tokens masked by staleness / by DIS",
         f"{metrics['tokens/stale_masked_share']:.3f} / {metrics['tokens/dis_masked_share']:.3f}"),
    ]
