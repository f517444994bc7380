"""Config models shared by several sections: the strict base, the optimizer, the loss configs."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


class _Strict(BaseModel):
    """Base of every config section: unknown keys are errors, and a true/false is never a number.

    Pydantic's lax mode reads ``true`` as 1 for an ``int`` field (``sao.steps=true`` ran one policy
    version) and as 1.0 for a ``float`` one; ``_no_bool_for_number`` refuses it for every field whose
    type admits a number but not a boolean.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            kinds = _number_kinds(cls.model_fields[info.field_name].annotation)
            if kinds and bool not in kinds:
                wanted = "an integer" if int in kinds and float not in kinds else "a number"
                raise PydanticCustomError("bool_is_not_a_number", "expected {wanted}, not true/false",
                                          {"wanted": wanted})
        return value


def _number_kinds(annotation: Any) -> set[type]:
    """The types among ``bool``, ``int`` and ``float`` that ``annotation`` admits (also inside ``X | None``)."""
    if annotation in (bool, int, float):
        return {annotation}
    found: set[type] = set()
    for arg in get_args(annotation):
        found |= _number_kinds(arg)
    return found


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
    denominator: Literal["all_action_tokens", "fresh_tokens"] = "all_action_tokens"
    """What the summed policy loss is divided by (over the whole step: every micro-batch and rank).
    all_action_tokens: every action token of the batch, stale-masked ones too; fresh_tokens: only the
    action tokens not masked for staleness (``max_staleness``), so a batch with many stale tokens does
    not shrink the fresh tokens' gradient. DIS-band-masked tokens count in both."""


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


class GKDLossConfig(_Strict):
    """GKD's divergence between teacher and student next-token distributions (Agarwal et al., arXiv 2306.13649).

    ``generalized_jsd`` compares the whole distributions at every trained position (the paper's
    JSD(beta): forward KL at beta 0, reverse KL at beta 1); ``sampled_reverse_kl`` is the token-level
    "on-policy distillation" of tinker and slime: reverse KL estimated from the student's sampled
    token alone, used as a per-token policy-gradient signal. Equations: ``posttrain.losses.gkd``.
    """

    divergence: Literal["generalized_jsd", "sampled_reverse_kl"] = "generalized_jsd"
    """``generalized_jsd``: JSD(beta) over the full vocabulary at every trained position (needs the
    teacher's logits); ``sampled_reverse_kl``: log pi_S(x_t) - log pi_T(x_t) of the sampled token x_t
    as a policy-gradient cost (needs only the teacher's log-probability of that token; on-policy rows
    only, so ``gkd.lmbda`` must be 1)."""
    beta: float = Field(0.5, ge=0.0, le=1.0)
    """beta of JSD(beta) (``generalized_jsd`` only): 0 is forward KL(teacher || student) (mode covering),
    1 is reverse KL(student || teacher) (mode seeking); in between, the paper's generalised JSD against
    the mixture beta * teacher + (1 - beta) * student."""
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    """Softmax temperature of both distributions in the divergence (teacher and student logits are
    divided by it). ``sampled_reverse_kl`` needs it equal to ``generator.temperature``."""
    is_cap: float = Field(2.0, gt=1.0, le=100.0)
    """``sampled_reverse_kl`` only: truncation C of the importance weight min(pi_S / pi_behav, C) that
    corrects for rollouts sampled by an older student version (staleness)."""
    log_ratio_clamp: float = Field(20.0, gt=0.0, le=80.0)
    """|log pi_S - log pi_behav| is clamped to this (nats) before exp, for a finite importance weight."""
