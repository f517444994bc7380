"""Runs started together on a fresh ``mlflow.db`` all get the same experiment (a new user's check, issue 23).

Three ``make demo SEED=N`` started at once on a fresh ``runs/mlflow.db`` failed in MLflow's table set-up: each
process ran the schema migrations at once (``alembic ... expected to match one row``, ``table ... already
exists``), and two that both found no experiment both tried to create it. The processes here are real and start
at one instant (a shared start time), so the race is there on every run; the check is a count, not a timing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROCESSES = 3

_ONE = """
import sys, time
import mlflow  # imported before the start line, so the processes meet at the store's creation
from posttrain.tracking.client import experiment_id_for, mlflow_client
uri, start = sys.argv[1], float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
print("experiment", experiment_id_for(mlflow_client(uri), uri, "together"))
"""


def test_processes_creating_a_fresh_store_and_experiment_at_once_all_succeed_with_one_experiment(tmp_path: Path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    start = time.time() + 15  # after every interpreter has imported mlflow (about 3-5 s each on 2 busy cores)
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, "-c", _ONE, uri, str(start)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path) for _ in range(PROCESSES)]
    results = [proc.communicate(timeout=300) for proc in procs]
    failed = [err[-1500:] for proc, (_, err) in zip(procs, results, strict=True) if proc.returncode != 0]
    assert failed == []
    ids = {out.strip().splitlines()[-1] for out, _ in results}
    assert len(ids) == 1 and next(iter(ids)).startswith("experiment ")
