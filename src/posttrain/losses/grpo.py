"""GRPO policy loss: PPO clipped surrogate with asymmetric clipping, optional k3 KL and DIS band.

DeepSeekMath (arXiv 2402.03300, eq. 3) with DAPO's decoupled clip range (arXiv 2503.14476). Per
action token t::

    r_t      = exp(clamp(logprobs_t - anchor_t, -c, c))        anchor = old_logprobs, else behaviour_logprobs
    pg_t     = -min(r_t * A_t, clip(r_t, 1 - clip_eps_low, 1 + clip_eps_high) * A_t)
    kl_t     = exp(ref_t - logprobs_t) - 1 - (ref_t - logprobs_t)          (k3, KL(pi_theta || pi_ref))
    loss_sum = sum_t  m_t * pg_t + kl_coef * kl_t                          over action tokens

``m_t`` is 1, or with ``config.dis_mask`` the DIS band of SAO (arXiv 2607.07508) on
pi_theta / pi_behav: ``1 - mask_eps_low < r_behav < 1 + mask_eps_high`` (the paper's "GRPO + DIS"
baseline). With no ``old_logprobs`` the PPO ratio is itself pi_theta / pi_behav ("bypass" mode).

Deviations and choices:

* The log-ratio is clamped to ±20 nats before ``exp`` (``config.log_ratio_clamp``); clamped tokens get
  no gradient through the ratio.
* The DIS band masks the policy-gradient term only; the KL penalty still applies to every
  action token, since it regularises towards the reference whatever the sampling mismatch.
* The loss is summed over tokens; the learner divides by the step's action-token count (DAPO's
  token-level aggregation rather than GRPO's per-sequence mean).

Run the tests: ``python -m pytest -q tests/unit/losses/test_grpo_loss.py``.
"""

from __future__ import annotations

import torch

from posttrain.config import GRPOLossConfig
from posttrain.losses.kl import k3_kl
from posttrain.losses.masked import masked_fill_zero, masked_sum
from posttrain.losses.sao import band_metrics, check_finite, dis_band, mismatch_metrics
from posttrain.losses.types import LossOutput, PolicyLossInputs


def grpo_loss(inputs: PolicyLossInputs, config: GRPOLossConfig) -> LossOutput:
    """GRPO/PPO clipped surrogate summed over action tokens (see the module doc for the equation).

    Args:
        inputs: ``logprobs`` [B, T] float32 with gradient; ``behaviour_logprobs`` [B, T] float32;
            ``advantages`` [B, T] float32 (group-relative, detached here); ``action_mask`` [B, T]
            bool; ``old_logprobs`` [B, T] float32 or None (PPO anchor; None: behaviour);
            ``ref_logprobs`` [B, T] float32, required when ``config.kl_coef > 0``.
        config: Clip range, KL weight and the optional DIS band.

    Returns:
        ``LossOutput`` with ``num_tokens`` = action tokens and metrics ``clip/frac_low`` (A < 0 and
        r < 1 - clip_eps_low: clipped, no gradient), ``clip/frac_high`` (A > 0 and
        r > 1 + clip_eps_high), ``clip/frac``, ``ppo_ratio/mean``, ``ppo_ratio/max``,
        ``kl/ref_k3`` (mean per action token; 0.0 without ``ref_logprobs``), the mismatch metrics of
        ``sao.mismatch_metrics`` (against ``behaviour_logprobs``) and, with ``dis_mask``,
        ``mask/frac_low``, ``mask/frac_high``, ``mask/frac_total``.

    Raises:
        ValueError: ``config.kl_coef > 0`` without ``ref_logprobs``; NaN at an action token.
    """
    if config.kl_coef > 0 and inputs.ref_logprobs is None:
        raise ValueError(f"ref_logprobs: required when kl_coef > 0 (kl_coef={config.kl_coef})")
    check_finite(inputs)
    mask = inputs.action_mask
    logprobs = masked_fill_zero(inputs.logprobs, mask)
    anchor = inputs.old_logprobs if inputs.old_logprobs is not None else inputs.behaviour_logprobs
    anchor = masked_fill_zero(anchor.detach(), mask)
    advantages = masked_fill_zero(inputs.advantages.detach().float(), mask)

    log_ratio = torch.clamp(logprobs - anchor, -config.log_ratio_clamp, config.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    policy_term = -torch.minimum(ratio * advantages, clipped_ratio * advantages)

    policy_mask = mask
    metrics: dict[str, float] = {}
    if config.dis_mask:
        band = dis_band(
            logprobs,
            inputs.behaviour_logprobs,
            mask,
            config.mask_eps_low,
            config.mask_eps_high,
            config.log_ratio_clamp,
        )
        policy_mask = band.keep
        metrics.update(band_metrics(band, mask))
    loss_sum = masked_sum(policy_term, policy_mask)

    kl_mean = 0.0
    num_tokens = int(mask.sum())
    if inputs.ref_logprobs is not None:
        kl = k3_kl(logprobs, masked_fill_zero(inputs.ref_logprobs.detach(), mask), clamp=config.log_ratio_clamp)
        if config.kl_coef > 0:
            loss_sum = loss_sum + config.kl_coef * masked_sum(kl, mask)
        kl_mean = float(masked_sum(kl.detach().double(), mask)) / max(num_tokens, 1)

    with torch.no_grad():
        count = max(num_tokens, 1)
        low = int((mask & (advantages < 0) & (ratio < 1.0 - config.clip_eps_low)).sum()) / count
        high = int((mask & (advantages > 0) & (ratio > 1.0 + config.clip_eps_high)).sum()) / count
        selected = ratio.detach()[mask]
        metrics.update(
            {
                "clip/frac_low": low,
                "clip/frac_high": high,
                "clip/frac": low + high,
                "ppo_ratio/mean": float(selected.double().mean()) if num_tokens else 0.0,
                "ppo_ratio/max": float(selected.max()) if num_tokens else 0.0,
                "kl/ref_k3": kl_mean,
            }
        )
        metrics.update(mismatch_metrics(logprobs, inputs.behaviour_logprobs, mask, config.log_ratio_clamp))
    return LossOutput(loss_sum=loss_sum, num_tokens=num_tokens, metrics=metrics)
