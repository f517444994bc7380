import json

import torch

from posttrain.learner.batching import collate_rollouts, micro_batches
from posttrain.learner.checkpoint import (
    LearnerState,
    latest_checkpoint,
    load_checkpoint_state,
    save_checkpoint,
)
from posttrain.records import Rollout


def _rollout(n_prompt, n_action, reward, version=0):
    return Rollout(
        rollout_id=f"r{n_prompt}{n_action}", task_id="t", env_name="synthetic_arith",
        token_ids=list(range(1, n_prompt + n_action + 1)),
        behaviour_logprobs=[0.0] * n_prompt + [-0.5] * n_action,
        action_mask=[False] * n_prompt + [True] * n_action,
        reward=reward, policy_version=version,
    )


def test_collate_pads_right_and_masks_padding():
    """Rows of 5 and 3 tokens: width 5; the short row's last 2 positions are padding (pad id 0)."""
    batch = collate_rollouts([_rollout(3, 2, 1.0, 2), _rollout(2, 1, 0.0, 1)], pad_token_id=0)
    assert batch.token_ids.shape == (2, 5)
    assert batch.token_ids[1].tolist() == [1, 2, 3, 0, 0]
    assert batch.attention_mask[1].tolist() == [True, True, True, False, False]
    assert batch.action_mask[1].tolist() == [False, False, True, False, False]
    assert batch.num_action_tokens == 3
    assert batch.rewards.tolist() == [1.0, 0.0] and batch.policy_versions.tolist() == [2, 1]


def test_micro_batches_cover_rows_in_order_and_trim_width():
    batch = collate_rollouts([_rollout(3, 4, 1.0), _rollout(1, 1, 0.0), _rollout(1, 1, 0.5)], pad_token_id=0)
    parts = micro_batches(batch, 2)
    assert [p.token_ids.shape[0] for p in parts] == [2, 1]
    assert parts[1].token_ids.shape[1] == 2  # the last row alone has 2 real tokens
    assert sum(p.num_action_tokens for p in parts) == batch.num_action_tokens


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def save_pretrained(self, path, safe_serialization=True):
        from pathlib import Path

        Path(path).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(path) / "w.pt")


class _Tok:
    def save_pretrained(self, path):
        from pathlib import Path

        (Path(path) / "tokenizer.json").write_text("{}")


def test_checkpoint_round_trip_restores_counters_critic_and_optimizer(tmp_path):
    critic = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(critic.parameters(), lr=0.1)
    critic(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = LearnerState(iteration=7, policy_version=5, consumed_entry_ids=["1-0", "2-0"], counters={"x": 3.0})
    path = save_checkpoint(tmp_path, state=state, policy=_Tiny(), tokenizer=_Tok(), critic=critic,
                           optimizers={"critic_opt": opt}, resolved_config_yaml="a: 1\n")
    assert latest_checkpoint(tmp_path) == path
    assert json.loads((path / "state.json").read_text())["policy_version"] == 5
    critic2 = torch.nn.Linear(3, 1)
    opt2 = torch.optim.AdamW(critic2.parameters(), lr=0.1)
    restored = load_checkpoint_state(path, critic=critic2, optimizers={"critic_opt": opt2})
    assert restored.iteration == 7 and restored.consumed_entry_ids == ["1-0", "2-0"]
    assert torch.equal(critic2.weight, critic.weight)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def test_only_complete_checkpoints_are_latest_and_old_ones_pruned(tmp_path):
    for it in range(5):
        save_checkpoint(tmp_path, state=LearnerState(iteration=it), policy=_Tiny(), tokenizer=_Tok(), critic=None,
                        optimizers={}, resolved_config_yaml="", keep=1)
    assert latest_checkpoint(tmp_path).name == "iter-000004"
    assert sorted(p.name for p in tmp_path.glob("iter-*")) == ["iter-000003", "iter-000004"]
    (tmp_path / "LATEST").write_text("iter-999999")
    assert latest_checkpoint(tmp_path) is None
