"""Masked reductions: masked-out inf/NaN never leak into values or gradients; empty masks give 0."""

import pytest
import torch

from posttrain.losses import masked_fill_zero, masked_mean, masked_sum, masked_var, masked_whiten


def test_masked_sum_and_mean_ignore_inf_and_nan_at_masked_positions():
    """values [1, 2, inf, nan], mask [T, T, F, F]: sum 3, mean 1.5, gradient [1, 1, 0, 0] for the sum."""
    values = torch.tensor([[1.0, 2.0, float("inf"), float("nan")]], requires_grad=True)
    mask = torch.tensor([[True, True, False, False]])
    total = masked_sum(values, mask)
    assert total.item() == 3.0
    assert masked_mean(values, mask).item() == 1.5
    total.backward()
    assert torch.equal(values.grad, torch.tensor([[1.0, 1.0, 0.0, 0.0]]))


def test_masked_mean_of_empty_mask_is_zero_not_nan():
    values = torch.tensor([[1.0, 2.0]])
    empty = torch.zeros(1, 2, dtype=torch.bool)
    assert masked_mean(values, empty).item() == 0.0
    assert masked_var(values, empty).item() == 0.0


def test_masked_whiten_standardises_only_masked_positions():
    """values [1, 2, 3, 100], mask [T, T, T, F]: mean 2, unbiased std 1 -> [-1, 0, 1, 0] (eps = 0)."""
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(masked_whiten(values, mask, eps=0.0), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]))
    torch.testing.assert_close(
        masked_whiten(values, mask, eps=0.0, shift_mean=False), torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    )


def test_masked_fill_zero_blocks_gradient_to_masked_positions():
    values = torch.tensor([[float("nan"), 2.0]], requires_grad=True)
    out = masked_fill_zero(values, torch.tensor([[False, True]]))
    (out * 3.0).sum().backward()
    assert torch.equal(values.grad, torch.tensor([[0.0, 3.0]]))


def test_masked_helpers_reject_non_bool_masks():
    with pytest.raises(ValueError, match="mask: expected dtype torch.bool"):
        masked_sum(torch.zeros(2), torch.ones(2))
