"""Where the learner's batches come from: stream entries in, a batch or nothing out, drops handled inside.

Two sources share one contract, ``next_batch(learner_version) -> list[QueueEntry] | None``:

* ``SingleRolloutSource`` (SAO): buffers rollouts as they arrive until ``batch_rollouts`` fresh
  ones are held; a rollout that cannot train is dropped, on arrival and again while it waits in
  the buffer (a read can bring more than a batch, e.g. the entries a dead learner left pending).
  Which rollout cannot train follows ``sao.staleness_rule`` (``trainable``): under ``token``, one
  whose *newest* turn lags the learner by more than ``max_staleness`` (no action token of it could
  get gradient; the stale tokens of the others are masked in the loss); under ``episode``, one
  whose *oldest* turn does.
* ``GroupSource`` (asynchronous GRPO): releases only complete groups (``posttrain.learner.groups``),
  ``groups_per_batch`` of them at a time; a group with any stale member is dropped whole.

Both read the queue the same way (reclaim entries idle on a dead consumer first, then block for
new ones up to ``block_s`` seconds) and send every drop through one ``DropRecorder``, which gives
its admission place back at once (once per entry, even if a restart delivers it again), keeps it
for the next ledger line and counts it there. Nothing is dropped any other way. A dropped entry is
acknowledged like a trained one: by the checkpoint that covers its ledger line (the learner adds
it to the checkpoint's entries), so its ledger line is always written before its ack; a learner
killed in between delivers it again and judges it again (issue 32: dropped entries used to be
acked at once, their line written at the next iteration, and a SIGKILL between lost them from
the ledger and from ``stale_dropped``). A rollout whose ``outcome`` is ``infra_error`` (a producer
that sent one) is dropped on arrival, never trained (reason ``infra_error: <cause>``).
``None`` means "no batch yet": the caller asks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from posttrain.config.roles import AsyncRLSettings
from posttrain.learner.groups import GroupAssembler, collect_groups
from posttrain.parallel.world import World
from posttrain.records import Rollout, decode_rollout, encode_rollout
from posttrain.rollout.admission import AdmissionController, StalenessStats, is_stale
from posttrain.rollout.queue import QueueEntry, RolloutQueue

INFRA_REASON = "infra_error"
"""Start of the ledger ``reason`` of a rollout whose ``outcome`` is ``infra_error`` (then ``: <cause>``)."""


class DropRecorder:
    """The one way a learner drops stream entries: refunded at once, counted and kept for the next ledger line.

    The entries are not acknowledged here: the learner acknowledges them with the checkpoint that
    covers their ledger line (module docstring).

    Args:
        admission: Admission control (each dropped rollout gives its place back, once per entry).
        staleness: Staleness statistics (drops are counted there too).
        dropped_before: Drops counted by earlier incarnations of this learner (from its checkpoint).
        infra_before: Rollouts with ``outcome="infra_error"`` dropped by earlier incarnations.

    Attributes:
        total: Entries dropped for staleness or group assembly over the run and written to the
            ledger, ``dropped_before`` included (infrastructure failures excepted).
        infra: Entries dropped because their ``outcome`` was ``infra_error``, ``infra_before`` included.
    """

    def __init__(self, admission: AdmissionController, staleness: StalenessStats, dropped_before: float = 0.0,
                 infra_before: float = 0.0) -> None:
        self._admission = admission
        self._staleness = staleness
        self._for_ledger: list[tuple[QueueEntry, str]] = []
        self.total = float(dropped_before)
        self.infra = float(infra_before)

    def drop(self, entries: Sequence[QueueEntry], reasons: Sequence[str]) -> None:
        """Drop ``entries`` for the given reasons (one each; e.g. ``stale``, ``stale group``).

        Raises:
            ValueError: ``reasons`` and ``entries`` differ in length.
        """
        if len(reasons) != len(entries):
            raise ValueError(f"reasons: expected {len(entries)} like entries, got {len(reasons)}")
        if not entries:
            return
        self._staleness.record_dropped(sum(1 for r in reasons if not r.startswith(INFRA_REASON)))
        self._for_ledger.extend(zip(entries, reasons, strict=True))
        self._admission.refund(len(entries), [e.entry_id for e in entries])

    @property
    def seen(self) -> float:
        """Entries dropped for staleness or group assembly so far: ``total`` plus those not yet in a ledger line."""
        return self.total + sum(1 for _, r in self._for_ledger if not r.startswith(INFRA_REASON))

    def take_for_ledger(self) -> list[tuple[QueueEntry, str]]:
        """The drops since the last call, as ``(entry, reason)``, for the next ledger line; counted now."""
        out, self._for_ledger = self._for_ledger, []
        infra = sum(1 for _, r in out if r.startswith(INFRA_REASON))
        self.infra += infra
        self.total += len(out) - infra
        return out


class DropLog(Protocol):
    """What the loop reads of the drops: their running totals and the ones for the next ledger line."""

    total: float
    infra: float

    @property
    def seen(self) -> float:
        """``total`` plus the drops not yet in a ledger line (what the progress bound counts)."""
        ...

    def take_for_ledger(self) -> list[tuple[QueueEntry, str]]:
        """The drops since the last call, as ``(entry, reason)``."""
        ...


def infra_failed(entries: Sequence[QueueEntry]) -> tuple[list[QueueEntry], list[QueueEntry]]:
    """``(completed, infra)``: entries split by their rollout's ``outcome`` (``infra_error`` never trains)."""
    completed = [e for e in entries if e.rollout.outcome != "infra_error"]
    return completed, [e for e in entries if e.rollout.outcome == "infra_error"]


def infra_reasons(entries: Sequence[QueueEntry]) -> list[str]:
    """The ledger reason of each infra-failed entry: ``infra_error: <cause>``."""
    return [f"{INFRA_REASON}: {e.rollout.infra_cause}" for e in entries]


class BatchSource(Protocol):
    """Assembles the learner's next batch from the stream (module docstring)."""

    drops: DropLog

    def next_batch(self, learner_version: int) -> list[QueueEntry] | None:
        """The next batch's entries, or None while not enough have arrived."""
        ...


def _read(queue: RolloutQueue, n: int, claim_idle_ms: int, block_s: float) -> list[QueueEntry]:
    """Entries idle on other consumers for ``claim_idle_ms`` first, then up to ``n`` in all, blocking ``block_s``."""
    arrived = queue.claim_stale(claim_idle_ms)
    if len(arrived) < n:
        arrived += queue.get_batch(n - len(arrived), timeout_s=block_s)
    return arrived


DROP_REASONS = {"token": "no fresh token", "episode": "stale"}
"""The ledger's ``reason`` of a rollout SAO drops for its age, by ``sao.staleness_rule``."""


def trainable(rollout: Rollout, learner_version: int, max_staleness: int, rule: str) -> bool:
    """Whether ``rollout`` can still give policy gradient at ``learner_version`` under ``rule``.

    ``token``: its newest turn's version (``max(turn_policy_versions)``, else ``policy_version``) is
    within ``max_staleness`` of the learner's, so at least one action token is fresh. ``episode``:
    its oldest version (``policy_version``) is.

    Raises:
        ValueError: ``rule`` is neither ``token`` nor ``episode``.
    """
    if rule == "token":
        newest = max(rollout.turn_policy_versions) if rollout.turn_policy_versions else rollout.policy_version
        return not is_stale(newest, learner_version, max_staleness)
    if rule == "episode":
        return not is_stale(rollout.policy_version, learner_version, max_staleness)
    raise ValueError(f"staleness_rule: expected 'token' or 'episode', got {rule!r}")


class SingleRolloutSource:
    """SAO's batches: ``batch_rollouts`` rollouts of any prompts, each trainable when its batch is released.

    Args:
        queue: Stream consumer.
        drops: Where rollouts that cannot train go.
        batch_rollouts: Rollouts per batch (>= 1).
        max_staleness: tau (policy versions).
        claim_idle_ms: Reclaim entries pending this long on another consumer (milliseconds).
        block_s: Longest wait for new entries per call (seconds).
        staleness_rule: ``token`` or ``episode`` (``trainable``).

    Raises:
        ValueError: an unknown ``staleness_rule``.
    """

    def __init__(
        self, queue: RolloutQueue, drops: DropRecorder, *, batch_rollouts: int, max_staleness: int,
        claim_idle_ms: int, block_s: float, staleness_rule: str = "token",
    ) -> None:
        if staleness_rule not in DROP_REASONS:
            raise ValueError(f"staleness_rule: expected 'token' or 'episode', got {staleness_rule!r}")
        self._queue = queue
        self.drops = drops
        self._batch = batch_rollouts
        self._tau = max_staleness
        self._rule = staleness_rule
        self._claim_idle_ms = claim_idle_ms
        self._block_s = block_s
        self._buffer: list[QueueEntry] = []

    def next_batch(self, learner_version: int) -> list[QueueEntry] | None:
        """Read what is needed to fill the buffer; return a full batch of trainable rollouts, or None.

        Staleness (``trainable``) is checked on arrival and again for every buffered rollout when a batch is
        released: a read can bring more than a batch (``claim_stale`` returns every idle entry,
        thousands after a learner restart), and a rollout that waits in the buffer while the
        learner publishes versions must not be trained more than ``max_staleness`` behind.
        """
        need = self._batch - len(self._buffer)
        if need > 0:
            arrived, infra = infra_failed(_read(self._queue, need, self._claim_idle_ms, self._block_s))
            self.drops.drop(infra, infra_reasons(infra))
            self._buffer.extend(arrived)
        fresh: list[QueueEntry] = []
        stale: list[QueueEntry] = []
        for entry in self._buffer:
            (fresh if trainable(entry.rollout, learner_version, self._tau, self._rule) else stale).append(entry)
        self.drops.drop(stale, [DROP_REASONS[self._rule]] * len(stale))
        self._buffer = fresh
        if len(self._buffer) < self._batch:
            return None
        out, self._buffer = self._buffer[: self._batch], self._buffer[self._batch :]
        return out


class GroupSource:
    """Asynchronous GRPO's batches: ``groups_per_batch`` complete groups, group after group.

    Args:
        queue: Stream consumer.
        drops: Where stale groups, surplus members and members without a group id go.
        group_size: G, rollouts per group (>= 2).
        groups_per_batch: Groups per batch (``grpo.prompts_per_step``).
        max_staleness: tau (policy versions).
        claim_idle_ms: Reclaim entries pending this long on another consumer (milliseconds).
        block_s: Longest wait for new entries per call (seconds).
    """

    def __init__(
        self, queue: RolloutQueue, drops: DropRecorder, *, group_size: int, groups_per_batch: int,
        max_staleness: int, claim_idle_ms: int, block_s: float,
    ) -> None:
        self._queue = queue
        self.drops = drops
        self._assembler = GroupAssembler(group_size)
        self._groups = groups_per_batch
        self._read_size = group_size * groups_per_batch
        self._tau = max_staleness
        self._claim_idle_ms = claim_idle_ms
        self._block_s = block_s

    def next_batch(self, learner_version: int) -> list[QueueEntry] | None:
        """Offer new entries to the group buffer; return complete groups' entries, or None."""
        arrived = self._queue.claim_stale(self._claim_idle_ms)
        arrived += self._queue.get_batch(self._read_size, timeout_s=self._block_s)
        arrived, infra = infra_failed(arrived)
        self.drops.drop(infra, infra_reasons(infra))
        ready, dropped = collect_groups(self._assembler, arrived, learner_version=learner_version,
                                        max_staleness=self._tau, num_groups=self._groups)
        self.drops.drop(dropped, [self._assembler.drop_reason(e) for e in dropped])
        return ready


class FixedOnlySource:
    """GKD at ``gkd.lmbda: 0`` (supervised KD): no on-policy rollout is ever read; every batch is the step's fixed rows.

    ``next_batch`` returns an empty batch at once (never None, so the learner never waits for rollouts);
    the GKD step draws the iteration's ``gkd.batch_size`` fixed sequences itself. Nothing is dropped.
    """

    def __init__(self) -> None:
        self.drops: DropLog = _NoDrops()

    def next_batch(self, learner_version: int) -> list[QueueEntry] | None:
        """``[]``: no rollout, ready now."""
        return []


def make_batch_source(
    settings: AsyncRLSettings, queue: RolloutQueue, drops: DropRecorder, *, claim_idle_ms: int, block_s: float
) -> BatchSource:
    """``SingleRolloutSource`` for SAO, ``GroupSource`` for asynchronous GRPO, sized by ``settings``."""
    if settings.technique == "grpo":
        return GroupSource(queue, drops, group_size=settings.group_size, groups_per_batch=settings.groups_per_batch,
                           max_staleness=settings.max_staleness, claim_idle_ms=claim_idle_ms, block_s=block_s)
    return SingleRolloutSource(queue, drops, batch_rollouts=settings.batch_rollouts,
                               max_staleness=settings.max_staleness, claim_idle_ms=claim_idle_ms, block_s=block_s,
                               staleness_rule=settings.staleness_rule)


class _NoDrops:
    """The drop log of a rank that does not read the stream (rank 0 drops, counts and logs)."""

    total = 0.0
    infra = 0.0
    seen = 0.0

    def take_for_ledger(self) -> list[tuple[QueueEntry, str]]:
        """Nothing: drops are rank 0's."""
        return []


def _encode_batch(entries: list[QueueEntry] | None) -> bytes:
    """Msgpack of ``[[entry_id, rollout bytes], ...]``, or of nil for "no batch yet"."""
    if entries is None:
        return msgspec.msgpack.encode(None)
    return msgspec.msgpack.encode([[e.entry_id, encode_rollout(e.rollout)] for e in entries])


def _decode_batch(payload: bytes) -> list[QueueEntry] | None:
    """The inverse of ``_encode_batch`` (rollouts decoded with per-token numpy arrays)."""
    items = msgspec.msgpack.decode(payload)
    if items is None:
        return None
    return [QueueEntry(entry_id, decode_rollout(raw, arrays=True)) for entry_id, raw in items]


class RankBatchSource:
    """One stream reader for all the learner's ranks: rank 0 reads and broadcasts, the others receive.

    Rank 0 keeps every duty a reader has (staleness drops, acknowledgement, admission refunds,
    the ledger), so the rule "acknowledge after the checkpoint that covers the entry" stays in one
    process and the stream has one consumer however many ranks train. Every rank gets the whole
    batch (encoded rollouts over the control group, no pickle) and trains its share of the rows
    (``learner.rank_rows``). The payload is token ids, logprobs and masks: small beside a forward pass.

    Args:
        world: The learner's ranks.
        inner: Rank 0's real source (``make_batch_source``); None on other ranks.

    Raises:
        ValueError: rank 0 without a source.
    """

    def __init__(self, world: World, inner: BatchSource | None) -> None:
        if world.is_main and inner is None:
            raise ValueError("RankBatchSource: rank 0 needs the stream's batch source")
        self._world, self._inner = world, inner
        self.drops: DropLog = inner.drops if inner is not None else _NoDrops()

    def next_batch(self, learner_version: int) -> list[QueueEntry] | None:
        """Rank 0's ``next_batch``, the same entries on every rank (None on all while none is ready)."""
        if not self._world.distributed:
            assert self._inner is not None
            return self._inner.next_batch(learner_version)
        entries = self._inner.next_batch(learner_version) if self._inner is not None else None
        payload = self._world.broadcast_bytes(_encode_batch(entries) if self._world.is_main else None)
        return entries if self._world.is_main else _decode_batch(payload)
