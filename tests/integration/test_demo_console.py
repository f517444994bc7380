"""``posttrain run configs/sao_demo_cpu.yaml``, shortened, as a user sees it: Ctrl-C, the re-run, the console.

One run is interrupted with Ctrl-C (SIGINT to its whole process group, as a terminal sends it) once the learner
has trained; the same command run again resumes it and finishes, and its console is checked.

Ctrl-C: the SIGINT used to reach the embedded Valkey too, which shut down under the learner; the learner retried
it for the whole reconnect window and the run ended 87 s later with "Redis ... unreachable", never saying it was
interrupted. Here the window is 300 s, so that behaviour would run past the wait below. Now the learner finishes
its step, checkpoints and the run exits 130 with one line saying so and how to resume.

Console: MLflow's INFO lines ("Creating initial MLflow database tables...") and tqdm's per-step bars were on the
console (and, with the vllm engine, vLLM's EngineCore warnings). Now the console holds the run's own lines;
library messages are in ``<run>/logs/run.log`` and each generator's output in ``<run>/logs/generator-g<i>.log``.
The stage line of an evaluation names the tasks it runs (6 here, the held-out split's size, where
``eval.num_tasks`` says 100), and every time on the console is read from one clock, labelled ``at N s``.
The run is the demo config with a few steps of each stage on the hf engine (vLLM takes a minute to start here).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHORT = ["generator.engine=hf", "generator.num_processes=2", "generator.episodes_in_flight=4",
         "warm_start.steps=5", "sao.steps=8", "sao.batch_size=4", "sao.micro_batch_size=4",
         "sao.checkpoint_every=2", "sao.critic.warmup_steps=1", "data.num_train_tasks=64", "data.num_eval_tasks=6",
         "eval.samples_per_task=1", "model.tiny.vocab_size=400", "queue.reconnect_window_s=300"]
LIBRARY_LINE = re.compile(r"\b(INFO|WARNING|DEBUG)\b|[Ww]arning:|it/s\]")
"""A logging record of a library (``... INFO mlflow...``), a Python warning, or a tqdm bar."""


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_ctrl_c_stops_the_demo_with_a_checkpoint_and_the_rerun_resumes_with_a_clean_console(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "MLFLOW_TRACKING_URI", "MLFLOW_CONFIGURE_LOGGING", "VLLM_CONFIGURE_LOGGING")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    cmd = [sys.executable, "-m", "posttrain.cli", "run", str(REPO / "configs" / "sao_demo_cpu.yaml"),
           f"output_dir={tmp_path}", *SHORT]
    run_dir = tmp_path / "sao-demo"
    ledger = run_dir / "learner_ledger.jsonl"

    # 1. Ctrl-C once the learner has trained a batch: the terminal's SIGINT reaches every process of the group.
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while not (ledger.exists() and ledger.read_text(encoding="utf-8").strip()):
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            assert time.monotonic() < deadline, "no learner iteration within 420 s"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGINT)
        console = first.communicate(timeout=120)[0]  # bounds a hang: the old path retried Redis for 300 s
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    lines = _lines(console)
    assert first.returncode == 130, lines[-20:]
    assert "Traceback" not in console and "unreachable" not in console
    stopped = re.fullmatch(r"posttrain: learner stopped at policy version (\d+) of 8: interrupted \(Ctrl-C\); "
                           r"stopped after a final checkpoint; run the same command again to resume from (\S+) "
                           r"\(learner iteration (\d+), policy version (\d+)\)", lines[-1])
    assert stopped, lines[-5:]
    version, checkpoint = int(stopped[1]), Path(stopped[2])
    state = json.loads((checkpoint / "state.json").read_text(encoding="utf-8"))["state"]
    assert state["policy_version"] == version == int(stopped[4]) < 8  # the checkpoint covers every trained version
    assert state["iteration"] == int(stopped[3]) and checkpoint.name == f"iter-{state['iteration']:06d}"
    account = json.loads((run_dir / "account.json").read_text(encoding="utf-8"))  # the interrupted life's
    assert account["outcome"] == "interrupted" and account["trained_tokens"] == state["counters"]["action_tokens_trained"] > 0
    assert "interrupted (Ctrl-C)" in (run_dir / "summary.md").read_text(encoding="utf-8")
    for i in (0, 1):  # the generators stopped on the SIGINT too, cleanly
        generator_log = (run_dir / "logs" / f"generator-g{i}.log").read_text(encoding="utf-8")
        assert "Traceback" not in generator_log

    # 2. The same command again: it resumes at the checkpoint and finishes; the console holds the run's own lines.
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    lines = _lines(console)
    for stage in ("[1/5] prepare", "[2/5] SFT warm start", "[3/5] held-out eval after SFT (6 tasks x 1 sample, hf",
                  f"[4/5] SAO: 2 generators + learner, 8 policy versions, resuming at policy version {version} ",
                  "[5/5] held-out eval after SAO"):
        assert sum(line.startswith(stage) for line in lines) == 1, (stage, lines)
    stage_lines = [line for line in lines if line.startswith("[")]
    assert all(re.search(r"  \(at \d+ s\)$", line) for line in stage_lines), stage_lines
    for row in ("accuracy after SFT:", "accuracy after SAO:", "policy version 8/8: training reward",
                "| held-out accuracy after SAO", "| seconds per stage", "| wall time (s, from the process start)"):
        assert sum(row in line for line in lines) == 1, (row, lines)
    # The model's first version is its champion (the docs load models:/sao-demo-policy@champion).
    assert any(re.match(r"\| registered model version +\| 1, champion \(first champion: version 1 ", line)
               for line in lines), lines[-30:]
    progress = [line for line in lines if "policy version" in line and "training reward" in line]
    assert progress and all(re.search(r"batch(es)? since the last line\)(, [a-z ]+ \d+%)*  \(at \d+ s\)$", line)
                            for line in progress)
    assert "| seconds per stage" in console and "start-up " in console
    # posttrain's own warnings stay (e.g. "generator(s) alive again" when the machine is slow to start them).
    noise = [line for line in lines if LIBRARY_LINE.search(line) and not line.startswith("posttrain: WARNING posttrain.")]
    assert noise == [], noise
    assert f"library and engine messages go to {run_dir / 'logs' / 'run.log'}" in lines[0]
    run_log = (run_dir / "logs" / "run.log").read_text(encoding="utf-8")
    assert re.search(r" mlflow\S* INFO ", run_log), run_log[-2000:]  # routed to the file, not dropped
    # The embedded server starts empty on the resume, by design: info lines of the run log (the generators'
    # positions restored; the admission counters re-based too when the checkpoint is past version 0), no
    # warning "(a fresh Redis?)" on the console (one or two of them before).
    assert not [line for line in lines if "fresh Redis" in line], lines
    assert re.search(r"posttrain\.learner INFO generator positions were behind the checkpoint's \(the run's embedded "
                     r"Redis starts empty on a resume\)", run_log)
    for i in (0, 1):
        generator_log = (run_dir / "logs" / f"generator-g{i}.log").read_text(encoding="utf-8")
        assert f"generator g{i}: " in generator_log  # its closing line ("... rollouts, busy fraction ...")
