"""Fault injection with real processes (``posttrain generator`` / ``posttrain learner``), embedded Valkey, hf engine.

* every generator SIGKILLed: the learner returns their tickets, stops with one line after
  ``learner.no_generator_timeout_s`` and leaves a checkpoint covering every entry it trained;
* SIGTERM: generators exit 0 and give back their tickets; the learner checkpoints, exits 143;
* Redis SIGKILLed and restarted (AOF) after a few seconds: every role reconnects and the run finishes
  with no rollout lost or trained twice.

Killing one generator and killing the learner are in ``tests/integration/test_sao_fault_tolerance.py``.
Checks are counts from the ledger and the stream, never timings (the waits only bound a hang).
Run: .venv/bin/python -m pytest -q tests/faults
"""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest
import redis

from integration.test_sao_fault_tolerance import _ctx, _ledger, _spawn, _stop, _surviving_iterations, _wait
from posttrain.account import RunAccount
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST_LIVENESS = ["generator.heartbeat_ttl_s=2", "generator.admission_lease_s=600"]


def _start_generators(ctx: RunContext, url: str, client: redis.Redis, n: int = 2) -> list:
    gens = [_spawn(ctx, "generator", url, "--generator-index", str(i), log_name=f"g{i}") for i in range(n)]
    _wait(lambda: all(client.exists(ctx.keys.heartbeat(f"g{i}")) for i in range(n)), 180, "generator heartbeats")
    return gens


def _wait_ledger(ctx: RunContext, learner, n: int) -> None:
    """Wait for ``n`` ledger lines; fail at once (with the log's tail) if the learner exits first."""
    ledger = ctx.run_dir / "learner_ledger.jsonl"
    _wait(lambda: learner.poll() is not None or (ledger.exists() and len(_ledger(ctx)) >= n), 300,
          f"{n} ledger lines")
    assert learner.poll() is None, _lines(ctx, "learner")[-20:]


def _lines(ctx: RunContext, name: str) -> list[str]:
    return [line for line in (ctx.run_dir / f"{name}.log").read_text(errors="replace").splitlines() if line.strip()]


def _trained_and_pending(ctx: RunContext, client: redis.Redis) -> tuple[set[str], set[str]]:
    trained = {e for ids in _surviving_iterations(ctx).values() for e in ids}
    rows = client.xpending_range(ctx.keys.rollouts, "learner", min="-", max="+", count=100_000)
    return trained, {r["message_id"].decode() for r in rows}


def test_killing_every_generator_stops_the_learner_with_one_line_and_a_checkpoint(tmp_path):
    ctx = _ctx(tmp_path, "kill-all-generators", 40, *FAST_LIVENESS, "learner.no_generator_timeout_s=10")
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = _start_generators(ctx, server.url, client)
        learner = _spawn(ctx, "learner", server.url)
        try:
            _wait_ledger(ctx, learner, 3)
            for g in gens:
                g.send_signal(signal.SIGKILL)
                g.wait()
            assert learner.wait(timeout=300) == 1, _lines(ctx, "learner")[-20:]
        finally:
            if learner.poll() is None:
                learner.kill()
        lines = _lines(ctx, "learner")
        assert not any("Traceback" in line for line in lines)
        assert lines[-1].startswith("posttrain: learner stopped at policy version ")
        assert "no live generator" in lines[-1] and "learner.no_generator_timeout_s=10" in lines[-1]
        assert any("learner: waiting for rollouts: no live generator" in line for line in lines)
        trained, pending = _trained_and_pending(ctx, client)
        assert len(trained) >= 12 and not trained & pending  # the final checkpoint covers (and acked) all trained
        assert client.zcard(ctx.keys.admission_leases) == 0  # the dead generators' tickets came back
        state = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
        assert state["iteration"] == max(_surviving_iterations(ctx))


def test_sigterm_generators_give_back_tickets_and_the_learner_checkpoints_first(tmp_path):
    ctx = _ctx(tmp_path, "sigterm", 40, *FAST_LIVENESS)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = _start_generators(ctx, server.url, client)
        learner = _spawn(ctx, "learner", server.url)
        try:
            _wait_ledger(ctx, learner, 3)
            for g in gens:
                g.send_signal(signal.SIGTERM)
            assert [g.wait(timeout=120) for g in gens] == [0, 0], [_lines(ctx, f"g{i}")[-10:] for i in range(2)]
            assert client.zcard(ctx.keys.admission_leases) == 0  # every ticket in flight was given back
            assert not client.exists(ctx.keys.heartbeat("g0")) and not client.exists(ctx.keys.heartbeat("g1"))
            learner.send_signal(signal.SIGTERM)
            assert learner.wait(timeout=120) == 143, _lines(ctx, "learner")[-20:]
        finally:
            for p in [*gens, learner]:
                if p.poll() is None:
                    p.kill()
        lines = _lines(ctx, "learner")
        assert "SIGTERM" in lines[-1] and not any("Traceback" in line for line in lines)
        trained, pending = _trained_and_pending(ctx, client)
        assert trained and not trained & pending
        state = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
        assert state["iteration"] == max(_surviving_iterations(ctx))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_redis_restart_within_the_reconnect_window_loses_nothing(tmp_path):
    """Valkey with AOF (fsync always) SIGKILLed after 2 ledger lines, back on the same port 5 s later
    (the audit's 10 s outage ended every role at about 3 s): every role reconnects, the run finishes,
    and the surviving ledger trains no entry twice and leaves none pending."""
    ctx = _ctx(tmp_path, "redis-restart", 8, "queue.reconnect_window_s=60")
    port, aof = _free_port(), tmp_path / "aof"
    server = EmbeddedRedis(aof_dir=aof, port=port).start()
    url = server.url
    redis.Redis.from_url(url).config_set("appendfsync", "always")
    gens = _start_generators(ctx, url, redis.Redis.from_url(url))
    learner = _spawn(ctx, "learner", url)
    try:
        _wait_ledger(ctx, learner, 2)
        server.stop()
        time.sleep(5)  # the outage itself; nothing is measured
        server = EmbeddedRedis(aof_dir=aof, port=port).start()
        assert learner.wait(timeout=420) == 0, _lines(ctx, "learner")[-20:]
        client = redis.Redis.from_url(url)
        assert [g.poll() for g in gens] == [None, None]  # the generators rode out the outage too
    finally:
        _stop(ctx, redis.Redis.from_url(url), gens)
        if learner.poll() is None:
            learner.kill()
        client = redis.Redis.from_url(url)
        trained, pending = _trained_and_pending(ctx, client)
        server.stop()
    iterations = _surviving_iterations(ctx)
    assert sum(len(ids) for ids in iterations.values()) == len(trained)  # none trained twice
    assert not pending
    state = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
    assert state["policy_version"] == 8


def test_the_embedded_redis_dying_under_posttrain_run_ends_with_the_first_cause_as_the_last_line(tmp_path):
    """SIGKILL the ``valkey-server`` that ``posttrain run`` started: the output's last line is the Redis error,
    naming the URL (before: 151 lines, 5-6 chained tracebacks, the last one a second error from stop_generators)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    config = Path(__file__).resolve().parents[2] / "configs" / "sao_demo_cpu.yaml"
    log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with log.open("wb") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "run", str(config), f"output_dir={tmp_path}", "run_name=dies",
             "generator.engine=hf", "generator.num_processes=1", "generator.episodes_in_flight=4",
             "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "model.tiny.vocab_size=400",
             "warm_start.steps=0", "sao.steps=40", "sao.batch_size=4", "sao.micro_batch_size=4",
             "sao.critic.warmup_steps=1", "eval.num_tasks=2", "eval.samples_per_task=1", "data.num_eval_tasks=8",
             "queue.reconnect_window_s=2", "tracking.register_final=false"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    ledger = tmp_path / "dies" / "learner_ledger.jsonl"
    try:
        _wait(lambda: run.poll() is not None or (ledger.exists() and len(ledger.read_text().splitlines()) >= 2),
              400, "2 ledger lines")
        assert run.poll() is None, log.read_text(errors="replace")[-3000:]
        servers = [p for p in psutil.Process(run.pid).children(recursive=True) if "valkey" in p.name()]
        assert len(servers) == 1
        url = f"redis://127.0.0.1:{servers[0].net_connections(kind='tcp')[0].laddr.port}"
        servers[0].kill()
        assert run.wait(timeout=300) == 1
    finally:
        if run.poll() is None:
            run.kill()
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    assert lines[-1].startswith(f"posttrain: Redis at {url} unreachable (retried for 2 s"), lines[-30:]
    assert sum("Traceback" in line for line in lines) == 0


def _freeze_with_episodes_in_flight(ctx: RunContext, client: redis.Redis, procs: list) -> None:
    """SIGSTOP every role at a moment some admission ticket is held (an episode in flight), so a SIGKILL
    that follows lands mid-episode; a tiny model's episode is shorter than a look at the leases."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        if client.zcard(ctx.keys.admission_leases) > 0:
            return
        for p in procs:
            p.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("no episode in flight within 120 s")


def test_every_role_sigkilled_mid_episode_then_restarted_loses_nothing_and_tau_0_wastes_nothing(tmp_path):
    """Issue 32 (the audit's (e) and row 10), one run of 2 generators and a learner at tau = 0, B = 2.

    First life, 10 policy versions: no rollout is dropped as stale (before the fix, 2-4 after nearly
    every update, "no fresh token": a generator woken by a new version started episodes on the old
    weights before its reload). Then, with episodes in flight, the learner and both generators are
    SIGKILLed together and restarted under the same ids. Afterwards:

    * every acknowledged entry is in a ledger line (trained, or dropped with its entry id) or dead-lettered,
      and nothing is left pending;
    * every ticket held at the kill was released as lost in flight and its task re-issued, and the
      re-issued tasks were run again (before: the new lives renewed the same heartbeats, so the
      tickets stayed leased until the lease ran out and nothing counted or re-issued them);
    * the final ``stale_dropped`` equals the drops in the surviving ledger.
    """
    # A heartbeat that outlives the restart (the audit's 120 s lease, default TTL 30 s): the new lives
    # renew it, so only their own start can give back what the previous lives held.
    ctx = _ctx(tmp_path, "kill-every-role", 14, "generator.heartbeat_ttl_s=120", "generator.admission_lease_s=600",
               "sao.max_staleness=0", "sao.checkpoint_every=4", "sao.batch_size=2", "sao.micro_batch_size=2")
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = _start_generators(ctx, server.url, client)
        learner = _spawn(ctx, "learner", server.url)
        try:
            _wait(lambda: learner.poll() is not None or (ctx.run_dir / "learner_ledger.jsonl").exists()
                  and max(r["policy_version"] for r in _ledger(ctx)) >= 10, 400, "10 policy versions")
            assert learner.poll() is None, _lines(ctx, "learner")[-20:]
            _freeze_with_episodes_in_flight(ctx, client, [learner, *gens])
            for p in [learner, *gens]:
                p.send_signal(signal.SIGKILL)
            for p in [learner, *gens]:
                p.wait()
            first_life = _ledger(ctx)
            first_account = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())[
                "state"]["account"]
            first_stats = {k.decode(): json.loads(v) for k, v in client.hgetall(ctx.keys.generator_stats).items()}
            held = {t.decode() for t in client.zrange(ctx.keys.admission_leases, 0, -1)}
            assigned = {t.decode() for t in client.hkeys(ctx.keys.admission_tasks)} & held
            assert held and client.hlen(ctx.keys.admission_owners) >= len(held)
            gens = [_spawn(ctx, "generator", server.url, "--generator-index", str(i), log_name=f"g{i}-again")
                    for i in range(2)]
            learner = _spawn(ctx, "learner", server.url, "--start-model", str(ctx.sft_model_dir), log_name="again")
            assert learner.wait(timeout=420) == 0, _lines(ctx, "again")[-20:]
        finally:
            _stop(ctx, client, gens)
            if learner.poll() is None:
                learner.kill()
        first_drops = [(line["iteration"], d["reason"]) for line in first_life for d in line["dropped"]]
        assert first_drops == [], f"tau = 0 wasted rollouts in the first life: {first_drops}"
        assert max(line["policy_version"] for line in first_life) >= 10
        lines = _ledger(ctx)
        recorded = {e for line in lines for e in line["entry_ids"]} | {
            d["entry_id"] for line in lines for d in line["dropped"]}
        dead = {d[b"original_id"].decode() for _, d in client.xrange(ctx.keys.dead_letter)}
        group = next(g for g in client.xinfo_groups(ctx.keys.rollouts) if g["name"] == b"learner")
        last = group["last-delivered-id"].decode()
        delivered = [eid.decode() for eid, _ in client.xrange(ctx.keys.rollouts, max=last)]
        trained, pending = _trained_and_pending(ctx, client)
        assert not pending
        missing = [e for e in delivered if e not in recorded | dead]
        assert delivered and not missing, f"acknowledged but in no ledger line: {missing}"
        state = json.loads((latest_checkpoint(ctx.checkpoints_dir) / "state.json").read_text())["state"]
        surviving = {row["iteration"]: row for row in lines}
        assert state["counters"]["stale_dropped"] == sum(len(row["dropped"]) for row in surviving.values())
        admission = {k.decode(): int(v) for k, v in client.hgetall(ctx.keys.admission).items()}
        assert admission.get("lost_total", 0) == len(held), (admission, held)  # each ticket held at the kill, once
        assert admission.get("reissued_total", 0) >= len(assigned), (admission, assigned)
        assert client.zcard(ctx.keys.admission_leases) == 0 and client.llen(ctx.keys.reissue) == 0, admission
        stats = {k.decode(): json.loads(v) for k, v in client.hgetall(ctx.keys.generator_stats).items()}
        assert sum(s["reissued"] for s in stats.values()) >= len(assigned)  # the lost tasks ran again
        assert any("previous life left" in line for i in range(2) for line in _lines(ctx, f"g{i}-again"))
        # Issue 35: every role's time account sums its two lives. The learner's from the checkpoint's
        # state.json (its first life's, as of its last checkpoint); each generator's from its earlier
        # snapshot in the telemetry hash (as of that snapshot).
        account = RunAccount.from_json((ctx.run_dir / "account.json").read_text())
        roles = {r.role: r for r in account.roles}
        learner_account = roles["learner"]
        assert first_account["lives"] == 1 and learner_account.processes == 2
        assert learner_account.wall_s > sum(first_account["shares"].values())
        assert learner_account.shares["training"] >= first_account["shares"]["training"] > 0
        assert all(r.gap() <= 0.02 for r in account.roles) and roles["generator"].processes >= 2
        for name in ("g0", "g1"):
            assert stats[name]["account/lives"] == 2.0, name
            for key in ("account/engine/wall_s", "account/engine/generating_s", "account/slots/running_s"):
                assert stats[name][key] >= first_stats[name][key], (name, key)
        # tau 0 and batches of 2 admit 2 episodes at a time, so one generator may have won every ticket of the first
        # life (a new user's run at load 7: g0 generated for 0 s); the two together did the work.
        assert first_stats["g0"]["account/engine/wall_s"] > 0 and first_stats["g1"]["account/engine/wall_s"] > 0
        for key in ("account/engine/generating_s", "account/slots/running_s"):
            assert first_stats["g0"][key] + first_stats["g1"][key] > 0, key
