"""Pure tensor maths of every technique: policy losses (SAO, GRPO), value, SFT and DPO losses.

Each loss returns a ``LossOutput`` whose ``loss_sum`` is summed over eligible tokens (pairs for
DPO); the learner divides by the global count of the optimizer step. No I/O, logging or
torch.distributed happens here. ``POLICY_LOSSES`` maps a technique name to its policy loss.

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
from posttrain.losses.grpo import grpo_loss
from posttrain.losses.kl import k1_kl, k2_kl, k3_kl
from posttrain.losses.logprobs import entropy_from_logits, token_logprobs
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
    "POLICY_LOSSES",
    "LossOutput",
    "PolicyLossInputs",
    "dpo_loss",
    "entropy_from_logits",
    "grpo_loss",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "masked_fill_zero",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "sao_loss",
    "sft_loss",
    "token_logprobs",
    "value_loss",
]
