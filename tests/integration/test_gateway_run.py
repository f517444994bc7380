"""``posttrain run configs/sao_gateway_cpu.yaml``, shrunk: SAO trained only from the example agents' gateway traffic.

The real command end to end: prepare, a short warm start, the gateway process, one example agent
(the plain ``openai`` loop of ``examples/external_agent``, its tool in the sandbox), the learner,
evaluation. Asserted: it exits 0, every trained rollout came from the gateway (no generator
process ran), the learner made its versions, and the gateway's counts add up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_sao_trains_only_from_the_example_agents_gateway_traffic(tmp_path: Path):
    steps, batch = 2, 4
    cmd = [sys.executable, "-m", "posttrain.cli", "run", "configs/sao_gateway_cpu.yaml", f"output_dir={tmp_path}",
           "run_name=gw-e2e", "model.tiny.vocab_size=400", "data.num_train_tasks=40", "data.num_eval_tasks=4",
           "warm_start.steps=20", f"sao.steps={steps}", f"sao.batch_size={batch}", f"sao.micro_batch_size={batch}",
           "sao.critic.warmup_steps=1", "sao.checkpoint_every=1", "gateway.agents=1", "gateway.agent_episodes_in_flight=4",
           "eval.num_tasks=4", "eval.samples_per_task=1", "tracking.register_final=false"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    run = tmp_path / "gw-e2e"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SAO: the gateway (1 example agents) + learner" in done.stdout
    ledger = [json.loads(line) for line in (run / "learner_ledger.jsonl").read_text().splitlines()]
    trained = [r for entry in ledger for r in entry["rollouts"]]
    assert len(trained) == (steps + 1) * batch  # the critic's warm-up batch, then one batch per version
    assert {r["generator_id"] for r in trained} == {"gw0"}
    assert all(r["task_id"].startswith("synthetic_tool-train-") for r in trained)  # closed by task id, verified
    summary = (run / "summary.md").read_text()
    assert re.search(r"\| generators +\| 0 +\|", summary)
    found = re.search(r"\| gateway episodes \(opened, closed, abandoned\) +\| (\d+), (\d+), (\d+) +\|", summary)
    assert found, summary
    opened, closed, abandoned = (int(x) for x in found.groups())
    assert closed >= len(trained) and opened == closed + abandoned
    agent_log = (run / "logs" / "agent-0.log").read_text()
    assert "agent:" in agent_log and "episodes" in agent_log


def test_a_gateway_for_the_users_own_agents_writes_its_task_file(tmp_path: Path):
    """``gateway.agents: 0`` (the user's own agents): a new user's check found ``<run>/gateway`` holding only
    ``token`` and ``url``, while the example agent's docstring points at ``tasks.jsonl`` and
    ``verifier: environment`` needs the training task ids. The runner's own ``start_gateway``, a real gateway."""
    import redis

    from posttrain.config import load_config
    from posttrain.models.hf import load_policy
    from posttrain.rollout.redis_streams import RedisPolicyVersionStore
    from posttrain.runners.common import prepare, warm_start
    from posttrain.runners.gateway import gateway_dir, start_gateway, stop_agents
    from posttrain.runners.sao import stop_generators
    from posttrain.runtime import RunContext
    from posttrain.services.embedded_redis import EmbeddedRedis
    from posttrain.weight_sync.factory import open_weight_store

    cfg = load_config(REPO / "configs" / "sao_gateway_cpu.yaml",
                      [f"output_dir={tmp_path}", "run_name=own-agents", "model.tiny.vocab_size=400",
                       "data.num_train_tasks=12", "data.num_eval_tasks=2", "warm_start.steps=0", "gateway.agents=0",
                       "gateway.port=0", "gateway.verifier=environment"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    open_weight_store(ctx).publish(load_policy(model_dir).state_dict(), 0, model_dir)
    config_path = ctx.save_resolved_config()
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        RedisPolicyVersionStore(client, ctx.keys).set(0)
        gateway = start_gateway(ctx, server.url, config_path)
        try:
            assert gateway.agents == []
            rows = [json.loads(line) for line in (gateway_dir(ctx) / "tasks.jsonl").read_text().splitlines()]
            assert sorted(r["task_id"] for r in rows) == sorted(t.task_id for t in ctx.tasks("train"))
            assert len(rows) == 12 and all(r["messages"] for r in rows)
            assert gateway.url == (gateway_dir(ctx) / "url").read_text().strip()
        finally:
            stop_agents(gateway.agents)
            stop_generators(ctx, client, [gateway.gateway])
