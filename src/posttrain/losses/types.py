"""Input and output records shared by every loss in ``posttrain.losses``.

A policy loss takes one ``PolicyLossInputs`` (all tensors ``[B, T]``, position ``t`` describes
``token_ids[:, t]``) and returns one ``LossOutput``: the loss *summed* over eligible tokens, the
number of those tokens, and python-float metrics. The learner divides the summed loss by the
global token count of the optimizer step, so micro-batching does not change the gradient.

Run ``python -c "from posttrain.losses.types import PolicyLossInputs; help(PolicyLossInputs)"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

_LOGPROB_FIELDS = ("logprobs", "behaviour_logprobs", "ref_logprobs", "old_logprobs")


@dataclass
class PolicyLossInputs:
    """Per-token inputs of a policy-gradient loss (SAO, GRPO).

    Attributes:
        logprobs: [B, T] float32. log pi_theta(token_ids[:, t] | tokens < t) from the learner,
            with gradient (``losses.logprobs.token_logprobs``).
        behaviour_logprobs: [B, T] float32. Log-probability (nats) of each sampled token under the
            generator's policy, returned while sampling; 0.0 on observation tokens. No gradient.
        advantages: [B, T] float32. Advantage of each token; only action tokens are read.
        action_mask: [B, T] bool. True where the token was sampled by the policy.
        ref_logprobs: [B, T] float32 or None. Frozen reference-policy log-probabilities (KL term).
        old_logprobs: [B, T] float32 or None. Learner-side log-probabilities of the policy at the
            start of the step (PPO's pi_old); None means "use ``behaviour_logprobs``".
        stale_mask: [B, T] bool or None. Action tokens sampled more than tau policy versions
            before the learner's version; they get no policy gradient (per-token staleness,
            ``losses.sao``). None: no token is stale.

    Raises:
        ValueError: a tensor is not 2-D, shapes differ, ``action_mask`` is not bool, a
            log-probability tensor is not float32, or ``advantages`` is not floating point.
            The message names the field.
    """

    logprobs: Tensor
    behaviour_logprobs: Tensor
    advantages: Tensor
    action_mask: Tensor
    ref_logprobs: Tensor | None = None
    old_logprobs: Tensor | None = None
    stale_mask: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.logprobs, Tensor) or self.logprobs.dim() != 2:
            raise ValueError(f"logprobs: expected a [B, T] tensor, got {_describe(self.logprobs)}")
        shape = self.logprobs.shape
        for name in ("behaviour_logprobs", "advantages", "action_mask", "ref_logprobs", "old_logprobs", "stale_mask"):
            value = getattr(self, name)
            if value is None and name in ("ref_logprobs", "old_logprobs", "stale_mask"):
                continue
            if not isinstance(value, Tensor) or value.shape != shape:
                raise ValueError(
                    f"{name}: expected shape {tuple(shape)} like logprobs, got {_describe(value)}"
                )
        for name in ("action_mask", "stale_mask"):
            mask = getattr(self, name)
            if mask is not None and mask.dtype != torch.bool:
                raise ValueError(f"{name}: expected dtype torch.bool, got {mask.dtype}")
        for name in _LOGPROB_FIELDS:
            value = getattr(self, name)
            if value is not None and value.dtype != torch.float32:
                raise ValueError(
                    f"{name}: expected dtype torch.float32 (log-probs are float32 even for bf16 models), "
                    f"got {value.dtype}"
                )
        if not self.advantages.is_floating_point():
            raise ValueError(f"advantages: expected a floating-point dtype, got {self.advantages.dtype}")


@dataclass
class LossOutput:
    """What every loss returns.

    Attributes:
        loss_sum: scalar float32 tensor. The loss summed over eligible tokens (or pairs for DPO),
            with gradient. Divide by the global count of the optimizer step before ``backward``.
        num_tokens: Eligible tokens (pairs for DPO) this call summed over; the learner adds these up
            across micro-batches and ranks to get the divisor.
        metrics: Python floats computed without gradient, keyed ``group/name``. Means over zero
            tokens are 0.0, never NaN.
    """

    loss_sum: Tensor
    num_tokens: int
    metrics: dict[str, float] = field(default_factory=dict)


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return type(value).__name__
