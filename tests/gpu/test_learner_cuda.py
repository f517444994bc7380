"""The learner on CUDA: SFT and SAO steps in bf16 land near the CPU fp32 steps; 2 NCCL ranks make 1 rank's update.

Needs a CUDA GPU (skipped otherwise; the 2-rank test needs two). The comparisons and tolerances are
``scripts/gpu_check.py``'s (``LIMITS``): bf16 against fp32 on the same batch and start weights, relative loss
difference < 2e-2 and cosine between the two parameter updates >= 0.9; 2 ranks against 1 in fp32, < 1e-4 and
>= 0.999. ``scripts/gpu_check.sh`` runs the same checks on the Qwen2-0.5B shape too and writes the figures.

Run: ``python -m pytest -q -m gpu tests/gpu/test_learner_cuda.py`` on a GPU machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_sft_and_sao_steps_in_bf16_on_cuda_land_near_the_fp32_steps_on_the_cpu(tmp_path: Path) -> None:
    from scripts.gpu_check import parity

    result = parity(["tiny"], "cuda", tmp_path)
    assert [c for c in result["checks"] if not c["ok"]] == []


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_nccl_ranks_make_the_sao_update_of_one_gpu(tmp_path: Path) -> None:
    from scripts.gpu_check import ranks

    result = ranks("cuda", "fp32", tmp_path)
    assert [c for c in result["checks"] if not c["ok"]] == []
