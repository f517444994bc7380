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
