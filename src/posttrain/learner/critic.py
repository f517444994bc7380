"""The SAO critic: a causal-LM backbone with a zero-initialised scalar value head (learner only)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from posttrain.models.hf import load_backbone


class CriticModel(nn.Module):
    """Value model V(s_t): a causal-LM backbone with a zero-initialised scalar head (SAO critic).

    ``forward(input_ids [B, T] int64, attention_mask [B, T] bool) -> values [B, T] float32``,
    where ``values[:, t]`` estimates the return from the state ending at token ``t``
    (the state in which the token at ``t + 1`` is chosen).
    """

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_policy_path(cls, path: Path | str) -> CriticModel:
        """Initialise the critic from a policy checkpoint (SAO: critic init from the policy)."""
        backbone = load_backbone(path)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Return values ``[B, T] float32``."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask.long()).last_hidden_state
        # A copy, not a view of the head's output: FSDP2 warns about views returned from a forward.
        return self.value_head(hidden.float()).squeeze(-1).clone()
