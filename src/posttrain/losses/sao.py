"""SAO policy loss: Direct Double-Sided Importance Sampling (DIS), arXiv 2607.07508 §3.1, eqs. 1-3.

Also, for ablations, truncated IS and no correction in its place (``sao.loss.correction``, below).

Per action token t, with the behaviour log-probability returned by the generator while sampling::

    r_t  = exp(clamp(log pi_theta(a_t|s_t) - log pi_behav(a_t|s_t), -c, c))
    f(r) = r  if 1 - mask_eps_low < r < 1 + mask_eps_high   (open interval)
         = 0  otherwise                                      (whatever the sign of A_t)
    loss_sum = - sum_t  sg(f(r_t)) * A_t * log pi_theta(a_t|s_t)     over action tokens

so the gradient w.r.t. ``logprobs`` is ``-f(r_t) * A_t``: the plain off-policy importance-sampled
policy gradient inside the band, and exactly zero outside it (a hard mask, not a clamp).

Per-token staleness (``sao.staleness_rule: token``): an action token whose sampling policy
version ``v_t`` lags the learner's ``v`` by more than tau (``v - v_t > max_staleness``) is masked
in the same way, ``f = 0`` whatever its ratio, and counted apart (``mask/frac_stale``)::

    f_t = 0   if stale_t,   else f(r_t) as above

Correction modes (``sao.loss.correction``, for the paper's ablation of DIS against no correction and
against truncated IS; issue 22 (a)). ``f`` above is ``dis``, the default and the paper's method::

    dis:   f(r) = r inside the open band, 0 outside   (hard mask)
    tis:   f(r) = min(r, tis_cap)                     (truncated importance sampling, Ionides 2008;
                                                       Yao et al. 2025, "Your efficient RL framework
                                                       secretly brings you off-policy RL training",
                                                       fengyao.notion.site/off-policy-rl; no band mask)
    none:  f(r) = 1                                   (plain policy gradient: behaviour samples are
                                                       treated as on-policy)

In every mode a stale token gets ``f = 0`` (that is the tau bound, not the correction), and the band
metrics (``mask/frac_low``, ``mask/frac_high``) are still computed, as diagnostics, on the same open
band even where ``tis`` or ``none`` do not apply it; ``mask/frac_applied`` is the fraction of action
tokens that actually get no gradient in the chosen mode (``mask/frac_total`` under ``dis``,
``mask/frac_stale`` otherwise).

The paper bounds staleness per trajectory by its oldest weight version (GLM-5's rule,
research/sao_algorithm.md §0 "Staleness" and §6 item 9, ``w' - w_0 > tau``: drop). DIS already
corrects each token by its own behaviour probability, so the bound only has to hold for the tokens
that get gradient: masking the stale tokens of a trajectory keeps its fresh turns (the long,
tool-heavy episodes a trajectory-level drop loses) while no token older than tau trains.

Deviations from the paper as printed:

* ``f`` is detached (stop-gradient); the paper does not print ``sg`` but every public
  implementation detaches it (research notes §0, §1.6).
* The log-ratio is clamped to ``±log_ratio_clamp`` before ``exp`` so numbers stay finite; such
  tokens are far outside any band and are masked anyway.
* The loss is a sum; the learner divides by the optimizer step's action-token count (token-mean
  aggregation; the paper does not say which aggregation it uses), or by its action tokens not
  masked for staleness under ``sao.loss.denominator: fresh_tokens``.
* NaN at an action token (in ``logprobs``, ``behaviour_logprobs``, ``advantages`` or their
  log-ratio) raises instead of being silently masked.

Run the tests: ``python -m pytest -q tests/unit/losses/test_sao_loss.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.config import SAOLossConfig
from posttrain.losses.kl import k3_kl
from posttrain.losses.masked import masked_fill_zero, masked_sum
from posttrain.losses.types import LossOutput, PolicyLossInputs


@dataclass(frozen=True)
class DISBand:
    """Which action tokens the DIS band keeps.

    Attributes:
        ratio: [B, T] float32, detached. ``exp(clamp(logprobs - behaviour_logprobs))``.
        keep: [B, T] bool. Action token with ``1 - mask_eps_low < ratio < 1 + mask_eps_high``.
        below: [B, T] bool. Action token with ``ratio <= 1 - mask_eps_low``.
        above: [B, T] bool. Action token with ``ratio >= 1 + mask_eps_high``.
        stale: [B, T] bool. Action token masked for per-token staleness (``stale_mask``); such a
            token is in none of ``keep``, ``below`` and ``above``.
    """

    ratio: Tensor
    keep: Tensor
    below: Tensor
    above: Tensor
    stale: Tensor


def check_finite(inputs: PolicyLossInputs) -> None:
    """Raise if a policy-loss input, or a log-ratio built from them, is NaN at an action token.

    ``+inf``/``-inf`` log-probabilities are allowed (the clamp and the band handle them), but
    ``-inf - (-inf)`` is NaN and would otherwise be dropped without a trace.

    Args:
        inputs: The loss inputs; ``logprobs``, ``behaviour_logprobs``, ``advantages`` and, when
            given, ``old_logprobs`` and ``ref_logprobs`` are read.

    Raises:
        ValueError: naming the field(s) and the first ``(row, position)`` holding NaN.
    """
    current = inputs.logprobs.detach()
    checks: list[tuple[str, Tensor]] = [
        ("logprobs", current),
        ("behaviour_logprobs", inputs.behaviour_logprobs.detach()),
        ("advantages", inputs.advantages.detach()),
        ("logprobs - behaviour_logprobs", current - inputs.behaviour_logprobs.detach()),
    ]
    for name in ("old_logprobs", "ref_logprobs"):
        other = getattr(inputs, name)
        if other is not None:
            checks += [(name, other.detach()), (f"logprobs - {name}", current - other.detach())]
    for name, values in checks:
        bad = torch.isnan(values) & inputs.action_mask
        if bool(bad.any()):
            row, pos = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"{name}: NaN at action token (row {row}, position {pos})")


def dis_band(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    action_mask: Tensor,
    mask_eps_low: float,
    mask_eps_high: float,
    log_ratio_clamp: float,
    stale_mask: Tensor | None = None,
) -> DISBand:
    """Evaluate the DIS band on r = pi_theta / pi_behav (arXiv 2607.07508 eq. 2), stale tokens apart.

    The comparison is strict on both edges and made on the float32 ratio: a token whose ratio is
    exactly ``1 - mask_eps_low`` or ``1 + mask_eps_high`` is dropped. A stale action token
    (``stale_mask``, module docstring) is dropped whatever its ratio and counted only in ``stale``.

    Args:
        logprobs: [B, T] float32. Current-policy log-probabilities (only read, never differentiated).
        behaviour_logprobs: [B, T] float32. Generator log-probabilities at sampling time.
        action_mask: [B, T] bool. Tokens sampled by the policy.
        mask_eps_low: Lower half-width in (0, 1]; keep only ``r > 1 - mask_eps_low``.
        mask_eps_high: Upper half-width (> 0); keep only ``r < 1 + mask_eps_high``.
        log_ratio_clamp: Bound on ``|log r|`` (nats) before ``exp``.
        stale_mask: [B, T] bool or None. Tokens sampled more than tau policy versions before the
            learner's version (``learner.sao_step.stale_tokens``); None: none is stale.

    Returns:
        A ``DISBand`` with the detached ratio and the keep / below / above / stale masks.

    Raises:
        ValueError: a half-width or the clamp is out of range.
    """
    if not 0 < mask_eps_low <= 1:
        raise ValueError(f"mask_eps_low: must lie in (0, 1], got {mask_eps_low}")
    if not mask_eps_high > 0:
        raise ValueError(f"mask_eps_high: must be > 0, got {mask_eps_high}")
    if not log_ratio_clamp > 0:
        raise ValueError(f"log_ratio_clamp: must be > 0, got {log_ratio_clamp}")
    with torch.no_grad():
        log_ratio = torch.clamp(
            logprobs.detach() - behaviour_logprobs.detach(), -log_ratio_clamp, log_ratio_clamp
        )
        ratio = torch.exp(log_ratio)
        stale = action_mask & stale_mask if stale_mask is not None else torch.zeros_like(action_mask)
        fresh = action_mask & ~stale
        below = fresh & (ratio <= 1.0 - mask_eps_low)
        above = fresh & (ratio >= 1.0 + mask_eps_high)
        keep = fresh & (ratio > 1.0 - mask_eps_low) & (ratio < 1.0 + mask_eps_high)
    return DISBand(ratio=ratio, keep=keep, below=below, above=above, stale=stale)


def mismatch_metrics(
    logprobs: Tensor, behaviour_logprobs: Tensor, action_mask: Tensor, log_ratio_clamp: float
) -> dict[str, float]:
    """Train/behaviour mismatch metrics over action tokens (research notes §7.3).

    Args:
        logprobs: [B, T] float32. Current-policy log-probabilities.
        behaviour_logprobs: [B, T] float32. Generator log-probabilities.
        action_mask: [B, T] bool. Tokens sampled by the policy.
        log_ratio_clamp: Bound on ``|log r|`` (nats) before ``exp``.

    Returns:
        ``ratio/mean``, ``ratio/max``, ``ratio/min`` of r = pi_theta / pi_behav (clamped);
        ``ratio/ess``: effective-sample-size fraction ``(sum r)^2 / (n * sum r^2)`` in (0, 1];
        ``mismatch/logprob_abs_diff``: mean ``|logprobs - behaviour_logprobs|`` (nats, each term capped
        at ``log_ratio_clamp`` so an ``-inf`` behaviour logprob stays finite);
        ``mismatch/k3_kl``: k3 estimate of KL(pi_behav || pi_theta) (nats per token).
        All 0.0 when there is no action token.
    """
    with torch.no_grad():
        count = int(action_mask.sum())
        if count == 0:
            keys = ("ratio/mean", "ratio/max", "ratio/min", "ratio/ess")
            return {k: 0.0 for k in (*keys, "mismatch/logprob_abs_diff", "mismatch/k3_kl")}
        current = logprobs.detach()[action_mask].double()
        behaviour = behaviour_logprobs.detach()[action_mask].double()
        log_ratio = torch.clamp(current - behaviour, -log_ratio_clamp, log_ratio_clamp)
        ratio = torch.exp(log_ratio)
        return {
            "ratio/mean": float(ratio.mean()),
            "ratio/max": float(ratio.max()),
            "ratio/min": float(ratio.min()),
            "ratio/ess": float(ratio.sum() ** 2 / (count * (ratio * ratio).sum())),
            "mismatch/logprob_abs_diff": float(log_ratio.abs().mean()),
            "mismatch/k3_kl": float(k3_kl(behaviour, current, clamp=log_ratio_clamp).mean()),
        }


def band_metrics(band: DISBand, action_mask: Tensor) -> dict[str, float]:
    """Fractions of action tokens the DIS band and the staleness bound drop.

    Args:
        band: Output of ``dis_band``.
        action_mask: [B, T] bool. Tokens sampled by the policy.

    Returns:
        ``mask/frac_low`` (fresh token, ratio at or below the low edge), ``mask/frac_high`` (fresh,
        at or above the high edge), ``mask/frac_stale`` (stale token, whatever its ratio) and
        ``mask/frac_total`` (their sum: the tokens without policy gradient), as fractions of
        action tokens; 0.0 when there is no action token.
    """
    count = max(int(action_mask.sum()), 1)
    low = int(band.below.sum()) / count
    high = int(band.above.sum()) / count
    stale = int(band.stale.sum()) / count
    return {"mask/frac_low": low, "mask/frac_high": high, "mask/frac_stale": stale,
            "mask/frac_total": low + high + stale}


CORRECTIONS = ("dis", "tis", "none")
"""The values of ``sao.loss.correction`` (module docstring)."""


def applied_band(band: DISBand, correction: str) -> DISBand:
    """The tokens a correction mode actually trains, as a ``DISBand`` (for the learner's token stats).

    Under ``dis`` this is ``band`` itself. Under ``tis`` and ``none`` no band applies: every fresh
    action token is kept and ``below`` / ``above`` are empty; ``stale`` and ``ratio`` are unchanged.

    Args:
        band: Output of ``dis_band`` (band evaluated whatever the mode).
        correction: ``"dis"``, ``"tis"`` or ``"none"``.

    Returns:
        A ``DISBand`` whose ``keep`` [B, T] bool marks the tokens with policy gradient.

    Raises:
        ValueError: an unknown correction.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction: allowed values are {CORRECTIONS}, got {correction!r}")
    if correction == "dis":
        return band
    none = torch.zeros_like(band.keep)
    return DISBand(ratio=band.ratio, keep=band.keep | band.below | band.above, below=none, above=none,
                   stale=band.stale)


def correction_weight(band: DISBand, correction: str, tis_cap: float) -> tuple[Tensor, Tensor]:
    """Per-token weight f(r) of a correction mode, and the tokens it trains (module docstring).

    Args:
        band: Output of ``dis_band``.
        correction: ``"dis"`` (f = r in the band), ``"tis"`` (f = min(r, tis_cap)) or ``"none"`` (f = 1).
        tis_cap: Truncation C (> 1) of the ``tis`` weight; read only under ``tis``.

    Returns:
        ``(weight, trains)``: [B, T] float32 detached weight, 0 where ``trains`` is False; [B, T]
        bool, the action tokens with policy gradient (never a stale one).

    Raises:
        ValueError: an unknown correction, or ``tis_cap <= 1`` under ``tis``.
    """
    trains = applied_band(band, correction).keep
    if correction == "dis":
        weight = band.ratio
    elif correction == "tis":
        if not tis_cap > 1.0:
            raise ValueError(f"tis_cap: must be > 1, got {tis_cap}")
        weight = torch.clamp(band.ratio, max=tis_cap)
    else:
        weight = torch.ones_like(band.ratio)
    return masked_fill_zero(weight, trains), trains


def sao_loss(inputs: PolicyLossInputs, config: SAOLossConfig) -> LossOutput:
    """SAO's DIS policy loss, summed over action tokens (arXiv 2607.07508 eqs. 1-3; see module doc).

    ``loss_sum = -sum_t sg(f(r_t)) * A_t * logprobs_t`` over action tokens. Under
    ``config.correction == "dis"`` (default) ``f(r) = r`` inside the open band
    ``(1 - mask_eps_low, 1 + mask_eps_high)`` and 0 outside; under ``"tis"`` ``f(r) = min(r, tis_cap)``
    with no band; under ``"none"`` ``f = 1``. In every mode ``f = 0`` on a stale token
    (``inputs.stale_mask``; module docstring), and the band metrics are computed as diagnostics
    even where the band is not applied.
    ``ref_logprobs`` and ``old_logprobs`` are not used (SAO has no KL term and no pi_old).

    Args:
        inputs: ``logprobs`` [B, T] float32 with gradient; ``behaviour_logprobs`` [B, T] float32;
            ``advantages`` [B, T] float32 (detached here); ``action_mask`` [B, T] bool;
            ``stale_mask`` [B, T] bool or None (per-token staleness).
        config: DIS band (``mask_eps_low``, ``mask_eps_high``), ``log_ratio_clamp``, ``correction``
            and ``tis_cap``.

    Returns:
        ``LossOutput`` with ``num_tokens`` = action tokens (kept or masked, stale ones too: the
        divisor does not change with the mask) and metrics ``mask/frac_low``, ``mask/frac_high``,
        ``mask/frac_stale``, ``mask/frac_total`` (band diagnostics, whatever the mode),
        ``mask/frac_applied`` (action tokens without gradient in this mode), ``ratio/mean``, ``ratio/max``,
        ``ratio/min``, ``ratio/ess``, ``mismatch/logprob_abs_diff``, ``mismatch/k3_kl``,
        ``advantage/mean`` (python floats, 0.0 with no action token).

    Raises:
        ValueError: NaN at an action token in ``logprobs``, ``behaviour_logprobs``,
            ``advantages`` or their log-ratio; a band parameter, ``correction`` or ``tis_cap`` out
            of range.
    """
    check_finite(inputs)
    band = dis_band(
        inputs.logprobs,
        inputs.behaviour_logprobs,
        inputs.action_mask,
        config.mask_eps_low,
        config.mask_eps_high,
        config.log_ratio_clamp,
        inputs.stale_mask,
    )
    weight, trains = correction_weight(band, config.correction, config.tis_cap)
    advantages = masked_fill_zero(inputs.advantages.detach().float(), trains)
    per_token = -(weight * advantages * masked_fill_zero(inputs.logprobs, trains))
    loss_sum = masked_sum(per_token, trains)
    num_tokens = int(inputs.action_mask.sum())
    with torch.no_grad():
        metrics = band_metrics(band, inputs.action_mask)
        metrics["mask/frac_applied"] = (num_tokens - int(trains.sum())) / max(num_tokens, 1)
        metrics.update(
            mismatch_metrics(
                inputs.logprobs, inputs.behaviour_logprobs, inputs.action_mask, config.log_ratio_clamp
            )
        )
        metrics["advantage/mean"] = float(
            masked_sum(inputs.advantages.detach().double(), inputs.action_mask)
        ) / max(num_tokens, 1)
    return LossOutput(loss_sum=loss_sum, num_tokens=num_tokens, metrics=metrics)
