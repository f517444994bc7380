"""``RedisAdmissionController``: admission tickets in Redis, shared by every generator process of a run.

Each operation is one Lua script, so check-and-grant is atomic: concurrent generators never exceed
capacity. Leases are scored by the server clock (``TIME``) in a sorted set; the counters live in
one hash (``StreamKeys.admission``), the leases in ``StreamKeys.admission_leases``, and the
learner's version is read from ``StreamKeys.policy_version``.

Example: see ``tests/integration/test_redis_stream.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import redis

from posttrain.rollout.admission.tickets import (
    AdmissionState,
    OpenTickets,
    Ticket,
    capacity,
    check_controller_args,
    poll_until_granted,
)
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import QueueError
from posttrain.rollout.redis_streams import DEFAULT_RETRIES, as_client, with_retries

# KEYS[1] admission hash, KEYS[2] policy version key, KEYS[3] lease zset, KEYS[4] owners hash.
# ARGV: batch_size, max_staleness, lease_s, ticket_id, owner ('' = none).
# Returns {granted 0/1, version, started, capacity}.
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
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[4], ARGV[4], ARGV[5]) end
  redis.call('HINCRBY', KEYS[1], 'granted_total', 1)
  return {1, version, started + 1, cap}
end
return {0, version, started, cap}
"""

# KEYS[1] admission hash, KEYS[2] lease zset, KEYS[3] owners hash; ARGV[1] ticket_id. Returns 1 if the lease was live.
_CONSUME_LUA = """
redis.call('HDEL', KEYS[3], ARGV[1])
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 0 then redis.call('HINCRBY', KEYS[1], 'late_total', 1) end
redis.call('HINCRBY', KEYS[1], 'consumed', 1)
return live
"""

_RELEASE_LUA = """
redis.call('HDEL', KEYS[3], ARGV[1])
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 1 then redis.call('HINCRBY', KEYS[1], 'released_total', 1) end
return live
"""

# KEYS[1] admission hash, KEYS[2] lease zset, KEYS[3] owners hash; ARGV[1] heartbeat key prefix.
# Removes the leases whose owner's heartbeat key is gone (counted as expired) and owner entries
# of leases that ended otherwise. Returns the number of leases returned.
_RETURN_DEAD_LUA = """
local owners = redis.call('HGETALL', KEYS[3])
local alive = {}
local returned = 0
for i = 1, #owners, 2 do
  local ticket, owner = owners[i], owners[i + 1]
  if redis.call('ZSCORE', KEYS[2], ticket) == false then
    redis.call('HDEL', KEYS[3], ticket)
  else
    if alive[owner] == nil then alive[owner] = redis.call('EXISTS', ARGV[1] .. owner) end
    if alive[owner] == 0 then
      redis.call('ZREM', KEYS[2], ticket)
      redis.call('HDEL', KEYS[3], ticket)
      returned = returned + 1
    end
  end
end
if returned > 0 then redis.call('HINCRBY', KEYS[1], 'expired_total', returned) end
return returned
"""

# KEYS[1] admission hash; ARGV[1] count. Refunds at most consumed; the rest counts as unticketed.
# Returns consumed after the refund.
_REFUND_LUA = """
local consumed = tonumber(redis.call('HGET', KEYS[1], 'consumed') or '0')
local n = tonumber(ARGV[1])
local back = math.min(n, consumed)
redis.call('HINCRBY', KEYS[1], 'consumed', -back)
redis.call('HINCRBY', KEYS[1], 'refunded_total', back)
if n > back then redis.call('HINCRBY', KEYS[1], 'unticketed_total', n - back) end
return consumed - back
"""

# KEYS[1] admission hash, KEYS[2] policy version key; ARGV learner_version, batch_size.
# Returns the rollouts added to consumed (0 when the counters already cover learner_version).
_REBASE_LUA = """
local raw = redis.call('GET', KEYS[2])
local known = tonumber(raw or '0') or 0
local base = tonumber(redis.call('HGET', KEYS[1], 'base_version') or '0')
if base > known then known = base end
local v = tonumber(ARGV[1])
if v <= known then return 0 end
local added = (v - known) * tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[1], 'consumed', added)
redis.call('HINCRBY', KEYS[1], 'rebased_total', added)
redis.call('HSET', KEYS[1], 'base_version', v)
return added
"""

# KEYS[1] admission hash, KEYS[2] lease zset. Expires leases that ran out (as acquire does), so the
# counters add up at once. Returns {consumed, in_flight, granted, released, expired, refunded, late,
# unticketed, rebased}.
_STATE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if expired > 0 then redis.call('HINCRBY', KEYS[1], 'expired_total', expired) end
local function h(f) return tonumber(redis.call('HGET', KEYS[1], f) or '0') end
local live = redis.call('ZCARD', KEYS[2])
return {h('consumed'), live, h('granted_total'), h('released_total'), h('expired_total'),
        h('refunded_total'), h('late_total'), h('unticketed_total'), h('rebased_total')}
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
        owner: The generator id the tickets are taken for (recorded beside each lease, so
            ``return_leases_of_dead`` can give them back as soon as its heartbeat lapses); None
            for a controller that takes no tickets (the learner's).

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
        owner: str | None = None,
    ) -> None:
        check_controller_args(batch_size, max_staleness, lease_s, poll_interval_s)
        self.client = as_client(client_or_url)
        self.owner = owner
        self.keys = keys
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.lease_s = lease_s
        self.poll_interval_s = poll_interval_s
        self.retries = retries
        self._open = OpenTickets()
        self._acquire = self.client.register_script(_ACQUIRE_LUA)
        self._consume = self.client.register_script(_CONSUME_LUA)
        self._release = self.client.register_script(_RELEASE_LUA)
        self._refund = self.client.register_script(_REFUND_LUA)
        self._rebase = self.client.register_script(_REBASE_LUA)
        self._state = self.client.register_script(_STATE_LUA)
        self._return_dead = self.client.register_script(_RETURN_DEAD_LUA)

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
                keys=[k.admission, k.policy_version, k.admission_leases, k.admission_owners],
                args=[self.batch_size, self.max_staleness, repr(float(self.lease_s)), ticket_id, self.owner or ""],
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
        return poll_until_granted(self._try_once, timeout_s, self.poll_interval_s)

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
            QueueConnectionError: the server stayed unreachable.
        """
        self._open.close(ticket, "consumed")
        k = self.keys
        self._run(
            "consume",
            lambda: self._consume(keys=[k.admission, k.admission_leases, k.admission_owners], args=[ticket.ticket_id]),
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
            "release",
            lambda: self._release(keys=[k.admission, k.admission_leases, k.admission_owners], args=[ticket.ticket_id]),
        )

    def refund(self, count: int) -> None:
        """Give back the slots of ``count`` consumed rollouts the learner dropped (at most ``consumed``).

        Refunds beyond ``consumed`` (entries put without a ticket) are counted in ``unticketed_total``;
        they used to raise and crash the learner's warm-up refund.

        Raises:
            ValueError: ``count < 0``.
            QueueConnectionError: the server stayed unreachable.
        """
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        self._run("refund", lambda: self._refund(keys=[self.keys.admission], args=[count]))

    def rebase(self, learner_version: int) -> int:
        """Count the versions the counters never saw as consumed batches, in one script (``AdmissionController.rebase``).

        Raises:
            ValueError: ``learner_version < 0``.
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        if learner_version < 0:
            raise ValueError(f"learner_version: must be >= 0, got {learner_version}")
        k = self.keys
        return int(self._run("rebase", lambda: self._rebase(  # type: ignore[call-overload]
            keys=[k.admission, k.policy_version], args=[learner_version, self.batch_size])))

    def return_leases_of_dead(self) -> int:
        """Give back at once the in-flight tickets of generators whose heartbeat key has lapsed.

        A generator that dies holding tickets would otherwise hold their capacity until the leases
        run out (``generator.admission_lease_s``, 300 s by default), stalling a run at small tau.
        The returned leases count in ``expired_total``. One script call; its work is one step per
        in-flight ticket (at most the capacity). The learner calls it while it waits for rollouts.

        Returns:
            How many leases were returned.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        k = self.keys
        return int(self._run(  # type: ignore[call-overload]
            "return_leases_of_dead",
            lambda: self._return_dead(keys=[k.admission, k.admission_leases, k.admission_owners],
                                      args=[k.heartbeat_prefix]),
        ))

    def state(self) -> AdmissionState:
        """Current counters (one script call plus one GET of the version); leases that ran out count as expired.

        Raises:
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        k = self.keys
        raw = self._run("state", lambda: self._state(keys=[k.admission, k.admission_leases]))
        consumed, in_flight, granted, released, expired, refunded, late, unticketed, rebased = (
            int(x) for x in raw)  # type: ignore[attr-defined]
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
            unticketed_total=unticketed,
            rebased_total=rebased,
        )

