"""Behaviour of the in-memory rollout queue (the twin of tests/integration/test_redis_stream.py).

Run: .venv/bin/python -m pytest -q tests/unit/rollout/test_rollout_memory_queue.py
"""

from __future__ import annotations

import math
import threading

import pytest

from posttrain.records import RecordError, Rollout, encode_rollout, pack_rollout_unvalidated
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue, MemoryStream
from posttrain.rollout.queue import PolicyVersionStore, RolloutQueue


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


def test_memory_queue_satisfies_the_protocols():
    assert isinstance(MemoryRolloutQueue(), RolloutQueue)
    assert isinstance(MemoryPolicyVersionStore(), PolicyVersionStore)


def test_put_get_ack_round_trip_keeps_order_and_content():
    """3 puts -> one get_batch of 3 in put order; 3 pending; ack -> 3, then 0 on a second ack."""
    q = MemoryRolloutQueue()
    ids = [q.put(make_rollout(i)) for i in range(3)]
    batch = q.get_batch(3, timeout_s=0.0)
    assert [e.entry_id for e in batch] == ids
    assert [e.rollout for e in batch] == [make_rollout(i) for i in range(3)]
    assert q.pending() == ids
    assert q.ack(ids) == 3
    assert q.pending() == []
    assert q.ack(ids) == 0
    assert q.get_batch(5, timeout_s=0.0) == []


def test_get_batch_returns_fewer_than_n_at_timeout():
    q = MemoryRolloutQueue()
    q.put(make_rollout(0))
    assert len(q.get_batch(4, timeout_s=0.0)) == 1


def test_put_rejects_an_invalid_rollout_and_appends_nothing():
    q = MemoryRolloutQueue()
    bad = make_rollout(0)
    bad.behaviour_logprobs[1] = math.nan
    with pytest.raises(RecordError, match="behaviour_logprobs"):
        q.put(bad)
    assert q.length() == 0


def test_corrupt_entries_go_to_dead_letter_and_learner_gets_only_good_ones():
    """5 entries: good, garbage bytes, no payload field, NaN logprob, unequal lengths, good.

    The learner gets the 2 good ones; the 4 others are dead-lettered with a reason naming the
    problem and their raw payload, and none of them stays pending.
    """
    stream = MemoryStream()
    q = MemoryRolloutQueue(stream)
    good0 = q.put(make_rollout(0))
    garbage = stream.add({"payload": b"\xc1\xff not msgpack"})
    no_payload = stream.add({"rollout_id": b"x"})
    nan = make_rollout(1)
    nan.behaviour_logprobs[2] = math.nan
    nan_bytes = pack_rollout_unvalidated(nan)
    nan_id = stream.add({"payload": nan_bytes})
    short = make_rollout(2)
    short.action_mask = short.action_mask[:-1]
    short_id = stream.add({"payload": pack_rollout_unvalidated(short)})
    good1 = q.put(make_rollout(3))

    batch = q.get_batch(10, timeout_s=0.0)
    assert [e.entry_id for e in batch] == [good0, good1]
    assert q.dead_letter_count() == 4
    dead = {d.original_id: d for d in q.dead_letters()}
    assert set(dead) == {garbage, no_payload, nan_id, short_id}
    assert "undecodable" in dead[garbage].reason and dead[garbage].payload == b"\xc1\xff not msgpack"
    assert "payload" in dead[no_payload].reason and dead[no_payload].payload == b""
    assert "behaviour_logprobs[2]" in dead[nan_id].reason and dead[nan_id].payload == nan_bytes
    assert "lengths differ" in dead[short_id].reason
    assert q.pending() == [good0, good1]


def test_unacked_entries_are_redelivered_to_the_same_consumer_after_restart():
    """Learner gets 3, acks 1, dies. New queue object, same name: its 2 pending come first, then 1 new."""
    stream = MemoryStream()
    first = MemoryRolloutQueue(stream, consumer="learner-0")
    ids = [first.put(make_rollout(i)) for i in range(3)]
    first.get_batch(3, timeout_s=0.0)
    first.ack([ids[0]])
    new_id = first.put(make_rollout(3))

    restarted = MemoryRolloutQueue(stream, consumer="learner-0")
    assert restarted.pending() == ids[1:]
    got = restarted.get_batch(10, timeout_s=0.0)
    assert [e.entry_id for e in got] == [ids[1], ids[2], new_id]
    assert restarted.get_batch(10, timeout_s=0.0) == []


def test_dead_consumer_pending_entries_are_claimed_by_another():
    stream = MemoryStream()
    dead = MemoryRolloutQueue(stream, consumer="learner-0")
    ids = [dead.put(make_rollout(i)) for i in range(2)]
    dead.get_batch(2, timeout_s=0.0)
    other = MemoryRolloutQueue(stream, consumer="learner-1")
    assert other.claim_stale(min_idle_ms=3_600_000) == []
    claimed = other.claim_stale(min_idle_ms=0)
    assert [e.entry_id for e in claimed] == ids
    assert other.pending() == ids
    assert dead.pending() == []


def test_claim_stale_never_returns_this_consumers_own_entries():
    q = MemoryRolloutQueue()
    q.put(make_rollout(0))
    q.get_batch(1, timeout_s=0.0)
    assert q.claim_stale(min_idle_ms=0) == []


def test_pending_entry_trimmed_before_ack_is_dead_lettered_on_restart():
    """maxlen 2: 1 delivered and unacked, then 2 more puts trim it; the restarted learner dead-letters it."""
    stream = MemoryStream(maxlen=2)
    q = MemoryRolloutQueue(stream)
    lost = q.put(make_rollout(0))
    q.get_batch(1, timeout_s=0.0)
    q.put(make_rollout(1))
    q.put(make_rollout(2))
    restarted = MemoryRolloutQueue(stream)
    got = restarted.get_batch(10, timeout_s=0.0)
    assert [e.rollout.rollout_id for e in got] == ["r1", "r2"]
    [dead] = restarted.dead_letters()
    assert dead.original_id == lost and "trimmed" in dead.reason


def test_maxlen_trims_the_oldest_entries():
    q = MemoryRolloutQueue(maxlen=5)
    for i in range(8):
        q.put(make_rollout(i))
    assert q.length() == 5
    assert [e.rollout.rollout_id for e in q.get_batch(10, timeout_s=0.0)] == ["r3", "r4", "r5", "r6", "r7"]


def test_lag_counts_entries_not_yet_delivered():
    q = MemoryRolloutQueue()
    for i in range(3):
        q.put(make_rollout(i))
    q.get_batch(1, timeout_s=0.0)
    assert (q.length(), q.lag()) == (3, 2)


def test_get_batch_waits_for_a_producer_thread():
    q = MemoryRolloutQueue()
    producer = threading.Thread(target=lambda: [q.put(make_rollout(i)) for i in range(3)])
    producer.start()
    got = q.get_batch(3, timeout_s=30.0)
    producer.join()
    assert [e.rollout.rollout_id for e in got] == ["r0", "r1", "r2"]


def test_concurrent_producers_lose_and_duplicate_nothing():
    """4 threads x 50 puts -> 200 distinct rollouts delivered."""
    q = MemoryRolloutQueue()
    threads = [
        threading.Thread(target=lambda k=k: [q.put(make_rollout(k * 1000 + i)) for i in range(50)])
        for k in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = q.get_batch(200, timeout_s=0.0)
    assert len({e.rollout.rollout_id for e in got}) == 200


def test_bad_arguments_are_rejected_with_the_argument_name():
    q = MemoryRolloutQueue()
    with pytest.raises(ValueError, match="n:"):
        q.get_batch(0, timeout_s=0.0)
    with pytest.raises(ValueError, match="timeout_s"):
        q.get_batch(1, timeout_s=-1.0)
    with pytest.raises(ValueError, match="entry_id"):
        q.ack(["nonsense"])
    with pytest.raises(ValueError, match="maxlen"):
        MemoryStream(maxlen=0)


def test_memory_policy_version_store_round_trip_and_validation():
    store = MemoryPolicyVersionStore()
    assert store.get() == 0
    store.set(7)
    assert store.get() == 7
    with pytest.raises(ValueError, match="version"):
        store.set(-1)


def test_encoded_payload_is_what_the_stream_holds():
    stream = MemoryStream()
    q = MemoryRolloutQueue(stream)
    r = make_rollout(0, policy_version=3)
    q.put(r)
    [fields] = stream.entries.values()
    assert fields == {"payload": encode_rollout(r), "rollout_id": b"r0", "policy_version": b"3"}
