"""When the asynchronous learner checkpoints, and the rule that acknowledgement comes after the checkpoint.

The entries a checkpoint covers are those of the batches it trained and those dropped while the
batches were assembled (their ledger lines written before); both are acknowledged after it.

A checkpoint (``posttrain.learner.checkpoint``) is written every ``checkpoint_every`` policy
versions, at the last version, and when the loop stops with trained entries not yet covered.
After it is durable (and mirrored to ``checkpoints_uri`` when the run keeps checkpoints on S3,
where a restarted pod looks), the stream entries it covers are acknowledged. A learner killed
between the two acknowledges them when it resumes instead of training on them again; entries
consumed after the checkpoint stay pending and are delivered again. So no rollout is lost and
none is trained twice.

Rank 0 also records the generators' positions (``posttrain.rollout.positions``) in each checkpoint,
read just before it is written, so a learner resumed on a Redis that lost its data can give the
generators their positions back and no (task, seed) pair the checkpoint trained on is sampled again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from posttrain.advantages import RunningMeanBaseline
from posttrain.learner.checkpoint import LearnerState, save_checkpoint
from posttrain.learner.remote_checkpoint import mirror_checkpoint
from posttrain.learner.types import Trainable
from posttrain.parallel.world import World
from posttrain.rollout.queue import RolloutQueue
from posttrain.runtime import RunContext

log = logging.getLogger("posttrain.learner")


class Checkpointer:
    """Saves the learner's state on its cadence, then acknowledges what the checkpoint covers.

    Args:
        ctx: The run (checkpoint directory, resolved config).
        state: The learner's counters and stream position (shared with the loop).
        counters: Cumulative counters saved into ``state`` (shared with the loop).
        parts: ``policy`` (and ``critic``): model, optimizer, scheduler (``learner.checkpoint``).
        baseline: The running-mean baseline whose window is saved, or None.
        queue: The stream consumer that acknowledges covered entries (rank 0's; None on other ranks).
        every: Policy versions between checkpoints (>= 1).
        last_version: The run's final policy version (always checkpointed).
        mirror_uri: ``s3://`` prefix the checkpoint is copied to before acknowledging, or None.
        world: The learner's ranks: every rank writes its shards; rank 0 mirrors and acknowledges.
        positions: Returns the generators' positions (``posttrain.rollout.positions.read_positions``),
            called by rank 0 before each checkpoint; None: not recorded (in-memory transports).
        acked: Called by rank 0 with the entries it acknowledged (``AdmissionController.settle``:
            the refund records of dropped entries are closed), or None.
    """

    def __init__(self, ctx: RunContext, *, state: LearnerState, counters: dict[str, float],
                 parts: dict[str, Trainable], baseline: RunningMeanBaseline | None, queue: RolloutQueue | None,
                 every: int, last_version: int, mirror_uri: str | None, world: World,
                 positions: Callable[[], dict[str, int]] | None = None,
                 acked: Callable[..., object] | None = None) -> None:
        self.ctx, self.state, self.counters, self.parts = ctx, state, counters, parts
        self.positions = positions
        self.acked = acked
        self.baseline, self.queue, self.world = baseline, queue, world
        self.every, self.last_version, self.mirror_uri = every, last_version, mirror_uri
        self.account: Callable[[], dict[str, Any]] | None = None
        """Returns the learner's time account to save (``StateClock.record``), or None: none kept."""

    def maybe_save(self, policy_updated: bool) -> Path | None:
        """Checkpoint after a policy update that lands on the cadence or on the last version; else nothing."""
        version = self.state.policy_version
        if policy_updated and (version % self.every == 0 or version >= self.last_version):
            return self.save()
        return None

    def flush(self) -> Path | None:
        """Checkpoint if trained entries are not covered yet (the loop is stopping)."""
        return self.save() if self.state.consumed_entry_ids else None

    def save(self) -> Path:
        """Write the checkpoint, mirror it when configured, then acknowledge the entries it covers.

        Raises:
            OSError: the checkpoint could not be written (nothing is acknowledged).
            posttrain.storage.StorageError: the mirror failed (nothing is acknowledged).
        """
        if self.baseline is not None:
            self.state.baseline_rewards = self.baseline.rewards()
        self.state.counters = dict(self.counters)
        if self.account is not None:
            self.state.account = self.account()
        if self.world.is_main and self.positions is not None:
            self._record_positions()
        saved = save_checkpoint(self.ctx.checkpoints_dir, state=self.state, parts=self.parts,
                                resolved_config_yaml=self.ctx.resolved_config_yaml(), world=self.world)
        if self.world.is_main:
            if self.mirror_uri:
                mirror_checkpoint(saved, self.mirror_uri)
            if self.queue is not None:
                self.queue.ack(self.state.consumed_entry_ids)
                if self.acked is not None:
                    self.acked(acked=list(self.state.consumed_entry_ids))
        self.state.consumed_entry_ids = []
        return saved

    def _record_positions(self) -> None:
        """Read the generators' positions into the state; with Redis unreachable keep the last ones read.

        The checkpoint is worth more than fresh positions: it is still written, with the positions
        of the previous checkpoint (or of the resume), and a warning says so. A later checkpoint
        records them again. (With Redis gone the acknowledgement after the checkpoint fails anyway.)
        """
        assert self.positions is not None
        try:
            positions = self.positions()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("generator positions not read for this checkpoint (Redis unreachable: %s); it keeps the "
                        "positions of the previous one", exc)
            return
        for name, value in self.state.generator_positions.items():  # never record less than the resume restored
            positions[name] = max(positions.get(name, 0), value)
        self.state.generator_positions = positions
