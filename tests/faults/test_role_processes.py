"""Fault injection with real processes (``posttrain generator`` / ``posttrain learner``), embedded Valkey, hf engine.

Kill every generator: the learner returns their tickets, stops with one line after
``learner.no_generator_timeout_s`` and leaves a checkpoint covering every entry it trained (the
ledger's entries are all acknowledged: none pending). Counts from the ledger and the stream only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from integration.test_sao_fault_tolerance import _ctx, _ledger, _spawn, _wait
from posttrain.learner.checkpoint import latest_checkpoint
from posttrain.services.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST_LIVENESS = ["generator.heartbeat_ttl_s=2", "learner.no_generator_timeout_s=8", "generator.admission_lease_s=600"]


def test_killing_every_generator_stops_the_learner_with_one_line_and_a_checkpoint(tmp_path):
    ctx = _ctx(tmp_path, "kill-all-generators", 40, *FAST_LIVENESS)
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        gens = [_spawn(ctx, "generator", server.url, "--generator-index", str(i), log_name=f"g{i}") for i in range(2)]
        learner = subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "learner", str(ctx.run_dir / "resolved_config.yaml")],
            env={**os.environ, "REDIS_URL": server.url},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        ledger = ctx.run_dir / "learner_ledger.jsonl"
        _wait(lambda: ledger.exists() and len(ledger.read_text().splitlines()) >= 3, 300, "3 ledger lines")
        for g in gens:
            g.send_signal(signal.SIGKILL)
            g.wait()
        _, err = learner.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.strip()]
        assert learner.returncode == 1, err[-3000:]
        assert "Traceback" not in err
        assert "no live generator" in lines[-1] and "learner.no_generator_timeout_s=8" in lines[-1]
        trained = {e for row in _ledger(ctx) for e in row["entry_ids"]}
        pending = client.xpending(ctx.keys.rollouts, "learner")["pending"]
        assert latest_checkpoint(ctx.checkpoints_dir) is not None
        assert len(trained) >= 3 * 4 and pending <= client.xlen(ctx.keys.rollouts) - len(trained)
        assert client.zcard(ctx.keys.admission_leases) == 0  # the dead generators' tickets came back
