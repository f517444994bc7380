"""Clipped value loss: hand-computed values, clip behaviour, explained variance, gradient flow."""

import math

import pytest
import torch

from posttrain.losses import value_loss


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float32, requires_grad=grad)


def test_value_loss_matches_hand_computed_value_and_metrics():
    """value_clip = 0.1; the third token is an observation (ignored).

    t=0: v=1.0, old=0.8, R=0: v_clip = 0.8 + clamp(0.2) = 0.9; max((1-0)^2, (0.9-0)^2) = 1.0
    t=1: v=0.5, old=0.5, R=1: both (0.5-1)^2 = 0.25
    loss_sum = 0.5 * (1.0 + 0.25) = 0.625; grad = v - R: [1.0, -0.5, 0]
    EV: Var(R) = Var([0, 1]) = 0.25; R - v = [-1, 0.5], Var = 0.5625 -> 1 - 0.5625/0.25 = -1.25
    value/mean = 0.75, clip_frac = 0 (the clipped error is never the larger one)
    """
    values = _t([[1.0, 0.5, 2.0]], grad=True)
    out = value_loss(
        values, _t([[0.8, 0.5, 0.0]]), _t([[0.0, 1.0, 5.0]]), torch.tensor([[True, True, False]]), 0.1
    )
    assert out.loss_sum.item() == pytest.approx(0.625)
    assert out.num_tokens == 2
    assert out.metrics["value/explained_variance"] == pytest.approx(-1.25)
    assert out.metrics["value/mean"] == pytest.approx(0.75)
    assert out.metrics["value/clip_frac"] == 0.0
    assert out.metrics["value/mse"] == pytest.approx(0.625)
    out.loss_sum.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[1.0, -0.5, 0.0]]))


def test_value_clip_takes_the_larger_error_and_stops_the_gradient():
    """v=1.0, old=0.8, R=2, clip 0.1: v_clip = 0.9; max((1-2)^2=1, (0.9-2)^2=1.21) = 1.21 -> loss 0.605,
    the clipped branch does not depend on v: grad 0, clip_frac 1."""
    values = _t([[1.0]], grad=True)
    out = value_loss(values, _t([[0.8]]), _t([[2.0]]), torch.tensor([[True]]), 0.1)
    assert out.loss_sum.item() == pytest.approx(0.605)
    assert out.metrics["value/clip_frac"] == 1.0
    out.loss_sum.backward()
    assert values.grad.item() == 0.0


def test_value_gradient_reaches_values_never_old_values_or_returns():
    values, old, returns = _t([[0.3, 0.1]], True), _t([[0.2, 0.2]], True), _t([[1.0, 0.0]], True)
    value_loss(values, old, returns, torch.tensor([[True, True]]), 0.5).loss_sum.backward()
    assert bool((values.grad != 0).all())
    assert old.grad is None and returns.grad is None


def test_value_all_masked_gives_finite_zero_and_backward_works():
    values = _t([[float("nan"), 1.0]], grad=True)
    out = value_loss(values, _t([[0.0, 0.0]]), _t([[float("inf"), 1.0]]), torch.tensor([[False, False]]), 0.2)
    assert out.loss_sum.item() == 0.0 and out.num_tokens == 0
    out.loss_sum.backward()
    assert torch.equal(values.grad, torch.zeros(1, 2))
    assert all(v == 0.0 for v in out.metrics.values())


def test_explained_variance_is_zero_for_one_token_or_constant_returns():
    one = value_loss(_t([[0.3, 9.0]]), _t([[0.3, 9.0]]), _t([[1.0, 0.0]]), torch.tensor([[True, False]]), 0.2)
    assert one.metrics["value/explained_variance"] == 0.0
    flat = value_loss(_t([[0.3, 0.7]]), _t([[0.3, 0.7]]), _t([[1.0, 1.0]]), torch.tensor([[True, True]]), 0.2)
    assert flat.metrics["value/explained_variance"] == 0.0


def test_perfect_values_explain_all_variance_and_inf_clip_disables_clipping():
    """values == returns: EV 1, loss 0. value_clip = inf: v=3, old=0, R=0 -> 0.5 * 9 = 4.5 (no clipping)."""
    perfect = value_loss(
        _t([[0.0, 1.0]]), _t([[0.5, 0.5]]), _t([[0.0, 1.0]]), torch.tensor([[True, True]]), 10.0
    )
    assert perfect.metrics["value/explained_variance"] == pytest.approx(1.0)
    assert perfect.loss_sum.item() == 0.0
    free = value_loss(_t([[3.0]]), _t([[0.0]]), _t([[0.0]]), torch.tensor([[True]]), math.inf)
    assert free.loss_sum.item() == pytest.approx(4.5)


def test_value_loss_rejects_bad_inputs():
    v = _t([[0.0, 0.0]])
    mask = torch.tensor([[True, True]])
    with pytest.raises(ValueError, match="value_clip: must be > 0"):
        value_loss(v, v, v, mask, 0.0)
    with pytest.raises(ValueError, match="returns: expected shape"):
        value_loss(v, v, _t([0.0, 0.0]), mask, 0.2)
    with pytest.raises(ValueError, match="action_mask: expected dtype torch.bool"):
        value_loss(v, v, v, mask.float(), 0.2)
