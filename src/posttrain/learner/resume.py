"""Loading the policy to train: from the newest checkpoint when there is one, else from the start model.

Every learner starts the same way (SFT, CPT, DPO, synchronous GRPO in ``posttrain.runners``; the
asynchronous learner in ``learner.setup``): find the newest complete checkpoint (``LATEST`` in
``<run>/checkpoints``; optionally fetched from an ``s3://`` mirror when the local disk is empty),
load the policy from the start model, place it (device, precision, FSDP2 with several ranks:
``posttrain.parallel``), build AdamW and its schedule, and restore policy, optimizer, scheduler
and critic states from the checkpoint with the counters and the stream position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from posttrain.config.common import OptimConfig
from posttrain.config.sections import LearnerConfig
from posttrain.learner.checkpoint import LearnerState, latest_checkpoint, load_checkpoint
from posttrain.learner.optim import build_optimizer
from posttrain.learner.remote_checkpoint import fetch_checkpoint
from posttrain.learner.types import Trainable
from posttrain.models.hf import load_policy
from posttrain.parallel.placement import prepare_model
from posttrain.parallel.world import World

log = logging.getLogger("posttrain.learner")


@dataclass
class ResumedPolicy:
    """The policy ready to train, and where it came from.

    Attributes:
        policy: The model (placed and, with several ranks, sharded) with its AdamW and LR schedule,
            states restored on resume.
        parts: What checkpoints hold: ``policy``, and ``critic`` with a critic.
        state: Iteration, policy version, counters, stream position (fresh without a checkpoint).
        checkpoint: The checkpoint resumed from, or None.
    """

    policy: Trainable
    parts: dict[str, Trainable]
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
    world: World | None = None,
    learner: LearnerConfig | None = None,
) -> ResumedPolicy:
    """Load the policy from ``start_model_dir``, place it, and restore the newest checkpoint's state.

    The architecture and the first weights always come from ``start_model_dir``; a checkpoint then
    overwrites weights, optimizer, scheduler (and the critic's) from its sharded files, whatever
    the number of ranks that wrote it (``learner.checkpoint``).

    Args:
        checkpoints_dir: ``<run>/checkpoints``.
        start_model_dir: The policy the run started from (the SFT warm start, the base model).
        optim: The policy's optimizer section.
        optimizer_steps: Optimizer steps the LR schedule spans.
        critic: A critic, already placed by ``prepare_model`` with its optimizer, whose states are
            restored too; or None.
        mirror_uri: ``s3://`` prefix holding mirrored checkpoints, fetched when the disk has none.
        world: The learner's ranks (one process when None).
        learner: The ``learner`` section (device, precision, activation checkpointing); defaults
            when None.

    Raises:
        FileNotFoundError: no model at ``start_model_dir``.
        posttrain.learner.checkpoint.CheckpointError: the checkpoint does not fit this model.
        posttrain.storage.StorageError: fetching the mirrored checkpoint failed.
    """
    world = world or World()
    ckpt = latest_checkpoint(checkpoints_dir)
    if ckpt is None and mirror_uri:
        ckpt = fetch_checkpoint(mirror_uri, checkpoints_dir) if world.is_main else None
        world.barrier()
        ckpt = latest_checkpoint(checkpoints_dir)
    model: nn.Module = prepare_model(load_policy(start_model_dir), world, learner or LearnerConfig())
    optimizer, scheduler = build_optimizer(model, optim, optimizer_steps)
    policy = Trainable(model, optimizer, scheduler)
    parts = {"policy": policy} | ({"critic": critic} if critic is not None else {})
    state = LearnerState()
    if ckpt is not None:
        state = load_checkpoint(ckpt, parts=parts, world=world)
        log.info("resumed from %s at policy version %d (iteration %d)", ckpt.name, state.policy_version,
                 state.iteration)
    return ResumedPolicy(policy, parts, state, ckpt)
