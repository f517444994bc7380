"""Two FSDP2 ranks (gloo, CPU) make the SAO update one rank makes on the same batch.

``sao_worker.py`` takes one SAO step (two critic updates, then the DIS policy update) on a fixed
batch of five rollouts with micro-batches of two, once as a plain process and once under
``torchrun --nproc_per_node 2``. The ranks split the rows 3/2, so one rank runs a filler
micro-batch, and each scales its summed loss by ranks / global action tokens. The second case turns
on issue 29's critic options (advantage whitening, the fresh-token denominator, the head-bias init),
whose statistics are pooled over the ranks.

Tolerances: the losses agree to 1e-6 relative (only the order of float additions differs). The
parameters after one AdamW step of lr 1e-3 agree to 1e-4 absolute with a mean difference under
1e-8: Adam divides each coordinate's gradient by its own magnitude, so the few coordinates whose
gradient is near zero turn a reduction-order difference of ~1e-9 into up to a few 1e-5 of update
(measured: 8 of 398k coordinates above 1e-6, the largest 1.7e-5, mean 1.8e-10).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.models.hf import build_tiny_model

WORKER = Path(__file__).with_name("sao_worker.py")
SRC = Path(__file__).resolve().parents[3] / "src"


def _run(cmd: list[str], out: Path) -> tuple[dict[str, float], dict[str, dict[str, torch.Tensor]]]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics, {n: load_file(str(out / f"{n}.safetensors")) for n in ("policy", "critic")}


CRITIC_OPTIONS = {"whiten_advantages": True, "loss": {"denominator": "fresh_tokens"},
                  "critic": {"head_bias_init": "first_batch_mean"}}
"""Issue 29's critic options, all on: whitening statistics, the fresh-token denominator and the head's
bias (the mean reward 0.6) are pooled over the ranks, so two ranks still make one rank's update."""


@pytest.mark.slow
@pytest.mark.parametrize("options", [None, CRITIC_OPTIONS], ids=["defaults", "critic_options"])
def test_two_fsdp2_ranks_make_the_sao_update_of_one_rank(tmp_path: Path, options: dict | None) -> None:
    model = build_tiny_model(tmp_path / "model", vocab_size=400, seed=0)
    extra = [json.dumps(options)] if options else []
    one_m, one = _run([sys.executable, str(WORKER), str(model), str(tmp_path / "one"), *extra], tmp_path / "one")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    two_m, two = _run([*torchrun, str(WORKER), str(model), str(tmp_path / "two"), *extra], tmp_path / "two")
    start = load_file(str(model / "model.safetensors"))
    assert one_m["policy/grad_norm"] > 0 and max(float((one["policy"][k] - start[k]).abs().max()) for k in start) > 5e-4
    for key in ("loss/policy", "loss/value", "critic/grad_norm", "policy/grad_norm", "advantage/mean", "advantage/std",
                "batch/real_tokens", "mismatch/k3_kl", "ratio/max", "ratio/min", "ratio/mean",
                "value/explained_variance", "value/explained_variance_before", "policy/entropy",
                "mismatch/k3_kl_unmasked", "advantage/fresh_mean", "advantage/fresh_std", "batch/policy_loss_tokens"):
        assert two_m[key] == pytest.approx(one_m[key], rel=1e-6, abs=1e-9), key
    if options:  # 28 action tokens, 4 stale: whitened over the 24 fresh ones, which are also the denominator
        assert two_m["critic/head_bias_init"] == pytest.approx(one_m["critic/head_bias_init"]) == pytest.approx(0.6)
        assert one_m["batch/policy_loss_tokens"] == 24.0
        assert one_m["advantage/fresh_mean"] == pytest.approx(0.0, abs=1e-6)
        assert one_m["advantage/fresh_std"] == pytest.approx(1.0, rel=1e-5)
        assert float(one["critic"]["value_head.bias"]) != pytest.approx(0.0, abs=0.1)
    # the per-rollout token accounting (rows dealt over the ranks, gathered back) is the same; rollout 1 is stale
    rows_one, rows_two = (json.loads((tmp_path / d / "rows.json").read_text()) for d in ("one", "two"))
    assert rows_one == rows_two and rows_one[1]["stale_masked_tokens"] == 4 and rows_one[1]["trained_tokens"] == 0
    assert two_m["mask/frac_stale"] == pytest.approx(one_m["mask/frac_stale"]) == pytest.approx(4 / 28)
    for name in ("policy", "critic"):
        assert one[name].keys() == two[name].keys()
        diffs = torch.cat([(two[name][k] - one[name][k]).abs().flatten() for k in one[name]])
        assert float(diffs.max()) < 1e-4, name
        assert float(diffs.mean()) < 1e-8, name
