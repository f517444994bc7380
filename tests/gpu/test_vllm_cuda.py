"""VLLMEngine on CUDA: step-0 logprob parity and decode throughput at batch 1 and 32.

Needs a CUDA GPU and the CUDA build of vLLM in the environment (skipped otherwise). The model is
built locally with random weights in the Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads / 2 KV
heads, vocabulary 151,936), so no hub access is needed; prompts are token ids.

Parity: bf16 vLLM behaviour logprobs vs the learner's fp32 recomputation on the GPU, single-turn and
multi-turn (observation ids appended between turns); mean |Δ| <= 0.01 and max |Δ| <= 0.1 nats, and
the SAO DIS band (0.7, 6.0) masks no token. Throughput (tokens/s of generated tokens) is measured,
not asserted, and appended with the parity figures to ``bench/results/gpu_vllm.json`` (or to the
file named by ``GPU_VLLM_RESULTS``).

Run: ``python -m pytest -q -s tests/gpu/test_vllm_cuda.py`` on a GPU machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fixtures_models import REPO_ROOT
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.inference.factory import vllm_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    # Short-circuits, so machines without CUDA never pay for importing vllm at collection.
    pytest.mark.skipif(not torch.cuda.is_available() or not vllm_available(), reason="needs CUDA and vllm"),
]

RESULTS = Path(os.environ.get("GPU_VLLM_RESULTS", REPO_ROOT / "bench" / "results" / "gpu_vllm.json"))
"""Where the figures are appended; ``GPU_VLLM_RESULTS`` overrides (for example a path under ``$OUT``)."""
VOCAB = 151_936
NEW_TOKENS = 256
MEAN_ABS_DIFF_BOUND = 0.01
MAX_ABS_DIFF_BOUND = 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.models.hf import build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("qwen2_05b_shape"),
        vocab_size=VOCAB,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_position_embeddings=4096,
        seed=0,
    )


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[InferenceEngine]:
    from posttrain.inference.vllm import VLLMEngine

    eng = VLLMEngine(model_dir, seed=0, max_model_len=2048, kv_cache_gib=8, dtype="bfloat16", max_batch=64)
    yield eng
    eng.close()


def append_result(entry: dict[str, object]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    rows.append(entry)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def run_all(engine: InferenceEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    async def go() -> list[GenerationResult]:
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))

    return asyncio.run(go())


def test_cuda_vllm_parity_and_throughput(engine: InferenceEngine, model_dir: Path) -> None:
    from posttrain.config.common import SAOLossConfig
    from posttrain.losses.logprobs import token_logprobs
    from posttrain.losses.sao import dis_band
    from posttrain.models.hf import load_policy

    rng = random.Random(0)
    # Single-turn and three-turn episodes, token in / token out.
    sequences: list[tuple[list[int], list[float], list[bool]]] = []
    for i in range(8):
        ids = random_ids(rng, 64)
        behaviour, mask = [0.0] * len(ids), [False] * len(ids)
        for turn in range(1 if i < 4 else 3):
            (res,) = run_all(
                engine, [GenerationRequest(prompt_token_ids=list(ids), max_new_tokens=64, seed=10 * i + turn)]
            )
            ids, behaviour, mask = (
                ids + res.token_ids,
                behaviour + res.logprobs,
                mask + [True] * len(res.token_ids),
            )
            observation = random_ids(rng, 16)
            ids, behaviour, mask = ids + observation, behaviour + [0.0] * 16, mask + [False] * 16
        sequences.append((ids, behaviour, mask))
    learner = load_policy(model_dir).cuda()
    current, behaviour_all = [], []
    for ids, behaviour, mask in sequences:
        t = torch.tensor([ids], device="cuda")
        with torch.no_grad():
            lp = token_logprobs(learner(input_ids=t).logits, t)[0].cpu()
        m = torch.tensor(mask)
        current.append(lp[m])
        behaviour_all.append(torch.tensor(behaviour)[m])
    cur, beh = torch.cat(current), torch.cat(behaviour_all)
    diff = (cur - beh).abs()
    sao = SAOLossConfig()
    ones = torch.ones(1, cur.numel(), dtype=torch.bool)
    band = dis_band(cur[None], beh[None], ones, sao.mask_eps_low, sao.mask_eps_high, sao.log_ratio_clamp)
    masked = int((~band.keep).sum())
    del learner
    torch.cuda.empty_cache()

    throughput = {}
    run_all(
        engine, [GenerationRequest(prompt_token_ids=random_ids(rng, 32), max_new_tokens=16, seed=1)]
    )  # warm-up
    for batch in (1, 32):
        requests = [
            GenerationRequest(prompt_token_ids=random_ids(rng, 128), max_new_tokens=NEW_TOKENS, seed=100 + j)
            for j in range(batch)
        ]
        start = time.perf_counter()
        results = run_all(engine, requests)
        elapsed = time.perf_counter() - start
        throughput[f"batch_{batch}_tokens_per_s"] = round(sum(len(r.token_ids) for r in results) / elapsed, 1)

    import vllm

    entry = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0),
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "model": "random Qwen2-0.5B shape (896 hidden, 24 layers, vocab 151936)",
        "dtype": "bfloat16",
        "new_tokens_per_request": NEW_TOKENS,
        "parity_action_tokens": int(cur.numel()),
        "parity_mean_abs_diff": round(float(diff.mean()), 6),
        "parity_max_abs_diff": round(float(diff.max()), 6),
        "dis_band_masked_tokens": masked,
        **throughput,
    }
    append_result(entry)
    print(json.dumps(entry, indent=2))
    assert diff.mean().item() <= MEAN_ABS_DIFF_BOUND
    assert diff.max().item() <= MAX_ABS_DIFF_BOUND
    assert masked == 0
