"""``sao_train_step``: micro-batch invariance, critic warm-up, the DIS band and config errors.

Real tiny Qwen2 policy and a critic initialised from it (zero value head), SGD so that equal
gradients give equal updates.
"""

import copy
import math

import msgspec
import pytest
import torch

from posttrain.advantages import RunningMeanBaseline
from posttrain.config import SAOConfig
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.critic import CriticModel
from posttrain.learner.sao_step import sao_train_step
from posttrain.learner.types import Trainable
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.records import Rollout

PROMPT = 3


@pytest.fixture(scope="module")
def policy_model(tiny_model):
    return load_policy(tiny_model.path)


@pytest.fixture(scope="module")
def critic_model(tiny_model):
    return CriticModel.from_policy_path(tiny_model.path)


def _trainable(model, lr):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    return Trainable(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))


def _rollouts(model, specs, seed=0, behaviour_shift=0.0):
    """specs: (action tokens, reward); behaviour logprobs are the policy's own plus ``behaviour_shift``."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (n, reward) in enumerate(specs):
        ids = torch.randint(5, 300, (PROMPT + n,), generator=gen)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=ids[None], use_cache=False).logits, ids[None])[0]
        mask = [False] * PROMPT + [True] * n
        out.append(Rollout(
            rollout_id=f"r{i}", task_id=f"t{i}", env_name="synthetic_arith", token_ids=ids.tolist(),
            behaviour_logprobs=[float(lp[t]) + behaviour_shift if m else 0.0 for t, m in enumerate(mask)],
            action_mask=mask, reward=reward, policy_version=0,
        ))
    return out


def _config(**updates):
    base = {"micro_batch_size": 4, "critic": {"warmup_steps": 0, "updates_per_step": 2}}
    return SAOConfig.model_validate({**base, **updates})


def _run(policy_model, critic_model, rollouts, config, iteration=0, lr=0.1):
    policy = _trainable(copy.deepcopy(policy_model), lr)
    critic = _trainable(copy.deepcopy(critic_model), lr) if config.advantage == "gae" else None
    batch = collate_rollouts(rollouts, pad_token_id=0)
    result = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=iteration,
                            baseline=RunningMeanBaseline(4) if config.advantage == "running_mean" else None)
    return result, policy.model, critic.model if critic else None


def _same(a, b):
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=1e-5)


def _moved(before, after):
    return any(not torch.equal(x, y) for x, y in zip(before.parameters(), after.parameters(), strict=True))


def test_micro_batches_of_one_give_the_same_policy_and_critic_update_as_one_batch(policy_model, critic_model):
    """Each loss is a sum over action tokens divided by the step's 2+3+4+2 = 11 action tokens, so
    micro-batches of 1 rollout and one micro-batch of 4 give the same SGD updates of both models,
    after K = 2 critic updates and one policy update."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0), (4, 0.0), (2, 1.0)], seed=1)
    whole, p4, c4 = _run(policy_model, critic_model, rollouts, _config(micro_batch_size=4))
    split, p1, c1 = _run(policy_model, critic_model, rollouts, _config(micro_batch_size=1))
    assert whole.policy_updated and split.policy_updated
    _same(p4, p1)
    _same(c4, c1)
    assert _moved(policy_model, p4) and _moved(critic_model, c4)
    assert whole.metrics["reward/mean"] == pytest.approx(0.5)
    assert whole.metrics["loss/policy"] == pytest.approx(split.metrics["loss/policy"], rel=1e-5, abs=1e-7)


def test_critic_warmup_trains_only_the_critic(policy_model, critic_model):
    """Iteration 0 < warmup_steps = 1: the critic moves, the policy keeps its weights."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0)], seed=2)
    result, policy, critic = _run(policy_model, critic_model, rollouts, _config(critic={"warmup_steps": 1}))
    assert not result.policy_updated
    _same(policy_model, policy)
    assert _moved(critic_model, critic)
    assert "loss/policy" not in result.metrics


def test_tokens_outside_the_dis_band_give_no_policy_gradient(policy_model, critic_model):
    """Behaviour logprobs 2 nats below the policy's: r = e^2 = 7.39 >= 1 + eps_high = 6 for every
    action token, so all are masked (mask/frac_high = 1) and the policy does not move."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0)], seed=3, behaviour_shift=-2.0)
    result, policy, _ = _run(policy_model, critic_model, rollouts,
                             _config(loss={"mask_eps_low": 0.3, "mask_eps_high": 5.0}))
    assert result.policy_updated
    assert result.metrics["mask/frac_high"] == pytest.approx(1.0)
    _same(policy_model, policy)


@pytest.mark.parametrize("correction", ["tis", "none"])
def test_tis_and_none_train_the_tokens_the_dis_band_would_mask(policy_model, critic_model, correction):
    """Same batch as above (r = e^2 outside the band): under ``tis`` / ``none`` the band is only a
    diagnostic (mask/frac_high = 1), no token loses its gradient (mask/frac_applied = 0), the policy
    moves and the ledger counts every action token as trained, none as DIS-masked."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0)], seed=3, behaviour_shift=-2.0)
    result, policy, _ = _run(policy_model, critic_model, rollouts, _config(loss={"correction": correction}))
    assert result.policy_updated
    assert result.metrics["mask/frac_high"] == pytest.approx(1.0)
    assert result.metrics["mask/frac_applied"] == 0.0
    assert _moved(policy_model, policy)
    rows = result.row_tokens
    assert [r["dis_masked_tokens"] for r in rows] == [0.0, 0.0]
    assert sorted(r["trained_tokens"] for r in rows) == [2.0, 3.0]


def test_gae_without_a_critic_is_refused(policy_model):
    batch = collate_rollouts(_rollouts(policy_model, [(2, 1.0)]), pad_token_id=0)
    with pytest.raises(ValueError, match="needs a critic"):
        sao_train_step(policy=_trainable(copy.deepcopy(policy_model), 0.1), critic=None, batch=batch,
                       config=_config(), iteration=0)


def test_running_mean_without_a_baseline_is_refused(policy_model):
    batch = collate_rollouts(_rollouts(policy_model, [(2, 1.0)]), pad_token_id=0)
    with pytest.raises(ValueError, match="RunningMeanBaseline"):
        sao_train_step(policy=_trainable(copy.deepcopy(policy_model), 0.1), critic=None, batch=batch,
                       config=_config(advantage="running_mean"), iteration=0)


def test_rows_are_trained_in_length_order_which_cuts_padding_and_changes_no_update(policy_model, critic_model):
    """Action lengths 20, 2, 19, 3 (prompt 3) in micro-batches of 2: in arrival order each
    micro-batch pads to a long row (2 x 23 + 2 x 22 = 90 tokens); ordered by length it is
    2 x 6 + 2 x 23 = 58. Reversing the arrival order gives the same SGD updates of both models."""
    rollouts = _rollouts(policy_model, [(20, 1.0), (2, 0.0), (19, 0.0), (3, 1.0)], seed=3)
    ahead, p_a, c_a = _run(policy_model, critic_model, rollouts, _config(micro_batch_size=2))
    behind, p_b, c_b = _run(policy_model, critic_model, rollouts[::-1], _config(micro_batch_size=2))
    assert ahead.metrics["batch/padded_tokens"] == 58 == behind.metrics["batch/padded_tokens"]
    assert ahead.metrics["batch/real_tokens"] == 4 * PROMPT + 44
    _same(p_a, p_b)
    _same(c_a, c_b)
    assert ahead.metrics["loss/policy"] == pytest.approx(behind.metrics["loss/policy"], rel=1e-5, abs=1e-7)


def test_explained_variance_is_the_whole_batchs_whatever_the_micro_batch_size(policy_model, critic_model):
    """Action lengths 2, 3, 4, 5 with rewards 1, 1, 0, 0: in length order micro-batches of 2 hold
    (1, 1) and (0, 0), and with gamma = lambda_critic = 1 every return of a rollout is its reward,
    so each micro-batch (and each single rollout) has constant returns and an explained variance
    of 0 on its own. Over the batch's 14 action tokens the returns vary (5 ones, 9 zeros), and the
    critic (value head set to 0.3 * x_0 + 0.1) explains some of it: 1 - Var(R - V) / Var(R) over
    the batch, computed here from the critic's values, for micro-batches of 1, 2 and 4 alike.
    K = 1, so the update's values are the old ones. Averaging per micro-batch read 0 at sizes 1 and 2."""
    from posttrain.learner.sao_step import critic_values

    critic = copy.deepcopy(critic_model)
    with torch.no_grad():
        critic.value_head.weight.zero_()
        critic.value_head.weight[0, 0] = 0.3
        critic.value_head.bias.fill_(0.1)
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 1.0), (4, 0.0), (5, 0.0)], seed=4)
    batch = collate_rollouts(rollouts, pad_token_id=0)
    with torch.no_grad():
        v = critic_values(critic, batch)[batch.action_mask].double()
    r = batch.rewards[:, None].expand_as(batch.action_mask)[batch.action_mask].double()
    expected = 1.0 - float((r - v).var(correction=0)) / float(r.var(correction=0))
    assert abs(expected) > 0.05
    for size in (1, 2, 4):
        config = _config(micro_batch_size=size, critic={"warmup_steps": 0, "updates_per_step": 1})
        result, _, _ = _run(policy_model, critic, rollouts, config)
        assert result.metrics["value/explained_variance"] == pytest.approx(expected, rel=1e-5), size


def test_entropy_and_mismatch_are_split_by_the_dis_mask_whatever_the_micro_batch_size(policy_model, critic_model):
    """Two rollouts whose behaviour logprobs are the policy's own (r = 1, inside the band: they train)
    and two 2 nats below it (r = e^2 = 7.39 >= 1 + 5: masked). Unmasked tokens: k3 = 0 and
    |diff| = 0; masked: |diff| = 2 and k3(behav, current) = e^2 - 1 - 2 = 4.389056. policy/entropy is
    the mean entropy of the start policy's next-token distribution over the 2 + 3 unmasked action
    tokens only; micro-batches of 1 and 4 give the same numbers."""
    from posttrain.learner.sao_step import policy_logprobs
    from posttrain.losses.logprobs import entropy_from_logits

    kept = _rollouts(policy_model, [(2, 1.0), (3, 0.0)], seed=5)
    masked = _rollouts(policy_model, [(4, 1.0), (2, 0.0)], seed=6, behaviour_shift=-2.0)
    batch = collate_rollouts(kept, pad_token_id=0)
    with torch.no_grad():
        logits, _ = policy_logprobs(policy_model, batch)
        expected = float(entropy_from_logits(logits)[batch.action_mask].double().mean())
    for size in (1, 4):
        result, _, _ = _run(policy_model, critic_model, kept + masked, _config(micro_batch_size=size))
        m = result.metrics
        assert m["mask/frac_high"] == pytest.approx(6 / 11)
        assert m["policy/entropy"] == pytest.approx(expected, rel=1e-5)
        assert m["mismatch/k3_kl_unmasked"] == pytest.approx(0.0, abs=1e-5)
        assert m["mismatch/logprob_abs_diff_unmasked"] == pytest.approx(0.0, abs=1e-5)
        assert m["mismatch/k3_kl_masked"] == pytest.approx(math.exp(2) - 3, rel=1e-4)
        assert m["mismatch/logprob_abs_diff_masked"] == pytest.approx(2.0, rel=1e-5)


def _two_turn_rollout(model, versions, seed=3):
    """Prompt 3, turn 0 (4 tokens), observation 2, turn 1 (3 tokens); on-policy behaviour logprobs."""
    gen = torch.Generator().manual_seed(seed)
    mask = [False] * PROMPT + [True] * 4 + [False] * 2 + [True] * 3
    ids = torch.randint(5, 300, (len(mask),), generator=gen)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids[None], use_cache=False).logits, ids[None])[0]
    return Rollout(rollout_id="long", task_id="t-long", env_name="synthetic_arith", token_ids=ids.tolist(),
                   behaviour_logprobs=[float(lp[t]) if m else 0.0 for t, m in enumerate(mask)], action_mask=mask,
                   reward=1.0, policy_version=min(versions), turn_policy_versions=versions, num_turns=2)


def test_stale_turns_get_no_policy_gradient_while_the_critic_learns_from_the_whole_episode(policy_model, critic_model):
    """Learner at version 5, tau = 2. Rollout ``long``: turn 0 sampled at version 0 (lag 5, stale: 4
    tokens), turn 1 at version 5 (lag 0: 3 tokens); ``r0`` one turn at version 5 (2 tokens). On-policy
    behaviour logprobs keep every fresh token in the DIS band, so: ``long`` trains 3 tokens, all of
    version 5, and masks 4 for staleness; ``mask/frac_stale`` = 4 / 9. The critic sees the same batch
    with or without the staleness mask (identical parameters after the step); the policy does not."""
    config = _config(max_staleness=2)
    rollouts = [_two_turn_rollout(policy_model, [0, 5]), *(
        msgspec.structs.replace(r, policy_version=5, turn_policy_versions=[5]) for r in _rollouts(policy_model, [(2, 0.0)]))]
    batch = collate_rollouts(rollouts, pad_token_id=0)
    models = {}
    for version in (5, None):
        policy, critic = _trainable(copy.deepcopy(policy_model), 0.1), _trainable(copy.deepcopy(critic_model), 0.1)
        result = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=0,
                                learner_version=version)
        models[version] = (policy.model, critic.model, result)
    masked = models[5][2]
    assert masked.metrics["mask/frac_stale"] == pytest.approx(4 / 9)
    assert masked.metrics["staleness/token_lag_max"] == 5.0
    long, short = masked.row_tokens
    assert (long["trained_tokens"], long["stale_masked_tokens"], long["dis_masked_tokens"]) == (3.0, 4.0, 0.0)
    assert long["trained_version_min"] == long["trained_version_max"] == 5.0
    assert (short["trained_tokens"], short["stale_masked_tokens"], short["trained_version_min"]) == (2.0, 0.0, 5.0)
    assert models[None][2].row_tokens[0]["trained_tokens"] == 7.0  # no learner version: nothing masked for age
    for a, b in zip(models[5][1].parameters(), models[None][1].parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(models[5][0].parameters(), models[None][0].parameters(),
                                                     strict=True))


# Critic practice options (issue 29): head-bias init, EV before the update, whitening, the loss denominator.


def test_head_bias_init_sets_the_bias_to_the_first_batchs_mean_reward_and_not_on_resume(policy_model, critic_model):
    """first_batch_mean at iteration 0: before any critic update the head's bias is the batch's mean
    reward (1 + 0 + 1 + 0.5) / 4 = 0.625 and every old value equals it (the head's weight is zero), so
    EV before = 0 exactly. A resumed run (iteration 1, critic loaded from the first run's state) keeps
    the trained bias, although its batch's mean reward (0.0) differs."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0), (4, 1.0), (2, 0.5)], seed=7)
    config = _config(critic={"warmup_steps": 2, "updates_per_step": 1, "head_bias_init": "first_batch_mean"})
    critic = _trainable(copy.deepcopy(critic_model), 0.0)  # lr 0: the bias after the step is the one set
    policy = _trainable(copy.deepcopy(policy_model), 0.0)
    first = sao_train_step(policy=policy, critic=critic, batch=collate_rollouts(rollouts, pad_token_id=0),
                           config=config, iteration=0)
    assert first.metrics["critic/head_bias_init"] == pytest.approx(0.625)
    assert float(critic.model.value_head.bias.detach()) == pytest.approx(0.625)
    assert first.metrics["value/mean"] == pytest.approx(0.625, rel=1e-6)
    assert first.metrics["value/explained_variance_before"] == pytest.approx(0.0, abs=1e-9)
    resumed_model = copy.deepcopy(critic_model)
    resumed_model.load_state_dict(critic.model.state_dict())
    resumed = _trainable(resumed_model, 0.1)
    zeros = _rollouts(policy_model, [(2, 0.0), (3, 0.0)], seed=8)
    again = sao_train_step(policy=policy, critic=resumed, batch=collate_rollouts(zeros, pad_token_id=0),
                           config=config, iteration=1)
    assert "critic/head_bias_init" not in again.metrics
    assert again.metrics["value/mean"] == pytest.approx(0.625, rel=1e-5)  # the first forward saw the kept bias
    assert float(resumed.model.value_head.bias.detach()) < 0.625  # then it trained towards 0, from 0.625


def test_head_bias_init_zero_keeps_the_zero_head(policy_model, critic_model):
    """The default leaves the head at zero: the first values are 0, whatever the rewards."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 1.0)], seed=7)
    result, _, _ = _run(policy_model, critic_model, rollouts, _config(critic={"warmup_steps": 1, "updates_per_step": 1}))
    assert "critic/head_bias_init" not in result.metrics
    assert result.metrics["value/mean"] == 0.0


def test_explained_variance_before_is_the_critics_on_unseen_data_and_after_shows_the_fit(policy_model, critic_model):
    """K = 16 critic updates (SGD, lr 0.02) on one batch whose returns vary (rewards 1, 0, 1, 0): before
    the first update the zero head explains nothing (EV before = 1 - Var(R - 0)/Var(R) = 0); at the
    last update the critic has fitted the batch (measured 0.95; asserted > 0.5)."""
    rollouts = _rollouts(policy_model, [(2, 1.0), (3, 0.0), (4, 1.0), (2, 0.0)], seed=9)
    config = _config(critic={"warmup_steps": 1, "updates_per_step": 16, "value_clip": 100.0})
    result, _, _ = _run(policy_model, critic_model, rollouts, config, lr=0.02)
    before, after = result.metrics["value/explained_variance_before"], result.metrics["value/explained_variance"]
    assert before == pytest.approx(0.0, abs=1e-9)
    assert after > 0.5


def _stale_batch(policy_model):
    """A two-turn rollout whose first turn (4 tokens) is stale at learner version 5, tau 2, plus two fresh rollouts."""
    fresh = [msgspec.structs.replace(r, policy_version=5, turn_policy_versions=[5])
             for r in _rollouts(policy_model, [(2, 0.0), (3, 1.0)], seed=10)]
    return collate_rollouts([_two_turn_rollout(policy_model, [0, 5]), *fresh], pad_token_id=0)


def test_whitened_advantages_have_mean_0_and_std_1_over_the_fresh_action_tokens(policy_model, critic_model):
    """sao.whiten_advantages: over the 3 + 2 + 3 fresh action tokens the advantages have mean 0 and std 1
    (stale tokens excluded from the statistics); off, the critic's raw advantages are not whitened."""
    batch = _stale_batch(policy_model)
    for whiten in (True, False):
        config = _config(max_staleness=2, whiten_advantages=whiten)
        policy, critic = _trainable(copy.deepcopy(policy_model), 0.1), _trainable(copy.deepcopy(critic_model), 0.1)
        m = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=0,
                           learner_version=5).metrics
        if whiten:
            assert m["advantage/fresh_mean"] == pytest.approx(0.0, abs=1e-6)
            assert m["advantage/fresh_std"] == pytest.approx(1.0, rel=1e-5)
            assert m["advantage/mean"] != pytest.approx(0.0, abs=1e-3)  # the stale tokens did not count
        else:
            assert m["advantage/fresh_std"] != pytest.approx(1.0, rel=1e-2)


def test_fresh_tokens_denominator_divides_the_policy_loss_by_the_fresh_action_tokens(policy_model, critic_model):
    """12 action tokens, 4 of them stale: under fresh_tokens the policy's summed loss is divided by 8
    instead of 12, so (SGD) its gradient norm and its update are 12/8 times those of all_action_tokens;
    the critic's (divided by every action token either way) are the same. Gradient clip off."""
    batch = _stale_batch(policy_model)
    runs = {}
    for denominator in ("all_action_tokens", "fresh_tokens"):
        config = _config(max_staleness=2, loss={"denominator": denominator}, optim={"grad_clip": 1000.0})
        policy, critic = _trainable(copy.deepcopy(policy_model), 0.1), _trainable(copy.deepcopy(critic_model), 0.1)
        result = sao_train_step(policy=policy, critic=critic, batch=batch, config=config, iteration=0,
                                learner_version=5)
        runs[denominator] = (result.metrics, policy.model, critic.model)
    (m_all, p_all, c_all), (m_fresh, p_fresh, c_fresh) = runs["all_action_tokens"], runs["fresh_tokens"]
    assert (m_all["batch/policy_loss_tokens"], m_fresh["batch/policy_loss_tokens"]) == (12.0, 8.0)
    assert m_fresh["policy/grad_norm"] == pytest.approx(m_all["policy/grad_norm"] * 12 / 8, rel=1e-5)
    start = dict(policy_model.named_parameters())
    for (name, a), b in zip(p_all.named_parameters(), p_fresh.parameters(), strict=True):  # no clip: SGD step ~ gradient
        torch.testing.assert_close(b - start[name], (a - start[name]) * 12 / 8, atol=1e-6, rtol=1e-4)
    _same(c_all, c_fresh)


@pytest.mark.filterwarnings("error:Converting a tensor with requires_grad=True:UserWarning")
def test_a_random_value_head_passes_gradient_into_the_backbone_and_is_the_same_on_every_build(tiny_model):
    """``sao.critic.head_weight_std``: 0 keeps the zero head (V = 0, no gradient reaches the backbone on the first
    step); > 0 draws the head from a fixed seed (two builds, as on two ranks, agree) and the backbone gets a gradient
    at once; a negative std is refused."""
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    zero = CriticModel.from_policy_path(tiny_model.path)
    assert torch.count_nonzero(zero.value_head.weight) == 0
    zero(ids, mask).pow(2).sum().add(zero(ids, mask).sub(1.0).pow(2).sum()).backward()
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in zero.backbone.parameters())
    a = CriticModel.from_policy_path(tiny_model.path, head_weight_std=0.01)
    b = CriticModel.from_policy_path(tiny_model.path, head_weight_std=0.01)
    assert torch.equal(a.value_head.weight, b.value_head.weight)
    assert 0.003 < float(a.value_head.weight.detach().std()) < 0.03 and float(a.value_head.bias.detach()) == 0.0
    a(ids, mask).sub(1.0).pow(2).sum().backward()
    assert any(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in a.backbone.parameters())
    with pytest.raises(ValueError, match="head_weight_std: must be >= 0, got -1"):
        CriticModel.from_policy_path(tiny_model.path, head_weight_std=-1)
