"""Staleness control: admission tickets for generators (AReaL-style capacity) and staleness stats.

SAO (arXiv 2607.07508) drops rollouts whose oldest generating policy version lags the learner
by more than tau (``max_staleness``); dropping biases training towards short tasks, so the
generators are first kept from starting work that would be too stale (admission control, as in
AReaL's staleness manager, arXiv 2505.24298). With ``B = batch_size`` and learner version ``v``,
a generator may start a rollout only while

    started < capacity(v) = (v + tau + 1) * B,   started = consumed + in_flight,

where ``consumed`` counts rollouts put on the stream (minus ``refund``s of rollouts the learner
dropped) and ``in_flight`` the tickets granted and not yet consumed or released. The learner
consumes B rollouts per version, so a rollout admitted at version v is trained by version
v + tau at the latest (if consumed in order, and if its engine was at v when it started).

Lifecycle: ``ticket = ctl.acquire(timeout_s)`` (None on timeout) -> run the episode ->
``queue.put(rollout); ctl.consume(ticket)``, or ``ctl.release(ticket)`` if the episode failed.
The learner calls ``ctl.refund(n)`` for rollouts it dropped (stale or dead-lettered) and for
rollouts that made no policy version (an SAO critic-only warm-up batch, GRPO groups whose rewards
are all equal) so their slots come back: capacity is counted in versions, and a batch consumed
without one would otherwise shrink it for the rest of the run. Each ticket is a lease
(``lease_s``): a generator that dies holding tickets does not shrink capacity forever; its
tickets expire.

Guarantees: in Redis, check-and-grant is one Lua script, so concurrent generators never exceed
capacity. Not guaranteed: a ticket whose lease expired before ``consume`` lets one extra
rollout start (counted in ``late_total``); per-rollout staleness still needs ``is_stale`` at
the learner because a generator engine may lag the version key.

Waiting on an event loop: ``AsyncTicketGate(ctl).acquire(timeout_s)`` waits for a ticket
without parking a thread. One coroutine at a time polls the controller with a non-blocking
``acquire(0)`` (one Lua call); between polls it sleeps on the loop with exponential backoff
(``min_interval_s`` doubling up to ``max_interval_s``), and ``wake()`` (a new policy version was
announced, so capacity grew) cuts the sleep short. The other waiting coroutines queue on an
``asyncio.Lock`` in arrival order, so a generator with 64 episode slots makes at most one poll
per interval instead of 64, and never fills the default thread pool with blocked ``acquire``
calls (which made the ``hf`` engine's batches queue behind them).

Example: see ``tests/unit/rollout/test_rollout_admission_memory.py`` and
``tests/unit/rollout/test_admission_async_gate.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import redis

from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import PolicyVersionStore, QueueError
from posttrain.rollout.redis_streams import DEFAULT_RETRIES, as_client, with_retries


def capacity(learner_version: int, max_staleness: int, batch_size: int) -> int:
    """Rollouts that may have been started in total at ``learner_version``: ``(v + tau + 1) * B``.

    Args:
        learner_version: Learner's policy version v (``>= 0``).
        max_staleness: tau, in policy versions (``>= 0``).
        batch_size: B, rollouts per optimizer step (``>= 1``).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    if learner_version < 0:
        raise ValueError(f"learner_version: must be >= 0, got {learner_version}")
    if max_staleness < 0:
        raise ValueError(f"max_staleness: must be >= 0, got {max_staleness}")
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    return (learner_version + max_staleness + 1) * batch_size


def is_stale(rollout_policy_version: int, learner_version: int, max_staleness: int) -> bool:
    """True when ``learner_version - rollout_policy_version > max_staleness`` (SAO drops the rollout).

    A rollout newer than the learner (negative staleness, e.g. after a learner restarted from an
    older checkpoint) is not stale.
    """
    return learner_version - rollout_policy_version > max_staleness


@dataclass(frozen=True)
class Ticket:
    """Permission to start one rollout.

    Attributes:
        ticket_id: Unique id (uuid4 hex).
        learner_version: Learner policy version when granted.
        started: ``consumed + in_flight`` after this grant (this ticket is number ``started``).
        capacity: ``(learner_version + max_staleness + 1) * batch_size`` at grant time.
    """

    ticket_id: str
    learner_version: int
    started: int
    capacity: int


@dataclass(frozen=True)
class AdmissionState:
    """Snapshot of the admission counters (all counts of rollouts).

    Attributes:
        learner_version: Current learner policy version.
        capacity: ``(learner_version + max_staleness + 1) * batch_size``.
        consumed: Rollouts put on the stream and not refunded.
        in_flight: Tickets granted, unexpired, not yet consumed or released.
        granted_total, released_total, expired_total, refunded_total, late_total: Running totals;
            ``late_total`` counts consumes whose lease had already expired.
    """

    learner_version: int
    capacity: int
    consumed: int
    in_flight: int
    granted_total: int
    released_total: int
    expired_total: int
    refunded_total: int
    late_total: int

    @property
    def started(self) -> int:
        """``consumed + in_flight``: what ``capacity`` bounds."""
        return self.consumed + self.in_flight

    def as_metrics(self) -> dict[str, float]:
        """Flat floats for MLflow: ``admission/<field>``."""
        fields = {k: float(v) for k, v in self.__dict__.items()}
        fields["started"] = float(self.started)
        return {f"admission/{k}": v for k, v in fields.items()}


@runtime_checkable
class AdmissionController(Protocol):
    """Admission tickets shared by all generators of a run."""

    def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds for a ticket; None if capacity stayed full."""
        ...

    def consume(self, ticket: Ticket) -> None:
        """The ticket's rollout is on the stream: it now counts as consumed."""
        ...

    def release(self, ticket: Ticket) -> None:
        """The episode failed and produced no rollout: give the slot back."""
        ...

    def refund(self, count: int) -> None:
        """The learner dropped ``count`` consumed rollouts (stale, dead-lettered): give their slots back."""
        ...

    def state(self) -> AdmissionState:
        """Current counters."""
        ...


def _check_args(batch_size: int, max_staleness: int, lease_s: float, poll_interval_s: float) -> None:
    capacity(0, max_staleness, batch_size)
    if lease_s <= 0:
        raise ValueError(f"lease_s: must be > 0 seconds, got {lease_s}")
    if poll_interval_s <= 0:
        raise ValueError(f"poll_interval_s: must be > 0 seconds, got {poll_interval_s}")


def _poll(try_once: Callable[[], Ticket | None], timeout_s: float, poll_interval_s: float) -> Ticket | None:
    if timeout_s < 0:
        raise ValueError(f"timeout_s: must be >= 0 seconds, got {timeout_s}")
    deadline = time.monotonic() + timeout_s
    while True:
        ticket = try_once()
        if ticket is not None:
            return ticket
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        time.sleep(min(poll_interval_s, remaining))


class _OpenTickets:
    """Ids granted by this controller and not yet consumed/released (catches double use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: set[str] = set()

    def add(self, ticket_id: str) -> None:
        with self._lock:
            self._ids.add(ticket_id)

    def close(self, ticket: Ticket, action: str) -> None:
        with self._lock:
            if ticket.ticket_id not in self._ids:
                raise ValueError(
                    f"ticket: {ticket.ticket_id} cannot be {action}: unknown to this controller, "
                    "or already consumed or released"
                )
            self._ids.remove(ticket.ticket_id)


class MemoryAdmissionController:
    """``AdmissionController`` in one process (thread-safe), reading ``version_store`` for v.

    Args:
        version_store: Source of the learner's policy version.
        batch_size: B, rollouts per optimizer step (``>= 1``).
        max_staleness: tau, policy versions (``>= 0``).
        lease_s: Seconds after which an unconsumed ticket expires (``> 0``).
        poll_interval_s: Sleep between capacity checks while waiting (seconds, ``> 0``).
        clock: Seconds clock for leases (``time.monotonic``; tests pass a hand-driven one).

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    def __init__(
        self,
        version_store: PolicyVersionStore,
        batch_size: int,
        max_staleness: int,
        lease_s: float = 3600.0,
        poll_interval_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_args(batch_size, max_staleness, lease_s, poll_interval_s)
        self.version_store = version_store
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.lease_s = lease_s
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._leases: dict[str, float] = {}  # ticket_id -> expiry, clock() seconds
        self._open = _OpenTickets()
        self._consumed = 0
        self._totals = {"granted": 0, "released": 0, "expired": 0, "refunded": 0, "late": 0}

    def _expire(self, now: float) -> None:
        dead = [t for t, exp in self._leases.items() if exp <= now]
        for t in dead:
            del self._leases[t]
        self._totals["expired"] += len(dead)

    def _try_once(self) -> Ticket | None:
        version = self.version_store.get()
        cap = capacity(version, self.max_staleness, self.batch_size)
        with self._lock:
            now = self.clock()
            self._expire(now)
            started = self._consumed + len(self._leases)
            if started >= cap:
                return None
            ticket = Ticket(uuid.uuid4().hex, version, started + 1, cap)
            self._leases[ticket.ticket_id] = now + self.lease_s
            self._totals["granted"] += 1
        self._open.add(ticket.ticket_id)
        return ticket

    def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None if capacity stayed full.

        Raises:
            ValueError: ``timeout_s < 0``.
        """
        return _poll(self._try_once, timeout_s, self.poll_interval_s)

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "consumed")
        with self._lock:
            if self._leases.pop(ticket.ticket_id, None) is None:
                self._totals["late"] += 1
            self._consumed += 1

    def release(self, ticket: Ticket) -> None:
        """Give the slot of a failed episode back.

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
        """
        self._open.close(ticket, "released")
        with self._lock:
            if self._leases.pop(ticket.ticket_id, None) is not None:
                self._totals["released"] += 1

    def refund(self, count: int) -> None:
        """Give back the slots of ``count`` consumed rollouts the learner dropped.

        Raises:
            ValueError: ``count < 0`` or more than are consumed.
        """
        with self._lock:
            if count < 0 or count > self._consumed:
                raise ValueError(f"count: must be in [0, consumed={self._consumed}], got {count}")
            self._consumed -= count
            self._totals["refunded"] += count

    def state(self) -> AdmissionState:
        """Current counters."""
        version = self.version_store.get()
        with self._lock:
            self._expire(self.clock())
            return AdmissionState(
                learner_version=version,
                capacity=capacity(version, self.max_staleness, self.batch_size),
                consumed=self._consumed,
                in_flight=len(self._leases),
                **{f"{k}_total": v for k, v in self._totals.items()},
            )


# KEYS[1] admission hash, KEYS[2] policy version key, KEYS[3] lease zset.
# ARGV: batch_size, max_staleness, lease_s, ticket_id. Returns {granted 0/1, version, started, capacity}.
_ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local raw = redis.call('GET', KEYS[2])
local version = 0
if raw then
  version = tonumber(raw)
  if version == nil or version < 0 or version % 1 ~= 0 then
    return redis.error_reply('policy version key ' .. KEYS[2] .. ' holds ' .. tostring(raw))
  end
end
local expired = redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if expired > 0 then redis.call('HINCRBY', KEYS[1], 'expired_total', expired) end
local consumed = tonumber(redis.call('HGET', KEYS[1], 'consumed') or '0')
local started = consumed + redis.call('ZCARD', KEYS[3])
local cap = (version + tonumber(ARGV[2]) + 1) * tonumber(ARGV[1])
if started < cap then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'granted_total', 1)
  return {1, version, started + 1, cap}
end
return {0, version, started, cap}
"""

# KEYS[1] admission hash, KEYS[2] lease zset; ARGV[1] ticket_id. Returns 1 if the lease was live.
_CONSUME_LUA = """
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 0 then redis.call('HINCRBY', KEYS[1], 'late_total', 1) end
redis.call('HINCRBY', KEYS[1], 'consumed', 1)
return live
"""

_RELEASE_LUA = """
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 1 then redis.call('HINCRBY', KEYS[1], 'released_total', 1) end
return live
"""

# KEYS[1] admission hash; ARGV[1] count. Returns consumed after the refund, or -1 if count > consumed.
_REFUND_LUA = """
local consumed = tonumber(redis.call('HGET', KEYS[1], 'consumed') or '0')
local n = tonumber(ARGV[1])
if n > consumed then return -1 end
redis.call('HINCRBY', KEYS[1], 'consumed', -n)
redis.call('HINCRBY', KEYS[1], 'refunded_total', n)
return consumed - n
"""

# KEYS[1] admission hash, KEYS[2] lease zset. Returns {consumed, in_flight, granted, released, expired, refunded, late}.
_STATE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function h(f) return tonumber(redis.call('HGET', KEYS[1], f) or '0') end
local live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
return {h('consumed'), live, h('granted_total'), h('released_total'), h('expired_total'),
        h('refunded_total'), h('late_total')}
"""


class RedisAdmissionController:
    """``AdmissionController`` in Redis, shared by generator processes; the version comes from the run's key.

    Args:
        client_or_url: A redis-py client or URL.
        keys: Key names of the run (uses ``admission``, ``admission_leases``, ``policy_version``).
        batch_size: B, rollouts per optimizer step (``>= 1``).
        max_staleness: tau, policy versions (``>= 0``).
        lease_s: Seconds after which an unconsumed ticket expires (``> 0``), by the server clock.
        poll_interval_s: Sleep between capacity checks while waiting (seconds, ``> 0``).
        retries: Retries per operation on connection errors.

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    def __init__(
        self,
        client_or_url: redis.Redis | str,
        keys: StreamKeys,
        batch_size: int,
        max_staleness: int,
        lease_s: float = 3600.0,
        poll_interval_s: float = 0.05,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        _check_args(batch_size, max_staleness, lease_s, poll_interval_s)
        self.client = as_client(client_or_url)
        self.keys = keys
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.lease_s = lease_s
        self.poll_interval_s = poll_interval_s
        self.retries = retries
        self._open = _OpenTickets()
        self._acquire = self.client.register_script(_ACQUIRE_LUA)
        self._consume = self.client.register_script(_CONSUME_LUA)
        self._release = self.client.register_script(_RELEASE_LUA)
        self._refund = self.client.register_script(_REFUND_LUA)
        self._state = self.client.register_script(_STATE_LUA)

    def _run(self, op: str, fn: Callable[[], object]) -> object:
        def call() -> object:
            try:
                return fn()
            except redis.ResponseError as exc:
                raise QueueError(f"admission {op} on {self.keys.admission}: {exc}") from exc

        return with_retries(f"admission {op} on {self.keys.admission}", call, retries=self.retries)

    def _try_once(self) -> Ticket | None:
        ticket_id = uuid.uuid4().hex
        k = self.keys
        reply = self._run(
            "acquire",
            lambda: self._acquire(
                keys=[k.admission, k.policy_version, k.admission_leases],
                args=[self.batch_size, self.max_staleness, repr(float(self.lease_s)), ticket_id],
            ),
        )
        granted, version, started, cap = (int(x) for x in reply)  # type: ignore[attr-defined]
        if not granted:
            return None
        self._open.add(ticket_id)
        return Ticket(ticket_id, version, started, cap)

    def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None if capacity stayed full.

        Raises:
            ValueError: ``timeout_s < 0``.
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        return _poll(self._try_once, timeout_s, self.poll_interval_s)

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
            QueueConnectionError: the server stayed unreachable.
        """
        self._open.close(ticket, "consumed")
        k = self.keys
        self._run(
            "consume", lambda: self._consume(keys=[k.admission, k.admission_leases], args=[ticket.ticket_id])
        )

    def release(self, ticket: Ticket) -> None:
        """Give the slot of a failed episode back.

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
            QueueConnectionError: the server stayed unreachable.
        """
        self._open.close(ticket, "released")
        k = self.keys
        self._run(
            "release", lambda: self._release(keys=[k.admission, k.admission_leases], args=[ticket.ticket_id])
        )

    def refund(self, count: int) -> None:
        """Give back the slots of ``count`` consumed rollouts the learner dropped.

        Raises:
            ValueError: ``count < 0`` or more than are consumed.
            QueueConnectionError: the server stayed unreachable.
        """
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        left = int(self._run("refund", lambda: self._refund(keys=[self.keys.admission], args=[count])))  # type: ignore[call-overload]
        if left < 0:
            raise ValueError(f"count: {count} is more than the consumed rollouts in {self.keys.admission}")

    def state(self) -> AdmissionState:
        """Current counters (one script call plus one GET of the version).

        Raises:
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        k = self.keys
        raw = self._run("state", lambda: self._state(keys=[k.admission, k.admission_leases]))
        consumed, in_flight, granted, released, expired, refunded, late = (int(x) for x in raw)  # type: ignore[attr-defined]
        raw_version = self._run("state", lambda: self.client.get(k.policy_version))
        text = raw_version.decode() if isinstance(raw_version, bytes) else "0"
        if not text.isdigit():
            raise QueueError(
                f"{k.policy_version}: policy version must be a non-negative integer, found {text!r}"
            )
        version = int(text)
        return AdmissionState(
            learner_version=version,
            capacity=capacity(version, self.max_staleness, self.batch_size),
            consumed=consumed,
            in_flight=in_flight,
            granted_total=granted,
            released_total=released,
            expired_total=expired,
            refunded_total=refunded,
            late_total=late,
        )


class AsyncTicketGate:
    """Waits for admission tickets on an asyncio event loop, with no thread parked (module docstring).

    Each poll is one non-blocking ``controller.acquire(0.0)`` run on the loop itself (for Redis,
    one loopback round trip, about 0.1 ms); the gate never uses an executor. Only the coroutine
    holding the gate's lock polls; the others wait for the lock in arrival order. Polls per
    ``acquire(timeout_s)`` are bounded by ``1 + ceil(log2(max/min)) + timeout_s / max_interval_s``
    (plus one per ``wake()``).

    Args:
        controller: The run's admission controller (Redis or in-memory).
        min_interval_s: First sleep after a refused poll (seconds, > 0).
        max_interval_s: Longest sleep between polls (seconds, >= ``min_interval_s``).

    Attributes:
        polls: Controller checks made so far (granted or refused).
        granted: Tickets handed out so far.

    Raises:
        ValueError: an interval out of range (the message names it).
    """

    def __init__(self, controller: AdmissionController, min_interval_s: float = 0.005,
                 max_interval_s: float = 0.1) -> None:
        if not min_interval_s > 0:
            raise ValueError(f"min_interval_s: must be > 0 seconds, got {min_interval_s}")
        if not max_interval_s >= min_interval_s:
            raise ValueError(f"max_interval_s: must be >= min_interval_s={min_interval_s}, got {max_interval_s}")
        self.controller = controller
        self.min_interval_s = min_interval_s
        self.max_interval_s = max_interval_s
        self.polls = 0
        self.granted = 0
        self._lock: asyncio.Lock | None = None
        self._woken: asyncio.Event | None = None

    def _bind(self) -> tuple[asyncio.Lock, asyncio.Event]:
        # Created lazily so the gate can be built outside the loop that uses it.
        if self._lock is None or self._woken is None:
            self._lock, self._woken = asyncio.Lock(), asyncio.Event()
        return self._lock, self._woken

    def wake(self) -> None:
        """Capacity may have grown (a new policy version, refunds): poll again now, backoff reset."""
        _, woken = self._bind()
        woken.set()

    async def acquire(self, timeout_s: float) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None on timeout.

        The wait for the gate's lock counts against ``timeout_s`` (but lasts at least
        ``min_interval_s``); then polls continue until the deadline.

        Raises:
            ValueError: ``timeout_s < 0``.
            QueueError / QueueConnectionError: from the controller (Redis controller only).
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s: must be >= 0 seconds, got {timeout_s}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        lock, woken = self._bind()
        if lock.locked() and timeout_s == 0:
            return None
        try:
            # At least one backoff interval, so a zero timeout still gets a free lock.
            await asyncio.wait_for(lock.acquire(), timeout=max(timeout_s, self.min_interval_s))
        except TimeoutError:
            return None
        try:
            interval = self.min_interval_s
            while True:
                woken.clear()
                self.polls += 1
                ticket = self.controller.acquire(0.0)
                if ticket is not None:
                    self.granted += 1
                    return ticket
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(woken.wait(), timeout=min(interval, remaining))
                    interval = self.min_interval_s
                except TimeoutError:
                    interval = min(2 * interval, self.max_interval_s)
        finally:
            lock.release()


class StalenessStats:
    """Histogram of ``learner_version - rollout.policy_version`` over consumed rollouts, and drops.

    Args:
        max_staleness: tau; bins ``hist_0`` .. ``hist_<tau>``, plus ``hist_over`` for larger lags.

    Raises:
        ValueError: ``max_staleness < 0``.
    """

    def __init__(self, max_staleness: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness: must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.hist = [0] * (max_staleness + 1)
        self.over = 0
        self.ahead = 0
        self.count = 0
        self.total = 0
        self.max = 0
        self.dropped = 0

    def observe(self, rollout_policy_version: int, learner_version: int) -> int:
        """Record one rollout; return its staleness (policy versions, may be negative).

        A negative staleness (rollout newer than the learner, after a learner restart from an
        older checkpoint) is counted in ``staleness/ahead_total`` only, not in the histogram.
        """
        s = learner_version - rollout_policy_version
        if s < 0:
            self.ahead += 1
            return s
        self.count += 1
        self.total += s
        self.max = max(self.max, s)
        if s <= self.max_staleness:
            self.hist[s] += 1
        else:
            self.over += 1
        return s

    def record_dropped(self, count: int = 1) -> None:
        """Count ``count`` rollouts the learner dropped (``>= 0``; raises ValueError otherwise)."""
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        self.dropped += count

    def as_metrics(self) -> dict[str, float]:
        """Cumulative flat metrics for MLflow.

        Keys: ``staleness/mean``, ``/max``, ``/count`` (non-negative observations),
        ``/dropped_total``, ``/ahead_total``, ``/hist_0`` .. ``/hist_<tau>``, ``/hist_over``.
        """
        out = {
            "staleness/mean": self.total / self.count if self.count else 0.0,
            "staleness/max": float(self.max),
            "staleness/count": float(self.count),
            "staleness/dropped_total": float(self.dropped),
            "staleness/ahead_total": float(self.ahead),
        }
        for s, c in enumerate(self.hist):
            out[f"staleness/hist_{s}"] = float(c)
        out["staleness/hist_over"] = float(self.over)
        return out
