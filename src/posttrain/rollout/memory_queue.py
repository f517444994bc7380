"""In-memory twin of the Redis Streams rollout queue, for unit tests and single-process runs.

``MemoryStream`` plays the server (entries, one consumer group, dead letters) and may be shared
by several ``MemoryRolloutQueue`` objects (one per consumer name, or a "restarted" learner that
reuses a name). Semantics follow ``RedisStreamQueue``: per-consumer pending lists, own pending
entries redelivered first after a restart, ``claim_stale`` of other consumers' idle entries,
dead-lettering of undecodable entries, and trimming to ``maxlen`` (exact here, approximate on
Redis). Everything is guarded by one lock, so generators and the learner may be threads.

Example: ``q = MemoryRolloutQueue(); q.put(rollout); [e] = q.get_batch(1, 0.0); q.ack([e.entry_id])``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posttrain.records import RecordError, Rollout, encode_rollout
from posttrain.rollout.queue import (
    PAYLOAD_FIELD,
    DeadLetter,
    DeadLetterHook,
    QueueEntry,
    RolloutLimits,
    check_batch_args,
    check_version,
    decode_entry,
    entry_fields,
)


@dataclass
class _Pending:
    consumer: str
    delivered_at: float  # time.monotonic() seconds
    deliveries: int


class MemoryStream:
    """Shared in-memory state of one rollout stream with one consumer group.

    Args:
        maxlen: Entries kept (exact trimming of the oldest on ``add``), ``>= 1``.

    Raises:
        ValueError: ``maxlen < 1``.
    """

    def __init__(self, maxlen: int = 100_000) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen: must be >= 1 entries, got {maxlen}")
        self.maxlen = maxlen
        self.cond = threading.Condition()
        self.entries: OrderedDict[int, dict[str, bytes]] = OrderedDict()
        self.pel: OrderedDict[int, _Pending] = OrderedDict()
        self.dead: list[DeadLetter] = []
        self.next_seq = 1
        self.last_delivered = 0

    def add(self, fields: Mapping[str, bytes]) -> str:
        """Append an entry with raw ``fields`` (no validation) and return its id ``"<seq>-0"``.

        Tests use it to inject corrupt entries; producers use ``MemoryRolloutQueue.put``.
        """
        with self.cond:
            seq = self.next_seq
            self.next_seq += 1
            self.entries[seq] = dict(fields)
            while len(self.entries) > self.maxlen:
                self.entries.popitem(last=False)
            self.cond.notify_all()
            return _fmt(seq)


def _fmt(seq: int) -> str:
    return f"{seq}-0"


def _parse(entry_id: str) -> int:
    head, _, tail = entry_id.partition("-")
    if not head.isdigit() or tail != "0":
        raise ValueError(f"entry_id: {entry_id!r} is not an id of this memory stream")
    return int(head)


class MemoryRolloutQueue:
    """``RolloutQueue`` over a ``MemoryStream`` for one consumer name.

    Args:
        stream: Shared stream state; a new private one (with ``maxlen``) when None.
        consumer: Consumer name; a queue built with the name of a dead consumer gets its pending
            entries back on the first ``get_batch`` calls.
        maxlen: Used only when ``stream`` is None.

    Raises:
        ValueError: empty ``consumer``.
    """

    def __init__(
        self, stream: MemoryStream | None = None, consumer: str = "learner-0", maxlen: int = 100_000
    ):
        if not consumer:
            raise ValueError("consumer: must be a non-empty name")
        self.stream = stream if stream is not None else MemoryStream(maxlen=maxlen)
        self.consumer = consumer
        self._recovering = True  # first read this consumer's own pending entries (Redis id "0")
        self._delivered: set[int] = set()  # handed out by this object and not acked
        self.limits: RolloutLimits | None = None
        self._on_dead_letter: DeadLetterHook | None = None
        self._dead_unreported = 0  # dead-lettered entries (not trimmed ones) not yet told to the hook

    def put(self, rollout: Rollout) -> str:
        """Validate, encode and append ``rollout``; return its entry id.

        Raises:
            RecordError: the rollout violates an invariant; nothing is appended.
        """
        payload = encode_rollout(rollout)
        return self.stream.add(entry_fields(rollout, payload))

    def set_limits(self, limits: RolloutLimits | None, on_dead_letter: DeadLetterHook | None = None) -> None:
        """Check delivered rollouts against ``limits``; tell ``on_dead_letter`` how many a read dead-lettered."""
        self.limits = limits
        self._on_dead_letter = on_dead_letter

    def _report_dead(self) -> None:
        """Call the dead-letter hook with the entries this object's reads dead-lettered (outside the lock)."""
        dead, self._dead_unreported = self._dead_unreported, 0
        if dead > 0 and self._on_dead_letter is not None:
            self._on_dead_letter(dead)

    def _take(self, seq: int, fields: Mapping[str, bytes] | None, out: list[QueueEntry]) -> None:
        """Decode one delivered entry into ``out`` or dead-letter it (caller holds the lock)."""
        try:
            rollout = decode_entry(fields)
            problem = self.limits.problem(rollout) if self.limits is not None else None
            if problem is not None:
                raise RecordError(problem)
        except RecordError as exc:
            payload = b"" if not fields else fields.get(PAYLOAD_FIELD, b"")
            st = self.stream
            st.dead.append(
                DeadLetter(
                    entry_id=f"{len(st.dead) + 1}-0",
                    original_id=_fmt(seq),
                    reason=str(exc),
                    payload=payload,
                    consumer=self.consumer,
                )
            )
            st.pel.pop(seq, None)
            if fields:  # an entry trimmed before ack was delivered before: no admission place to give back
                self._dead_unreported += 1
            return
        self._delivered.add(seq)
        out.append(QueueEntry(entry_id=_fmt(seq), rollout=rollout))

    def _read_own_pending(self, need: int, out: list[QueueEntry]) -> None:
        st = self.stream
        mine = [s for s, p in st.pel.items() if p.consumer == self.consumer and s not in self._delivered]
        if len(mine) <= need:
            self._recovering = False
        for seq in mine[:need]:
            p = st.pel[seq]
            p.delivered_at = time.monotonic()
            p.deliveries += 1
            self._take(seq, st.entries.get(seq), out)

    def _read_new(self, need: int, out: list[QueueEntry]) -> None:
        st = self.stream
        fresh = [s for s in st.entries if s > st.last_delivered][:need]
        for seq in fresh:
            st.last_delivered = seq
            st.pel[seq] = _Pending(self.consumer, time.monotonic(), 1)
            self._take(seq, st.entries[seq], out)

    def get_batch(self, n: int, timeout_s: float) -> list[QueueEntry]:
        """Deliver up to ``n`` valid rollouts (own pending first), waiting up to ``timeout_s`` seconds.

        Raises:
            ValueError: ``n < 1`` or ``timeout_s < 0``.
        """
        check_batch_args(n, timeout_s)
        try:
            return self._get_batch(n, timeout_s)
        finally:
            self._report_dead()

    def _get_batch(self, n: int, timeout_s: float) -> list[QueueEntry]:
        deadline = time.monotonic() + timeout_s
        out: list[QueueEntry] = []
        st = self.stream
        with st.cond:
            while True:
                if self._recovering:
                    self._read_own_pending(n - len(out), out)
                if not self._recovering and len(out) < n:
                    self._read_new(n - len(out), out)
                if len(out) >= n:
                    return out
                if self._recovering:
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return out
                st.cond.wait(timeout=remaining)

    def ack(self, entry_ids: Sequence[str]) -> int:
        """Acknowledge entries; return how many were pending.

        Raises:
            ValueError: an id that is not of the form ``"<seq>-0"``.
        """
        seqs = [_parse(e) for e in entry_ids]
        with self.stream.cond:
            acked = 0
            for seq in seqs:
                if self.stream.pel.pop(seq, None) is not None:
                    acked += 1
                self._delivered.discard(seq)
            return acked

    def claim_stale(self, min_idle_ms: int) -> list[QueueEntry]:
        """Take over entries pending on other consumers idle for >= ``min_idle_ms`` milliseconds.

        Raises:
            ValueError: ``min_idle_ms < 0``.
        """
        if min_idle_ms < 0:
            raise ValueError(f"min_idle_ms: must be >= 0, got {min_idle_ms}")
        out: list[QueueEntry] = []
        st = self.stream
        with st.cond:
            now = time.monotonic()
            stale = [
                s
                for s, p in st.pel.items()
                if p.consumer != self.consumer and (now - p.delivered_at) * 1000.0 >= min_idle_ms
            ]
            for seq in stale:
                p = st.pel[seq]
                p.consumer, p.delivered_at, p.deliveries = self.consumer, now, p.deliveries + 1
                self._take(seq, st.entries.get(seq), out)
        self._report_dead()
        return out

    def pending(self) -> list[str]:
        """Ids pending on this consumer name, oldest first."""
        with self.stream.cond:
            return [_fmt(s) for s, p in self.stream.pel.items() if p.consumer == self.consumer]

    def dead_letter_count(self) -> int:
        """Number of dead-letter records."""
        with self.stream.cond:
            return len(self.stream.dead)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead-letter records."""
        with self.stream.cond:
            return list(self.stream.dead[:limit])

    def length(self) -> int:
        """Entries currently held in the stream."""
        with self.stream.cond:
            return len(self.stream.entries)

    def lag(self) -> int:
        """Entries not yet delivered to any consumer."""
        with self.stream.cond:
            return sum(1 for s in self.stream.entries if s > self.stream.last_delivered)


class MemoryPolicyVersionStore:
    """``PolicyVersionStore`` in memory (thread-safe).

    Args:
        version: Initial policy version (``>= 0``).

    Raises:
        ValueError: a negative or non-int version.
    """

    def __init__(self, version: int = 0) -> None:
        self._lock = threading.Lock()
        self._version = check_version(version)

    def get(self) -> int:
        """Current policy version."""
        with self._lock:
            return self._version

    def set(self, version: int) -> None:
        """Set the policy version.

        Raises:
            ValueError: a negative or non-int version.
        """
        check_version(version)
        with self._lock:
            self._version = version
