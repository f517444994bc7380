"""The rollout stream on Redis Streams (redis-py; any Redis >= 7 or Valkey, embedded or in-cluster).

Generators ``XADD`` encoded rollouts (approximate ``MAXLEN``); the learner reads through one
consumer group (``XREADGROUP``) and ``XACK``s only when the optimizer step that used an entry has
been checkpointed, or the entry was deliberately dropped. A restarted learner with the same
consumer name first re-reads its own pending entries (``XREADGROUP`` id ``0``), then new ones
(``>``); ``claim_stale`` takes over idle entries of other, dead consumers (``XPENDING IDLE`` + ``XCLAIM``). Entries that
do not decode go to the dead-letter stream (``reason``, ``original_id``, ``payload``) and are
acked, in one MULTI/EXEC.

Guarantees:
    * An entry handed to ``put`` that returned is delivered at least once, unless trimmed by
      ``maxlen`` before it was read (size ``maxlen`` well above (max_staleness + 1) * batch_size).
    * A pending entry trimmed or deleted before ack is dead-lettered, not dropped silently.
    * Connection errors are retried ``retries`` times (default 3, backoff 0.1/0.5/2.0 s), then
      ``QueueConnectionError`` names the operation.
Not guaranteed:
    * Exactly-once: a retried ``XADD`` whose first attempt reached the server appends a duplicate
      (same ``rollout_id`` field); an entry acked late may be trained twice after a crash.
    * Redis Cluster: the admission script touches two keys of a run without hash tags.

Example: ``q = RedisStreamQueue("redis://127.0.0.1:6379", StreamKeys("posttrain", "run"))``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from posttrain.records import RecordError, Rollout, encode_rollout
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import (
    PAYLOAD_FIELD,
    DeadLetter,
    DeadLetterHook,
    QueueConnectionError,
    QueueEntry,
    QueueError,
    RedisUnreachableError,
    RolloutLimits,
    check_batch_args,
    check_version,
    decode_entry,
    entry_fields,
)

T = TypeVar("T")

DEFAULT_RETRIES = 3
"""Retries after a connection error or timeout, per operation (4 attempts in all)."""
DEFAULT_BACKOFF_S = (0.1, 0.5, 2.0)
"""Sleep (seconds) before retry 1, 2, 3...; the last value repeats."""
_ACK_CHUNK = 1000


DEFAULT_RECONNECT_WINDOW_S = 30.0
"""Default time (seconds) a role's client keeps reconnecting to an unreachable Redis (``queue.reconnect_window_s``)."""
_BACKOFF_BASE_S = 0.1
_BACKOFF_CAP_S = 2.0


def retries_for_window(window_s: float, base_s: float = _BACKOFF_BASE_S, cap_s: float = _BACKOFF_CAP_S) -> int:
    """How many retries of ``ExponentialBackoff(cap_s, base_s)`` sleep at least ``window_s`` seconds in all.

    redis-py sleeps ``min(cap, base * 2**k)`` before retry k (k = 1, 2, ...), so with the defaults
    0.2, 0.4, 0.8, 1.6, 2, 2, ... seconds; the connection attempts themselves add to the time.

    Example: ``retries_for_window(10.0) == 8`` (0.2 + 0.4 + 0.8 + 1.6 + 2 + 2 + 2 + 2 = 11 s).

    Raises:
        ValueError: ``window_s < 0`` or a non-positive ``base_s``/``cap_s``.
    """
    if window_s < 0 or base_s <= 0 or cap_s <= 0:
        raise ValueError(f"window_s: must be >= 0 seconds (base/cap > 0), got {window_s} ({base_s}/{cap_s})")
    slept, k = 0.0, 0
    while slept < window_s:
        k += 1
        slept += min(cap_s, base_s * 2**k)
    return k


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for error lines): ``redis://u:***@host:6379/0``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def connect(url: str, socket_timeout_s: float = 30.0, reconnect_window_s: float = 0.0) -> redis.Redis:
    """Open a redis-py client for ``url`` that returns raw bytes.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL (credentials may be in it).
        socket_timeout_s: Read timeout (seconds); must exceed every ``XREADGROUP`` block.
        reconnect_window_s: Every command of the client retries connection errors and timeouts
            with exponential backoff (0.2 s doubling to 2 s) for at least this long (seconds)
            before it raises ``redis.ConnectionError``/``redis.TimeoutError``; 0: no retries (the
            callers' ``with_retries`` decides). A role gives ``queue.reconnect_window_s``, so a Redis
            restart shorter than the window is survived and a longer one ends the role.

    Raises:
        ValueError: ``url`` has another scheme (the message names ``url``), or a negative window.
    """
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"url: expected redis://, rediss:// or unix://, got {url!r}")
    retry = (Retry(ExponentialBackoff(cap=_BACKOFF_CAP_S, base=_BACKOFF_BASE_S), retries_for_window(reconnect_window_s))
             if reconnect_window_s > 0 else Retry(NoBackoff(), 0))
    return redis.Redis.from_url(
        url,
        decode_responses=False,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(10.0, socket_timeout_s),
        retry=retry,
    )


def check_reachable(client: redis.Redis, url: str, window_s: float) -> None:
    """``PING`` the server through ``client`` (which retries over its own window); one clear error if it fails.

    Raises:
        RedisUnreachableError: the server did not answer; the message names the redacted URL and
            the window, with the last connection error.
    """
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise RedisUnreachableError(unreachable_message(url, window_s, exc)) from None


def unreachable_message(url: str, window_s: float, exc: BaseException) -> str:
    """One line: ``Redis at URL unreachable (retried for W s, queue.reconnect_window_s): cause``."""
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"Redis at {redact_url(url)} unreachable (retried for {window_s:g} s, "
            f"queue.reconnect_window_s): {cause}")


def as_client(client_or_url: redis.Redis | str, socket_timeout_s: float = 30.0) -> redis.Redis:
    """Return ``client_or_url`` if it is a client, else ``connect(client_or_url)``.

    Raises:
        ValueError: a client with ``decode_responses=True`` (payloads are raw bytes), or a bad URL.
    """
    if isinstance(client_or_url, str):
        return connect(client_or_url, socket_timeout_s)
    if client_or_url.connection_pool.connection_kwargs.get("decode_responses"):
        raise ValueError(
            "client_or_url: the redis client must use decode_responses=False (raw payload bytes)"
        )
    return client_or_url


def with_retries(
    op: str,
    fn: Callable[[], T],
    retries: int = DEFAULT_RETRIES,
    backoff_s: Sequence[float] = DEFAULT_BACKOFF_S,
) -> T:
    """Call ``fn``; on ``redis.ConnectionError``/``redis.TimeoutError`` retry at most ``retries`` times.

    Args:
        op: Operation name for the error message (``"XADD posttrain:run:rollouts"``).
        fn: The call; Redis errors other than connection errors and timeouts propagate at once.
        retries: Retries after the first attempt (``>= 0``).
        backoff_s: Sleeps (seconds) before successive retries; the last value repeats.

    Raises:
        QueueConnectionError: still failing after ``retries`` retries; chained to the last error.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if attempt >= retries:
                raise QueueConnectionError(
                    f"{op}: Redis unreachable after {retries} retries ({attempt + 1} attempts): {exc}"
                ) from exc
            time.sleep(backoff_s[min(attempt, len(backoff_s) - 1)] if backoff_s else 0.0)
            attempt += 1


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _str_fields(fields: Mapping[Any, Any] | None) -> dict[str, bytes] | None:
    if fields is None:
        return None
    return {_s(k): v for k, v in fields.items()}


class RedisStreamQueue:
    """``RolloutQueue`` on a Redis Stream with one consumer group.

    ``put`` may be called from any thread (redis-py pools connections); the consumer side
    (``get_batch``, ``ack``, ``claim_stale``) belongs to one thread per object.

    Args:
        client_or_url: A redis-py client (``decode_responses=False``) or a URL for ``connect``.
        keys: Key names of the run (``StreamKeys``).
        group: Consumer group of the learner.
        consumer: This consumer's name; keep it stable across restarts of the same learner rank
            so its pending entries come back to it.
        maxlen: Approximate ``MAXLEN`` of the stream (entries); Redis trims whole nodes, so the
            length stays within ``maxlen`` + ``stream-node-max-entries`` (100 by default).
        block_ms: Longest single ``XREADGROUP BLOCK`` (milliseconds), below the client's socket
            timeout; ``get_batch`` loops up to its own timeout.
        retries: Retries per operation on connection errors (see ``with_retries``).
        create_group: Create the consumer group (``XGROUP CREATE ... 0 MKSTREAM``) now, so
            entries put before the learner starts are delivered; generators may pass False.
        arrays: Deliver rollouts whose ``token_ids`` / ``behaviour_logprobs`` / ``action_mask``
            are read-only numpy views of the entry's payload ([T] int32 / float32 / bool) instead
            of python lists (``decode_rollout(arrays=True)``: same validation, no per-token
            python objects; ~1.3 ms less per 32k-token rollout, docs/benchmarks.md, stream). For a
            learner that only turns them into tensors.

    Raises:
        ValueError: a bad argument (the message names it).
        QueueConnectionError: the server is unreachable while creating the group.
    """

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        keys: StreamKeys,
        group: str = "learner",
        consumer: str = "learner-0",
        maxlen: int = 100_000,
        block_ms: int = 1000,
        retries: int = DEFAULT_RETRIES,
        create_group: bool = True,
        arrays: bool = False,
    ) -> None:
        if not group or not consumer:
            raise ValueError(f"group/consumer: must be non-empty, got {group!r}/{consumer!r}")
        if maxlen < 1:
            raise ValueError(f"maxlen: must be >= 1 entries, got {maxlen}")
        if block_ms < 1:
            raise ValueError(f"block_ms: must be >= 1 ms, got {block_ms}")
        if retries < 0:
            raise ValueError(f"retries: must be >= 0, got {retries}")
        self.client = as_client(client_or_url, socket_timeout_s=block_ms / 1000.0 + 30.0)
        socket_timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout")
        if socket_timeout is not None and socket_timeout <= block_ms / 1000.0:
            raise ValueError(
                f"block_ms: {block_ms} ms must be below the client's socket_timeout ({socket_timeout} s), "
                "or every blocking read times out"
            )
        self.keys = keys
        self.group = group
        self.consumer = consumer
        self.maxlen = maxlen
        self.block_ms = block_ms
        self.retries = retries
        self.arrays = arrays
        self._cursor: str | None = "0"  # own-pending recovery cursor; None once drained
        self._delivered: set[str] = set()  # handed out by this object and not acked
        self.limits: RolloutLimits | None = None
        self._on_dead_letter: DeadLetterHook | None = None
        if create_group:
            self.ensure_group()

    def _call(self, op: str, fn: Callable[[], T]) -> T:
        return with_retries(op, fn, retries=self.retries)

    def ensure_group(self) -> None:
        """Create the consumer group at id ``0`` with ``MKSTREAM``; an existing group is kept (BUSYGROUP)."""
        stream = self.keys.rollouts

        def create() -> None:
            try:
                self.client.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise QueueError(f"XGROUP CREATE {stream} {self.group}: {exc}") from exc

        self._call(f"XGROUP CREATE {stream}", create)

    def put(self, rollout: Rollout) -> str:
        """Validate, encode and ``XADD`` (``MAXLEN ~ maxlen``) a rollout; return its entry id.

        Raises:
            RecordError: the rollout violates an invariant; nothing is appended.
            QueueConnectionError: the server stayed unreachable.
        """
        fields = entry_fields(rollout, encode_rollout(rollout))
        entry_id = self._call(
            f"XADD {self.keys.rollouts}",
            lambda: self.client.xadd(self.keys.rollouts, fields, maxlen=self.maxlen, approximate=True),  # type: ignore[arg-type]
        )
        return _s(entry_id)

    def _xreadgroup(
        self, last_id: str, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[str, bytes] | None]]:
        stream = self.keys.rollouts

        def read() -> Any:
            try:
                return self.client.xreadgroup(
                    self.group, self.consumer, {stream: last_id}, count=count, block=block_ms
                )
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise QueueError(f"XREADGROUP {stream} {self.group}: {exc}") from exc
            # The stream or group vanished (deleted key, flushed server): recreate it once.
            self.ensure_group()
            return self.client.xreadgroup(
                self.group, self.consumer, {stream: last_id}, count=count, block=block_ms
            )

        reply = self._call(f"XREADGROUP {stream} {last_id}", read)
        if not reply:
            return []
        return [(_s(eid), _str_fields(fields)) for eid, fields in reply[0][1]]

    def _dead_letter(self, entry_id: str, fields: Mapping[str, bytes] | None, reason: str) -> None:
        payload = b"" if not fields else fields.get(PAYLOAD_FIELD, b"")
        record = {
            "reason": reason.encode(),
            "original_id": entry_id.encode(),
            "payload": payload,
            "consumer": self.consumer.encode(),
        }

        def move() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(self.keys.dead_letter, record)  # type: ignore[arg-type]
            pipe.xack(self.keys.rollouts, self.group, entry_id)
            pipe.execute()

        self._call(f"dead-letter {entry_id} to {self.keys.dead_letter}", move)

    def set_limits(self, limits: RolloutLimits | None, on_dead_letter: DeadLetterHook | None = None) -> None:
        """Check delivered rollouts against ``limits``; tell ``on_dead_letter`` how many a read dead-lettered."""
        self.limits = limits
        self._on_dead_letter = on_dead_letter

    def _take(self, entries: list[tuple[str, dict[str, bytes] | None]], out: list[QueueEntry]) -> None:
        dead = 0
        for entry_id, fields in entries:
            if entry_id in self._delivered:
                continue
            try:
                rollout = decode_entry(fields, arrays=self.arrays)
            except RecordError as exc:
                self._dead_letter(entry_id, fields, str(exc))
                dead += int(bool(fields))  # a trimmed entry (no fields) was delivered before: nothing to give back
                continue
            problem = self.limits.problem(rollout) if self.limits is not None else None
            if problem is not None:
                self._dead_letter(entry_id, fields, problem)
                dead += 1
                continue
            self._delivered.add(entry_id)
            out.append(QueueEntry(entry_id=entry_id, rollout=rollout))
        if dead and self._on_dead_letter is not None:
            self._on_dead_letter(dead)

    def get_batch(self, n: int, timeout_s: float) -> list[QueueEntry]:
        """Deliver up to ``n`` valid rollouts: own pending entries (id ``0``) first, then new ones (``>``).

        Waits until ``n`` entries are collected or ``timeout_s`` seconds have passed (each
        ``XREADGROUP`` blocks at most ``block_ms``). Undecodable entries are dead-lettered.

        Raises:
            ValueError: ``n < 1`` or ``timeout_s < 0``.
            QueueConnectionError: the server stayed unreachable.
        """
        check_batch_args(n, timeout_s)
        deadline = time.monotonic() + timeout_s
        out: list[QueueEntry] = []
        while self._cursor is not None and len(out) < n:
            entries = self._xreadgroup(self._cursor, n - len(out), None)
            if not entries:
                self._cursor = None
                break
            self._cursor = entries[-1][0]
            self._take(entries, out)
        while len(out) < n:
            remaining = deadline - time.monotonic()
            block = None if remaining <= 0 else max(1, min(self.block_ms, int(remaining * 1000)))
            self._take(self._xreadgroup(">", n - len(out), block), out)
            if remaining <= 0 or time.monotonic() >= deadline:
                break
        return out

    def ack(self, entry_ids: Sequence[str]) -> int:
        """``XACK`` entries (in chunks of 1000); return how many were pending. Acking twice is harmless.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        ids = list(entry_ids)
        acked = 0
        for i in range(0, len(ids), _ACK_CHUNK):
            chunk = ids[i : i + _ACK_CHUNK]
            acked += int(
                self._call(
                    f"XACK {self.keys.rollouts}",
                    partial(self.client.xack, self.keys.rollouts, self.group, *chunk),
                )
            )
        self._delivered.difference_update(ids)
        return acked

    def claim_stale(self, min_idle_ms: int, max_entries: int = 10_000) -> list[QueueEntry]:
        """Claim entries idle >= ``min_idle_ms`` ms that are pending on *other* consumers of the group.

        ``XPENDING ... IDLE`` lists the idle entries; those of other consumers are taken with
        ``XCLAIM`` (which re-checks the idle time, so two claimers never both get an entry). Entries
        pending on this consumer's own name (an earlier incarnation of it) are left to
        ``get_batch``, which hands them back in order (the queue contract). Entries deleted from
        the stream while pending are dead-lettered with reason "deleted before ack".

        Args:
            min_idle_ms: Idle time (milliseconds) since last delivery, ``>= 0``.
            max_entries: Upper bound on pending entries scanned in this call (bounded loop).

        Raises:
            ValueError: ``min_idle_ms < 0``.
            QueueConnectionError: the server stayed unreachable.
        """
        if min_idle_ms < 0:
            raise ValueError(f"min_idle_ms: must be >= 0, got {min_idle_ms}")
        stream = self.keys.rollouts
        out: list[QueueEntry] = []
        start = "-"
        scanned = 0
        while scanned < max_entries:
            count = min(100, max_entries - scanned)
            rows: Any = self._call(
                f"XPENDING {stream} IDLE {min_idle_ms}",
                partial(self.client.xpending_range, stream, self.group, min=start, max="+", count=count,
                        idle=min_idle_ms),
            )
            scanned += len(rows)
            others: list[Any] = [_s(r["message_id"]) for r in rows if _s(r["consumer"]) != self.consumer]
            if others:
                claimed: Any = self._call(
                    f"XCLAIM {stream}",
                    partial(self.client.xclaim, stream, self.group, self.consumer, min_idle_ms, others),
                )
                got = [(_s(eid), _str_fields(f)) for eid, f in claimed]
                self._take([(eid, f) for eid, f in got if f is not None], out)
                found = {eid for eid, f in got if f is not None}
                for eid in others:
                    if eid not in found and not self._exists(eid):
                        self._dead_letter(eid, None, "entry deleted from the stream before ack (trimmed by maxlen?)")
            if len(rows) < count:
                break
            start = "(" + _s(rows[-1]["message_id"])
        return out

    def _exists(self, entry_id: str) -> bool:
        """Whether the stream still holds ``entry_id`` (``XRANGE id id``)."""
        rows: Any = self._call(
            f"XRANGE {self.keys.rollouts} {entry_id}",
            lambda: self.client.xrange(self.keys.rollouts, min=entry_id, max=entry_id),
        )
        return bool(rows)

    def pending(self) -> list[str]:
        """Ids pending on this consumer name (``XPENDING`` range), oldest first.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        out: list[str] = []
        start = "-"
        while True:
            rows: Any = self._call(
                f"XPENDING {self.keys.rollouts}",
                partial(
                    self.client.xpending_range,
                    self.keys.rollouts,
                    self.group,
                    min=start,
                    max="+",
                    count=1000,
                    consumername=self.consumer,
                ),
            )
            out.extend(_s(r["message_id"]) for r in rows)
            if len(rows) < 1000:
                return out
            start = "(" + out[-1]

    def dead_letter_count(self) -> int:
        """``XLEN`` of the dead-letter stream (never trimmed)."""
        return int(
            self._call(f"XLEN {self.keys.dead_letter}", lambda: self.client.xlen(self.keys.dead_letter))
        )

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead-letter records (``XRANGE``)."""
        rows: Any = self._call(
            f"XRANGE {self.keys.dead_letter}",
            lambda: self.client.xrange(self.keys.dead_letter, count=limit),
        )
        out = []
        for eid, raw in rows:
            f = _str_fields(raw) or {}
            out.append(
                DeadLetter(
                    entry_id=_s(eid),
                    original_id=_s(f.get("original_id", b"")),
                    reason=_s(f.get("reason", b"")),
                    payload=f.get("payload", b""),
                    consumer=_s(f.get("consumer", b"")),
                )
            )
        return out

    def length(self) -> int:
        """``XLEN`` of the rollout stream."""
        return int(self._call(f"XLEN {self.keys.rollouts}", lambda: self.client.xlen(self.keys.rollouts)))

    def lag(self) -> int:
        """Entries not yet delivered to the group (``XINFO GROUPS`` ``lag``).

        Raises:
            QueueError: the group does not exist, or the server cannot tell the lag (it reports
                none after some trims/deletes).
        """
        groups = self._call(
            f"XINFO GROUPS {self.keys.rollouts}", lambda: self.client.xinfo_groups(self.keys.rollouts)
        )
        for g in groups:
            if _s(g["name"]) == self.group:
                if g.get("lag") is None:
                    raise QueueError(
                        f"XINFO GROUPS {self.keys.rollouts}: server reports no lag for {self.group}"
                    )
                return int(g["lag"])
        raise QueueError(f"XINFO GROUPS {self.keys.rollouts}: no group {self.group!r}")


class RedisPolicyVersionStore:
    """``PolicyVersionStore`` on the run's ``policy_version`` key (a decimal string).

    Args:
        client_or_url: A redis-py client or URL.
        keys: Key names of the run.
        retries: Retries per operation on connection errors.
    """

    def __init__(
        self, client_or_url: redis.Redis | str, keys: StreamKeys, retries: int = DEFAULT_RETRIES
    ) -> None:
        self.client = as_client(client_or_url)
        self.keys = keys
        self.retries = retries

    def get(self) -> int:
        """Current policy version; 0 when the key is absent.

        Raises:
            QueueError: the key holds something other than a non-negative integer.
            QueueConnectionError: the server stayed unreachable.
        """
        key = self.keys.policy_version
        raw = with_retries(f"GET {key}", lambda: self.client.get(key), retries=self.retries)
        if raw is None:
            return 0
        text = _s(raw)
        if not text.isdigit():
            raise QueueError(f"{key}: policy version must be a non-negative integer, found {text!r}")
        return int(text)

    def set(self, version: int) -> None:
        """Set the policy version.

        Raises:
            ValueError: a negative or non-int version.
            QueueConnectionError: the server stayed unreachable.
        """
        check_version(version)
        key = self.keys.policy_version
        with_retries(f"SET {key}", lambda: self.client.set(key, str(version)), retries=self.retries)
