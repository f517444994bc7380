"""Group assembly for asynchronous GRPO: complete groups out of stream entries that arrive one by one.

A group (rollouts sharing a ``group_id``) is released only when all ``group_size`` members have
arrived, and it is dropped whole when any member is stale (``max_staleness``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

from posttrain.rollout.admission import is_stale
from posttrain.rollout.queue import QueueEntry

log = logging.getLogger("posttrain.learner.groups")


class GroupAssembler:
    """Buffers stream entries by ``group_id`` and releases only complete groups (asynchronous GRPO).

    A group is complete when ``group_size`` distinct entries of it have arrived. A group is
    dropped whole, never trained partially: when a member is stale on arrival, when a pending
    member becomes stale (``evict_stale``), or when its members lack a ``group_id``. Ids of
    dropped groups are remembered (the newest ``remember`` of them) so late members are dropped too.

    Args:
        group_size: G, rollouts per group (>= 2).
        remember: How many dropped group ids to remember.

    Raises:
        ValueError: ``group_size < 2`` or ``remember < 1``.
    """

    def __init__(self, group_size: int, remember: int = 100_000) -> None:
        if group_size < 2:
            raise ValueError(f"group_size: must be >= 2, got {group_size}")
        if remember < 1:
            raise ValueError(f"remember: must be >= 1, got {remember}")
        self.group_size = group_size
        self._remember = remember
        self._pending: OrderedDict[str, dict[str, QueueEntry]] = OrderedDict()
        self._complete: OrderedDict[str, list[QueueEntry]] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()

    @property
    def complete_groups(self) -> int:
        """Complete groups waiting to be taken."""
        return len(self._complete)

    @property
    def pending_rollouts(self) -> int:
        """Rollouts of incomplete groups held."""
        return sum(len(g) for g in self._pending.values())

    def _forget(self, group_id: str) -> list[QueueEntry]:
        out = list(self._pending.pop(group_id, {}).values()) + self._complete.pop(group_id, [])
        self._dropped[group_id] = None
        while len(self._dropped) > self._remember:
            self._dropped.popitem(last=False)
        return out

    def offer(self, entry: QueueEntry, learner_version: int, max_staleness: int) -> list[QueueEntry]:
        """Add one entry; return the entries to drop now (acknowledge and count them as dropped).

        Returns:
            ``[]`` normally; ``[entry]`` for an entry without ``group_id``, of an already dropped
            group, or beyond ``group_size`` members; the entry and its held siblings when it is
            stale (``learner_version - policy_version > max_staleness``). A re-delivered entry (same
            ``entry_id``) is held once.
        """
        gid = entry.rollout.group_id
        if gid is None:
            log.warning("rollout %s has no group_id; asynchronous GRPO drops it", entry.rollout.rollout_id)
            return [entry]
        if gid in self._dropped:
            return [entry]
        if is_stale(entry.rollout.policy_version, learner_version, max_staleness):
            return [entry, *self._forget(gid)]
        if gid in self._complete:
            known = any(e.entry_id == entry.entry_id for e in self._complete[gid])
            return [] if known else [entry]
        group = self._pending.setdefault(gid, {})
        group[entry.entry_id] = entry
        if len(group) >= self.group_size:
            self._complete[gid] = list(self._pending.pop(gid).values())
        return []

    def drop_reason(self, entry: QueueEntry) -> str:
        """Why ``offer`` or ``evict_stale`` just dropped ``entry``, for the learner's ledger.

        Returns:
            ``no group id``; ``stale group`` (the entry or a member of its group lagged the learner
            by more than ``max_staleness``, now or before); or ``surplus member`` (its group was
            already complete).
        """
        gid = entry.rollout.group_id
        if gid is None:
            return "no group id"
        return "stale group" if gid in self._dropped else "surplus member"

    def evict_stale(self, learner_version: int, max_staleness: int) -> list[QueueEntry]:
        """Drop every held group (pending or complete) with a member that has become stale; return its entries."""
        doomed = [
            gid
            for gid, entries in [*((g, list(e.values())) for g, e in self._pending.items()), *self._complete.items()]
            if any(is_stale(e.rollout.policy_version, learner_version, max_staleness) for e in entries)
        ]
        out: list[QueueEntry] = []
        for gid in doomed:
            out.extend(self._forget(gid))
        return out

    def take(self, num_groups: int) -> list[list[QueueEntry]] | None:
        """The ``num_groups`` oldest complete groups, or None while fewer are complete.

        Raises:
            ValueError: ``num_groups < 1``.
        """
        if num_groups < 1:
            raise ValueError(f"num_groups: must be >= 1, got {num_groups}")
        if len(self._complete) < num_groups:
            return None
        return [self._complete.popitem(last=False)[1] for _ in range(num_groups)]


def collect_groups(
    assembler: GroupAssembler,
    incoming: Sequence[QueueEntry],
    *,
    learner_version: int,
    max_staleness: int,
    num_groups: int,
) -> tuple[list[QueueEntry] | None, list[QueueEntry]]:
    """One pass of the asynchronous learner's read loop: offer entries, evict stale groups, take a batch.

    Args:
        assembler: The learner's group buffer.
        incoming: Entries just read from the stream (or reclaimed).
        learner_version: The learner's policy version.
        max_staleness: tau (policy versions).
        num_groups: Groups per batch (``grpo.prompts_per_step``).

    Returns:
        ``(batch, dropped)``: the batch's entries, group after group (None while fewer than
        ``num_groups`` groups are complete), and the entries to acknowledge as dropped.
    """
    dropped: list[QueueEntry] = []
    for entry in incoming:
        dropped.extend(assembler.offer(entry, learner_version, max_staleness))
    dropped.extend(assembler.evict_stale(learner_version, max_staleness))
    groups = assembler.take(num_groups)
    return ([e for g in groups for e in g] if groups is not None else None), dropped
