"""Two FSDP2 ranks (gloo, CPU, torchrun) make the update one process makes: SFT, DPO and GKD steps.

``_worker.py`` runs one optimizer step of each technique on the tiny model and a fixed batch,
once as a plain process and once under ``torchrun --nproc_per_node 2``; rank 0 writes the loss,
the gradient norm and the updated full weights. The batches have five rows (packed rows, pairs;
GKD: three on-policy rollouts and two fixed sequences, scored by a teacher sharded like the
student) in micro-batches of two, so on two ranks rank 0 trains rows 0, 2, 4 in two micro-batches and
rank 1 rows 1, 3 in one micro-batch plus a zero-weight filler.

Tolerances: everything is fp32 and the arithmetic is the same but for the order of sums (FSDP2
reduce-scatters two partial gradients and divides by 2; micro-batches are padded to other
widths). Measured on the 2-core CPU machine: loss differs by <= 2e-7 (SFT) and 0 (DPO), gradient
norm by <= 1e-6 relative, weights by <= 8e-9. The bounds (loss and norm rtol 1e-5, weights
atol 1e-6 + rtol 1e-5) are ~100x those and ~1000x below what a wrong loss scale does: the
optimizer is SGD at lr 0.05, so every weight moves by lr x its gradient (up to ~5e-3 here), and a
factor of 2 in the scale would move it ~2.5e-3 away.
"""

from __future__ import annotations

import pytest
import torch
from _worker import run_worker
from safetensors.torch import load_file

from posttrain.models.hf import build_tiny_model

pytestmark = pytest.mark.slow

TECHNIQUES = ["sft", "dpo", "gkd"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(one process, two ranks, start weights), each technique run once per launch."""
    root = tmp_path_factory.mktemp("fsdp_parity")
    build_tiny_model(root / "model", vocab_size=512, seed=0)
    one = run_worker(root / "model", root / "one", TECHNIQUES, nproc=1)
    two = run_worker(root / "model", root / "two", TECHNIQUES, nproc=2)
    return one, two, load_file(str(root / "model" / "model.safetensors"))


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_two_ranks_make_the_same_step_as_one(runs, technique):
    one, two, start = runs
    a, b = one[technique], two[technique]
    assert (a.world_size, b.world_size) == (1, 2)
    assert b.loss == pytest.approx(a.loss, rel=1e-5)
    assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
    count = {"sft": "sft/tokens", "dpo": "dpo/pairs", "gkd": "gkd/trained_tokens"}[technique]
    assert b.metrics[count] == a.metrics[count]  # the divisor: the step's count over both ranks
    assert sorted(a.weights) == sorted(b.weights)
    moved = max(float((a.weights[f"policy.{k}"] - v).abs().max()) for k, v in start.items())
    assert moved > 1e-3  # the step is big enough for a wrong loss scale to show
    for key, value in a.weights.items():
        torch.testing.assert_close(b.weights[key], value, atol=1e-6, rtol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


def test_metrics_are_the_steps_over_both_ranks(runs):
    """Metrics are reduced over ranks, so they read the same for one rank or two."""
    one, two, _ = runs
    for technique in TECHNIQUES:
        a, b = one[technique].metrics, two[technique].metrics
        assert sorted(a) == sorted(b)
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), f"{technique} {key}"
