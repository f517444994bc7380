"""``posttrain run configs/sao_demo_cpu.yaml``, shortened, as a user sees it: stages and a summary on the console.

Before: MLflow's INFO lines ("Creating initial MLflow database tables...") and tqdm's per-step bars
were on the console (and, with the vllm engine, vLLM's EngineCore warnings). Now the console holds
the run's own lines; library messages are in ``<run>/logs/run.log`` and each generator's output in
``<run>/logs/generator-g<i>.log``. The run is the demo config with a few steps of each stage on
the hf engine (vLLM takes a minute to start here).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHORT = ["generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
         "warm_start.steps=5", "sao.steps=4", "sao.batch_size=4", "sao.micro_batch_size=4",
         "sao.checkpoint_every=2", "sao.critic.warmup_steps=1", "data.num_train_tasks=64", "data.num_eval_tasks=8",
         "eval.num_tasks=4", "eval.samples_per_task=1", "model.tiny.vocab_size=400"]
LIBRARY_LINE = re.compile(r"\b(INFO|WARNING|DEBUG)\b|[Ww]arning:|it/s\]")
"""A logging record of a library (``... INFO mlflow...``), a Python warning, or a tqdm bar."""


def test_a_short_demo_run_shows_its_stages_and_summary_and_sends_library_lines_to_the_run_log(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "MLFLOW_TRACKING_URI", "MLFLOW_CONFIGURE_LOGGING", "VLLM_CONFIGURE_LOGGING")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "run", str(REPO / "configs" / "sao_demo_cpu.yaml"),
         f"output_dir={tmp_path}", *SHORT],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    lines = [line for line in console.splitlines() if line.strip()]
    for stage in ("[1/5] prepare", "[2/5] SFT warm start", "[3/5] held-out eval after SFT", "[4/5] SAO",
                  "[5/5] held-out eval after SAO"):
        assert sum(line.startswith(stage) for line in lines) == 1, (stage, lines)
    for row in ("accuracy after SFT:", "accuracy after SAO:", "policy version 2/4: training reward",
                "policy version 4/4: training reward", "| held-out accuracy after SAO", "| seconds per stage",
                "| registered model version"):
        assert sum(row in line for line in lines) == 1, (row, lines)
    # posttrain's own warnings stay (e.g. "generator(s) alive again" when the machine is slow to start them).
    noise = [line for line in lines if LIBRARY_LINE.search(line) and not line.startswith("posttrain: WARNING posttrain.")]
    assert noise == [], noise
    run_dir = tmp_path / "sao-demo"
    assert f"library and engine messages go to {run_dir / 'logs' / 'run.log'}" in lines[0]
    run_log = (run_dir / "logs" / "run.log").read_text(encoding="utf-8")
    assert re.search(r" mlflow\S* INFO ", run_log), run_log[-2000:]  # routed to the file, not dropped
    for i in (0, 1):
        generator_log = (run_dir / "logs" / f"generator-g{i}.log").read_text(encoding="utf-8")
        assert f"generator g{i}: " in generator_log  # its closing line ("... rollouts, busy fraction ...")
