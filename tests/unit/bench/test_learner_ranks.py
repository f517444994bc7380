"""bench.learner_ranks: the bytes-per-rank accounting, the per-rank gather and the step table (no timings checked)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from bench import common
from bench.learner_ranks import (
    MEMORY_SHAPES,
    launch,
    median_after_warmup,
    model_state_bytes,
    per_rank,
    render,
    step_rows,
)

from posttrain.parallel.world import World


def _tiny() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**MEMORY_SHAPES["tiny"]))


def test_model_state_bytes_counts_parameters_gradients_and_adamw_state_once_each() -> None:
    """Tied embeddings count once: n parameters -> 4n bytes each of weights and gradients; AdamW keeps exp_avg and
    exp_avg_sq (8n bytes) and a float32 step per parameter tensor (4 bytes each)."""
    model = _tiny()
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    assert model_state_bytes(model, optimizer) == {"parameters": 4 * n, "gradients": 0, "optimizer": 0}
    ids = torch.randint(0, 1024, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert model_state_bytes(model, optimizer) == {"parameters": 4 * n, "gradients": 4 * n,
                                                   "optimizer": 8 * n + 4 * len(params)}


def test_per_rank_gives_one_row_per_rank_and_median_skips_the_warmup() -> None:
    assert per_rank(World(), [1, 2.5]) == [[1.0, 2.5]]
    assert median_after_warmup([9.0, 1.0, 3.0, 2.0], 1) == 2.0
    with pytest.raises(ValueError, match="none left"):
        median_after_warmup([1.0], 1)


def test_step_rows_take_the_median_over_rounds_and_divide_by_the_one_rank_layouts() -> None:
    """SFT medians: 1x1 over {2, 4} (rounds' steps after one warm-up) = 3; 1x2 = 2; 2x1 over {3, 3} = 3.
    2x1 / 1x1 = 1.0, 2x1 / 1x2 = 1.5; tokens/s = 600 / 3 = 200."""
    def run(ranks: int, threads: int, sft: list[float]) -> dict:
        return {"ranks": ranks, "threads": threads, "parameters": 10, "batch_tokens": 600,
                "peak_rss_bytes_per_rank": [2**30] * ranks, "sft": {"step_s": sft, "loss_first": 1.0},
                "sao": {"step_s": sft, "loss_first": {"loss/policy": 1.0}}}

    runs = {"1x1": [run(1, 1, [9, 2]), run(1, 1, [9, 4])], "1x2": [run(1, 2, [9, 2])],
            "2x1": [run(2, 1, [9, 3]), run(2, 1, [9, 3])]}
    rows = {(r["technique"], r["layout"]): r for r in step_rows("tiny", runs, warmup=1)}
    two = rows["sft", "2x1"]
    assert (rows["sft", "1x1"]["step_s"], rows["sft", "1x2"]["step_s"], two["step_s"]) == (3.0, 2.0, 3.0)
    assert (two["ratio_over_1x1"], two["ratio_over_1x2"], two["tokens_per_s"]) == (1.0, 1.5, 200.0)
    assert rows["sft", "1x1"]["round_medians_s"] == [2, 4]
    text = render({"machine": {}, "command": "c", "batch_rows": 8, "batch_tokens": 600, "micro_batch_size": 2,
                   "rounds": 2, "steps_measured": 1, "warmup": 1, "steps": list(rows.values()), "memory": []})
    assert "| tiny | 0.0 M | SFT | 2 x 1 | 3.000 (3.00 / 3.00) | 200 | 1.00 | **1.50** | 1.00 |" in text


@pytest.mark.slow
def test_two_sharded_ranks_together_hold_the_model_state_of_one_rank(tmp_path: Path) -> None:
    """FSDP2 splits every parameter, gradient and AdamW moment over the ranks (dim 0, no copies): the two ranks'
    bytes add up to one rank's, except AdamW's scalar step, which each rank keeps for each parameter (4 bytes)."""
    launch(["memory", "tiny", str(tmp_path / "one.json")], ranks=1, threads=1, timeout_s=600)
    launch(["memory", "tiny", str(tmp_path / "two.json")], ranks=2, threads=1, timeout_s=600)
    one, two = (common.read_json(tmp_path / f"{n}.json") for n in ("one", "two"))
    assert (one["sharded"], two["sharded"], len(two["per_rank"])) == (False, True, 2)
    (single,) = one["per_rank"]
    n_tensors = (single["optimizer"] - 2 * single["parameters"]) // 4
    for key in ("parameters", "gradients"):
        assert sum(r[key] for r in two["per_rank"]) == single[key], key
        assert max(r[key] for r in two["per_rank"]) < 0.6 * single[key], key
    assert sum(r["optimizer"] for r in two["per_rank"]) == single["optimizer"] + 4 * n_tensors
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
