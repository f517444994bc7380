"""GRPO clipped surrogate: hand-computed values, clip edges, KL term, old_logprobs anchor, DIS band."""

import math

import pytest
import torch

from posttrain.config import GRPOLossConfig
from posttrain.losses import POLICY_LOSSES, PolicyLossInputs, grpo_loss


def _inputs(logprobs, behaviour, advantages, mask, ref=None, old=None):
    def t(x, grad=False):
        return None if x is None else torch.tensor(x, dtype=torch.float32, requires_grad=grad)

    return PolicyLossInputs(
        t(logprobs, True),
        t(behaviour, True),
        t(advantages),
        torch.tensor(mask, dtype=torch.bool),
        ref_logprobs=t(ref, True),
        old_logprobs=t(old, True),
    )


def test_grpo_loss_matches_hand_computed_value_and_gradient():
    """Clip range (0.8, 1.28); ratio against behaviour (behaviour = 0, so r = exp(logp)).

    t=0: r=1.5, A=+1: min(1.5, 1.28) = 1.28 -> -1.28, clipped: grad 0
    t=1: r=0.5, A=-1: min(-0.5, -0.8) = -0.8 -> +0.8, clipped: grad 0
    t=2: r=1.0, A=+2: min(2, 2) = 2 -> -2, grad = -r*A = -2
    t=3: r=0.5, A=+1: min(0.5, 0.8) = 0.5 -> -0.5, not clipped (PPO keeps it): grad -0.5
    t=4: observation, ignored
    loss_sum = -1.28 + 0.8 - 2 - 0.5 = -2.98; clip/frac_high = 1/4, clip/frac_low = 1/4
    """
    inputs = _inputs(
        [[math.log(1.5), math.log(0.5), 0.0, math.log(0.5), -7.0]],
        [[0.0, 0.0, 0.0, 0.0, 0.0]],
        [[1.0, -1.0, 2.0, 1.0, 50.0]],
        [[True, True, True, True, False]],
    )
    out = grpo_loss(inputs, GRPOLossConfig())
    assert out.loss_sum.item() == pytest.approx(-2.98, abs=1e-5)
    assert out.num_tokens == 4
    assert out.metrics["clip/frac_high"] == 0.25
    assert out.metrics["clip/frac_low"] == 0.25
    assert out.metrics["clip/frac"] == 0.5
    out.loss_sum.backward()
    torch.testing.assert_close(
        inputs.logprobs.grad, torch.tensor([[0.0, 0.0, -2.0, -0.5, 0.0]]), atol=1e-6, rtol=0
    )


def test_grpo_gradient_reaches_logprobs_never_behaviour_old_or_ref():
    inputs = _inputs(
        [[-1.0, -2.0]],
        [[-1.1, -2.1]],
        [[1.0, -1.0]],
        [[True, True]],
        ref=[[-1.5, -2.5]],
        old=[[-1.05, -2.05]],
    )
    grpo_loss(inputs, GRPOLossConfig(kl_coef=0.1)).loss_sum.backward()
    assert bool((inputs.logprobs.grad != 0).all())
    assert inputs.behaviour_logprobs.grad is None
    assert inputs.old_logprobs.grad is None
    assert inputs.ref_logprobs.grad is None


def test_grpo_all_masked_gives_finite_zero_and_backward_works():
    inputs = _inputs(
        [[float("nan"), -1.0]], [[0.0, 9.0]], [[float("inf"), 1.0]], [[False, False]], ref=[[0.0, 0.0]]
    )
    out = grpo_loss(inputs, GRPOLossConfig(kl_coef=0.5, dis_mask=True))
    assert out.loss_sum.item() == 0.0 and out.num_tokens == 0
    out.loss_sum.backward()
    assert torch.equal(inputs.logprobs.grad, torch.zeros(1, 2))
    assert all(v == 0.0 for v in out.metrics.values())


@pytest.mark.parametrize(
    ("ratio", "advantage", "has_grad"),
    [
        (1.28 - 1e-4, 1.0, True),  # just inside the high clip: gradient -r*A
        (1.28 + 1e-4, 1.0, False),  # just outside with A > 0: clipped
        (1.28 + 1e-4, -1.0, True),  # PPO is one-sided: A < 0 keeps the gradient above the range
        (0.8 + 1e-4, -1.0, True),
        (0.8 - 1e-4, -1.0, False),
        (0.8 - 1e-4, 1.0, True),
    ],
)
def test_grpo_clip_edges_depend_on_advantage_sign(ratio, advantage, has_grad):
    inputs = _inputs([[math.log(ratio)]], [[0.0]], [[advantage]], [[True]])
    grpo_loss(inputs, GRPOLossConfig()).loss_sum.backward()
    grad = inputs.logprobs.grad.item()
    if has_grad:
        assert grad == pytest.approx(-ratio * advantage, rel=1e-4)
    else:
        assert grad == 0.0


def test_grpo_k3_kl_term_matches_hand_computation():
    """logp = -1, ref = -2, r = 1 (behaviour = logp), A = 0, kl_coef = 0.1.

    k3 = exp(ref - logp) - 1 - (ref - logp) = e^-1 - 1 + 1 = 0.367879; loss = 0.1 * 0.367879 = 0.0367879
    d/dlogp = 0.1 * (1 - exp(ref - logp)) = 0.1 * 0.632121 = 0.0632121
    """
    inputs = _inputs([[-1.0]], [[-1.0]], [[0.0]], [[True]], ref=[[-2.0]])
    out = grpo_loss(inputs, GRPOLossConfig(kl_coef=0.1))
    assert out.loss_sum.item() == pytest.approx(0.0367879, abs=1e-6)
    assert out.metrics["kl/ref_k3"] == pytest.approx(0.367879, abs=1e-6)
    out.loss_sum.backward()
    assert inputs.logprobs.grad.item() == pytest.approx(0.0632121, abs=1e-6)


def test_grpo_kl_coef_without_ref_logprobs_raises():
    inputs = _inputs([[-1.0]], [[-1.0]], [[1.0]], [[True]])
    with pytest.raises(ValueError, match="ref_logprobs: required when kl_coef > 0"):
        grpo_loss(inputs, GRPOLossConfig(kl_coef=0.01))


def test_grpo_ratio_uses_old_logprobs_when_given():
    """logp = 0, behaviour = 0, old = ln 0.5, A = 1: against old r = 2 > 1.28 -> clipped, loss -1.28, grad 0;
    against behaviour r = 1 -> loss -1, grad -1."""
    with_old = _inputs([[0.0]], [[0.0]], [[1.0]], [[True]], old=[[math.log(0.5)]])
    out = grpo_loss(with_old, GRPOLossConfig())
    out.loss_sum.backward()
    assert out.loss_sum.item() == pytest.approx(-1.28, abs=1e-6)
    assert with_old.logprobs.grad.item() == 0.0

    without_old = _inputs([[0.0]], [[0.0]], [[1.0]], [[True]])
    out = grpo_loss(without_old, GRPOLossConfig())
    out.loss_sum.backward()
    assert out.loss_sum.item() == pytest.approx(-1.0, abs=1e-6)
    assert without_old.logprobs.grad.item() == pytest.approx(-1.0)


@pytest.mark.parametrize(
    ("behaviour_ratio", "kept"), [(0.7, False), (0.7001, True), (6.0, False), (5.999, True)]
)
def test_grpo_dis_mask_edges_on_behaviour_ratio(behaviour_ratio, kept):
    """dis_mask: r_behav = pi_theta / pi_behav must lie in (0.7, 6.0). old = logp so the PPO ratio is 1
    and the PPO gradient is -A = -1 whenever the token is kept."""
    logp = 0.0
    behaviour = -torch.log(torch.tensor(behaviour_ratio, dtype=torch.float32)).item()
    inputs = _inputs([[logp]], [[behaviour]], [[1.0]], [[True]], old=[[logp]])
    out = grpo_loss(inputs, GRPOLossConfig(dis_mask=True))
    out.loss_sum.backward()
    assert inputs.logprobs.grad.item() == (pytest.approx(-1.0) if kept else 0.0)
    assert out.metrics["mask/frac_total"] == (0.0 if kept else 1.0)


def test_grpo_dis_mask_drops_token_plain_grpo_keeps():
    """r = 0.5 with A = +1: PPO keeps gradient -0.5 (r below the clip range but A > 0); GRPO + DIS drops it."""
    plain = _inputs([[math.log(0.5)]], [[0.0]], [[1.0]], [[True]])
    grpo_loss(plain, GRPOLossConfig()).loss_sum.backward()
    assert plain.logprobs.grad.item() == pytest.approx(-0.5)
    masked = _inputs([[math.log(0.5)]], [[0.0]], [[1.0]], [[True]])
    out = grpo_loss(masked, GRPOLossConfig(dis_mask=True))
    out.loss_sum.backward()
    assert masked.logprobs.grad.item() == 0.0
    assert out.metrics["mask/frac_low"] == 1.0


def test_grpo_is_in_policy_losses():
    assert POLICY_LOSSES["grpo"] is grpo_loss
