"""The SAO critic: a causal-LM backbone with a scalar value head, zero-initialised by default (learner only)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from posttrain.models.hf import load_backbone

HEAD_INIT_SEED = 0
"""Seed of the value head's random initial weights (``head_weight_std > 0``): every rank draws the same head."""


class CriticModel(nn.Module):
    """Value model V(s_t): a causal-LM backbone with a scalar value head (SAO critic).

    ``forward(input_ids [B, T] int64, attention_mask [B, T] bool) -> values [B, T] float32``,
    where ``values[:, t]`` estimates the return from the state ending at token ``t``
    (the state in which the token at ``t + 1`` is chosen).

    Args:
        backbone: The causal LM without its LM head (``last_hidden_state`` ``[B, T, hidden_size]``).
        hidden_size: Width of the backbone's hidden state.
        head_weight_std: Standard deviation of the head's initial weights, drawn from a generator seeded
            with ``HEAD_INIT_SEED`` (0: a zero weight, V = 0 everywhere). A zero weight passes no
            gradient into the backbone until the head itself has grown, so the critic is slow to learn a
            feature its start policy does not already expose (issue 29: the ``left`` count).

    Raises:
        ValueError: ``head_weight_std < 0``.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int, head_weight_std: float = 0.0) -> None:
        super().__init__()
        if not head_weight_std >= 0.0:
            raise ValueError(f"head_weight_std: must be >= 0, got {head_weight_std}")
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.bias)
        if head_weight_std > 0.0:
            gen = torch.Generator().manual_seed(HEAD_INIT_SEED)
            with torch.no_grad():
                self.value_head.weight.copy_(torch.randn(self.value_head.weight.shape, generator=gen) * head_weight_std)
        else:
            nn.init.zeros_(self.value_head.weight)

    @classmethod
    def from_policy_path(cls, path: Path | str, head_weight_std: float = 0.0) -> CriticModel:
        """Initialise the critic from a policy checkpoint (SAO: critic init from the policy); head as in the class."""
        backbone = load_backbone(path)
        return cls(backbone, backbone.config.hidden_size, head_weight_std)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return values ``[B, T] float32``."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
        # A copy, not a view of the head's output: FSDP2 warns about views returned from a forward.
        return self.value_head(hidden.float()).squeeze(-1).clone()
