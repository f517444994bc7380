"""GKD's batch: on-policy rollouts then fixed sequences in one padded batch; fixed rows drawn alike on every rank and after a resume."""

import pytest
import torch

from posttrain.learner.gkd_step import FixedSequences, mixed_batch
from posttrain.learner.sft import TokenExample
from posttrain.records import Rollout


def _examples(n: int) -> list[TokenExample]:
    return [TokenExample([10 + i, 11 + i, 12 + i], [False, True, True]) for i in range(n)]


def test_fixed_sequences_are_the_same_for_an_iteration_however_the_learner_got_there():
    """A learner resumed at iteration 5 draws what one that ran iterations 0-4 draws next (epochs of 7, 3 per batch)."""
    through = FixedSequences(_examples(7), per_batch=3, seed=4)
    straight = [through.take(i) for i in range(8)]
    resumed = FixedSequences(_examples(7), per_batch=3, seed=4)
    assert [resumed.take(i) for i in range(5, 8)] == straight[5:]
    assert resumed.take(2) == straight[2]  # asked again for an earlier iteration: the same rows
    ids = [e.token_ids[0] for batch in straight[:7] for e in batch]  # 21 draws = 3 epochs of 7
    assert all(sorted(ids[k * 7:(k + 1) * 7]) == list(range(10, 17)) for k in range(3))
    assert FixedSequences([], per_batch=0, seed=0).take(3) == []
    with pytest.raises(ValueError, match="gkd.data_path: no fixed sequence"):
        FixedSequences([], per_batch=2, seed=0)


def test_mixed_batch_puts_the_rollouts_first_and_trains_the_fixed_rows_assistant_tokens():
    rollout = Rollout(rollout_id="r", task_id="t", env_name="synthetic_arith", token_ids=[1, 2, 3, 4, 5],
                      behaviour_logprobs=[0.0, 0.0, -0.5, -0.25, -1.0], action_mask=[False, False, True, True, True],
                      reward=1.0, policy_version=6)
    batch = mixed_batch([rollout], _examples(2), pad_token_id=0, learner_version=7)
    assert batch.token_ids.tolist() == [[1, 2, 3, 4, 5], [10, 11, 12, 0, 0], [11, 12, 13, 0, 0]]
    assert batch.action_mask.tolist()[1] == [False, True, True, False, False]
    assert batch.attention_mask.sum(dim=1).tolist() == [5, 3, 3]
    assert batch.behaviour_logprobs[0].tolist() == [0.0, 0.0, -0.5, -0.25, -1.0]
    assert torch.equal(batch.behaviour_logprobs[1:], torch.zeros(2, 5))
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0] and batch.policy_versions.tolist() == [6, 7, 7]
    assert mixed_batch([], _examples(1), 0, 0).token_ids.shape == (1, 3)
    with pytest.raises(ValueError, match="no rollout and no fixed sequence"):
        mixed_batch([], [], 0, 0)
