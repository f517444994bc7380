import json

import pytest
import torch

from posttrain.learner.batching import collate_rollouts, micro_batches
from posttrain.learner.checkpoint import (
    CheckpointError,
    LearnerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from posttrain.learner.types import Trainable
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


def _part(seed: int) -> Trainable:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    return Trainable(model, opt, sched)


def test_checkpoint_round_trip_restores_counters_weights_optimizer_and_schedule(tmp_path):
    saved = _part(0)
    state = LearnerState(iteration=7, policy_version=5, consumed_entry_ids=["1-0", "2-0"], counters={"x": 3.0})
    path = save_checkpoint(tmp_path, state=state, parts={"critic": saved}, resolved_config_yaml="a: 1\n")
    assert latest_checkpoint(tmp_path) == path
    assert json.loads((path / "state.json").read_text())["state"]["policy_version"] == 5
    fresh = _part(1)
    assert not torch.equal(fresh.model.weight, saved.model.weight)
    restored = load_checkpoint(path, parts={"critic": fresh})
    assert restored.iteration == 7 and restored.consumed_entry_ids == ["1-0", "2-0"]
    assert torch.equal(fresh.model.weight, saved.model.weight)
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["exp_avg"], saved.optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh.scheduler.state_dict()["last_epoch"] == saved.scheduler.state_dict()["last_epoch"]


def test_checkpoint_of_another_shape_or_missing_shard_is_refused_by_name(tmp_path):
    path = save_checkpoint(tmp_path, state=LearnerState(iteration=1), parts={"policy": _part(0)},
                           resolved_config_yaml="")
    wide = torch.nn.Linear(4, 1)
    with pytest.raises(CheckpointError, match=r"policy.weight has shape \[1, 3\] there and \[1, 4\]"):
        load_checkpoint(path, parts={"policy": Trainable(wide, None, None)})  # type: ignore[arg-type]
    (path / "dcp" / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="lacks __0_0.distcp"):
        load_checkpoint(path, parts={"policy": _part(2)})


def test_only_complete_checkpoints_are_latest_and_old_ones_pruned(tmp_path):
    for it in range(5):
        save_checkpoint(tmp_path, state=LearnerState(iteration=it), parts={"policy": _part(0)},
                        resolved_config_yaml="", keep=1)
    assert latest_checkpoint(tmp_path).name == "iter-000004"
    assert sorted(p.name for p in tmp_path.glob("iter-*")) == ["iter-000003", "iter-000004"]
    (tmp_path / "LATEST").write_text("iter-999999")
    assert latest_checkpoint(tmp_path) is None


def test_the_checkpointer_records_generator_positions_and_never_fewer_than_before(tmp_path):
    """Issue 23 item 18. Reads give {0: 64}, a Redis outage, then {0: 32, 1: 64} (a Redis that lost its data and
    a generator that reserved again from 0). The three checkpoints hold {0: 64}, {0: 64} (the outage keeps the last
    positions and the checkpoint is still written) and {0: 64, 1: 64} (a position is never recorded lower)."""
    from types import SimpleNamespace

    import redis

    from posttrain.learner.checkpointer import Checkpointer
    from posttrain.parallel.world import World

    reads: list = [{"0": 64}, redis.ConnectionError("Connection refused"), {"0": 32, "1": 64}]

    def positions() -> dict[str, int]:
        read = reads.pop(0)
        if isinstance(read, Exception):
            raise read
        return dict(read)

    ctx = SimpleNamespace(checkpoints_dir=tmp_path, resolved_config_yaml=lambda: "a: 1\n")
    checkpointer = Checkpointer(ctx, state=LearnerState(), counters={}, parts={"critic": _part(0)}, baseline=None,
                                queue=None, every=1, last_version=9, mirror_uri=None, world=World(),
                                positions=positions)
    saved = [json.loads((checkpointer.save() / "state.json").read_text())["state"]["generator_positions"]
             for _ in range(3)]
    assert saved == [{"0": 64}, {"0": 64}, {"0": 64, "1": 64}]
