"""``posttrain.learner.ledger``: per-turn lengths of a rollout and the ledger's lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posttrain.learner.ledger import append_ledger, ledger_line, read_ledger, rollout_summary, turn_lengths
from posttrain.records import Rollout


def rollout(mask: list[bool], **kw) -> Rollout:
    fields = dict(rollout_id="r1", task_id="t1", env_name="synthetic_longtail", token_ids=list(range(len(mask))),
                  behaviour_logprobs=[-0.5 if m else 0.0 for m in mask], action_mask=mask, reward=1.0,
                  policy_version=3, turn_policy_versions=[3, 4], num_turns=2, generator_id="g0",
                  started_at=100.0, finished_at=107.5, metrics={"tool_calls": 1.0, "tool_wait_s": 2.5})
    fields.update(kw)
    return Rollout(**fields)


@pytest.mark.parametrize(("mask", "expected"), [
    # prompt 3, action 2, observation 4, action 1 (the episode ended on it: observation 0)
    ([0, 0, 0, 1, 1, 0, 0, 0, 0, 1], (3, [2, 1], [4, 0])),
    # no prompt tokens: the rollout starts with an action
    ([1, 1, 0, 1], (0, [2, 1], [1, 0])),
    # a trailing observation after the last action counts for that turn
    ([0, 1, 1, 0, 0], (1, [2], [2])),
    ([0, 0], (2, [], [])),
    ([], (0, [], [])),
])
def test_turn_lengths_split_the_action_mask_into_prompt_turns_and_observations(mask, expected):
    assert turn_lengths([bool(m) for m in mask]) == expected
    assert turn_lengths(np.array(mask, dtype=bool)) == expected  # decoded rollouts hold numpy arrays


def test_a_line_keeps_the_batch_and_the_drops_with_their_reason(tmp_path):
    """Two iterations appended: each line has the batch's summaries in order, the entry ids, the drops."""
    trained = rollout([False, False, True, True, False, True], rollout_id="a", group_id="g1")
    stale = rollout([False, True], rollout_id="b", policy_version=0)
    path = tmp_path / "run" / "learner_ledger.jsonl"
    append_ledger(path, ledger_line(1, 1, [trained], ["1-0"], [(stale, "stale")]))
    append_ledger(path, ledger_line(2, 2, [trained]))
    first, second = read_ledger(path)
    assert (first["iteration"], first["policy_version"], first["entry_ids"]) == (1, 1, ["1-0"])
    summary = first["rollouts"][0]
    assert summary == rollout_summary(trained)
    assert (summary["prompt_tokens"], summary["action_tokens"], summary["observation_tokens"]) == (2, [2, 1], [1, 0])
    assert (summary["group_id"], summary["reward"], summary["metrics"]["tool_wait_s"]) == ("g1", 1.0, 2.5)
    assert (summary["started_at"], summary["finished_at"]) == (100.0, 107.5)
    assert first["dropped"] == [{**rollout_summary(stale), "reason": "stale"}]
    assert "entry_ids" not in second and second["dropped"] == []  # a synchronous run has no stream entries
    assert "token_ids" not in json.dumps(first)  # lengths, not tokens


def test_a_malformed_ledger_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "learner_ledger.jsonl"
    path.write_text(ledger_line(1, 1, []) + "{not json\n")
    with pytest.raises(ValueError, match=r"learner_ledger.jsonl:2: not JSON"):
        read_ledger(path)
    path.write_text('{"policy_version": 1}\n')
    with pytest.raises(ValueError, match=r"learner_ledger.jsonl:1: expected an object with 'iteration'"):
        read_ledger(path)
    with pytest.raises(FileNotFoundError):
        read_ledger(tmp_path / "missing.jsonl")


def test_a_line_records_the_training_version_tau_and_each_rollouts_token_accounting():
    r = rollout([False, True, False, True, True])
    tokens = {"trained_tokens": 2.0, "stale_masked_tokens": 1.0, "dis_masked_tokens": 0.0,
              "trained_version_min": 4.0, "trained_version_max": 4.0}
    line = json.loads(ledger_line(3, 6, [r], learner_version=5, max_staleness=1, row_tokens=[tokens]))
    assert (line["learner_version"], line["max_staleness"]) == (5, 1)
    assert line["rollouts"][0]["turn_policy_versions"] == [3, 4]
    assert {k: line["rollouts"][0][k] for k in tokens} == tokens
    with pytest.raises(ValueError, match="row_tokens: expected 1 like rollouts, got 0"):
        ledger_line(3, 6, [r], row_tokens=[])
