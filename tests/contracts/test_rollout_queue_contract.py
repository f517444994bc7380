"""The ``RolloutQueue`` contract: one suite that every rollout-queue backend must pass.

Each ``@contract`` test states one guarantee of ``posttrain.rollout.queue.RolloutQueue`` and runs
on every backend: ``MemoryRolloutQueue`` and ``RedisStreamQueue`` on the embedded Valkey server
(those cases are marked ``integration``). A backend enters through a harness (``QueueBackend``)
that opens queue objects on one stream -- a new object with an old consumer name is a restarted
process -- and does what a server or a crash would do: append raw fields, delete entries.

``test_the_contract_rejects_a_broken_twin`` runs the same checks against ``FaultyQueue`` (a
real queue with one fault injected: acks on read, or claims entries that are not idle) and
expects the checks of the broken guarantee to fail, so a check that passes anything is caught.

Backend-specific behaviour stays beside its backend: approximate ``maxlen`` trimming, arrays
mode, group re-creation, retries and client checks in ``tests/integration/test_redis_stream.py``;
exact trimming and id parsing in ``tests/unit/rollout/test_rollout_memory_queue.py``.

Run: .venv/bin/python -m pytest -q tests/contracts/test_rollout_queue_contract.py
(``-m "not integration"`` runs the in-memory backend only, without a server.)
"""

from __future__ import annotations

import math
import pickle
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import pytest
import redis

from posttrain.records import RecordError, Rollout, encode_rollout, pack_rollout_unvalidated
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.memory_queue import MemoryRolloutQueue, MemoryStream
from posttrain.rollout.queue import DeadLetter, DeadLetterHook, QueueEntry, RolloutLimits, RolloutQueue
from posttrain.rollout.redis_streams import RedisStreamQueue, connect


def make_rollout(i: int, num_tokens: int = 4, policy_version: int = 0) -> Rollout:
    return Rollout(
        rollout_id=f"r{i}",
        task_id=f"t{i}",
        env_name="synthetic_arith",
        token_ids=list(range(num_tokens)),
        behaviour_logprobs=[0.0] + [-0.5] * (num_tokens - 1),
        action_mask=[False] + [True] * (num_tokens - 1),
        reward=1.0,
        policy_version=policy_version,
    )


BLOCK_MS = 50
"""Longest single blocking read on Redis: short, so waits here span several reads."""


# ---------------------------------------------------------------- backends


class QueueBackend(Protocol):
    """One rollout stream of one backend, as the contract tests see it."""

    def queue(self, consumer: str = "learner-0") -> RolloutQueue:
        """A new consumer-side queue object (a new process) for ``consumer`` on this stream."""
        ...

    def producer(self) -> RolloutQueue:
        """A new generator-side queue object; it only puts and creates no consumer group."""
        ...

    def append_raw(self, fields: dict[str, bytes]) -> str:
        """Append an entry with these fields, unvalidated (a buggy or hostile producer); return its id."""
        ...

    def delete(self, entry_ids: Sequence[str]) -> None:
        """Remove entries from the stream as trimming does, whether pending or not."""
        ...

    def stored_fields(self, entry_id: str) -> dict[str, bytes]:
        """The fields of one entry exactly as the stream holds them."""
        ...

    def close(self) -> None:
        """Release what the backend opened."""
        ...


class MemoryBackend:
    """``MemoryRolloutQueue`` objects sharing one ``MemoryStream``; ``wrap`` turns each into a twin."""

    def __init__(self, wrap: Callable[[RolloutQueue], RolloutQueue] | None = None) -> None:
        self.stream = MemoryStream()
        self.wrap = wrap

    def queue(self, consumer: str = "learner-0") -> RolloutQueue:
        q = MemoryRolloutQueue(self.stream, consumer=consumer)
        return self.wrap(q) if self.wrap is not None else q

    def producer(self) -> RolloutQueue:
        return MemoryRolloutQueue(self.stream, consumer="generator-0")

    def append_raw(self, fields: dict[str, bytes]) -> str:
        return self.stream.add(fields)

    def delete(self, entry_ids: Sequence[str]) -> None:
        with self.stream.cond:
            for entry_id in entry_ids:
                self.stream.entries.pop(int(entry_id.split("-")[0]), None)

    def stored_fields(self, entry_id: str) -> dict[str, bytes]:
        with self.stream.cond:
            return dict(self.stream.entries[int(entry_id.split("-")[0])])

    def close(self) -> None:
        pass


class RedisBackend:
    """``RedisStreamQueue`` objects on a fresh run of the embedded server, each on its own connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys = StreamKeys(prefix="contract", run=uuid.uuid4().hex[:12])
        self.admin = connect(url)
        self._clients: list[redis.Redis] = [self.admin]

    def _client(self) -> redis.Redis:
        client = connect(self.url)
        self._clients.append(client)
        return client

    def queue(self, consumer: str = "learner-0") -> RolloutQueue:
        return RedisStreamQueue(self._client(), self.keys, consumer=consumer, block_ms=BLOCK_MS)

    def producer(self) -> RolloutQueue:
        return RedisStreamQueue(self._client(), self.keys, create_group=False)

    def append_raw(self, fields: dict[str, bytes]) -> str:
        return self.admin.xadd(self.keys.rollouts, fields).decode()  # type: ignore[arg-type]

    def delete(self, entry_ids: Sequence[str]) -> None:
        self.admin.xdel(self.keys.rollouts, *entry_ids)

    def stored_fields(self, entry_id: str) -> dict[str, bytes]:
        [(_, fields)] = self.admin.xrange(self.keys.rollouts, min=entry_id, max=entry_id)
        return {k.decode(): v for k, v in fields.items()}

    def close(self) -> None:
        self.admin.delete(*self.keys.all_keys().values())
        for client in self._clients:
            client.close()


KNOWN_REDIS_DIVERGENCES: dict[str, str] = {}
"""Contract checks the Redis backend is known to fail, with why: a strict xfail, so a fix shows."""


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
def backend(request):
    if request.param == "memory":
        b: MemoryBackend | RedisBackend = MemoryBackend()
    else:
        b = RedisBackend(request.getfixturevalue("redis_server").url)
        reason = KNOWN_REDIS_DIVERGENCES.get(request.node.originalname)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    yield b
    b.close()


QUEUE_CONTRACT: list[Callable[[QueueBackend], None]] = []


def contract(check: Callable[[QueueBackend], None]) -> Callable[[QueueBackend], None]:
    """Register ``check`` as a contract test (pytest runs it per backend; the twin test reruns it)."""
    QUEUE_CONTRACT.append(check)
    return check


def ids_of(entries: Sequence[QueueEntry]) -> list[str]:
    return [e.entry_id for e in entries]


# ---------------------------------------------------------------- delivery and ack


@contract
def test_queue_satisfies_the_protocol(backend: QueueBackend) -> None:
    assert isinstance(backend.queue(), RolloutQueue)
    assert isinstance(backend.producer(), RolloutQueue)


@contract
def test_put_get_ack_round_trip_keeps_order_and_content(backend: QueueBackend) -> None:
    """3 puts -> one get_batch of 3 in put order, equal rollouts; 3 pending; ack -> 3, then 0 again."""
    q = backend.queue()
    ids = [q.put(make_rollout(i, policy_version=i)) for i in range(3)]
    assert len(set(ids)) == 3
    batch = q.get_batch(3, timeout_s=0.0)
    assert ids_of(batch) == ids
    assert [e.rollout for e in batch] == [make_rollout(i, policy_version=i) for i in range(3)]
    assert q.pending() == ids
    assert q.ack([]) == 0
    assert q.ack(ids) == 3
    assert q.pending() == []
    assert q.ack(ids) == 0
    assert q.get_batch(5, timeout_s=0.0) == []


@contract
def test_a_delivered_entry_is_not_handed_out_twice_by_the_same_queue_object(backend: QueueBackend) -> None:
    """2 puts; get 1 -> r0; get 5 -> only r1 (r0 is pending, not redelivered); get 5 -> nothing."""
    q = backend.queue()
    q.put(make_rollout(0))
    q.put(make_rollout(1))
    assert [e.rollout.rollout_id for e in q.get_batch(1, timeout_s=0.0)] == ["r0"]
    assert [e.rollout.rollout_id for e in q.get_batch(5, timeout_s=0.0)] == ["r1"]
    assert q.get_batch(5, timeout_s=0.0) == []
    assert len(q.pending()) == 2


@contract
def test_get_batch_returns_what_it_has_when_the_timeout_passes(backend: QueueBackend) -> None:
    """Empty: [] at once; 1 entry, n=4, timeout 0.2 s: that 1 entry, after at least 0.2 s."""
    q = backend.queue()
    assert q.get_batch(4, timeout_s=0.0) == []
    q.put(make_rollout(0))
    start = time.monotonic()
    got = q.get_batch(4, timeout_s=0.2)
    elapsed = time.monotonic() - start
    assert [e.rollout.rollout_id for e in got] == ["r0"]
    assert 0.2 <= elapsed < 10.0


@contract
def test_get_batch_waits_for_a_producer_in_another_thread(backend: QueueBackend) -> None:
    q = backend.queue()
    producer_q = backend.producer()

    def produce() -> None:
        time.sleep(0.05)
        for i in range(3):
            producer_q.put(make_rollout(i))

    producer = threading.Thread(target=produce)
    producer.start()
    got = q.get_batch(3, timeout_s=30.0)
    producer.join()
    assert [e.rollout.rollout_id for e in got] == ["r0", "r1", "r2"]


@contract
def test_entries_put_before_the_learner_exists_are_delivered(backend: QueueBackend) -> None:
    backend.producer().put(make_rollout(0))
    learner = backend.queue()
    assert [e.rollout.rollout_id for e in learner.get_batch(5, timeout_s=0.0)] == ["r0"]


@contract
def test_concurrent_producers_lose_and_duplicate_nothing(backend: QueueBackend) -> None:
    """4 producer threads x 50 puts -> 200 distinct rollouts delivered. Two threads share one queue
    object (``put`` is thread-safe), two have their own (separate generator processes)."""
    learner = backend.queue()
    shared = backend.producer()
    producers = [shared, shared, backend.producer(), backend.producer()]
    threads = [
        threading.Thread(target=lambda k=k, p=p: [p.put(make_rollout(k * 1000 + i)) for i in range(50)])
        for k, p in enumerate(producers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = learner.get_batch(200, timeout_s=0.0)
    assert len({e.rollout.rollout_id for e in got}) == 200
    assert learner.length() == 200


@contract
def test_consumers_of_one_group_split_the_entries_without_overlap(backend: QueueBackend) -> None:
    """4 puts; consumer a takes 2, consumer b gets the other 2; each has only its own pending."""
    a, b = backend.queue("a"), backend.queue("b")
    ids = [a.put(make_rollout(i)) for i in range(4)]
    got_a = ids_of(a.get_batch(2, timeout_s=0.0))
    got_b = ids_of(b.get_batch(10, timeout_s=0.0))
    assert got_a == ids[:2] and got_b == ids[2:]
    assert a.pending() == ids[:2] and b.pending() == ids[2:]


@contract
def test_bad_arguments_are_rejected_with_the_argument_name(backend: QueueBackend) -> None:
    q = backend.queue()
    with pytest.raises(ValueError, match="n:"):
        q.get_batch(0, timeout_s=0.0)
    with pytest.raises(ValueError, match="timeout_s"):
        q.get_batch(1, timeout_s=-1.0)
    with pytest.raises(ValueError, match="min_idle_ms"):
        q.claim_stale(min_idle_ms=-1)


# ---------------------------------------------------------------- at-least-once across crashes


@contract
def test_unacked_entries_come_back_to_the_same_consumer_name_after_a_restart(backend: QueueBackend) -> None:
    """Learner gets 3, acks 1, dies; 1 more put. New queue, same name: its 2 pending first, then the new one."""
    first = backend.queue("learner-0")
    ids = [first.put(make_rollout(i)) for i in range(3)]
    first.get_batch(3, timeout_s=0.0)
    first.ack([ids[0]])
    new_id = first.put(make_rollout(3))

    restarted = backend.queue("learner-0")
    assert restarted.pending() == ids[1:]
    got = restarted.get_batch(10, timeout_s=0.0)
    assert ids_of(got) == [ids[1], ids[2], new_id]
    assert [e.rollout.rollout_id for e in got] == ["r1", "r2", "r3"]
    assert restarted.get_batch(10, timeout_s=0.0) == []


@contract
def test_restart_recovery_hands_back_pending_entries_in_pages_of_n(backend: QueueBackend) -> None:
    """5 pending, 1 new; the restarted learner asks 2 at a time: 2, 2, then the last pending and the new one."""
    first = backend.queue()
    ids = [first.put(make_rollout(i)) for i in range(5)]
    first.get_batch(5, timeout_s=0.0)
    new_id = first.put(make_rollout(5))
    restarted = backend.queue()
    pages = [ids_of(restarted.get_batch(2, timeout_s=0.0)) for _ in range(3)]
    assert pages == [ids[0:2], ids[2:4], [ids[4], new_id]]


@contract
def test_claim_stale_takes_over_idle_entries_of_a_dead_consumer(backend: QueueBackend) -> None:
    """Consumer learner-0 holds 2 entries: not claimable at 1 h idle; after 60 ms, claimable at 50 ms."""
    dead = backend.queue("learner-0")
    ids = [dead.put(make_rollout(i)) for i in range(2)]
    dead.get_batch(2, timeout_s=0.0)
    other = backend.queue("learner-1")
    assert other.claim_stale(min_idle_ms=3_600_000) == []
    time.sleep(0.06)
    claimed = other.claim_stale(min_idle_ms=50)
    assert ids_of(claimed) == ids
    assert [e.rollout for e in claimed] == [make_rollout(0), make_rollout(1)]
    assert other.pending() == ids and dead.pending() == []
    assert other.ack(ids) == 2 and other.pending() == []


@contract
def test_claim_stale_never_returns_entries_this_consumer_already_holds(backend: QueueBackend) -> None:
    q = backend.queue()
    q.put(make_rollout(0))
    q.get_batch(1, timeout_s=0.0)
    assert q.claim_stale(min_idle_ms=0) == []
    assert len(q.pending()) == 1


@contract
def test_claim_stale_leaves_entries_pending_on_its_own_name_to_get_batch(backend: QueueBackend) -> None:
    """A restarted learner-0 claims nothing of learner-0's own pending entry: get_batch hands it back."""
    first = backend.queue("learner-0")
    entry_id = first.put(make_rollout(0))
    first.get_batch(1, timeout_s=0.0)
    restarted = backend.queue("learner-0")
    assert restarted.claim_stale(min_idle_ms=0) == []
    assert ids_of(restarted.get_batch(5, timeout_s=0.0)) == [entry_id]


# ---------------------------------------------------------------- poison entries and dead letters


@contract
def test_undecodable_entries_are_dead_lettered_with_the_reason_and_raw_bytes(backend: QueueBackend) -> None:
    """good, garbage bytes, no payload field, NaN logprob, short token_ids, short action_mask, good.

    The learner gets the 2 good ones; the 5 others are dead-lettered with a reason naming the
    problem, their raw payload and the consumer that found them, oldest first; they are acked, so
    only the good ones stay pending and a restarted learner gets only those back.
    """
    q = backend.queue()
    good0 = q.put(make_rollout(0))
    garbage = backend.append_raw({"payload": b"\xc1\xff not msgpack"})
    no_payload = backend.append_raw({"junk": b"1"})
    nan = make_rollout(1)
    nan.behaviour_logprobs[2] = math.nan
    nan_bytes = pack_rollout_unvalidated(nan)
    nan_id = backend.append_raw({"payload": nan_bytes})
    short_tokens = make_rollout(2)
    short_tokens.token_ids = short_tokens.token_ids[:-1]
    short_tokens_id = backend.append_raw({"payload": pack_rollout_unvalidated(short_tokens)})
    short_mask = make_rollout(3)
    short_mask.action_mask = short_mask.action_mask[:-1]
    short_mask_id = backend.append_raw({"payload": pack_rollout_unvalidated(short_mask)})
    good1 = q.put(make_rollout(4))

    batch = q.get_batch(10, timeout_s=0.0)
    assert ids_of(batch) == [good0, good1]
    assert q.dead_letter_count() == 5
    dead = {d.original_id: d for d in q.dead_letters()}
    assert set(dead) == {garbage, no_payload, nan_id, short_tokens_id, short_mask_id}
    assert "undecodable" in dead[garbage].reason and dead[garbage].payload == b"\xc1\xff not msgpack"
    assert "payload" in dead[no_payload].reason and dead[no_payload].payload == b""
    assert "behaviour_logprobs[2]" in dead[nan_id].reason and dead[nan_id].payload == nan_bytes
    assert "lengths differ" in dead[short_tokens_id].reason
    assert "lengths differ" in dead[short_mask_id].reason
    assert all(d.consumer == "learner-0" for d in dead.values())
    assert [d.original_id for d in q.dead_letters(limit=2)] == [garbage, no_payload]
    assert q.pending() == [good0, good1]
    assert (q.length(), q.lag()) == (7, 0)
    assert ids_of(backend.queue().get_batch(10, timeout_s=0.0)) == [good0, good1]


@contract
def test_rollouts_outside_the_models_vocabulary_or_length_are_dead_lettered_before_the_learner(
    backend: QueueBackend,
) -> None:
    """Issue 23, item 7: token id 5000 with a vocabulary of 400 passed validation and crash-looped the learner.

    With ``set_limits(vocab 400, 8 tokens)``: good, id 5000, 9 tokens, good. The learner gets the 2
    good ones; the 2 others are dead-lettered with the field, index and bound, acked (a restart
    does not see them again), and the hook hears 2 (their admission places go back).
    """
    q = backend.queue()
    heard: list[int] = []
    q.set_limits(RolloutLimits(vocab_size=400, max_tokens=8), heard.append)
    good0 = q.put(make_rollout(0))
    oov = make_rollout(1, num_tokens=6)
    oov.token_ids[4] = 5000
    oov_id = q.put(oov)
    long_id = q.put(make_rollout(2, num_tokens=9))
    good1 = q.put(make_rollout(3, num_tokens=8))
    assert ids_of(q.get_batch(10, timeout_s=0.0)) == [good0, good1]
    dead = {d.original_id: d.reason for d in q.dead_letters()}
    assert dead == {oov_id: "token_ids[4]: id 5000 is outside the model's vocabulary (vocab_size 400)",
                    long_id: "token_ids: 9 tokens, more than the learner's limit of 8"}
    assert sum(heard) == 2
    assert q.pending() == [good0, good1]
    restarted = backend.queue()
    restarted.set_limits(RolloutLimits(vocab_size=400, max_tokens=8), heard.append)
    assert ids_of(restarted.get_batch(10, timeout_s=0.0)) == [good0, good1]
    assert sum(heard) == 2


@contract
def test_undecodable_entries_are_told_to_the_dead_letter_hook_but_trimmed_ones_are_not(
    backend: QueueBackend,
) -> None:
    """Issue 23, item 15: dead-lettered entries' admission places must come back; a trimmed entry was
    delivered (and counted) before, so it gives nothing back."""
    q = backend.queue()
    heard: list[int] = []
    q.set_limits(None, heard.append)
    backend.append_raw({"payload": b"\xc1 not msgpack"})
    kept = q.put(make_rollout(0))
    assert ids_of(q.get_batch(10, timeout_s=0.0)) == [kept]
    assert heard == [1]
    backend.delete([kept])
    restarted = backend.queue()
    restarted.set_limits(None, heard.append)
    assert restarted.get_batch(10, timeout_s=0.0) == []
    assert restarted.dead_letter_count() == 2 and heard == [1]


@contract
def test_pending_entries_deleted_before_ack_are_dead_lettered_not_dropped(backend: QueueBackend) -> None:
    """Entries held by a and b are deleted from the stream: the restart path (a again) and the claim
    path (c claims b's) each dead-letter one, with a reason saying so; nothing stays pending."""
    a = backend.queue("a")
    ids = [a.put(make_rollout(i)) for i in range(2)]
    a.get_batch(1, timeout_s=0.0)
    b = backend.queue("b")
    b.get_batch(1, timeout_s=0.0)
    backend.delete(ids)

    assert backend.queue("a").get_batch(5, timeout_s=0.0) == []
    c = backend.queue("c")
    assert c.claim_stale(min_idle_ms=0) == []
    dead: list[DeadLetter] = a.dead_letters()
    assert sorted(d.original_id for d in dead) == sorted(ids)
    assert all("deleted" in d.reason and d.payload == b"" for d in dead)
    assert a.pending() == [] and b.pending() == [] and c.pending() == []


class _Tripwire:
    """Unpickling this creates ``path``: a payload that is unpickled leaves a trace."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@contract
def test_a_pickled_payload_is_dead_lettered_and_never_unpickled(backend: QueueBackend) -> None:
    q = backend.queue()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "unpickled"
        bomb = pickle.dumps(_Tripwire(str(trace)))
        bomb_id = backend.append_raw({"payload": bomb})
        assert q.get_batch(5, timeout_s=0.0) == []
        assert not trace.exists()
    [dead] = q.dead_letters()
    assert dead.original_id == bomb_id and dead.payload == bomb and "undecodable" in dead.reason
    assert q.pending() == []


@contract
def test_put_stores_the_msgpack_payload_with_id_and_version_in_clear(backend: QueueBackend) -> None:
    """No pickle on the wire: the entry is exactly encode_rollout's bytes plus two readable fields."""
    r = make_rollout(0, policy_version=3)
    entry_id = backend.queue().put(r)
    assert backend.stored_fields(entry_id) == {
        "payload": encode_rollout(r),
        "rollout_id": b"r0",
        "policy_version": b"3",
    }


@contract
def test_put_rejects_an_invalid_rollout_and_appends_nothing(backend: QueueBackend) -> None:
    q = backend.queue()
    nan = make_rollout(0)
    nan.behaviour_logprobs[1] = math.nan
    with pytest.raises(RecordError, match="behaviour_logprobs"):
        q.put(nan)
    inf = make_rollout(1)
    inf.reward = math.inf
    with pytest.raises(RecordError, match="reward"):
        q.put(inf)
    assert (q.length(), q.lag(), q.dead_letter_count()) == (0, 0, 0)
    assert q.get_batch(5, timeout_s=0.0) == []


# ---------------------------------------------------------------- lengths and counters


@contract
def test_length_counts_stored_entries_and_lag_counts_undelivered_ones(backend: QueueBackend) -> None:
    """3 puts, 1 delivered: (3, 2); acked entries stay in the stream: (3, 2); 2 more delivered: (3, 0)."""
    q = backend.queue()
    for i in range(3):
        q.put(make_rollout(i))
    [first] = q.get_batch(1, timeout_s=0.0)
    assert (q.length(), q.lag()) == (3, 2)
    q.ack([first.entry_id])
    assert (q.length(), q.lag()) == (3, 2)
    q.get_batch(2, timeout_s=0.0)
    assert (q.length(), q.lag()) == (3, 0)


# ---------------------------------------------------------------- the suite rejects a broken twin


class FaultyQueue:
    """A broken twin: a real queue with one fault injected, which the contract must reject.

    Faults: ``"ack_on_read"`` acks every entry as it hands it out, so a crash loses it
    (at-most-once); ``"claim_busy"`` makes ``claim_stale`` ignore ``min_idle_ms`` and steal entries
    a live consumer is still working on.
    """

    def __init__(self, inner: RolloutQueue, fault: str) -> None:
        self.inner = inner
        self.fault = fault

    def put(self, rollout: Rollout) -> str:
        return self.inner.put(rollout)

    def get_batch(self, n: int, timeout_s: float) -> list[QueueEntry]:
        batch = self.inner.get_batch(n, timeout_s)
        if self.fault == "ack_on_read":
            self.inner.ack(ids_of(batch))
        return batch

    def ack(self, entry_ids: Sequence[str]) -> int:
        return self.inner.ack(entry_ids)

    def claim_stale(self, min_idle_ms: int) -> list[QueueEntry]:
        if self.fault == "claim_busy" and min_idle_ms >= 0:
            min_idle_ms = 0
        return self.inner.claim_stale(min_idle_ms)

    def pending(self) -> list[str]:
        return self.inner.pending()

    def dead_letter_count(self) -> int:
        return self.inner.dead_letter_count()

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return self.inner.dead_letters(limit)

    def length(self) -> int:
        return self.inner.length()

    def set_limits(self, limits: RolloutLimits | None, on_dead_letter: DeadLetterHook | None = None) -> None:
        self.inner.set_limits(limits, on_dead_letter)

    def lag(self) -> int:
        return self.inner.lag()


CONTRACT_FAILURES = (AssertionError, pytest.fail.Exception)
"""What a check raises when the backend breaks the contract (a failed ``assert`` or ``pytest.raises``)."""


def failing_checks(make_backend: Callable[[], QueueBackend]) -> dict[str, BaseException]:
    """Run every contract check on a fresh backend; return ``{check name: what it raised}`` for failures."""
    failures: dict[str, BaseException] = {}
    for check in QUEUE_CONTRACT:
        b = make_backend()
        try:
            check(b)
        except (Exception, pytest.fail.Exception) as exc:
            failures[check.__name__] = exc
        finally:
            b.close()
    return failures


def test_the_contract_runner_passes_the_real_memory_queue() -> None:
    assert failing_checks(MemoryBackend) == {}


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        pytest.param(
            "ack_on_read",
            {
                "test_put_get_ack_round_trip_keeps_order_and_content",
                "test_a_delivered_entry_is_not_handed_out_twice_by_the_same_queue_object",
                "test_consumers_of_one_group_split_the_entries_without_overlap",
                "test_unacked_entries_come_back_to_the_same_consumer_name_after_a_restart",
                "test_restart_recovery_hands_back_pending_entries_in_pages_of_n",
                "test_claim_stale_takes_over_idle_entries_of_a_dead_consumer",
                "test_claim_stale_never_returns_entries_this_consumer_already_holds",
                "test_undecodable_entries_are_dead_lettered_with_the_reason_and_raw_bytes",
                "test_pending_entries_deleted_before_ack_are_dead_lettered_not_dropped",
            },
            id="ack_on_read",
        ),
        pytest.param(
            "claim_busy", {"test_claim_stale_takes_over_idle_entries_of_a_dead_consumer"}, id="claim_busy"
        ),
    ],
)
def test_the_contract_rejects_a_broken_twin(fault: str, expected: set[str]) -> None:
    """Each fault fails at least the checks of the guarantee it breaks, by a failed assertion (not a crash)."""
    failures = failing_checks(lambda: MemoryBackend(wrap=lambda q: FaultyQueue(q, fault)))
    assert expected <= set(failures), sorted(expected - set(failures))
    assert all(isinstance(failures[name], CONTRACT_FAILURES) for name in expected)
