"""Loading the policy to train: from the newest checkpoint when there is one, else from the start model.

Every learner starts the same way (SFT, CPT, DPO, synchronous GRPO in ``posttrain.runners``; the
asynchronous learner in ``learner.setup``): find the newest complete checkpoint (``LATEST`` in
``<run>/checkpoints``; optionally fetched from an ``s3://`` mirror when the local disk is empty),
load the policy from it or from the start model, build AdamW and its schedule, and restore the
optimizer, scheduler and critic states with the counters and the stream position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from posttrain.config.common import OptimConfig
from posttrain.learner.checkpoint import LearnerState, latest_checkpoint, load_checkpoint_state
from posttrain.learner.optim import build_optimizer
from posttrain.learner.remote_checkpoint import fetch_checkpoint
from posttrain.learner.types import Trainable
from posttrain.models.hf import load_policy

log = logging.getLogger("posttrain.learner")


@dataclass
class ResumedPolicy:
    """The policy ready to train, and where it came from.

    Attributes:
        policy: The model with its AdamW and LR schedule (states restored on resume).
        optimizers: Name -> optimizer or scheduler, as checkpoints store them (``policy_opt``,
            ``policy_sched``, and ``critic_opt`` / ``critic_sched`` with a critic).
        state: Iteration, policy version, counters, stream position (fresh without a checkpoint).
        checkpoint: The checkpoint resumed from, or None.
    """

    policy: Trainable
    optimizers: dict[str, Any]
    state: LearnerState
    checkpoint: Path | None


def resume_policy(
    checkpoints_dir: Path,
    start_model_dir: Path,
    optim: OptimConfig,
    optimizer_steps: int,
    *,
    critic: Trainable | None = None,
    mirror_uri: str | None = None,
) -> ResumedPolicy:
    """Load the policy from the newest checkpoint or ``start_model_dir`` and restore its training state.

    Args:
        checkpoints_dir: ``<run>/checkpoints``.
        start_model_dir: The policy to start from when there is no checkpoint.
        optim: The policy's optimizer section.
        optimizer_steps: Optimizer steps the LR schedule spans.
        critic: A critic whose weights and optimizer states are restored too, or None.
        mirror_uri: ``s3://`` prefix holding mirrored checkpoints, fetched when the disk has none.

    Raises:
        FileNotFoundError: neither a checkpoint nor a model at ``start_model_dir``.
        posttrain.storage.StorageError: fetching the mirrored checkpoint failed.
    """
    ckpt = latest_checkpoint(checkpoints_dir)
    if ckpt is None and mirror_uri:
        ckpt = fetch_checkpoint(mirror_uri, checkpoints_dir)
    model: nn.Module = load_policy(ckpt / "policy" if ckpt else start_model_dir)
    optimizer, scheduler = build_optimizer(model, optim, optimizer_steps)
    optimizers: dict[str, Any] = {"policy_opt": optimizer, "policy_sched": scheduler}
    if critic is not None:
        optimizers.update(critic_opt=critic.optimizer, critic_sched=critic.scheduler)
    state = LearnerState()
    if ckpt is not None:
        state = load_checkpoint_state(ckpt, critic=critic.model if critic else None, optimizers=optimizers)
        log.info("resumed from %s at policy version %d (iteration %d)", ckpt.name, state.policy_version,
                 state.iteration)
    return ResumedPolicy(Trainable(model, optimizer, scheduler), optimizers, state, ckpt)
