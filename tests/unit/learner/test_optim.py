"""``learner.optim``: the schedule builder and ``clip_and_step``'s handling of a non-finite gradient.

Run: ``python -m pytest -q tests/unit/learner/test_optim.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posttrain.config import OptimConfig
from posttrain.learner.optim import build_optimizer, clip_and_step


def test_a_non_finite_gradient_norm_skips_the_step_and_zeroes_the_gradients():
    """One NaN in the gradient: the norm is NaN, clip_and_step returns it without raising, the
    weights, the optimizer's state and the schedule stay where they were, and the gradients are
    cleared so the next step starts clean. A finite gradient then steps as usual."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=0.1, warmup_steps=2), total_steps=10)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 3)).sum().backward()
    model.weight.grad[0, 0] = float("nan")

    norm = clip_and_step(model, optimizer, scheduler, max_norm=1.0)

    assert math.isnan(norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.state_dict()["state"] == {} and scheduler.last_epoch == 0
    model(torch.ones(1, 3)).sum().backward()
    assert math.isfinite(clip_and_step(model, optimizer, scheduler, max_norm=1.0))
    assert scheduler.last_epoch == 1 and not torch.equal(before[0], model.weight)
