"""Types the learner's parts share: a model with its optimizer, one train step's result, a run's summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass
class Trainable:
    """A model with its optimizer and LR scheduler."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR


@dataclass
class TrainStepResult:
    """Outcome of one learner iteration.

    Attributes:
        policy_updated: Whether the policy took an optimizer step (False during the SAO critic
            warm-up, when GRPO dropped every group as uniform, or when every policy step was
            skipped for a non-finite gradient norm); a policy update makes one policy version.
        metrics: Flat float metrics (``loss/policy``, ``mask/frac_low``, ``value/explained_variance``...).
        rows_trained: Rollouts of the batch whose tokens entered the policy update (0 without an
            update; GRPO: the rows of kept groups). Admission refunds follow ``policy_updated``,
            not this count: a batch that made a version gives no place back.
        action_tokens_trained: Action tokens counted as trained (tokens): the whole batch's for SAO
            (critic warm-up batches and skipped policy steps included), the kept groups' for GRPO.
        skipped_nonfinite: Optimizer steps (critic and policy) skipped for a non-finite gradient
            norm (``optim.clip_and_step``); the same on every rank.
        row_tokens: Per rollout of the batch, in batch order, its token accounting
            (``learner.token_metrics.ROW_TOKEN_KEYS``: action tokens that got policy gradient, that
            the staleness bound and the DIS band masked, the oldest and newest version among the
            trained ones; SAO adds per-turn lists, ``token_metrics.TURN_KEYS``); None when the step
            does not report it (GRPO).
    """

    policy_updated: bool
    metrics: dict[str, float] = field(default_factory=dict)
    rows_trained: int = 0
    action_tokens_trained: float = 0.0
    skipped_nonfinite: int = 0
    row_tokens: list[dict[str, Any]] | None = None


@dataclass
class LearnerSummary:
    """Result of a learner run.

    Attributes:
        policy_version: Final policy version.
        iterations: Learner iterations done in total.
        final_model_dir: The trained policy (HF directory).
        counters: ``rollouts_trained``, ``stale_dropped``, ``dead_letters``...
        generators: What became of the generators ``posttrain run`` started (``2``, or ``2 started,
            1 died: g0 (killed by SIGKILL)``); empty when the learner ran on its own.
        generator_stats: The final ``GeneratorStats.snapshot()`` of each generator (flat JSON numbers,
            with their time accounts: ``posttrain.inference.metering``); synchronous GRPO's engine's,
            or those the generators published to the run's Redis.
        counters_at_start: ``counters`` as this process found them (restored from the checkpoint it resumed;
            empty for a fresh run). The counters are cumulative over the run's lives; what this life did is
            the difference (``this_life``): a re-run of a finished run trained nothing, and its time account
            must not charge the earlier lives' tokens again.
        iterations_at_start: ``iterations`` as this process found them (0 for a fresh run).
    """

    policy_version: int
    iterations: int
    final_model_dir: Path
    counters: dict[str, float]
    generators: str = ""
    generator_stats: list[dict[str, float]] = field(default_factory=list)
    counters_at_start: dict[str, float] = field(default_factory=dict)
    iterations_at_start: int = 0

    def this_life(self, key: str) -> float:
        """Counter ``key`` counted by this process only: ``counters[key] - counters_at_start[key]`` (0 when absent)."""
        return float(self.counters.get(key, 0.0)) - float(self.counters_at_start.get(key, 0.0))

    @property
    def trained_this_life(self) -> bool:
        """Whether this process ran any learner iteration (False: it resumed at the final version)."""
        return self.iterations > self.iterations_at_start
