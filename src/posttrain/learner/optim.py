"""AdamW with a linear warm-up and a constant or cosine schedule; one builder for every technique."""

from __future__ import annotations

import math

import torch
from torch import nn

from posttrain.config import OptimConfig
from posttrain.parallel.placement import replicated_float


def build_optimizer(
    model: nn.Module, config: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters plus its LR schedule.

    Args:
        model: Module whose ``requires_grad`` parameters are optimised.
        config: Learning rate, betas, weight decay, warm-up and schedule.
        total_steps: Planned optimizer steps (for the cosine schedule).

    Returns:
        ``(optimizer, scheduler)``; call ``scheduler.step()`` after each ``optimizer.step()``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    warmup = config.warmup_steps
    horizon = max(total_steps, 1)

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if config.schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, horizon - warmup))
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    max_norm: float,
) -> float:
    """Clip the global gradient norm, step, zero the gradients; return the pre-clip norm.

    Under FSDP2 the norm is computed over every rank's shards (a replicated ``DTensor``), so all
    ranks clip, step or skip alike.

    Raises:
        FloatingPointError: if the gradient norm is not finite (the step is skipped, gradients zeroed).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    norm = replicated_float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"gradient norm is {norm}; optimizer step skipped")
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm
