"""A critic warm-up longer than the staleness window must not starve the generators.

Admission lets generators start ``(v + tau + 1) * B`` rollouts by learner version ``v``. The
critic-only warm-up iterations consume batches without a new version, so before the fix each
one shrank that capacity by ``B`` and a warm-up of more than ``tau + 1`` iterations (the config
defaults: 10 against 5) hung the run at version 0. Here ``tau = 1``, warm-up 3: the run must
finish its 2 policy versions. It runs in a child process with a time limit, so a regression
fails the test instead of hanging the suite.

Run: ``python -m pytest -q tests/integration/test_sao_warmup_admission.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = """
import sys
from posttrain.config import load_config
from posttrain.runners import run
summary = run(load_config(None, sys.argv[1:]))
print(dict(summary.rows)["policy versions"], dict(summary.rows)["rollouts trained"])
"""


def test_a_warmup_longer_than_the_staleness_window_still_trains(tmp_path: Path) -> None:
    """tau = 1, B = 4, warm-up 3 iterations, 2 policy versions: 5 iterations, 20 rollouts trained."""
    overrides = [
        f"output_dir={tmp_path / 'runs'}", "run_name=warmup", "generator.engine=hf", "generator.num_processes=1",
        "generator.episodes_in_flight=4", "generator.max_new_tokens=8", "generator.max_episode_tokens=64",
        "generator.episode_timeout_s=20", "model.tiny.vocab_size=400", "warm_start.steps=0", "sao.steps=2",
        "sao.batch_size=4", "sao.micro_batch_size=4", "sao.max_staleness=1", "sao.critic.warmup_steps=3",
        "eval.num_tasks=4", "eval.samples_per_task=1", "data.num_eval_tasks=4", "data.num_train_tasks=40",
        "tracking.register_final=false",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("REDIS_URL", None)
    child = subprocess.Popen([sys.executable, "-c", RUN, *overrides], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = child.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the run and its generator processes
        child.communicate()
        pytest.fail("the run did not finish in 420 s (admission starved by the warm-up?)")
    assert child.returncode == 0, err[-2000:]
    assert out.split()[-2:] == ["2", "20"]
