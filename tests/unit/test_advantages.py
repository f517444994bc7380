"""Advantage estimators: skip-observation GAE against a pure-Python oracle, lambdas, baselines, groups."""

import pytest
import torch

from posttrain.advantages import (
    RunningMeanBaseline,
    batch_normalized_advantages,
    group_relative_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
    whiten,
)


def _oracle_gae(values, reward, mask, gamma, lam):
    """Pure-Python skip-observation GAE for one row (lists in, lists out)."""
    actions = [t for t, m in enumerate(mask) if m]
    advantages = [0.0] * len(mask)
    returns = [0.0] * len(mask)
    next_value, next_advantage = 0.0, 0.0
    for k in reversed(range(len(actions))):
        t = actions[k]
        r = reward if k == len(actions) - 1 else 0.0
        delta = r + gamma * next_value - values[t]
        advantages[t] = delta + gamma * lam * next_advantage
        returns[t] = advantages[t] + values[t]
        next_value, next_advantage = values[t], advantages[t]
    return advantages, returns


def _multi_turn_batch():
    """Three rows: prompt, two turns with a tool observation between them, right padding."""
    p, a, o = False, True, False  # prompt/padding, action, observation
    masks = [
        [p, p, a, a, a, o, o, a, a, p],  # prompt 2, turn 3, observation 2, turn 2, pad 1
        [p, a, o, o, o, a, a, a, a, a],  # 1-token first turn, long second turn
        [p, p, p, a, a, p, p, p, p, p],  # single short turn, heavy padding
    ]
    mask = torch.tensor(masks)
    torch.manual_seed(0)
    values = torch.randn(3, 10)
    rewards = torch.tensor([1.0, 0.0, 0.5])
    return values, rewards, mask


def test_skip_observation_gae_hand_computed_gamma_and_lambda_half():
    """mask [F, T, T, F, T], V = [9, 0.5, 0.6, 9, 0.8], reward 1, gamma = lam = 0.5 (obs value 9 never read).

    t=4 (last action): delta = 1 + 0 - 0.8 = 0.2; A = 0.2
    t=2: next action is t=4: delta = 0 + 0.5*0.8 - 0.6 = -0.2; A = -0.2 + 0.25*0.2 = -0.15
    t=1: delta = 0 + 0.5*0.6 - 0.5 = -0.2; A = -0.2 + 0.25*(-0.15) = -0.2375
    returns = A + V: [0, 0.2625, 0.45, 0, 1.0]
    """
    values = torch.tensor([[9.0, 0.5, 0.6, 9.0, 0.8]])
    mask = torch.tensor([[False, True, True, False, True]])
    adv, ret = skip_observation_gae(
        values=values, rewards=torch.tensor([1.0]), action_mask=mask, gamma=0.5, lam=0.5
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, -0.2375, -0.15, 0.0, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 0.2625, 0.45, 0.0, 1.0]]))


def test_skip_observation_gae_with_gamma_and_lambda_one_is_reward_minus_value():
    """gamma = lam = 1: A_t = R - V(t) on every action token: R = 1, V = [0.5, 0.6, 0.8] -> [0.5, 0.4, 0.2]; returns = R."""
    values = torch.tensor([[9.0, 0.5, 0.6, 9.0, 0.8]])
    mask = torch.tensor([[False, True, True, False, True]])
    adv, ret = skip_observation_gae(
        values=values, rewards=torch.tensor([1.0]), action_mask=mask, gamma=1.0, lam=1.0
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.5, 0.4, 0.0, 0.2]]))
    torch.testing.assert_close(ret, torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]]))


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("lam", [1.0, 0.95, "per_row"])
def test_skip_observation_gae_matches_python_oracle_on_multi_turn_masks(gamma, lam):
    values, rewards, mask = _multi_turn_batch()
    lam_arg = torch.tensor([0.3, 0.97, 0.6]) if lam == "per_row" else lam
    adv, ret = skip_observation_gae(
        values=values, rewards=rewards, action_mask=mask, gamma=gamma, lam=lam_arg
    )
    for b in range(3):
        row_lam = float(lam_arg[b]) if lam == "per_row" else lam
        want_adv, want_ret = _oracle_gae(
            values[b].tolist(), float(rewards[b]), mask[b].tolist(), gamma, row_lam
        )
        torch.testing.assert_close(adv[b], torch.tensor(want_adv), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret[b], torch.tensor(want_ret), atol=1e-5, rtol=1e-5)


def test_skip_observation_gae_is_zero_on_observation_and_padding_tokens():
    values, rewards, mask = _multi_turn_batch()
    adv, ret = skip_observation_gae(values=values, rewards=rewards, action_mask=mask, gamma=1.0, lam=0.9)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())
    assert bool((adv[mask] != 0).all())


def test_reward_lands_on_the_last_action_token():
    """V = 0, lam = 0: A = delta = reward only on the last action token (t=8 of row 0), 0 on all others,
    even though padding follows it and an observation precedes it."""
    _, _, mask = _multi_turn_batch()
    adv, _ = skip_observation_gae(
        values=torch.zeros(3, 10), rewards=torch.tensor([2.0, 3.0, 4.0]), action_mask=mask, gamma=1.0, lam=0.0
    )
    expected = torch.zeros(3, 10)
    expected[0, 8], expected[1, 9], expected[2, 4] = 2.0, 3.0, 4.0
    torch.testing.assert_close(adv, expected)


def test_observation_values_are_never_read():
    values, rewards, mask = _multi_turn_batch()
    noisy = values.clone()
    noisy[~mask] = 1e6
    a, r = skip_observation_gae(values=values, rewards=rewards, action_mask=mask, gamma=0.9, lam=0.8)
    b, s = skip_observation_gae(values=noisy, rewards=rewards, action_mask=mask, gamma=0.9, lam=0.8)
    assert torch.equal(a, b) and torch.equal(r, s)


def test_critic_lambda_one_and_length_adaptive_lambda_give_different_advantages():
    """Same batch: lambda_critic = 1 (Monte-Carlo) vs lambda_policy = 1 - 1/(1.5 l) bootstrap differently."""
    values, rewards, mask = _multi_turn_batch()
    lam_policy = length_adaptive_lambda(mask.sum(dim=1), alpha=1.5)
    adv_critic, ret_critic = skip_observation_gae(
        values=values, rewards=rewards, action_mask=mask, gamma=1.0, lam=1.0
    )
    adv_policy, _ = skip_observation_gae(
        values=values, rewards=rewards, action_mask=mask, gamma=1.0, lam=lam_policy
    )
    assert not torch.allclose(adv_critic, adv_policy)
    torch.testing.assert_close(ret_critic[mask], rewards[:, None].expand(3, 10)[mask])  # MC targets = R


def test_skip_observation_gae_builds_no_graph():
    values, rewards, mask = _multi_turn_batch()
    values.requires_grad_(True)
    adv, ret = skip_observation_gae(values=values, rewards=rewards, action_mask=mask, gamma=1.0, lam=1.0)
    assert not adv.requires_grad and not ret.requires_grad


def test_single_rollout_gae_is_never_all_zero():
    """n = 1 with an untrained critic (V = 0): A = reward on every action token, not 0 as a group mean would give."""
    mask = torch.tensor([[False, True, True]])
    adv, _ = skip_observation_gae(
        values=torch.zeros(1, 3), rewards=torch.tensor([1.0]), action_mask=mask, gamma=1.0, lam=1.0
    )
    torch.testing.assert_close(adv, torch.tensor([[0.0, 1.0, 1.0]]))


def test_skip_observation_gae_rejects_bad_inputs_naming_the_field():
    mask = torch.tensor([[True, False], [False, False]])
    with pytest.raises(ValueError, match="action_mask: row 1 has no action token"):
        skip_observation_gae(
            values=torch.zeros(2, 2), rewards=torch.zeros(2), action_mask=mask, gamma=1.0, lam=1.0
        )
    ok = torch.tensor([[True, True]])
    with pytest.raises(ValueError, match="lam: every value must lie in"):
        skip_observation_gae(
            values=torch.zeros(1, 2), rewards=torch.zeros(1), action_mask=ok, gamma=1.0, lam=1.5
        )
    with pytest.raises(ValueError, match="lam: expected a float or a \\[1\\] tensor"):
        skip_observation_gae(
            values=torch.zeros(1, 2), rewards=torch.zeros(1), action_mask=ok, gamma=1.0, lam=torch.ones(2)
        )
    with pytest.raises(ValueError, match="gamma: must lie in"):
        skip_observation_gae(
            values=torch.zeros(1, 2), rewards=torch.zeros(1), action_mask=ok, gamma=1.1, lam=1.0
        )
    with pytest.raises(ValueError, match="values: expected a float tensor of shape"):
        skip_observation_gae(
            values=torch.zeros(1, 3), rewards=torch.zeros(1), action_mask=ok, gamma=1.0, lam=1.0
        )
    with pytest.raises(ValueError, match="rewards: non-finite value at row 0"):
        skip_observation_gae(
            values=torch.zeros(1, 2), rewards=torch.tensor([float("nan")]), action_mask=ok, gamma=1.0, lam=1.0
        )


def test_length_adaptive_lambda_hand_values():
    """alpha = 1.5: l = 1 -> 1 - 1/1.5 = 0.333333; l = 2 -> 0.666667; l = 1000 -> 0.999333; l = 0 -> 0.
    alpha = 0.05, l = 10: 1 - 1/0.5 = -1 -> clamped to 0."""
    lam = length_adaptive_lambda(torch.tensor([1, 2, 1000, 0]), alpha=1.5)
    assert lam.dtype == torch.float32
    torch.testing.assert_close(lam, torch.tensor([1 / 3, 2 / 3, 1 - 1 / 1500, 0.0]))
    assert length_adaptive_lambda(torch.tensor([10]), alpha=0.05).item() == 0.0
    with pytest.raises(ValueError, match="alpha: must be > 0"):
        length_adaptive_lambda(torch.tensor([1]), alpha=0.0)


def test_batch_normalized_advantages_whiten_across_rollouts():
    """rewards [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) = 0.577350 -> +-0.866025 on action tokens."""
    mask = torch.tensor([[True, False], [True, True], [False, True], [True, True]])
    adv = batch_normalized_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, eps=0.0)
    s = 0.5 / (1 / 3) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([[s, 0.0], [-s, -s], [0.0, -s], [s, s]]))


def test_batch_normalized_advantages_with_one_rollout_keep_the_raw_reward():
    """B = 1: whitening would give 0 everywhere (no learning); the raw reward 0.7 is returned instead."""
    adv = batch_normalized_advantages(torch.tensor([0.7]), torch.tensor([[False, True, True]]))
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.7, 0.7]]))


def test_running_mean_baseline_uses_previous_rewards_then_updates():
    """window 2. batch [1, 0]: empty window -> baseline 0 -> A [1, 0]; window {1, 0}.
    batch [1]: baseline 0.5 -> A 0.5; window {0, 1}. batch [0]: baseline 0.5 -> A -0.5."""
    baseline = RunningMeanBaseline(window=2)
    mask2 = torch.tensor([[True, True], [False, True]])
    torch.testing.assert_close(
        baseline.advantages(torch.tensor([1.0, 0.0]), mask2), torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    )
    one = torch.tensor([[True]])
    assert baseline.advantages(torch.tensor([1.0]), one).item() == pytest.approx(0.5)
    assert baseline.advantages(torch.tensor([0.0]), one).item() == pytest.approx(-0.5)

    restored = RunningMeanBaseline(window=2)
    restored.load_state_dict(baseline.state_dict())
    assert restored.baseline == baseline.baseline == pytest.approx(0.5)
    with pytest.raises(ValueError, match="window: checkpoint has 2"):
        RunningMeanBaseline(window=3).load_state_dict(baseline.state_dict())


def test_group_relative_advantages_and_degenerate_groups():
    """groups a = [1, 0, 1], b = [1, 1], c = [0.5].
    a: mean 2/3, unbiased std sqrt((1/9 + 4/9 + 1/9)/2) = sqrt(1/3) = 0.577350
       -> [0.577350, -1.154701, 0.577350]; b all equal and c alone: degenerate, 0.
    normalize_std=False: a -> [1/3, -2/3, 1/3]."""
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    groups = ["a", "a", "a", "b", "b", "c"]
    mask = torch.ones(6, 2, dtype=torch.bool)
    mask[0, 0] = False
    adv, degenerate = group_relative_advantages(rewards, groups, mask, eps=0.0)
    s = 3**0.5 / 3
    torch.testing.assert_close(adv[:, 1], torch.tensor([s, -2 * s, s, 0.0, 0.0, 0.0]))
    assert adv[0, 0].item() == 0.0
    assert degenerate.tolist() == [False, False, False, True, True, True]
    plain, _ = group_relative_advantages(rewards, groups, mask, normalize_std=False)
    torch.testing.assert_close(plain[:3, 1], torch.tensor([1 / 3, -2 / 3, 1 / 3]))
    with pytest.raises(ValueError, match="group_ids: expected 6 ids"):
        group_relative_advantages(rewards, groups[:5], mask)


def test_whiten_gives_mean_0_std_1_on_the_tokens_its_statistics_came_from_and_0_off_the_mask():
    """Advantages 1, 2, 3 on three action tokens (mean 2, unbiased std 1) and 5 on a fourth that is
    masked out of the statistics (a stale token): whitened with (2, 1) they are -1, 0, 1 (over the
    first three: mean 0, std 1) and 3 on the fourth; the observation token stays 0."""
    adv = torch.tensor([[1.0, 2.0, 3.0, 5.0, 9.0]])
    act = torch.tensor([[True, True, True, True, False]])
    counted = torch.tensor([[True, True, True, False, False]])
    mean, std = float(adv[counted].mean()), float(adv[counted].std())
    out = whiten(adv, act, mean, std, eps=1e-6)
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 1.0, 3.0, 0.0]]), atol=1e-5, rtol=0)
    assert float(out[counted].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(out[counted].std()) == pytest.approx(1.0, rel=1e-5)
    constant = whiten(torch.full((1, 3), 0.7), torch.ones(1, 3, dtype=torch.bool), 0.7, 0.0)
    assert float(constant.abs().max()) == 0.0  # a constant batch gives 0, not a division by zero
    with pytest.raises(ValueError, match="action_mask"):
        whiten(adv, act[:, :3], mean, std)
    with pytest.raises(ValueError, match="std must be >= 0"):
        whiten(adv, act, mean, -1.0)
