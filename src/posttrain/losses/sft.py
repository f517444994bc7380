"""Supervised fine-tuning loss: negative log-likelihood summed over the trained tokens.

``loss_sum = -sum_t logprobs_t`` over ``loss_mask``; the learner divides by the step's token count
(token-mean cross-entropy). Also used for continued pre-training with every token in the mask.

Run the tests: ``python -m pytest -q tests/unit/losses/test_sft_loss.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.losses.masked import masked_sum
from posttrain.losses.types import LossOutput


def sft_loss(logprobs: Tensor, loss_mask: Tensor) -> LossOutput:
    """Negative log-likelihood summed over the masked tokens.

    Args:
        logprobs: [B, T] float32. ``token_logprobs`` of the example, with gradient.
        loss_mask: [B, T] bool. Tokens trained on (the assistant's tokens; all tokens for CPT).

    Returns:
        ``LossOutput`` with ``num_tokens`` = masked tokens and metric ``sft/nll`` (mean
        negative log-likelihood per token, nats; 0.0 with no token).

    Raises:
        ValueError: ``logprobs`` is not 2-D, shapes differ, or ``loss_mask`` is not bool.
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs: expected [B, T], got shape {tuple(logprobs.shape)}")
    if loss_mask.shape != logprobs.shape:
        raise ValueError(f"loss_mask: expected shape {tuple(logprobs.shape)}, got {tuple(loss_mask.shape)}")
    if loss_mask.dtype != torch.bool:
        raise ValueError(f"loss_mask: expected dtype torch.bool, got {loss_mask.dtype}")
    loss_sum = -masked_sum(logprobs.float(), loss_mask)
    num_tokens = int(loss_mask.sum())
    nll = float(loss_sum.detach()) / num_tokens if num_tokens else 0.0
    return LossOutput(loss_sum=loss_sum, num_tokens=num_tokens, metrics={"sft/nll": nll})
