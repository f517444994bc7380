"""Pure tensor maths of every technique: policy losses (SAO, GRPO), value, SFT, DPO and GKD losses.

Each loss returns a ``LossOutput`` whose ``loss_sum`` is summed over eligible tokens (pairs for
DPO); the learner divides by the global count of the optimizer step. No I/O, logging or
torch.distributed happens here. ``POLICY_LOSSES`` maps a technique name to its policy loss,
``DISTILL_LOSSES`` a GKD divergence (``gkd.loss.divergence``) to its loss.

Example::

    from posttrain.config import SAOLossConfig
    from posttrain.losses import POLICY_LOSSES, PolicyLossInputs
    out = POLICY_LOSSES["sao"](PolicyLossInputs(logprobs, behaviour_logprobs, advantages, action_mask),
                               SAOLossConfig())
    (out.loss_sum / total_action_tokens).backward()

Run the tests: ``python -m pytest -q tests/unit/losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.losses.dpo import dpo_loss
from posttrain.losses.gkd import (
    DISTILL_LOSSES,
    DistillLossInputs,
    generalized_jsd_loss,
    sampled_reverse_kl_loss,
)
from posttrain.losses.grpo import grpo_loss
from posttrain.losses.kl import k1_kl, k2_kl, k3_kl
from posttrain.losses.logprobs import entropy_from_logits, predicting_logits, token_logprobs
from posttrain.losses.masked import masked_fill_zero, masked_mean, masked_sum, masked_var, masked_whiten
from posttrain.losses.sao import sao_loss
from posttrain.losses.sft import sft_loss
from posttrain.losses.types import LossOutput, PolicyLossInputs
from posttrain.losses.value import value_loss

POLICY_LOSSES: dict[str, Callable[[PolicyLossInputs, Any], LossOutput]] = {
    "sao": sao_loss,
    "grpo": grpo_loss,
}
"""Technique name -> policy loss; the config passed must be that technique's loss config
(``SAOLossConfig`` for ``sao``, ``GRPOLossConfig`` for ``grpo``)."""

__all__ = [
    "DISTILL_LOSSES",
    "POLICY_LOSSES",
    "DistillLossInputs",
    "LossOutput",
    "PolicyLossInputs",
    "dpo_loss",
    "entropy_from_logits",
    "generalized_jsd_loss",
    "grpo_loss",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "masked_fill_zero",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "predicting_logits",
    "sampled_reverse_kl_loss",
    "sao_loss",
    "sft_loss",
    "token_logprobs",
    "value_loss",
]
