"""A real SAO run (``posttrain.runners.run``: learner here, two generator processes, evaluation) on a task
file with bad rows under ``data.on_bad_row=quarantine``: each bad row is quarantined once although
every process loads the file, and the count reaches the run summary and the metrics.

Run: ``python -m pytest -q tests/integration/test_sao_quarantine.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from posttrain.config import load_config
from posttrain.runners import run
from time_account import check_account

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [
    "generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
    "generator.max_new_tokens=8", "generator.max_episode_tokens=64", "generator.episode_timeout_s=20",
    "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.steps=2", "sao.batch_size=4",
    "sao.micro_batch_size=4", "sao.critic.warmup_steps=1", "eval.num_tasks=4", "eval.samples_per_task=1",
    "data.on_bad_row=quarantine", "data.num_eval_tasks=4", "tracking.register_final=false",
]


@pytest.fixture(autouse=True)
def _quiet_machine(monkeypatch):
    """One torch thread here and in the generator processes; MLflow on sqlite in the run directory."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("REDIS_URL", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _logged_metric(run_dir: Path, key: str) -> float:
    """Latest value of ``key`` in the run's MLflow store (sqlite beside the run)."""
    from mlflow import MlflowClient

    from posttrain.tracking import metric_key

    uri = f"sqlite:///{(run_dir.parent / 'mlflow.db').resolve()}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    values = [r.data.metrics[metric_key(key)] for r in runs if metric_key(key) in r.data.metrics]
    assert len(values) == 1, f"{key}: logged by {len(values)} runs"
    return float(values[0])


def test_sao_run_quarantines_each_bad_task_row_once_and_reports_the_count(tmp_path: Path) -> None:
    """Train file: 40 good sums and 2 bad rows (line 3 invalid JSON, line 7 no reference); eval file:
    8 good rows and 1 bad (line 2, empty prompt). The train file is loaded 3 times (prepare in this
    process, then each of the 2 generator processes), the eval file 3 times (prepare and the two
    held-out evaluations); before the fix that left 6 and 3 quarantine lines. Now
    quarantine-train.jsonl holds 2 lines and quarantine-eval.jsonl 1; summary and metrics say 3."""
    train = [json.dumps({"prompt": f"What is {i} + {i}?", "reference": str(2 * i)}) for i in range(40)]
    train.insert(2, "{not json")
    train.insert(6, json.dumps({"prompt": "What is 1 + 2?"}))
    heldout = [json.dumps({"prompt": f"What is {i} + 1?", "reference": str(i + 1)}) for i in range(8)]
    heldout.insert(1, json.dumps({"prompt": " ", "reference": "0"}))
    (tmp_path / "train.jsonl").write_text("\n".join(train) + "\n", encoding="utf-8")
    (tmp_path / "heldout.jsonl").write_text("\n".join(heldout) + "\n", encoding="utf-8")
    cfg = load_config(None, [
        *OVERRIDES, f"output_dir={tmp_path / 'runs'}", "run_name=q",
        f"data.train_path={tmp_path / 'train.jsonl'}", f"data.eval_path={tmp_path / 'heldout.jsonl'}",
    ])
    t0 = time.monotonic()
    summary = run(cfg)
    account = check_account(summary.run_dir, {"learner", "generator", "generator_slots"}, time.monotonic() - t0)
    assert {r.role: r for r in account.roles}["generator"].processes == 2  # both generators' accounts, summed
    train_q = [json.loads(x) for x in (summary.run_dir / "quarantine-train.jsonl").read_text().splitlines()]
    eval_q = [json.loads(x) for x in (summary.run_dir / "quarantine-eval.jsonl").read_text().splitlines()]
    assert [(q["line"], q["field"]) for q in train_q] == [(3, "<json>"), (7, "reference")]
    assert [(q["line"], q["field"]) for q in eval_q] == [(2, "prompt")]
    assert ("quarantined rows", "3") in summary.rows
    assert re.search(r"\| quarantined rows +\| 3 +\|", (summary.run_dir / "summary.md").read_text())
    assert _logged_metric(summary.run_dir, "data/quarantined_rows") == 3.0
    logs = sorted((summary.run_dir / "logs").glob("generator-*.log"))
    assert len(logs) == 2
