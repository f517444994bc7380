"""``torchrun --nproc_per_node 2 -m posttrain.cli run CONFIG``: SFT and synchronous GRPO on two FSDP2 ranks.

Each test starts the command line as a user would (gloo on the CPU, one torch thread per rank,
MLflow on sqlite in the test's directory) with the shipped config and a few steps. It checks what
the run leaves behind: a final model that loads, checkpoints with one shard file per rank, the
metrics written once (by rank 0), the summary printed once; that a 2-rank checkpoint resumes on
one process; and that a batch smaller than the number of ranks stops before anything is written.
The step arithmetic (2 ranks = 1 rank) is checked in ``tests/unit/parallel/test_fsdp_parity.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posttrain.account import RunAccount
from posttrain.learner.ledger import LEDGER_NAME, read_ledger
from posttrain.models.hf import load_policy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SFT = ["sft.max_examples=40", "sft.max_seq_len=256", "sft.checkpoint_every=2", "eval.num_tasks=2",
       "generator.max_new_tokens=8"]


def _run(config: str, out: Path, *overrides: str, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    """``posttrain run`` under torchrun with ``ranks`` ranks (a plain process for 1)."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                if ranks > 1 else [sys.executable])
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "REDIS_URL", "RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")])))
    cmd = [*launcher, "-m", "posttrain.cli", "run", f"configs/{config}", f"output_dir={out}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc.stdout


def _metric_steps(run_dir: Path, key: str) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [r["step"] for r in rows if key in r]


def _shards(checkpoint: Path) -> list[str]:
    return sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp"))


def test_sft_on_two_ranks_checkpoints_exports_and_resumes_on_one(tmp_path):
    """4 steps on 2 ranks (checkpoints at 2 and 4, two shard files each), then steps 5-6 on one process."""
    run_dir = tmp_path / "sft-cpu"
    stdout = _ok(_run("sft_cpu.yaml", tmp_path, "sft.steps=4", *SFT))
    assert stdout.count("| technique ") == 1  # rank 0 prints the summary, rank 1 nothing
    assert _metric_steps(run_dir, "loss/sft") == [1, 2, 3, 4]  # written once per step, by rank 0
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "LATEST").read_text(encoding="utf-8") == "iter-000004"
    assert _shards(checkpoints / "iter-000004") == ["__0_0.distcp", "__1_0.distcp"]
    final = run_dir / "final_model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "resolved_config.yaml"):
        assert (final / name).is_file(), name
    model = load_policy(final)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()

    _ok(_run("sft_cpu.yaml", tmp_path, "sft.steps=6", *SFT, ranks=1))  # resumes the 2-rank checkpoint
    assert _metric_steps(run_dir, "loss/sft") == [1, 2, 3, 4, 5, 6]
    assert (checkpoints / "LATEST").read_text(encoding="utf-8") == "iter-000006"
    assert _shards(checkpoints / "iter-000006") == ["__0_0.distcp"]


def test_a_batch_smaller_than_the_ranks_is_refused_before_anything_is_written(tmp_path):
    proc = _run("sft_cpu.yaml", tmp_path, "sft.batch_size=1", "sft.micro_batch_size=1")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("posttrain: ")]
    assert lines and all(line.startswith("posttrain: config error: sft.batch_size: a batch of 1 cannot feed 2 "
                                         "learner ranks") for line in lines)
    assert not (tmp_path / "sft-cpu").exists()


def test_sync_grpo_on_two_ranks_generates_every_group_once_in_prompt_order(tmp_path):
    """3 iterations of 3 prompts x 4 rollouts: rank 0 samples prompts 0 and 2, rank 1 prompt 1; every
    iteration's ledger line has the 12 rollouts as 3 whole groups, a policy version per update, and
    the final model loads."""
    stdout = _ok(_run("grpo_cpu.yaml", tmp_path, "warm_start.steps=2", "grpo.steps=3", "grpo.prompts_per_step=3",
                      "grpo.group_size=4", "grpo.checkpoint_every=2", "grpo.drop_uniform_groups=false",
                      "eval.num_tasks=2"))
    assert stdout.count("| technique ") == 1
    run_dir = tmp_path / "grpo-cpu"
    ledger = read_ledger(run_dir / LEDGER_NAME)
    assert [line["iteration"] for line in ledger] == [1, 2, 3]
    for line in ledger:
        tasks = [r["task_id"] for r in line["rollouts"]]
        assert len(tasks) == 12 and len(set(tasks)) == 3
        assert tasks == sorted(tasks, key=tasks.index)  # each group whole and contiguous
    assert _shards(run_dir / "checkpoints" / "iter-000003") == ["__0_0.distcp", "__1_0.distcp"]
    assert (run_dir / "final_model" / "model.safetensors").is_file()
    load_policy(run_dir / "final_model")
    # Issue 35: the generator account is both ranks' engines summed (one all-reduce), not rank 0's alone.
    account = RunAccount.from_json((run_dir / "account.json").read_text(encoding="utf-8"))
    engine = next(r for r in account.roles if r.role == "generator")
    assert engine.processes == 2 and engine.gap() <= 0.02 and engine.shares["generating"] > 0
