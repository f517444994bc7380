"""k1/k2/k3 KL estimators: hand values and exact expectations over a small categorical."""

import math

import pytest
import torch

from posttrain.losses import k1_kl, k2_kl, k3_kl


def test_k3_matches_hand_computed_values():
    """log p = -1, log q = -2: log(q/p) = -1; k3 = e^-1 - 1 + 1 = 0.367879; k1 = 1; k2 = 0.5."""
    p, q = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert k3_kl(p, q).item() == pytest.approx(0.367879, abs=1e-6)
    assert k1_kl(p, q).item() == pytest.approx(1.0)
    assert k2_kl(p, q).item() == pytest.approx(0.5)


def test_k1_and_k3_expectations_equal_the_exact_kl():
    """Over all outcomes i of p = [0.5, 0.3, 0.2], q = [0.2, 0.2, 0.6]:
    sum_i p_i k(i) = KL(p || q) = 0.5 ln 2.5 + 0.3 ln 1.5 + 0.2 ln(1/3) = 0.360800."""
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.2, 0.6])
    exact = float((p * (p / q).log()).sum())
    assert exact == pytest.approx(0.5 * math.log(2.5) + 0.3 * math.log(1.5) + 0.2 * math.log(1 / 3))
    for estimator in (k1_kl, k3_kl):
        per_outcome = estimator(p.log()[None], q.log()[None])[0]
        assert float((p * per_outcome).sum()) == pytest.approx(exact, abs=1e-6)


def test_k3_is_nonnegative_and_finite_under_extreme_log_ratios():
    p = torch.tensor([[0.0, -200.0, -1.0]])
    q = torch.tensor([[-200.0, 0.0, -1.0]])
    out = k3_kl(p, q)
    assert bool(torch.isfinite(out).all()) and bool((out >= 0).all())
    assert out[0, 2].item() == 0.0


def test_kl_estimators_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="shapes differ"):
        k3_kl(torch.zeros(2, 3), torch.zeros(3, 2))
