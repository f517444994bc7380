"""``RedisAdmissionController``: admission tickets in Redis, shared by every generator process of a run.

Each operation is one Lua script, so check-and-grant is atomic: concurrent generators never exceed
capacity. Leases are scored by the server clock (``TIME``) in a sorted set; the counters live in
one hash (``StreamKeys.admission``), the leases in ``StreamKeys.admission_leases``, and the
learner's version is read from ``StreamKeys.policy_version``.

Example: see ``tests/integration/test_redis_stream.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis

from posttrain.rollout.admission.tickets import (
    AdmissionState,
    OpenTickets,
    ReissuedTask,
    Ticket,
    capacity,
    check_controller_args,
    check_refund_args,
    check_release_infra_args,
    poll_until_granted,
)
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import QueueError
from posttrain.rollout.redis_streams import DEFAULT_RETRIES, as_client, with_retries

# KEYS[1] admission hash, KEYS[2] policy version key, KEYS[3] lease zset, KEYS[4] owners hash.
# ARGV: batch_size, max_staleness, lease_s, ticket_id, owner ('' = none), served version ('' = unknown).
# Returns {granted 0/1, version, started, capacity, engine behind 0/1}.
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
  if ARGV[6] ~= '' and version - tonumber(ARGV[6]) > tonumber(ARGV[2]) then
    redis.call('HINCRBY', KEYS[1], 'engine_behind_total', 1)
    return {0, version, started, cap, 1}
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[4])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[4], ARGV[4], ARGV[5]) end
  redis.call('HINCRBY', KEYS[1], 'granted_total', 1)
  return {1, version, started + 1, cap, 0}
end
return {0, version, started, cap, 0}
"""

# KEYS[1] admission hash, KEYS[2] lease zset, KEYS[3] owners hash, KEYS[4] tasks hash; ARGV[1] ticket_id.
# Returns 1 if the lease was live.
_CONSUME_LUA = """
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 0 then redis.call('HINCRBY', KEYS[1], 'late_total', 1) end
redis.call('HINCRBY', KEYS[1], 'consumed', 1)
redis.call('HINCRBY', KEYS[1], 'completed_total', 1)
return live
"""

_RELEASE_LUA = """
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 1 then redis.call('HINCRBY', KEYS[1], 'released_total', 1) end
return live
"""

# KEYS as _RELEASE_LUA plus KEYS[5] re-issue list; ARGV ticket_id, cause, task record ('' = given up),
# '1' when the episode's client owns the retry (the gateway's external agents; then the record is '').
_RELEASE_INFRA_LUA = """
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
local live = redis.call('ZREM', KEYS[2], ARGV[1])
if live == 1 then redis.call('HINCRBY', KEYS[1], 'released_total', 1) end
redis.call('HINCRBY', KEYS[1], 'infra_total', 1)
redis.call('HINCRBY', KEYS[1], 'infra:' .. ARGV[2], 1)
if ARGV[3] ~= '' then
  redis.call('RPUSH', KEYS[5], ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'reissued_total', 1)
elseif ARGV[4] == '1' then
  redis.call('HINCRBY', KEYS[1], 'client_retry_total', 1)
else
  redis.call('HINCRBY', KEYS[1], 'abandoned_total', 1)
end
return live
"""

# KEYS[1] admission hash, KEYS[2] lease zset, KEYS[3] owners hash, KEYS[4] tasks hash, KEYS[5] re-issue
# list; ARGV[1] heartbeat key prefix, ARGV[2] an owner to treat as dead whatever its heartbeat ('' = none:
# a generator's new life passes its own id). Every ticket of a dead owner is lost in flight: its lease
# is removed (a live one counted as expired), its task record moved to the re-issue list. A lease that
# ran out while its owner lives keeps its entries (a late consume clears them). Returns the tickets lost.
_RETURN_DEAD_LUA = """
local owners = redis.call('HGETALL', KEYS[3])
local dead = {}
local lost, expired, reissued = 0, 0, 0
for i = 1, #owners, 2 do
  local ticket, owner = owners[i], owners[i + 1]
  if dead[owner] == nil then
    dead[owner] = owner == ARGV[2] or redis.call('EXISTS', ARGV[1] .. owner) == 0
  end
  if dead[owner] then
    expired = expired + redis.call('ZREM', KEYS[2], ticket)
    redis.call('HDEL', KEYS[3], ticket)
    local task = redis.call('HGET', KEYS[4], ticket)
    if task then
      redis.call('HDEL', KEYS[4], ticket)
      redis.call('RPUSH', KEYS[5], task)
      reissued = reissued + 1
    end
    lost = lost + 1
  end
end
if expired > 0 then redis.call('HINCRBY', KEYS[1], 'expired_total', expired) end
if lost > 0 then redis.call('HINCRBY', KEYS[1], 'lost_total', lost) end
if reissued > 0 then redis.call('HINCRBY', KEYS[1], 'reissued_total', reissued) end
return lost
"""

# KEYS[1] admission hash, KEYS[2] refunded-entries set; ARGV[1] count, then the entry ids (none: a
# plain count). With ids, only those not refunded before count. Refunds at most consumed; the rest
# counts as unticketed. Returns the slots given back.
_REFUND_LUA = """
local n = tonumber(ARGV[1])
if #ARGV > 1 then
  n = 0
  for i = 2, #ARGV do n = n + redis.call('SADD', KEYS[2], ARGV[i]) end
end
local consumed = tonumber(redis.call('HGET', KEYS[1], 'consumed') or '0')
local back = math.min(n, consumed)
redis.call('HINCRBY', KEYS[1], 'consumed', -back)
redis.call('HINCRBY', KEYS[1], 'refunded_total', back)
if n > back then redis.call('HINCRBY', KEYS[1], 'unticketed_total', n - back) end
return back
"""

# KEYS[1] admission hash, KEYS[2] refunded-entries set; ARGV[1] number of trained ids, the trained ids,
# then acknowledged ids. A trained id that was refunded takes its place back; every id leaves the set.
# Returns the places taken back.
_SETTLE_LUA = """
local trained = tonumber(ARGV[1])
local retaken = 0
for i = 2, #ARGV do
  local gone = redis.call('SREM', KEYS[2], ARGV[i])
  if i <= trained + 1 then retaken = retaken + gone end
end
if retaken > 0 then
  redis.call('HINCRBY', KEYS[1], 'consumed', retaken)
  redis.call('HINCRBY', KEYS[1], 'retaken_total', retaken)
end
return retaken
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
# counters add up at once. Returns {in_flight, then the admission hash as field/value pairs}.
_STATE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expired = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if expired > 0 then redis.call('HINCRBY', KEYS[1], 'expired_total', expired) end
return {redis.call('ZCARD', KEYS[2]), redis.call('HGETALL', KEYS[1])}
"""

_STATE_FIELDS = ("granted_total", "released_total", "expired_total", "refunded_total", "late_total",
                 "unticketed_total", "rebased_total", "completed_total", "infra_total", "reissued_total",
                 "abandoned_total", "lost_total", "retaken_total", "engine_behind_total", "client_retry_total")
_ID_CHUNK = 1000


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
        self._release_infra = self.client.register_script(_RELEASE_INFRA_LUA)
        self._settle = self.client.register_script(_SETTLE_LUA)
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

    def _try_once(self, served_version: int | None = None) -> Ticket | None:
        ticket_id = uuid.uuid4().hex
        k = self.keys
        served = "" if served_version is None else str(int(served_version))
        reply = self._run(
            "acquire",
            lambda: self._acquire(
                keys=[k.admission, k.policy_version, k.admission_leases, k.admission_owners],
                args=[self.batch_size, self.max_staleness, repr(float(self.lease_s)), ticket_id, self.owner or "",
                      served],
            ),
        )
        granted, version, started, cap, _behind = (int(x) for x in reply)  # type: ignore[attr-defined]
        if not granted:
            return None
        self._open.add(ticket_id)
        return Ticket(ticket_id, version, started, cap)

    def acquire(self, timeout_s: float, served_version: int | None = None) -> Ticket | None:
        """Wait up to ``timeout_s`` seconds (``>= 0``) for a ticket; None if capacity stayed full.

        No ticket while the learner is more than tau versions ahead of ``served_version``
        (``AdmissionController.acquire``); checked in the same script as capacity.

        Raises:
            ValueError: ``timeout_s < 0``.
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        return poll_until_granted(lambda: self._try_once(served_version), timeout_s, self.poll_interval_s)

    def _ticket_keys(self) -> list[str]:
        k = self.keys
        return [k.admission, k.admission_leases, k.admission_owners, k.admission_tasks]

    def consume(self, ticket: Ticket) -> None:
        """Count the ticket's rollout as consumed (call after ``queue.put``).

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
            QueueConnectionError: the server stayed unreachable.
        """
        self._open.close(ticket, "consumed")
        self._run("consume", lambda: self._consume(keys=self._ticket_keys(), args=[ticket.ticket_id]))

    def release(self, ticket: Ticket) -> None:
        """Give the slot of a failed episode back.

        Raises:
            ValueError: the ticket is unknown or already consumed/released.
            QueueConnectionError: the server stayed unreachable.
        """
        self._open.close(ticket, "released")
        self._run("release", lambda: self._release(keys=self._ticket_keys(), args=[ticket.ticket_id]))

    def release_infra(self, ticket: Ticket, cause: str, reissue: ReissuedTask | None, *,
                      client_retries: bool = False) -> None:
        """Give the slot back, count the failure by ``cause`` and queue ``reissue``, in one script.

        Raises:
            ValueError: the ticket is unknown or already consumed/released; ``client_retries`` with a ``reissue``.
            QueueConnectionError: the server stayed unreachable.
        """
        check_release_infra_args(reissue, client_retries)
        self._open.close(ticket, "released")
        record = reissue.encode() if reissue is not None else ""
        self._run("release_infra", lambda: self._release_infra(
            keys=[*self._ticket_keys(), self.keys.reissue],
            args=[ticket.ticket_id, cause, record, "1" if client_retries else "0"]))

    def assign(self, ticket: Ticket, task: ReissuedTask) -> None:
        """Record the task ``ticket`` runs (``HSET``); a loss in flight moves it to the re-issue list.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        self._run("assign", lambda: self.client.hset(self.keys.admission_tasks, ticket.ticket_id, task.encode()))

    def take_reissued(self) -> ReissuedTask | None:
        """The oldest task queued to run again (``LPOP``), or None.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        raw = self._run("take_reissued", lambda: self.client.lpop(self.keys.reissue))
        return None if raw is None else ReissuedTask.decode(raw)  # type: ignore[arg-type]

    def refund(self, count: int, entry_ids: Sequence[str] | None = None) -> int:
        """Give back the slots of ``count`` consumed rollouts the learner dropped (at most ``consumed``).

        Refunds beyond ``consumed`` (entries put without a ticket) are counted in ``unticketed_total``;
        they used to raise and crash the learner's warm-up refund. With ``entry_ids`` each entry is
        refunded once until ``settle`` (``AdmissionController.refund``).

        Returns:
            Slots given back.

        Raises:
            ValueError: ``count < 0``, or ``entry_ids`` not one per rollout.
            QueueConnectionError: the server stayed unreachable.
        """
        check_refund_args(count, entry_ids)
        k = self.keys
        ids = list(entry_ids or [])
        return int(self._run("refund", lambda: self._refund(  # type: ignore[call-overload]
            keys=[k.admission, k.admission_refunded], args=[count, *ids])))

    def settle(self, trained: Sequence[str] = (), acked: Sequence[str] = ()) -> int:
        """Refunded entries about to be trained take their place back; acknowledged ones are forgotten.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        retaken = 0
        for ids, is_trained in ((list(trained), True), (list(acked), False)):
            for i in range(0, len(ids), _ID_CHUNK):
                retaken += self._settle_chunk(ids[i : i + _ID_CHUNK], is_trained)
        return retaken

    def _settle_chunk(self, ids: list[str], trained: bool) -> int:
        k = self.keys
        reply: Any = self._run("settle", lambda: self._settle(
            keys=[k.admission, k.admission_refunded], args=[len(ids) if trained else 0, *ids]))
        return int(reply)

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
        Each such ticket is an episode lost in flight (``lost_total``): its task goes to the
        re-issue list (``take_reissued``); a lease still live counts in ``expired_total``. One
        script call; its work is one step per in-flight ticket (at most the capacity). The learner
        calls it at every iteration.

        Returns:
            How many tickets were lost in flight.

        Raises:
            QueueConnectionError: the server stayed unreachable.
        """
        return self._return_lost("")

    def release_leases_of(self, owner: str) -> int:
        """A generator's new life gives back the tickets its previous life held (same id), at start.

        Restarted under the same id, a generator renews the same heartbeat, so the dead-owner rule
        never frees what its previous life held: the leases stayed taken until they ran out and the
        killed episodes were never re-issued (issue 32). Called before the new life takes a ticket,
        so every ticket of ``owner`` is the previous life's: each is lost in flight (``lost_total``)
        and its task re-issued, as in ``return_leases_of_dead``.

        Returns:
            How many tickets were lost in flight.

        Raises:
            ValueError: an empty ``owner``.
            QueueConnectionError: the server stayed unreachable.
        """
        if not owner:
            raise ValueError("owner: must be a generator id, got ''")
        return self._return_lost(owner)

    def _return_lost(self, owner: str) -> int:
        k = self.keys
        return int(self._run(  # type: ignore[call-overload]
            "return_leases_of_dead",
            lambda: self._return_dead(keys=[*self._ticket_keys(), k.reissue], args=[k.heartbeat_prefix, owner]),
        ))

    def state(self) -> AdmissionState:
        """Current counters (one script call plus one GET of the version); leases that ran out count as expired.

        Raises:
            QueueError: the version key holds a non-integer.
            QueueConnectionError: the server stayed unreachable.
        """
        k = self.keys
        raw: Any = self._run("state", lambda: self._state(keys=[k.admission, k.admission_leases]))
        in_flight, pairs = int(raw[0]), raw[1]
        fields = {_text(pairs[i]): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
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
            consumed=fields.get("consumed", 0),
            in_flight=in_flight,
            infra_by_cause={f[len("infra:"):]: n for f, n in fields.items() if f.startswith("infra:")},
            **{f: fields.get(f, 0) for f in _STATE_FIELDS},
        )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

