"""Config models shared by several sections: the strict base, the optimizer, the loss configs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class OptimConfig(_Strict):
    """AdamW with gradient clipping and a constant or cosine schedule."""

    lr: float = Field(1e-4, gt=0.0, le=1.0)
    """Peak learning rate."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    grad_clip: float = Field(1.0, gt=0.0, le=1000.0)
    """Max global gradient norm."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up (optimizer steps)."""
    schedule: Literal["constant", "cosine"] = "constant"
    """LR schedule after warm-up."""


class SAOLossConfig(_Strict):
    """SAO policy loss (arXiv 2607.07508): DIS band (1 - mask_eps_low, 1 + mask_eps_high) and the correction mode."""

    mask_eps_low: float = Field(0.3, gt=0.0, le=1.0)
    """Lower half-width: tokens with ratio <= 1 - mask_eps_low get weight 0. Paper: 0.3 (math), 0.8 (SWE)."""
    mask_eps_high: float = Field(5.0, gt=0.0, le=100.0)
    """Upper half-width: tokens with ratio >= 1 + mask_eps_high get weight 0. Paper: 5.0 (math), 3.0 (SWE)."""
    log_ratio_clamp: float = Field(20.0, gt=0.0, le=80.0)
    """|log r| is clamped to this before exp, for finite numbers; the mask still applies."""
    correction: Literal["dis", "tis", "none"] = "dis"
    """Per-token off-policy correction f(r) (ablation of arXiv 2607.07508): ``dis`` f = r inside the band,
    0 outside (the paper); ``tis`` truncated IS f = min(r, tis_cap), no band; ``none`` f = 1 (plain
    policy gradient). Stale tokens get no gradient in every mode; band metrics are always reported."""
    tis_cap: float = Field(2.0, gt=1.0, le=100.0)
    """Upper truncation C of the ``tis`` weight min(r, C) (slime's default ``--tis-clip 2.0``); unused otherwise."""


class GRPOLossConfig(_Strict):
    """GRPO/PPO clipped surrogate (DeepSeekMath, arXiv 2402.03300) with asymmetric clipping (DAPO)."""

    clip_eps_low: float = Field(0.2, gt=0.0, le=1.0)
    """Ratio clamp below: 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, gt=0.0, le=10.0)
    """Ratio clamp above: 1 + clip_eps_high (DAPO clip-higher: 0.28)."""
    log_ratio_clamp: float = Field(20.0, gt=0.0, le=80.0)
    """|log r| is clamped to this before exp, for finite numbers."""
    kl_coef: float = Field(0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL estimator to the reference policy; 0 disables it."""
    dis_mask: bool = False
    """Async GRPO ("GRPO + DIS"): also zero tokens whose behaviour ratio leaves the DIS band."""
    mask_eps_low: float = Field(0.3, gt=0.0, le=1.0)
    """DIS lower half-width, used when ``dis_mask``."""
    mask_eps_high: float = Field(5.0, gt=0.0, le=100.0)
    """DIS upper half-width, used when ``dis_mask``."""


class DPOLossConfig(_Strict):
    """Sigmoid DPO (Rafailov et al., arXiv 2305.18290)."""

    beta: float = Field(0.1, gt=0.0, le=100.0)
    """Inverse temperature of the implicit reward."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """Conservative DPO label smoothing; 0 is plain DPO."""
