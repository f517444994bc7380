"""Critic (value model) loss: clipped squared error against GAE returns, summed over action tokens.

PPO-style value clipping (as in OpenAI baselines' PPO2 and slime's ``--value-clip``)::

    v_clip_t = old_values_t + clamp(values_t - old_values_t, -value_clip, value_clip)
    loss_sum = sum_t 0.5 * max((values_t - returns_t)^2, (v_clip_t - returns_t)^2)   over action tokens

SAO (arXiv 2607.07508 §3.2) trains the critic K = 2 times per policy update on returns computed
with lambda_critic = 1; values are neither trained on nor queried at observation tokens.

Run the tests: ``python -m pytest -q tests/unit/losses/test_value_loss.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.losses.masked import masked_fill_zero, masked_sum
from posttrain.losses.types import LossOutput


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, action_mask: Tensor, value_clip: float
) -> LossOutput:
    """Clipped value regression (see module doc for the equation).

    Args:
        values: [B, T] float. Critic predictions with gradient (any float dtype; computed in float32).
        old_values: [B, T] float. Critic predictions when the returns were computed (no gradient).
        returns: [B, T] float32. Regression targets (``advantages + old values`` from GAE).
        action_mask: [B, T] bool. Tokens that take part (action tokens).
        value_clip: Half-width (> 0, in reward units) of the trust region around ``old_values``;
            ``math.inf`` disables clipping.

    Returns:
        ``LossOutput`` with ``num_tokens`` = action tokens and metrics ``value/mean`` (mean of
        ``values``), ``value/returns_mean``, ``value/clip_frac`` (fraction of tokens where the
        clipped error is the larger one, so the gradient is zero),
        ``value/explained_variance`` (``1 - Var(returns - values) / Var(returns)`` over these
        tokens, ``explained_variance``; a learner reports the whole batch's instead) and
        ``value/mse``. All 0.0 with no action token.

    Raises:
        ValueError: shapes differ, ``action_mask`` is not bool, or ``value_clip <= 0``.
    """
    if not value_clip > 0:
        raise ValueError(f"value_clip: must be > 0, got {value_clip}")
    for name, tensor in (("old_values", old_values), ("returns", returns), ("action_mask", action_mask)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(values.shape)} like values, got {tuple(tensor.shape)}"
            )
    if action_mask.dtype != torch.bool:
        raise ValueError(f"action_mask: expected dtype torch.bool, got {action_mask.dtype}")

    values32 = masked_fill_zero(values.float(), action_mask)
    old32 = masked_fill_zero(old_values.detach().float(), action_mask)
    targets = masked_fill_zero(returns.detach().float(), action_mask)
    clipped = old32 + torch.clamp(values32 - old32, -value_clip, value_clip)
    error = (values32 - targets) ** 2
    clipped_error = (clipped - targets) ** 2
    loss_sum = 0.5 * masked_sum(torch.maximum(error, clipped_error), action_mask)
    num_tokens = int(action_mask.sum())

    with torch.no_grad():
        metrics = {
            "value/mean": 0.0,
            "value/returns_mean": 0.0,
            "value/clip_frac": 0.0,
            "value/explained_variance": 0.0,
            "value/mse": 0.0,
        }
        if num_tokens:
            v = values32.detach()[action_mask].double()
            r = targets[action_mask].double()
            metrics["value/mean"] = float(v.mean())
            metrics["value/returns_mean"] = float(r.mean())
            metrics["value/clip_frac"] = float((clipped_error > error)[action_mask].double().mean())
            metrics["value/mse"] = float(((v - r) ** 2).mean())
            metrics["value/explained_variance"] = explained_variance(
                explained_variance_sums(values32, targets, action_mask))
    return LossOutput(loss_sum=loss_sum, num_tokens=num_tokens, metrics=metrics)


def explained_variance_sums(values: Tensor, returns: Tensor, action_mask: Tensor) -> list[float]:
    """The sums explained variance is made of, over action tokens: add them over micro-batches and ranks.

    Args:
        values: [B, T] float. Critic predictions (not differentiated).
        returns: [B, T] float. Regression targets.
        action_mask: [B, T] bool. Tokens that count.

    Returns:
        ``[n, sum r, sum r^2, sum e, sum e^2]`` (float64 arithmetic) with ``r`` the returns and
        ``e = r - values`` the residuals of the ``n`` action tokens.
    """
    with torch.no_grad():
        r = returns.detach()[action_mask].double()
        e = r - values.detach()[action_mask].double()
        return [float(r.numel()), float(r.sum()), float((r * r).sum()), float(e.sum()), float((e * e).sum())]


def explained_variance(sums: list[float]) -> float:
    """``1 - Var(e) / Var(r)`` from pooled ``explained_variance_sums`` (population variances).

    0.0 with fewer than 2 tokens or a return variance below 1e-10 (float noise on constant
    returns is not variance). Pooling the sums of a whole batch gives the batch's value, whatever
    the micro-batches and ranks it was split into.
    """
    n, sum_r, sum_rr, sum_e, sum_ee = sums
    if n < 2:
        return 0.0
    return_var = sum_rr / n - (sum_r / n) ** 2
    if return_var <= 1e-10:
        return 0.0
    return 1.0 - (sum_ee / n - (sum_e / n) ** 2) / return_var
