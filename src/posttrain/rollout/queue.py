"""The rollout queue contract: what generators and the learner may rely on, for every backend.

Backends: ``redis_streams.RedisStreamQueue`` (the real one, Redis Streams with one consumer
group) and ``memory_queue.MemoryRolloutQueue`` (an in-process twin for tests). Both give:

* at-least-once delivery: an entry stays pending for its consumer until ``ack``; a restarted
  consumer (same name) gets its own pending entries back first; ``claim_stale`` takes over the
  pending entries of a dead consumer;
* no poison entries: an entry that does not decode to a valid ``Rollout`` never reaches the
  learner and is never dropped silently: it moves to the dead-letter stream with the reason
  and its raw bytes, and the original is acked;
* no pickle: the payload is ``posttrain.records.encode_rollout`` msgpack;
* fits the model: once the learner has called ``set_limits``, a rollout whose token ids fall
  outside the model's vocabulary or that is longer than the model takes is dead-lettered with the
  reason before any forward pass (an out-of-vocabulary id crash-looped the learner: every restart
  re-read the pending entry); ``on_dead_letter`` then hears how many entries went, so the learner
  gives their admission places back.

This module holds only types; import it anywhere (no Redis needed). Run the tests with
``.venv/bin/python -m pytest -q tests/contracts tests/unit/rollout tests/integration/test_redis_stream.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from posttrain.records import RecordError, Rollout, decode_rollout

PAYLOAD_FIELD = "payload"
"""Stream entry field holding the msgpack ``Rollout`` bytes."""
ROLLOUT_ID_FIELD = "rollout_id"
"""Stream entry field holding ``Rollout.rollout_id`` (readable without decoding the payload)."""
POLICY_VERSION_FIELD = "policy_version"
"""Stream entry field holding ``Rollout.policy_version`` as a decimal string."""


class QueueError(RuntimeError):
    """The rollout queue failed (the message says which operation and why)."""


class QueueConnectionError(QueueError):
    """The queue server stayed unreachable after the bounded number of retries."""


class RedisUnreachableError(QueueConnectionError):
    """A role gave up on its Redis after ``queue.reconnect_window_s``; the message is one line naming the URL."""


@dataclass(frozen=True)
class QueueEntry:
    """One delivered rollout.

    Attributes:
        entry_id: Stream entry id (``"<ms>-<seq>"`` on Redis); pass it to ``ack``.
        rollout: The decoded and validated rollout.
    """

    entry_id: str
    rollout: Rollout


@dataclass(frozen=True)
class DeadLetter:
    """An entry that could not be delivered, as stored in the dead-letter stream.

    Attributes:
        entry_id: Id of the record in the dead-letter stream.
        original_id: Id the entry had in the rollout stream.
        reason: Why it was dead-lettered (the decode error, or that it was trimmed before ack).
        payload: The raw ``payload`` bytes as found (``b""`` if the entry had none).
        consumer: Consumer that found it.
    """

    entry_id: str
    original_id: str
    reason: str
    payload: bytes
    consumer: str


@dataclass(frozen=True)
class RolloutLimits:
    """What the learner's model can take; every decoded rollout is checked against it.

    Attributes:
        vocab_size: V; every token id must be in ``[0, V)`` (the embedding's rows).
        max_tokens: Longest rollout in tokens (the model's ``max_position_embeddings``, or the
            generators' ``max_episode_tokens + max_new_tokens``); None: no length limit.

    Raises:
        ValueError: ``vocab_size < 1`` or ``max_tokens < 1``.
    """

    vocab_size: int
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size: must be >= 1, got {self.vocab_size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1 or None, got {self.max_tokens}")

    def problem(self, rollout: Rollout) -> str | None:
        """Why ``rollout`` does not fit the model (the field, index and bound), or None.

        ``token_ids`` may be a list or a ``[T] int32`` numpy array (``decode_rollout(arrays=True)``).
        """
        ids = rollout.token_ids
        n = len(ids)
        if self.max_tokens is not None and n > self.max_tokens:
            return f"token_ids: {n} tokens, more than the learner's limit of {self.max_tokens}"
        if n == 0:
            return None
        top = int(ids.max()) if hasattr(ids, "max") else max(ids)
        if top >= self.vocab_size:
            at = next(i for i, t in enumerate(ids) if int(t) >= self.vocab_size)
            return (f"token_ids[{at}]: id {int(ids[at])} is outside the model's vocabulary "
                    f"(vocab_size {self.vocab_size})")
        return None


DeadLetterHook = Callable[[int], object]
"""Called with the number of entries a read dead-lettered (not counting entries trimmed before ack)."""


@runtime_checkable
class RolloutQueue(Protocol):
    """A rollout stream seen by one consumer (the learner) and any number of producers (generators)."""

    def put(self, rollout: Rollout) -> str:
        """Validate, encode and append ``rollout``; return its entry id.

        Raises:
            RecordError: the rollout violates an invariant (``Rollout.validate``); nothing is appended.
            QueueConnectionError: the server stayed unreachable.
        """
        ...

    def get_batch(self, n: int, timeout_s: float) -> list[QueueEntry]:
        """Deliver up to ``n`` valid rollouts, this consumer's own pending entries first.

        Waits until ``n`` entries are collected or ``timeout_s`` (seconds) has passed, then
        returns what it has (possibly ``[]``). Undecodable entries are dead-lettered on the way.

        Raises:
            ValueError: ``n < 1`` or ``timeout_s < 0``.
            QueueConnectionError: the server stayed unreachable.
        """
        ...

    def ack(self, entry_ids: Sequence[str]) -> int:
        """Acknowledge delivered entries; return how many were pending (acking twice is harmless)."""
        ...

    def claim_stale(self, min_idle_ms: int) -> list[QueueEntry]:
        """Take over entries pending on *other* consumers for at least ``min_idle_ms`` milliseconds."""
        ...

    def pending(self) -> list[str]:
        """Ids delivered to this consumer name and not yet acked (in this and earlier incarnations)."""
        ...

    def dead_letter_count(self) -> int:
        """Number of records in the dead-letter stream."""
        ...

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead-letter records."""
        ...

    def length(self) -> int:
        """Entries in the rollout stream (acked ones stay until trimmed by ``maxlen``)."""
        ...

    def lag(self) -> int:
        """Entries appended but not yet delivered to the consumer group."""
        ...

    def set_limits(self, limits: RolloutLimits | None, on_dead_letter: DeadLetterHook | None = None) -> None:
        """Check every rollout delivered from now on against ``limits`` (None: no check).

        A rollout that fails is dead-lettered with ``limits.problem``'s reason, like an
        undecodable entry; ``on_dead_letter(n)`` is called after each read that dead-lettered
        ``n > 0`` entries for either reason.
        """
        ...


@runtime_checkable
class PolicyVersionStore(Protocol):
    """The learner's current policy version (count of weight publications), shared with generators."""

    def get(self) -> int:
        """Current policy version; 0 before the learner first sets it."""
        ...

    def set(self, version: int) -> None:
        """Set the policy version (``version >= 0``; raises ValueError otherwise)."""
        ...


def decode_entry(fields: Mapping[str, bytes] | None, *, arrays: bool = False) -> Rollout:
    """Decode the fields of one stream entry into a validated rollout.

    Args:
        fields: The entry's fields, names as ``str``; ``None`` or empty when the entry was deleted
            from the stream (trimmed) while still pending.
        arrays: Per-token fields as read-only numpy views of the payload instead of python lists
            (``decode_rollout(arrays=True)``; same validation).

    Raises:
        RecordError: the entry was deleted, lacks ``payload``, or the payload does not decode to a
            valid ``Rollout`` (``posttrain.records.decode_rollout``); the message says which.
    """
    if not fields:
        raise RecordError("entry deleted from the stream before ack (trimmed by maxlen?)")
    payload = fields.get(PAYLOAD_FIELD)
    if payload is None:
        raise RecordError(f"{PAYLOAD_FIELD}: field missing (fields present: {sorted(fields)})")
    return decode_rollout(payload, arrays=arrays)


def entry_fields(rollout: Rollout, payload: bytes) -> dict[str, bytes]:
    """Fields written for one rollout: ``payload``, plus ``rollout_id`` and ``policy_version`` in clear."""
    return {
        PAYLOAD_FIELD: payload,
        ROLLOUT_ID_FIELD: rollout.rollout_id.encode(),
        POLICY_VERSION_FIELD: str(rollout.policy_version).encode(),
    }


def check_batch_args(n: int, timeout_s: float) -> None:
    """Validate ``get_batch`` arguments.

    Raises:
        ValueError: ``n < 1`` or ``timeout_s < 0`` (the message names the argument).
    """
    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if timeout_s < 0:
        raise ValueError(f"timeout_s: must be >= 0 seconds, got {timeout_s}")


def check_version(version: int) -> int:
    """Return ``version`` if it is a non-negative int, else raise ValueError naming ``version``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version: policy version must be an int >= 0, got {version!r}")
    return version
