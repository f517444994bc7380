"""Masked reductions used by the losses and advantage estimators.

Masked-out positions never contribute, even when they hold ``inf`` or NaN (``torch.where`` selects
rather than multiplies), and their gradient is exactly zero. Means over an empty mask are 0.0.

Run the tests: ``python -m pytest -q tests/unit/losses/test_masked_ops.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(values: Tensor, mask: Tensor) -> None:
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected dtype torch.bool, got {mask.dtype}")
    if values.shape != mask.shape:
        raise ValueError(f"values/mask: shapes differ, {tuple(values.shape)} vs {tuple(mask.shape)}")


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """Sum of ``values`` where ``mask`` is True.

    Args:
        values: [B, T] float (any shape equal to ``mask``). Values to add up.
        mask: [B, T] bool. Positions to include.

    Returns:
        Scalar tensor of ``values``' dtype; 0 when the mask is empty. Gradient flows to the
        selected positions only.

    Raises:
        ValueError: ``mask`` is not bool or the shapes differ.
    """
    _check(values, mask)
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device)).sum()


def masked_fill_zero(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` where ``mask`` is True, 0 elsewhere, with zero gradient to the masked-out positions.

    Losses call this on their inputs first, so ``inf``/NaN on observation or padding positions can
    reach neither the loss nor the gradient (``0 * inf`` would otherwise poison ``backward``).

    Args:
        values: [B, T] float. Values to sanitise.
        mask: [B, T] bool. Positions to keep.

    Returns:
        [B, T] tensor of ``values``' dtype.

    Raises:
        ValueError: ``mask`` is not bool or the shapes differ.
    """
    _check(values, mask)
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the positions where ``mask`` is True.

    Args:
        values: [B, T] float. Values to average.
        mask: [B, T] bool. Positions to include.

    Returns:
        Scalar tensor; 0 (not NaN) when the mask is empty.

    Raises:
        ValueError: ``mask`` is not bool or the shapes differ.
    """
    count = int(mask.sum())
    return masked_sum(values, mask) / max(count, 1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values`` over the masked positions.

    Args:
        values: [B, T] float. Values.
        mask: [B, T] bool. Positions to include.
        unbiased: Divide by ``n - 1`` (Bessel) instead of ``n``.

    Returns:
        Scalar tensor; 0 when fewer than 2 positions (1 when ``unbiased`` is False) are selected.

    Raises:
        ValueError: ``mask`` is not bool or the shapes differ.
    """
    count = int(mask.sum())
    denominator = count - 1 if unbiased else count
    if denominator <= 0:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    centred = values - masked_mean(values, mask)
    return masked_sum(centred * centred, mask) / denominator


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-6, shift_mean: bool = True) -> Tensor:
    """Standardise the masked positions to zero mean and unit (unbiased) standard deviation.

    ``(x - mean) / (std + eps)`` on masked positions, 0 elsewhere. With ``shift_mean=False`` only
    the scale changes. Fewer than 2 masked positions have no defined std: the values are then
    centred only (a single position becomes 0; left unchanged with ``shift_mean=False``), so callers that must keep a lone value (see
    ``posttrain.advantages.batch_normalized_advantages``) handle that case themselves.

    Args:
        values: [B, T] float. Values to standardise.
        mask: [B, T] bool. Positions that take part (statistics and output).
        eps: Added to the standard deviation (same unit as ``values``).
        shift_mean: Subtract the masked mean.

    Returns:
        [B, T] tensor of ``values``' dtype; 0 on unmasked positions.

    Raises:
        ValueError: ``mask`` is not bool, the shapes differ, or ``eps`` is negative.
    """
    if eps < 0:
        raise ValueError(f"eps: must be >= 0, got {eps}")
    _check(values, mask)
    out = values - masked_mean(values, mask) if shift_mean else values
    if int(mask.sum()) >= 2:
        out = out / (masked_var(values, mask, unbiased=True).sqrt() + eps)
    return torch.where(mask, out, torch.zeros((), dtype=values.dtype, device=values.device))
