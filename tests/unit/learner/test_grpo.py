import copy
import math

import pytest
import torch

from posttrain.config import GRPOLossConfig, OptimConfig, RunConfig
from posttrain.config.load import ConfigError
from posttrain.config.roles import async_rl_settings
from posttrain.config.techniques import GRPOTechniqueConfig
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.groups import GroupAssembler, collect_groups
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.types import Trainable
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.records import Rollout
from posttrain.rollout.queue import QueueEntry

PROMPT = 3


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_policy(tiny_model.path)


def _trainable(model, lr=1e-9):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return Trainable(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))


def _rollouts(model, specs, seed=0, behaviour_shift=0.0):
    """specs: (group_id, action tokens, reward); behaviour logprobs are the model's own (+ shift)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (group, n, reward) in enumerate(specs):
        ids = torch.randint(5, 300, (PROMPT + n,), generator=gen)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=ids[None], use_cache=False).logits, ids[None])[0]
        mask = [False] * PROMPT + [True] * n
        out.append(Rollout(
            rollout_id=f"r{i}", task_id=group, env_name="synthetic_arith", token_ids=ids.tolist(),
            behaviour_logprobs=[float(lp[t]) + behaviour_shift if m else 0.0 for t, m in enumerate(mask)],
            action_mask=mask, reward=reward, policy_version=0, group_id=group,
        ))
    return out


def _step(model, rollouts, config, lr=1e-9, **kwargs):
    policy = _trainable(model, lr)
    batch = collate_rollouts(rollouts, pad_token_id=0)
    result = grpo_train_step(policy=policy, batch=batch, group_ids=[r.group_id for r in rollouts], config=config,
                             **kwargs)
    return result, policy


def _action_logprob(model, rollout):
    ids = torch.tensor([rollout.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids, use_cache=False).logits, ids)[0]
    return float(lp[PROMPT:].sum())


def test_on_policy_loss_is_minus_the_token_mean_advantage(model):
    """Group a, rewards [1, 0]: mean 0.5, unbiased std 0.70711, A = +-0.70711. The rewarded rollout has
    3 action tokens, the other 1. On policy r = 1, so loss = -(3 * 0.70711 - 1 * 0.70711) / 4 = -0.35355;
    advantage/mean = +0.35355; nothing is clipped."""
    rollouts = _rollouts(model, [("a", 3, 1.0), ("a", 1, 0.0)])
    result, _ = _step(copy.deepcopy(model), rollouts, GRPOTechniqueConfig(micro_batch_size=2))
    m = result.metrics
    assert result.policy_updated
    assert m["loss/policy"] == pytest.approx(-math.sqrt(0.5) / 2, abs=1e-5)
    assert m["advantage/mean"] == pytest.approx(math.sqrt(0.5) / 2, abs=1e-5)
    assert m["clip/frac"] == 0.0 and m["ppo_ratio/mean"] == pytest.approx(1.0)
    assert m["reward/mean"] == 0.5 and m["grpo/groups"] == 1.0


def test_an_update_raises_the_rewarded_rollout_and_lowers_the_other(model):
    rollouts = _rollouts(model, [("a", 4, 1.0), ("a", 4, 0.0)], seed=1)
    m = copy.deepcopy(model)
    before = [_action_logprob(m, r) for r in rollouts]
    _step(m, rollouts, GRPOTechniqueConfig(micro_batch_size=2), lr=0.05)
    after = [_action_logprob(m, r) for r in rollouts]
    assert after[0] > before[0] and after[1] < before[1]


def test_uniform_groups_are_dropped_and_counted(model):
    """Group a has rewards [1, 1] (no preference), group b [1, 0]: half the groups are uniform, 2 rollouts
    (b's) are kept; without dropping all 4 are kept and a's advantages are 0."""
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 2, 1.0), ("b", 2, 1.0), ("b", 3, 0.0)])
    dropped, _ = _step(copy.deepcopy(model), rollouts, GRPOTechniqueConfig(micro_batch_size=4))
    assert dropped.metrics["grpo/uniform_groups_frac"] == 0.5
    assert dropped.metrics["grpo/rollouts_kept"] == 2.0 and dropped.metrics["grpo/action_tokens_kept"] == 5.0
    kept, _ = _step(copy.deepcopy(model), rollouts, GRPOTechniqueConfig(micro_batch_size=4, drop_uniform_groups=False))
    assert kept.metrics["grpo/rollouts_kept"] == 4.0 and kept.metrics["grpo/uniform_groups_frac"] == 0.5


def test_a_batch_of_uniform_groups_takes_no_optimizer_step(model):
    rollouts = _rollouts(model, [("a", 2, 0.0), ("a", 2, 0.0), ("b", 2, 1.0), ("b", 2, 1.0)])
    m = copy.deepcopy(model)
    before = [p.detach().clone() for p in m.parameters()]
    result, policy = _step(m, rollouts, GRPOTechniqueConfig(), lr=1.0)
    assert not result.policy_updated and "loss/policy" not in result.metrics
    assert policy.scheduler.last_epoch == 0
    for a, b in zip(before, m.parameters(), strict=True):
        assert torch.equal(a, b)


def test_two_micro_batches_give_the_same_update_as_one_batch(model):
    """The summed loss of each micro-batch is divided by the step's 11 action tokens, so micro-batches
    of 4 rollouts or of 1 rollout give the same SGD update."""
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 3, 0.0), ("b", 4, 0.0), ("b", 2, 1.0)], seed=2)
    params = []
    for micro in (4, 1):
        m = copy.deepcopy(model)
        _step(m, rollouts, GRPOTechniqueConfig(micro_batch_size=micro), lr=0.1)
        params.append(list(m.parameters()))
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_kept_rows_are_trained_in_length_order_which_cuts_padding_and_changes_no_update(model):
    """Groups a = (20, 2), b = (19, 3) action tokens (prompt 3), micro-batches of 2: by group each
    micro-batch pads to its long row (2 x 23 + 2 x 22 = 90 tokens); ordered by length 2 x 6 +
    2 x 23 = 58. Listing the rollouts in reverse gives the same SGD update."""
    rollouts = _rollouts(model, [("a", 20, 1.0), ("a", 2, 0.0), ("b", 19, 0.0), ("b", 3, 1.0)], seed=4)
    params, padded = [], []
    for order in (rollouts, rollouts[::-1]):
        m = copy.deepcopy(model)
        result, _ = _step(m, order, GRPOTechniqueConfig(micro_batch_size=2), lr=0.1)
        params.append(list(m.parameters()))
        padded.append(result.metrics["batch/padded_tokens"])
        assert result.metrics["batch/real_tokens"] == 4 * PROMPT + 44
    assert padded == [58, 58]
    for a, b in zip(*params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_mini_batches_take_one_optimizer_step_each(model):
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 3, 0.0), ("b", 4, 0.0), ("b", 2, 1.0)], seed=3)
    config = GRPOTechniqueConfig(micro_batch_size=4, mini_batches=2, prompts_per_step=2)
    result, policy = _step(copy.deepcopy(model), rollouts, config, lr=0.5)
    assert result.metrics["grpo/optimizer_steps"] == 2.0
    assert policy.scheduler.last_epoch == 2


def test_a_mini_batch_with_a_non_finite_gradient_is_skipped_and_the_others_step(model):
    """Two mini-batches (groups a, b); a hook makes the first backward's gradient NaN: that optimizer
    step is skipped and counted, the second steps (one scheduler step), and the batch still makes a
    version. Both skipped: no version, nothing trained."""
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 3, 0.0), ("b", 4, 0.0), ("b", 2, 1.0)], seed=3)
    config = GRPOTechniqueConfig(micro_batch_size=4, mini_batches=2, prompts_per_step=2)
    for poisoned, updated in (({0}, True), ({0, 1}, False)):
        copied, calls = copy.deepcopy(model), []

        def hook(grad, poisoned=poisoned, calls=calls):
            calls.append(1)
            return torch.full_like(grad, float("nan")) if len(calls) - 1 in poisoned else grad

        next(copied.parameters()).register_hook(hook)
        result, policy = _step(copied, rollouts, config, lr=0.5)
        assert result.skipped_nonfinite == len(poisoned)
        assert result.policy_updated is updated and result.rows_trained == (4 if updated else 0)
        assert policy.scheduler.last_epoch == 2 - len(poisoned)
        assert result.metrics["grpo/optimizer_steps"] == 2.0 - len(poisoned)


def test_async_mode_masks_tokens_outside_the_dis_band(model):
    """Behaviour logprobs 2 nats below the learner's: r = exp(2) = 7.389 >= 1 + mask_eps_high = 6, so every
    action token is masked, the loss is 0 and the weights do not move. Behaviour = learner: nothing masked."""
    config = GRPOTechniqueConfig(async_=True, loss=GRPOLossConfig(dis_mask=True), micro_batch_size=4)
    specs = [("a", 2, 1.0), ("a", 3, 0.0)]
    m = copy.deepcopy(model)
    before = [p.detach().clone() for p in m.parameters()]
    result, _ = _step(m, _rollouts(model, specs, behaviour_shift=-2.0), config, lr=1.0)
    assert result.metrics["mask/frac_total"] == 1.0 and result.metrics["loss/policy"] == 0.0
    for a, b in zip(before, m.parameters(), strict=True):
        assert torch.equal(a, b)
    on_policy, _ = _step(copy.deepcopy(model), _rollouts(model, specs), config)
    assert on_policy.metrics["mask/frac_total"] == 0.0


def test_kl_to_the_reference_needs_a_reference_and_is_zero_against_itself(model):
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 2, 0.0)])
    config = GRPOTechniqueConfig(loss=GRPOLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="reference: required when grpo.loss.kl_coef > 0"):
        _step(copy.deepcopy(model), rollouts, config)
    result, _ = _step(copy.deepcopy(model), rollouts, config, reference=copy.deepcopy(model))
    assert result.metrics["kl/ref_k3"] == pytest.approx(0.0, abs=1e-6)


def test_group_ids_must_match_the_batch(model):
    rollouts = _rollouts(model, [("a", 2, 1.0), ("a", 2, 0.0)])
    with pytest.raises(ValueError, match="group_ids: expected 2 ids"):
        grpo_train_step(policy=_trainable(copy.deepcopy(model)), batch=collate_rollouts(rollouts, 0), group_ids=["a"],
                        config=GRPOTechniqueConfig())


# ---------------------------------------------------------------------------------- group assembly
def _entry(entry_id, group, version=0):
    rollout = Rollout(rollout_id=entry_id, task_id="t", env_name="synthetic_arith", token_ids=[1, 2],
                      behaviour_logprobs=[0.0, -0.5], action_mask=[False, True], reward=1.0,
                      policy_version=version, group_id=group)
    return QueueEntry(entry_id, rollout)


def test_a_group_is_released_only_when_all_its_members_arrived():
    """G = 2: the first member waits; a re-delivery of it (same entry id) does not complete the group."""
    asm = GroupAssembler(2)
    assert asm.offer(_entry("1-0", "g"), 0, 2) == []
    assert asm.offer(_entry("1-0", "g"), 0, 2) == []
    assert asm.take(1) is None and asm.pending_rollouts == 1
    assert asm.offer(_entry("2-0", "g"), 0, 2) == []
    groups = asm.take(1)
    assert groups is not None and [e.entry_id for e in groups[0]] == ["1-0", "2-0"]


def test_a_stale_member_drops_its_whole_group_and_its_late_siblings():
    """tau = 1, learner at v3: a member from v1 (lag 2 > 1) is stale; its held sibling and a later
    sibling are dropped too, so no group is ever trained partially."""
    asm = GroupAssembler(3)
    assert asm.offer(_entry("1-0", "g", version=3), 3, 1) == []
    dropped = asm.offer(_entry("2-0", "g", version=1), 3, 1)
    assert sorted(e.entry_id for e in dropped) == ["1-0", "2-0"]
    assert [e.entry_id for e in asm.offer(_entry("3-0", "g", version=3), 3, 1)] == ["3-0"]
    assert asm.pending_rollouts == 0
    assert {asm.drop_reason(e) for e in dropped} == {"stale group"}  # what the learner's ledger says


def test_held_groups_that_become_stale_are_evicted():
    asm = GroupAssembler(2)
    asm.offer(_entry("1-0", "pending", version=0), 0, 1)
    asm.offer(_entry("2-0", "done", version=1), 1, 1)
    asm.offer(_entry("3-0", "done", version=1), 1, 1)
    assert asm.evict_stale(1, 1) == []
    evicted = asm.evict_stale(2, 1)
    assert [e.entry_id for e in evicted] == ["1-0"]
    assert asm.complete_groups == 1
    assert sorted(e.entry_id for e in asm.evict_stale(3, 1)) == ["2-0", "3-0"]


def test_a_rollout_without_group_id_or_beyond_the_group_size_is_dropped():
    asm = GroupAssembler(2)
    assert [e.entry_id for e in asm.offer(_entry("1-0", None), 0, 4)] == ["1-0"]
    asm.offer(_entry("2-0", "g"), 0, 4)
    asm.offer(_entry("3-0", "g"), 0, 4)
    surplus = asm.offer(_entry("4-0", "g"), 0, 4)
    assert [e.entry_id for e in surplus] == ["4-0"]
    assert asm.drop_reason(surplus[0]) == "surplus member"
    assert asm.drop_reason(_entry("1-0", None)) == "no group id"


def test_collect_groups_returns_whole_groups_oldest_first():
    asm = GroupAssembler(2)
    incoming = [_entry("1-0", "a"), _entry("2-0", "b"), _entry("3-0", "a"), _entry("4-0", "c", version=0)]
    batch, dropped = collect_groups(asm, incoming, learner_version=0, max_staleness=2, num_groups=1)
    assert [e.entry_id for e in batch] == ["1-0", "3-0"] and dropped == []
    batch, dropped = collect_groups(asm, [_entry("5-0", "b")], learner_version=3, max_staleness=2, num_groups=1)
    assert batch is None
    assert sorted(e.entry_id for e in dropped) == ["2-0", "4-0", "5-0"]


# ------------------------------------------------------------------------------- runtime mapping
def _run_config(**data):
    return RunConfig.model_validate(data)


def test_async_runtime_reads_the_grpo_section_itself_not_a_rewritten_sao_section():
    """8 prompts x group 4 = 32 rollouts per batch, tau 2, 7 versions x 3 mini-batches = 21 optimizer steps."""
    config = _run_config(technique="grpo", grpo={
        "async": True, "steps": 7, "prompts_per_step": 8, "group_size": 4, "micro_batch_size": 64,
        "mini_batches": 3, "max_staleness": 2, "loss": {"dis_mask": True}, "optim": {"lr": 3e-4},
    })
    settings = async_rl_settings(config)
    assert (settings.technique, settings.steps, settings.batch_rollouts) == ("grpo", 7, 32)
    assert (settings.group_size, settings.groups_per_batch, settings.max_staleness) == (4, 8, 2)
    assert settings.optim.lr == 3e-4 and settings.policy_optimizer_steps == 21
    assert config.sao == RunConfig().sao  # nothing is copied into the sao section
    sao = async_rl_settings(_run_config(technique="sao", sao={"steps": 5, "batch_size": 24, "max_staleness": 3}))
    assert (sao.technique, sao.steps, sao.batch_rollouts, sao.group_size, sao.max_staleness) == ("sao", 5, 24, 1, 3)
    with pytest.raises(ConfigError, match="does not run on the asynchronous runtime"):
        async_rl_settings(_run_config(technique="grpo"))


def test_grpo_config_needs_the_dis_mask_when_asynchronous():
    with pytest.raises(ValueError, match="grpo.async is true but grpo.loss.dis_mask is false"):
        GRPOTechniqueConfig.model_validate({"async": True})
    with pytest.raises(ValueError, match=r"grpo.mini_batches \(3\) must be <= grpo.prompts_per_step \(2\)"):
        GRPOTechniqueConfig(prompts_per_step=2, mini_batches=3)
    assert GRPOTechniqueConfig.model_validate({"async": True, "loss": {"dis_mask": True}}).model_dump()["async"] is True
    assert OptimConfig(lr=1e-6) == GRPOTechniqueConfig().optim
