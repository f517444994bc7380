"""Sigmoid DPO: hand-computed values, label smoothing, gradient flow, empty batch."""

import math

import pytest
import torch

from posttrain.config import DPOLossConfig
from posttrain.losses import dpo_loss


def _pairs():
    chosen = torch.tensor([-10.0, -5.0], requires_grad=True)
    rejected = torch.tensor([-15.0, -4.0], requires_grad=True)
    ref_chosen = torch.tensor([-12.0, -5.0], requires_grad=True)
    ref_rejected = torch.tensor([-14.0, -5.0], requires_grad=True)
    return chosen, rejected, ref_chosen, ref_rejected


def test_dpo_loss_matches_hand_computed_value_and_metrics():
    """beta = 0.1.

    pair 0: chosen reward 0.1*(-10+12) = 0.2, rejected 0.1*(-15+14) = -0.1, margin 0.3
            loss = log(1 + e^-0.3) = 0.554355
    pair 1: chosen reward 0, rejected 0.1*(-4+5) = 0.1, margin -0.1, loss = log(1 + e^0.1) = 0.744397
    loss_sum = 1.298752; accuracy 0.5; margin mean 0.1; chosen reward mean 0.1; rejected mean 0.0
    d loss / d chosen_0 = -beta * sigmoid(-0.3) = -0.1 * 0.425557 = -0.0425557
    """
    chosen, rejected, ref_chosen, ref_rejected = _pairs()
    out = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, DPOLossConfig(beta=0.1))
    assert out.loss_sum.item() == pytest.approx(1.298752, abs=1e-5)
    assert out.num_tokens == 2
    assert out.metrics["dpo/accuracy"] == 0.5
    assert out.metrics["dpo/margin"] == pytest.approx(0.1, abs=1e-6)
    assert out.metrics["dpo/chosen_reward"] == pytest.approx(0.1, abs=1e-6)
    assert out.metrics["dpo/rejected_reward"] == pytest.approx(0.0, abs=1e-6)
    out.loss_sum.backward()
    assert chosen.grad[0].item() == pytest.approx(-0.0425557, abs=1e-6)
    assert rejected.grad[0].item() == pytest.approx(0.0425557, abs=1e-6)


def test_dpo_label_smoothing_matches_hand_computation():
    """Pair 0 with eps = 0.1: 0.9 * log(1 + e^-0.3) + 0.1 * log(1 + e^0.3) = 0.9*0.554355 + 0.1*0.854355 = 0.584355."""
    chosen, rejected, ref_chosen, ref_rejected = (t[:1] for t in _pairs())
    out = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, DPOLossConfig(beta=0.1, label_smoothing=0.1))
    expected = 0.9 * math.log1p(math.exp(-0.3)) + 0.1 * math.log1p(math.exp(0.3))
    assert out.loss_sum.item() == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(0.584355, abs=1e-6)


def test_dpo_gradient_reaches_policy_logprobs_never_reference():
    chosen, rejected, ref_chosen, ref_rejected = _pairs()
    dpo_loss(chosen, rejected, ref_chosen, ref_rejected, DPOLossConfig()).loss_sum.backward()
    assert bool((chosen.grad != 0).all()) and bool((rejected.grad != 0).all())
    assert ref_chosen.grad is None and ref_rejected.grad is None


def test_dpo_empty_batch_gives_finite_zero_and_backward_works():
    empty = [torch.zeros(0, requires_grad=True) for _ in range(4)]
    out = dpo_loss(*empty, DPOLossConfig())
    assert out.loss_sum.item() == 0.0 and out.num_tokens == 0
    out.loss_sum.backward()
    assert all(v == 0.0 for v in out.metrics.values())


def test_dpo_rejects_mismatched_shapes_naming_the_field():
    chosen, rejected, ref_chosen, _ = _pairs()
    with pytest.raises(ValueError, match="ref_rejected_logprobs: expected a \\[B\\] tensor"):
        dpo_loss(chosen, rejected, ref_chosen, torch.zeros(3), DPOLossConfig())
