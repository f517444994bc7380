"""``posttrain.rollout.lengths``: buckets, the learner's per-iteration counts and the run's length accounting.

Run: ``python -m pytest -q tests/unit/rollout/test_lengths.py``.
"""

from __future__ import annotations

import pytest

from posttrain.records import Rollout
from posttrain.rollout.lengths import (
    CALL_BUCKETS,
    TOKEN_BUCKETS,
    bucket_label,
    count_batch,
    labels,
    length_metrics,
    summary_rows,
    tool_calls,
)


def _rollout(calls: int | None, action_tokens: int, turns: int = 1) -> Rollout:
    mask = [False] + [True] * action_tokens
    return Rollout(rollout_id="r", task_id="t", env_name="e", token_ids=[1] * len(mask),
                   behaviour_logprobs=[0.0] + [-0.5] * action_tokens, action_mask=mask, reward=0.0, policy_version=0,
                   num_turns=turns, metrics={} if calls is None else {"tool_calls": float(calls)})


@pytest.mark.parametrize(("value", "calls", "tokens"), [
    (0, "0-2", "0-63"), (2, "0-2", "0-63"), (3, "3-5", "0-63"), (8, "6-8", "0-63"), (9, "9+", "0-63"),
    (64, "9+", "64-127"), (511, "9+", "256-511"), (512, "9+", "512+")])
def test_bucket_bounds_are_inclusive(value, calls, tokens):
    assert bucket_label(value, CALL_BUCKETS) == calls and bucket_label(value, TOKEN_BUCKETS) == tokens


def test_a_negative_length_is_refused():
    with pytest.raises(ValueError, match="value: -1 lies in no bucket"):
        bucket_label(-1, CALL_BUCKETS)


def test_tool_calls_come_from_the_environment_else_from_the_turns():
    assert tool_calls(_rollout(5, 3, turns=2)) == 5
    assert tool_calls(_rollout(None, 3, turns=4)) == 3
    assert tool_calls(_rollout(None, 3, turns=1)) == 0


def test_started_counts_trained_dropped_and_cancelled_and_the_shares_follow():
    """Trained: calls 1 (10 tokens), 4 (70 tokens), 10 (300 tokens); dropped: calls 12 (400 tokens);
    cancelled by generators: two episodes with 9+ calls begun (9 and 11 calls).

    9+ bucket: started 1 + 1 + 2 = 4, trained 1 -> share 0.25; 0-2: 1/1. Mean calls started
    (1 + 4 + 10 + 12 + 20) / 6 = 7.833, trained 15 / 3 = 5. Tokens: 256-511 started 2 (300 trained,
    400 dropped), trained 1; cancelled episodes are not in the token buckets. Token shares over the
    update's 10 + 3 + 2 = 15 action tokens: stale 3/15 = 0.2, DIS 2/15.
    """
    counters: dict[str, float] = {}
    rows = [{"trained_tokens": 10.0, "stale_masked_tokens": 0.0, "dis_masked_tokens": 0.0},
            {"trained_tokens": 0.0, "stale_masked_tokens": 3.0, "dis_masked_tokens": 2.0},
            {"trained_tokens": 0.0, "stale_masked_tokens": 0.0, "dis_masked_tokens": 0.0}]
    count_batch(counters, [_rollout(1, 10), _rollout(4, 70), _rollout(10, 300)], [_rollout(12, 400)], rows)
    m = length_metrics({**counters, "generator_stale_aborted_calls_9+": 2.0, "generator_stale_aborted_calls_sum": 20.0})

    assert [m[f"length/started_calls_{b}"] for b in labels(CALL_BUCKETS)] == [1, 1, 0, 4]
    assert [m[f"length/trained_calls_{b}"] for b in labels(CALL_BUCKETS)] == [1, 1, 0, 1]
    assert m["length/trained_share_calls_9+"] == 0.25 and m["length/trained_share_calls_0-2"] == 1.0
    assert m["length/trained_share_calls_6-8"] == 0.0
    assert m["length/started_tokens_256-511"] == 2 and m["length/trained_tokens_256-511"] == 1
    assert sum(m[f"length/started_tokens_{b}"] for b in labels(TOKEN_BUCKETS)) == 4
    assert m["length/cancelled"] == 2
    assert m["length/calls_mean_started"] == pytest.approx(47 / 6)
    assert m["length/calls_mean_trained"] == pytest.approx(5.0)
    assert m["tokens/stale_masked_share"] == pytest.approx(0.2)
    assert m["tokens/dis_masked_share"] == pytest.approx(2 / 15)
    rows_out = dict(summary_rows(m))
    assert rows_out["episodes trained/started by tool calls"] == "0-2: 1/1, 3-5: 1/1, 6-8: 0/0, 9+: 1/4"
    assert rows_out["mean tool calls, started vs trained"] == "7.83 vs 5.00"


def test_an_empty_run_reports_zeros_not_errors():
    m = length_metrics({})
    assert m["length/calls_mean_started"] == 0.0 and m["tokens/stale_masked_share"] == 0.0
