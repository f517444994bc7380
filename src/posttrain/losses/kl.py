"""Per-token KL-divergence estimators from sampled tokens (Schulman, "Approximating KL Divergence", 2020).

For tokens sampled from p, with ``log_ratio = log q - log p``:

* k1 = -log_ratio                         (unbiased, high variance, can be negative)
* k2 = log_ratio**2 / 2                   (biased, low variance)
* k3 = exp(log_ratio) - 1 - log_ratio     (unbiased, >= 0; DeepSeekMath's GRPO KL term)

All three estimate KL(p || q). The log-ratio is clamped to ``[-clamp, clamp]`` before ``exp`` so
the numbers stay finite; clamped tokens get zero gradient through the clamp.

Run the tests: ``python -m pytest -q tests/unit/losses/test_kl_estimators.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _log_ratio(sample_logprobs: Tensor, other_logprobs: Tensor, clamp: float) -> Tensor:
    if sample_logprobs.shape != other_logprobs.shape:
        raise ValueError(
            f"sample_logprobs/other_logprobs: shapes differ, {tuple(sample_logprobs.shape)} vs "
            f"{tuple(other_logprobs.shape)}"
        )
    if not clamp > 0:
        raise ValueError(f"clamp: must be > 0, got {clamp}")
    return torch.clamp(other_logprobs - sample_logprobs, -clamp, clamp)


def k1_kl(sample_logprobs: Tensor, other_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """k1 estimate of KL(p || q) per token: ``log p - log q``.

    Args:
        sample_logprobs: [B, T] float32. log p of tokens sampled from p.
        other_logprobs: [B, T] float32. log q of the same tokens.
        clamp: Bound on ``|log q - log p|`` (nats).

    Returns:
        [B, T] float32 per-token estimates (may be negative).

    Raises:
        ValueError: shapes differ or ``clamp <= 0``.
    """
    return -_log_ratio(sample_logprobs, other_logprobs, clamp)


def k2_kl(sample_logprobs: Tensor, other_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """k2 estimate of KL(p || q) per token: ``(log q - log p)**2 / 2``.

    Args:
        sample_logprobs: [B, T] float32. log p of tokens sampled from p.
        other_logprobs: [B, T] float32. log q of the same tokens.
        clamp: Bound on ``|log q - log p|`` (nats).

    Returns:
        [B, T] float32 per-token estimates (>= 0).

    Raises:
        ValueError: shapes differ or ``clamp <= 0``.
    """
    log_ratio = _log_ratio(sample_logprobs, other_logprobs, clamp)
    return 0.5 * log_ratio * log_ratio


def k3_kl(sample_logprobs: Tensor, other_logprobs: Tensor, clamp: float = 20.0) -> Tensor:
    """k3 estimate of KL(p || q) per token: ``q/p - 1 - log(q/p)``.

    Used with ``sample_logprobs = logprobs`` and ``other_logprobs = ref_logprobs`` for the GRPO
    KL penalty KL(pi_theta || pi_ref) (DeepSeekMath eq. 4), and with
    ``sample_logprobs = behaviour_logprobs`` and ``other_logprobs = logprobs`` for the mismatch
    metric KL(pi_behav || pi_theta).

    Args:
        sample_logprobs: [B, T] float32. log p of tokens sampled from p.
        other_logprobs: [B, T] float32. log q of the same tokens.
        clamp: Bound on ``|log q - log p|`` (nats) before ``exp``.

    Returns:
        [B, T] float32 per-token estimates (>= 0), differentiable w.r.t. both inputs.

    Raises:
        ValueError: shapes differ or ``clamp <= 0``.
    """
    log_ratio = _log_ratio(sample_logprobs, other_logprobs, clamp)
    return torch.expm1(log_ratio) - log_ratio
