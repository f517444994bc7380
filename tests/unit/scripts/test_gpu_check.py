"""scripts/gpu_check.py without a GPU: the comparison arithmetic, the summary, and its steps on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scripts.gpu_check import LIMITS, compare_updates, judge, parity, ranks, relative_difference, summarize


def test_compare_updates_measures_the_distance_and_the_angle_between_two_steps() -> None:
    """From 0, a moves (+lr, -lr) and b (+lr, +lr): differences 0 and 2 lr (max 2 lr, mean lr), the updates are
    orthogonal (cosine 0)."""
    lr = 1e-4
    start = {"w": torch.zeros(2)}
    out = compare_updates(start, {"w": torch.tensor([lr, -lr])}, {"w": torch.tensor([lr, lr])}, lr)
    assert out["max_abs_diff"] == pytest.approx(2 * lr) and out["mean_abs_diff"] == pytest.approx(lr)
    assert out["update_cosine"] == pytest.approx(0.0) and out["max_diff_over_lr"] == pytest.approx(2.0)
    assert out["finite"] and out["max_abs_update"] == pytest.approx(lr)
    same = compare_updates(start, {"w": torch.tensor([lr, lr])}, {"w": torch.tensor([2 * lr, 2 * lr])}, lr)
    assert same["update_cosine"] == pytest.approx(1.0)
    assert not compare_updates(start, {"w": torch.tensor([float("nan"), 0.0])}, start, lr)["finite"]
    with pytest.raises(ValueError, match="names"):
        compare_updates(start, {"v": torch.zeros(2)}, start, lr)


def test_judge_and_relative_difference() -> None:
    assert relative_difference(1.01, 1.0) == pytest.approx(0.01) and relative_difference(0.5, 0.0) == 0.5
    assert judge("x", 0.01, 0.02, at_most=True)["ok"] and not judge("x", 0.8, 0.9, at_most=False)["ok"]


def test_summary_lists_every_check_the_throughput_and_what_is_missing(tmp_path: Path) -> None:
    checks = [judge("tiny sft: loss/sft relative difference", 0.001, 0.02, at_most=True),
              judge("tiny sft: policy update cosine", 0.5, 0.9, at_most=False)]
    (tmp_path / "parity.json").write_text(json.dumps({"checks": checks}))
    (tmp_path / "throughput.json").write_text(json.dumps({"checks": [], "rows": [
        {"shape": "qwen2-0.5b", "step": "sft", "precision": "bf16", "device": "cuda", "tokens_per_s": 12345.6,
         "step_s": 0.66, "batch_tokens": 8192, "peak_cuda_memory_bytes": 3 * 2**30}]}))
    result, text = summarize(tmp_path)
    assert not result["all_ok"] and result["missing"] == ["vllm", "gateway"]
    assert "PASS  tiny sft: loss/sft relative difference: 0.001 (< 0.02)" in text
    assert "FAIL  tiny sft: policy update cosine: 0.5 (>= 0.9)" in text
    assert "tokens/s  qwen2-0.5b sft bf16 on cuda: 12346 (0.660 s/step for 8192 tokens, peak 3.0 GiB)" in text
    assert "MISSING   vllm (see vllm.log)" in text


def _gateway_row(concurrency: int, direct: float, gateway: float) -> dict[str, object]:
    return {"layout": "shared", "concurrency": concurrency, "direct_ms_per_token": direct,
            "gateway_ms_per_token": gateway, "ratio": gateway / direct}


def test_summary_lists_the_gateway_ratios_and_judges_the_worst_against_the_goal(tmp_path: Path) -> None:
    """Three concurrency levels: every ratio gets a line; the worst one (1.25 at 8) fails the 1.2x goal, and one at
    exactly 1.2 passes."""
    rows = [_gateway_row(1, 4.0, 4.4), _gateway_row(8, 0.8, 1.0), _gateway_row(32, 0.25, 0.275)]
    (tmp_path / "gateway.json").write_text(json.dumps({"engine": "vllm", "rows": rows}))
    result, text = summarize(tmp_path)
    assert result["missing"] == ["parity", "throughput", "vllm"] and result["parts"]["gateway"]["engine"] == "vllm"
    assert result["limits"]["gateway_ratio_max"] == 1.2
    assert "FAIL  gateway / direct time per token, worst (vllm engine, shared layout, 8 concurrent): 1.25 (< 1.2)" in text
    for line in ("gateway   shared 1 concurrent (vllm engine): ms/token direct 4.000, gateway 4.400, ratio 1.10",
                 "gateway   shared 8 concurrent (vllm engine): ms/token direct 0.800, gateway 1.000, ratio 1.25",
                 "gateway   shared 32 concurrent (vllm engine): ms/token direct 0.250, gateway 0.275, ratio 1.10"):
        assert line in text
    rows[1] = _gateway_row(8, 1.0, 1.2)
    (tmp_path / "gateway.json").write_text(json.dumps({"engine": "vllm", "rows": rows}))
    (check,) = summarize(tmp_path)[0]["checks"]
    assert check["ok"] and check["value"] == pytest.approx(1.2)


@pytest.mark.slow
def test_bf16_steps_on_the_cpu_pass_the_checks_the_script_applies_on_cuda(tmp_path: Path) -> None:
    """The parity part with bf16 autocast on the CPU in place of CUDA: the same code and the same limits."""
    result = parity(["tiny"], "cpu", tmp_path)
    assert {(r["step"], r["device"]) for r in result["rows"]} == {("sft", "cpu"), ("sao", "cpu")}
    assert [c for c in result["checks"] if not c["ok"]] == []
    assert all(0 < r["parameters"]["policy"]["max_abs_update"] <= 1.01 * 1e-4 for r in result["rows"])


@pytest.mark.slow
def test_two_gloo_ranks_pass_the_rank_checks_the_script_applies_with_nccl(tmp_path: Path) -> None:
    result = ranks("cpu", "fp32", tmp_path)
    assert [c for c in result["checks"] if not c["ok"]] == []
    assert result["rows"][0]["loss_relative_difference"]["loss/policy"] < LIMITS["ranks_loss_rtol"]
