"""DPO loss (Rafailov et al., arXiv 2305.18290, eq. 7) with conservative label smoothing.

For each preference pair i, with sequence log-probabilities summed over response tokens::

    h_i      = beta * [(chosen_i - ref_chosen_i) - (rejected_i - ref_rejected_i)]
    loss_i   = -(1 - eps) * log sigmoid(h_i) - eps * log sigmoid(-h_i)       (eps = label_smoothing)
    loss_sum = sum_i loss_i,   num_tokens = B (pairs)

The implicit rewards are ``beta * (chosen_i - ref_chosen_i)`` and ``beta * (rejected_i - ref_rejected_i)``.
The reference log-probabilities are detached. Label smoothing follows cDPO (Mitchell, 2023).

Run the tests: ``python -m pytest -q tests/unit/losses/test_dpo_loss.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.config import DPOLossConfig
from posttrain.losses.types import LossOutput


def dpo_loss(
    chosen_logprobs: Tensor,
    rejected_logprobs: Tensor,
    ref_chosen_logprobs: Tensor,
    ref_rejected_logprobs: Tensor,
    config: DPOLossConfig,
) -> LossOutput:
    """Sigmoid DPO loss summed over pairs (see module doc).

    Args:
        chosen_logprobs: [B] float32. Policy log-probability of each chosen response (sum over its
            response tokens, nats), with gradient.
        rejected_logprobs: [B] float32. Same for the rejected response.
        ref_chosen_logprobs: [B] float32. Reference-model log-probability of the chosen response.
        ref_rejected_logprobs: [B] float32. Reference-model log-probability of the rejected response.
        config: ``beta`` and ``label_smoothing``.

    Returns:
        ``LossOutput`` with ``num_tokens`` = B pairs and metrics ``dpo/accuracy`` (fraction of pairs
        whose reward margin is > 0), ``dpo/margin``, ``dpo/chosen_reward``, ``dpo/rejected_reward``
        (means over pairs, nats times beta); all 0.0 for B = 0.

    Raises:
        ValueError: an input is not 1-D or the four shapes differ.
    """
    named = {
        "chosen_logprobs": chosen_logprobs,
        "rejected_logprobs": rejected_logprobs,
        "ref_chosen_logprobs": ref_chosen_logprobs,
        "ref_rejected_logprobs": ref_rejected_logprobs,
    }
    for name, tensor in named.items():
        if tensor.dim() != 1 or tensor.shape != chosen_logprobs.shape:
            raise ValueError(
                f"{name}: expected a [B] tensor with B={chosen_logprobs.shape[0] if chosen_logprobs.dim() else '?'}"
                f" like chosen_logprobs, got shape {tuple(tensor.shape)}"
            )
    chosen_reward = config.beta * (chosen_logprobs.float() - ref_chosen_logprobs.detach().float())
    rejected_reward = config.beta * (rejected_logprobs.float() - ref_rejected_logprobs.detach().float())
    margin = chosen_reward - rejected_reward
    smoothing = config.label_smoothing
    per_pair = -(1.0 - smoothing) * F.logsigmoid(margin) - smoothing * F.logsigmoid(-margin)
    loss_sum = per_pair.sum()
    num_pairs = int(chosen_logprobs.shape[0])
    with torch.no_grad():
        if num_pairs:
            metrics = {
                "dpo/accuracy": float((margin > 0).double().mean()),
                "dpo/margin": float(margin.double().mean()),
                "dpo/chosen_reward": float(chosen_reward.double().mean()),
                "dpo/rejected_reward": float(rejected_reward.double().mean()),
            }
        else:
            metrics = {
                "dpo/accuracy": 0.0,
                "dpo/margin": 0.0,
                "dpo/chosen_reward": 0.0,
                "dpo/rejected_reward": 0.0,
            }
    return LossOutput(loss_sum=loss_sum, num_tokens=num_pairs, metrics=metrics)
