"""Redis faults on a real embedded Valkey: a dead generator's tickets, a server that is down, then back, or never there.

Each test checks counts (tickets in flight, attempts, exit status, lines printed), never timings.
Run: .venv/bin/python -m pytest -q tests/faults/test_redis_outages.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from posttrain.rollout.admission import RedisAdmissionController, ReissuedTask
from posttrain.rollout.keys import StreamKeys
from posttrain.rollout.liveness import Heartbeat, beat, farewell, live_generators
from posttrain.rollout.queue import RedisUnreachableError
from posttrain.rollout.redis_streams import (
    RedisPolicyVersionStore,
    check_reachable,
    connect,
    retries_for_window,
)
from posttrain.services.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.integration]

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "sao_demo_cpu.yaml"


@pytest.fixture(scope="module")
def server():
    with EmbeddedRedis() as s:
        yield s


def _keys() -> StreamKeys:
    return StreamKeys("faults", uuid.uuid4().hex[:12])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_generators_tickets_come_back_as_soon_as_its_heartbeat_lapses(server) -> None:
    """B=2, tau=0: capacity 2. g0 takes both with a 1 h lease and dies (heartbeat deleted): one call returns 2,
    g1 can take tickets again at once, g1's own live ticket is kept, and expired_total counts the 2."""
    keys = _keys()
    client = connect(server.url)
    g0 = RedisAdmissionController(client, keys, batch_size=2, max_staleness=0, lease_s=3600.0, owner="g0")
    g1 = RedisAdmissionController(client, keys, batch_size=2, max_staleness=0, lease_s=3600.0, owner="g1")
    learner = RedisAdmissionController(client, keys, batch_size=2, max_staleness=0)
    beat(client, keys, "g0", ttl_s=60.0)
    beat(client, keys, "g1", ttl_s=60.0)
    assert g0.acquire(0.0) is not None and g0.acquire(0.0) is not None
    assert g1.acquire(0.0) is None  # full: before the fix it stayed full for the hour of the lease
    assert learner.return_leases_of_dead() == 0  # g0 alive: nothing returned
    client.delete(keys.heartbeat("g0"))  # SIGKILL: no farewell, the key lapses (TTL) or, here, is gone
    assert live_generators(client, keys) == ["g1"]
    assert learner.return_leases_of_dead() == 2
    s = learner.state()
    assert (s.in_flight, s.expired_total, s.granted_total) == (0, 2, 2)
    kept = g1.acquire(0.0)
    assert kept is not None
    assert learner.return_leases_of_dead() == 0 and learner.state().in_flight == 1
    g1.consume(kept)
    assert client.hlen(keys.admission_owners) == 0  # no owner entry outlives its lease


def test_a_restarted_generator_releases_its_previous_lifes_tickets_as_lost_and_their_tasks_come_back(
        server) -> None:
    """Issue 32. B=3, tau=0. g0 takes 2 tickets (tasks t1, t2) and is SIGKILLed; a new life under the
    same id renews the same heartbeat, so the dead-owner rule never frees them (before the fix they
    stayed leased for the whole lease). At its start the new life releases them: both counted lost in
    flight, both tasks queued again, in order; g1's ticket is kept. Later g1 dies too: the learner's
    dead-owner rule returns its ticket the same way (lost 3, t3 re-issued)."""
    keys = _keys()
    client = connect(server.url)
    first_life = RedisAdmissionController(client, keys, batch_size=3, max_staleness=0, lease_s=3600.0, owner="g0")
    g1 = RedisAdmissionController(client, keys, batch_size=3, max_staleness=0, lease_s=3600.0, owner="g1")
    learner = RedisAdmissionController(client, keys, batch_size=3, max_staleness=0)
    beat(client, keys, "g0", ttl_s=60.0)
    beat(client, keys, "g1", ttl_s=60.0)
    for task in ("t1", "t2"):
        ticket = first_life.acquire(0.0)
        assert ticket is not None
        first_life.assign(ticket, ReissuedTask(task))
    kept = g1.acquire(0.0)
    assert kept is not None
    g1.assign(kept, ReissuedTask("t3"))
    second_life = RedisAdmissionController(client, keys, batch_size=3, max_staleness=0, lease_s=3600.0, owner="g0")
    beat(client, keys, "g0", ttl_s=60.0)  # the new life's heartbeat: g0 looks alive throughout
    assert learner.return_leases_of_dead() == 0 and second_life.acquire(0.0) is None  # full, and nobody frees it
    assert second_life.release_leases_of("g0") == 2
    s = learner.state()
    assert (s.in_flight, s.lost_total, s.reissued_total, s.expired_total) == (1, 2, 2, 2)
    assert [second_life.take_reissued(), second_life.take_reissued()] == [ReissuedTask("t1"), ReissuedTask("t2")]
    assert second_life.release_leases_of("g0") == 0  # nothing of the previous life is left
    client.delete(keys.heartbeat("g1"))
    assert learner.return_leases_of_dead() == 1
    assert learner.take_reissued() == ReissuedTask("t3", 0, "lost_in_flight") and learner.take_reissued() is None
    s = learner.state()
    assert (s.in_flight, s.lost_total, s.reissued_total) == (0, 3, 3)
    assert client.hlen(keys.admission_owners) == 0 and client.hlen(keys.admission_tasks) == 0
    with pytest.raises(ValueError, match="owner: must be a generator id"):
        learner.release_leases_of("")


def test_heartbeats_lapse_by_ttl_and_farewell_ends_them_at_once(server) -> None:
    keys = _keys()
    client = connect(server.url)
    beat(client, keys, "g0", ttl_s=1.0)
    beat(client, keys, "g1", ttl_s=60.0)
    assert live_generators(client, keys) == ["g0", "g1"]
    farewell(client, keys, "g1")
    assert live_generators(client, keys) == ["g0"]
    deadline = time.monotonic() + 30
    while live_generators(client, keys) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_generators(client, keys) == []


def test_the_heartbeat_thread_keeps_a_generator_alive_past_its_ttl_and_farewell_ends_it(server) -> None:
    """TTL 1 s, renewed every 0.25 s: alive after 4 TTLs (at least 4 renewals), gone at once after stop()."""
    keys = _keys()
    client = connect(server.url)
    heartbeat = Heartbeat(client, keys, "g0", ttl_s=1.0).start()
    time.sleep(4.0)  # 4 TTLs: without renewals the key would be gone
    assert live_generators(client, keys) == ["g0"] and heartbeat.beats >= 4 and heartbeat.misses == 0
    heartbeat.stop()
    assert live_generators(client, keys) == []


def test_a_client_survives_an_outage_shorter_than_its_reconnect_window(tmp_path) -> None:
    """Valkey (AOF) killed, restarted on the same port 2 s later: a SET/GET through a 20 s window client
    succeeds and sees the value written before; a 0 s window client fails on the first command."""
    port = _closed_port()
    aof = tmp_path / "aof"
    first = EmbeddedRedis(aof_dir=aof, port=port).start()
    url = first.url
    keys = _keys()
    store = RedisPolicyVersionStore(connect(url, reconnect_window_s=20.0), keys, retries=0)
    store.set(7)
    client = store.client
    client.config_set("appendfsync", "always")
    store.set(8)
    first.stop()
    restarted: list[EmbeddedRedis] = []
    timer = threading.Timer(2.0, lambda: restarted.append(EmbeddedRedis(aof_dir=aof, port=port).start()))
    timer.start()
    try:
        assert store.get() == 8  # blocks through the outage, then reads the value from before it
        assert RedisPolicyVersionStore(connect(url), keys, retries=0).get() == 8
    finally:
        timer.join()
        for s in restarted:
            s.stop()


def test_an_unreachable_redis_gives_one_line_naming_the_url_after_bounded_retries() -> None:
    url = f"redis://user:secret@127.0.0.1:{_closed_port()}/0"
    assert retries_for_window(1.0) == 3  # 0.2 + 0.4 + 0.8 s
    with pytest.raises(RedisUnreachableError) as info:
        check_reachable(connect(url, reconnect_window_s=1.0), url, 1.0)
    message = str(info.value)
    assert "\n" not in message and "secret" not in message
    assert f"Redis at redis://user:***@127.0.0.1:{url.rsplit(':', 1)[1]}" in message
    assert "queue.reconnect_window_s" in message


@pytest.mark.parametrize("role", ["generator", "learner"])
def test_a_role_pointed_at_a_closed_port_exits_1_with_one_line(role: str, tmp_path) -> None:
    """Before: the generator waited 600 s for weights, silent; the learner printed 3 tracebacks after 55 s of work."""
    url = f"redis://127.0.0.1:{_closed_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", role, str(DEMO_CONFIG), "queue.reconnect_window_s=1", f"output_dir={tmp_path}",
         "generator.engine=hf", "model.tiny.vocab_size=300"],
        env={**os.environ, "REDIS_URL": url}, capture_output=True, text=True, timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith(f"posttrain: Redis at {url} unreachable (retried for 1 s")
