"""AdamW with a linear warm-up and a constant or cosine schedule; one builder for every technique.

``clip_and_step`` clips the global gradient norm and steps, or skips the step when the norm is
not finite. The RL learners count skipped steps and stop after ``max_nonfinite_iterations``
iterations in a row with one (``NonFiniteStreak``); SFT, CPT and DPO stop at the first
(``raise_if_nonfinite``).
"""

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

    A non-finite norm (a NaN or inf gradient anywhere) skips the step: the gradients are zeroed,
    and neither the optimizer (weights, moments, step count) nor the schedule moves. The caller
    sees it in the returned norm (``math.isfinite``). Under FSDP2 the norm is computed over every
    rank's shards (a replicated ``DTensor``), so all ranks clip, step or skip alike.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    norm = replicated_float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if math.isfinite(norm):
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


class NonFiniteGradientError(FloatingPointError):
    """Training stopped on non-finite gradient norms (the message is one line and names the setting)."""


def raise_if_nonfinite(norm: float) -> float:
    """Return ``norm``; stop (for techniques without a skip budget: SFT, CPT, DPO) when it is not finite.

    Raises:
        NonFiniteGradientError: ``norm`` is NaN or infinite (``clip_and_step`` skipped the step).
    """
    if not math.isfinite(norm):
        raise NonFiniteGradientError(f"gradient norm is {norm}; the optimizer step was skipped and training stops")
    return norm


class NonFiniteStreak:
    """Learner iterations in a row that skipped an optimizer step for a non-finite gradient norm.

    Every rank sees the same norms (they are global), so every rank counts, and stops, alike.

    Args:
        limit: Iterations in a row that stop the run (``>= 1``).
        setting: The config field holding ``limit``, named in the error.

    Attributes:
        in_a_row: Consecutive iterations, up to the last one observed, that skipped a step.
    """

    def __init__(self, limit: int, setting: str) -> None:
        if limit < 1:
            raise ValueError(f"limit: must be >= 1, got {limit}")
        self.limit, self.setting, self.in_a_row = limit, setting, 0

    def observe(self, skipped_steps: int) -> None:
        """Record one iteration that skipped ``skipped_steps`` optimizer steps (0 ends a streak).

        Raises:
            NonFiniteGradientError: ``limit`` iterations in a row skipped a step.
        """
        self.in_a_row = self.in_a_row + 1 if skipped_steps > 0 else 0
        if self.in_a_row >= self.limit:
            raise NonFiniteGradientError(
                f"{self.setting}: {self.in_a_row} learner iterations in a row had a non-finite gradient norm "
                f"(each skipped its optimizer step); stopping. Lower the learning rate or check the rewards and "
                f"advantages, or raise {self.setting} to tolerate more"
            )
