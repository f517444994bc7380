"""``learner.setup``: how the asynchronous learner builds its parts (the critic's LR schedule).

Run: ``python -m pytest -q tests/unit/learner/test_setup.py``.
"""

from __future__ import annotations

import math

import pytest

from posttrain.config import RunConfig
from posttrain.learner.setup import _critic
from posttrain.parallel.world import World


def test_the_critic_cosine_schedule_spans_k_updates_per_iteration_up_to_the_last_iteration(tmp_path, tiny_model):
    """sao.steps 30 + critic.warmup_steps 2 = 32 iterations, K = 2 critic updates each: 64 critic
    optimizer steps. A cosine schedule over 64 steps uses lr * 0.5 * (1 + cos(pi * s / 64)) at step s:
    lr at iteration 16 (steps 32, 33) is about half, at the last iteration (steps 62, 63) small but
    above 0, and the last step uses 0.5 * (1 + cos(pi * 63 / 64)) = 6.0e-4 of lr. Sized in iterations
    (32 steps), the schedule reached 0 at iteration 16 and stayed there."""
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path), "run_name": "critic", "technique": "sao",
        "sao": {"steps": 30, "optim": {"lr": 1e-3, "schedule": "cosine"},
                "critic": {"lr": 1e-2, "warmup_steps": 2, "updates_per_step": 2}}})
    critic = _critic(config, tiny_model.path, World())
    assert critic is not None
    used: list[list[float]] = []  # per iteration, the lr of each of its K critic steps
    for _ in range(32):
        lrs = []
        for _ in range(2):
            lrs.append(critic.scheduler.get_last_lr()[0])
            critic.optimizer.step()  # no gradients: moves nothing, keeps the scheduler's order of calls
            critic.scheduler.step()
        used.append(lrs)
    assert used[16][0] == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 32 / 64)))
    assert min(lr for lrs in used for lr in lrs) > 0
    assert used[-1][-1] == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * 63 / 64)))
