"""HFEngine: padded-batch sampling with per-request stops, behaviour logprobs equal to the learner's."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from fixtures_models import TinyModel, build_tiny
from posttrain.inference import hf as hf_engine
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.inference.factory import make_engine, vllm_available
from posttrain.inference.hf import BatchTiming, HFEngine, process_logits
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy
from posttrain.weight_sync import FilesystemWeightStore


def learner_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """[A] float32: the learner's recomputation, one forward pass over prompt + completion."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return token_logprobs(logits, ids, temperature=temperature)[0, len(prompt) :]


def run_all(engine: HFEngine, requests: list[GenerationRequest]) -> list[GenerationResult]:
    async def go() -> list[GenerationResult]:
        return list(await asyncio.gather(*(engine.generate(r) for r in requests)))

    return asyncio.run(go())


def prompt(n: int, start: int = 40) -> list[int]:
    return list(range(start, start + n))


def test_hf_engine_satisfies_inference_engine_protocol(tiny_model: TinyModel) -> None:
    engine = make_engine("hf", tiny_model.path, seed=0, max_model_len=256, kv_cache_gib=1, max_batch=8)
    assert isinstance(engine, InferenceEngine)
    assert engine.policy_version == 0
    assert isinstance(vllm_available(), bool)
    engine.close()


def test_generate_returns_one_finite_nonpositive_logprob_per_token(tiny_model: TinyModel) -> None:
    engine = HFEngine(tiny_model.path)
    (result,) = run_all(engine, [GenerationRequest(prompt_token_ids=prompt(7), max_new_tokens=12, seed=3)])
    assert len(result.token_ids) == len(result.logprobs) == 12
    assert result.finish_reason == "length"
    assert result.policy_version == 0
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in result.logprobs)
    assert all(0 <= t < tiny_model.vocab_size for t in result.token_ids)


def test_stop_token_ends_the_row_and_is_kept(tiny_model: TinyModel) -> None:
    """Same seed twice; the second run stops at the first occurrence of the free run's 4th token."""
    engine = HFEngine(tiny_model.path)
    (free,) = run_all(engine, [GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=10, seed=11)])
    stop = free.token_ids[3]
    cut = free.token_ids.index(stop) + 1
    (stopped,) = run_all(
        engine,
        [GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=10, stop_token_ids=[stop], seed=11)],
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:cut]
    assert stopped.token_ids[-1] == stop
    assert stopped.logprobs == pytest.approx(free.logprobs[:cut], abs=1e-6)


def test_mixed_budgets_and_stops_in_one_batch_match_running_alone(tiny_model: TinyModel) -> None:
    """Rows of prompt lengths 3, 9, 6 with budgets 2, 9, 5 and different stop sets share one padded batch."""
    engine = HFEngine(tiny_model.path)
    alone = [
        run_all(engine, [GenerationRequest(prompt_token_ids=prompt(n, s), max_new_tokens=m, seed=seed)])[0]
        for n, s, m, seed in [(3, 10, 2, 1), (9, 50, 9, 2), (6, 90, 5, 3)]
    ]
    stop_for_second = alone[1].token_ids[4]
    requests = [
        GenerationRequest(
            prompt_token_ids=prompt(3, 10), max_new_tokens=2, stop_token_ids=[tiny_model.im_end_id], seed=1
        ),
        GenerationRequest(
            prompt_token_ids=prompt(9, 50), max_new_tokens=9, stop_token_ids=[stop_for_second], seed=2
        ),
        GenerationRequest(prompt_token_ids=prompt(6, 90), max_new_tokens=5, seed=3),
    ]
    engine.batch_sizes.clear()
    batched = run_all(engine, requests)
    assert list(engine.batch_sizes) == [3]
    for req, got, ref in zip(requests, batched, alone, strict=True):
        cut = next(
            (i + 1 for i, t in enumerate(ref.token_ids) if t in req.stop_token_ids), len(ref.token_ids)
        )
        assert got.token_ids == ref.token_ids[:cut]
        assert got.finish_reason == ("stop" if got.token_ids[-1] in req.stop_token_ids else "length")
        assert got.logprobs == pytest.approx(ref.logprobs[:cut], abs=1e-5)
    assert batched[1].finish_reason == "stop" and batched[2].finish_reason == "length"


def test_eight_concurrent_generates_run_as_one_batch(tiny_model: TinyModel) -> None:
    engine = HFEngine(tiny_model.path, max_batch=32)
    requests = [
        GenerationRequest(prompt_token_ids=prompt(4 + i), max_new_tokens=3 + i, seed=i) for i in range(8)
    ]
    results = run_all(engine, requests)
    assert list(engine.batch_sizes) == [8]
    assert [len(r.token_ids) for r in results] == [3 + i for i in range(8)]


def test_batch_observer_sees_each_batch_shape(tiny_model: TinyModel) -> None:
    """8 prompts of 4..11 tokens, continuations of 3..10: one batch, width 11, 60 real prompt tokens, 10 steps.

    52 tokens sampled: each row only until its own budget, not the batch's 10 steps.
    """
    engine = HFEngine(tiny_model.path, max_batch=32)
    seen: list[BatchTiming] = []
    engine.batch_observer = seen.append
    run_all(engine, [GenerationRequest(prompt_token_ids=prompt(4 + i), max_new_tokens=3 + i, seed=i) for i in range(8)])
    assert len(seen) == 1
    timing = seen[0]
    assert (timing.rows, timing.width, timing.prompt_tokens, timing.new_tokens) == (8, 11, sum(range(4, 12)), 10)
    assert timing.generated_tokens == sum(range(3, 11))
    assert timing.seconds > 0


def test_batch_history_keeps_only_the_most_recent_batches(tiny_model: TinyModel, monkeypatch) -> None:
    """With a history of 2, three sequential single-request batches leave the last two sizes."""
    monkeypatch.setattr(hf_engine, "BATCH_HISTORY", 2)
    engine = HFEngine(tiny_model.path, max_batch=4)
    for n in (1, 2, 3):
        run_all(engine, [GenerationRequest(prompt_token_ids=prompt(3), max_new_tokens=1, seed=i) for i in range(n)])
    assert list(engine.batch_sizes) == [2, 3]


def test_max_batch_splits_concurrent_requests(tiny_model: TinyModel) -> None:
    """10 concurrent requests with max_batch=4 run as batches of 4, 4, 2."""
    engine = HFEngine(tiny_model.path, max_batch=4)
    run_all(
        engine, [GenerationRequest(prompt_token_ids=prompt(3), max_new_tokens=2, seed=i) for i in range(10)]
    )
    assert list(engine.batch_sizes) == [4, 4, 2]


def test_behaviour_logprobs_equal_learner_recomputation_in_fp32(tiny_model: TinyModel) -> None:
    """Left-padded batch at temperatures 1.0 and 0.7: |engine - learner| <= 1e-4 on every token."""
    engine = HFEngine(tiny_model.path)
    requests = [
        GenerationRequest(
            prompt_token_ids=prompt(3 + 5 * i, 30 + i), max_new_tokens=16, temperature=t, seed=i
        )
        for i, t in enumerate([1.0, 0.7, 1.0, 0.7])
    ]
    results = run_all(engine, requests)
    learner = load_policy(tiny_model.path)
    for req, res in zip(requests, results, strict=True):
        ref = learner_logprobs(learner, req.prompt_token_ids, res.token_ids, req.temperature)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() <= 1e-4


def test_greedy_picks_argmax_with_untempered_logprob(tiny_model: TinyModel) -> None:
    engine = HFEngine(tiny_model.path)
    (res,) = run_all(
        engine, [GenerationRequest(prompt_token_ids=prompt(6), max_new_tokens=5, temperature=0.0)]
    )
    learner = load_policy(tiny_model.path)
    ids = torch.tensor([prompt(6) + res.token_ids])
    with torch.no_grad():
        logits = learner(input_ids=ids).logits[0, 5:-1]
    assert res.token_ids == logits.argmax(-1).tolist()
    ref = learner_logprobs(learner, prompt(6), res.token_ids)
    assert (ref - torch.tensor(res.logprobs)).abs().max().item() <= 1e-4


def test_top_p_renormalises_over_the_nucleus() -> None:
    """p = (0.5, 0.3, 0.2), top_p 0.6: mass before token 1 is 0.5 < 0.6 (kept), before token 2 is
    0.8 >= 0.6 (dropped); renormalised p = (0.5/0.8, 0.3/0.8, 0) = (0.625, 0.375, 0)."""
    logits = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]).log()
    out = process_logits(logits, torch.tensor([1.0, 1.0]), torch.tensor([0.6, 1.0]))
    assert out[0].exp().tolist() == pytest.approx([0.625, 0.375, 0.0], abs=1e-6)
    assert out[1].exp().tolist() == pytest.approx([0.5, 0.3, 0.2], abs=1e-6)


def test_same_seeds_give_same_tokens(tiny_model: TinyModel) -> None:
    requests = [GenerationRequest(prompt_token_ids=prompt(5), max_new_tokens=8) for _ in range(3)]
    first = run_all(HFEngine(tiny_model.path, seed=5), requests)
    second = run_all(HFEngine(tiny_model.path, seed=5), requests)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert len({tuple(r.token_ids) for r in first}) > 1


def test_update_weights_changes_outputs_and_policy_version(tiny_model: TinyModel, tmp_path: Path) -> None:
    """v1 = a differently initialised model published to the weight store; the same seeded request then
    samples other tokens, and its logprobs equal the new model's recomputation."""
    other = build_tiny(tmp_path / "other", seed=1)
    new_model = load_policy(other.path)
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(new_model.state_dict(), 1, other.path)
    engine = HFEngine(tiny_model.path)
    request = GenerationRequest(prompt_token_ids=prompt(6), max_new_tokens=12, seed=4)
    (before,) = run_all(engine, [request])
    asyncio.run(engine.update_weights(store.path_for(1), 1))
    (after,) = run_all(engine, [request])
    assert engine.policy_version == 1
    assert (before.policy_version, after.policy_version) == (0, 1)
    assert after.token_ids != before.token_ids
    ref = learner_logprobs(new_model, request.prompt_token_ids, after.token_ids)
    assert (ref - torch.tensor(after.logprobs)).abs().max().item() <= 1e-4


def test_concurrent_update_labels_every_result_with_the_weights_that_sampled_it(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    """Generates before and after an update_weights call, all concurrent: each result's logprobs match
    the learner's recomputation under the model of the version the result reports."""
    other = build_tiny(tmp_path / "other", seed=2)
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(load_policy(other.path).state_dict(), 1, other.path)
    engine = HFEngine(tiny_model.path)
    requests = [GenerationRequest(prompt_token_ids=prompt(5 + i), max_new_tokens=6, seed=i) for i in range(8)]

    async def go() -> list[GenerationResult]:
        first = [asyncio.create_task(engine.generate(r)) for r in requests[:4]]
        update = asyncio.create_task(engine.update_weights(store.path_for(1), 1))
        second = [asyncio.create_task(engine.generate(r)) for r in requests[4:]]
        await update
        return list(await asyncio.gather(*first, *second))

    results = asyncio.run(go())
    models = {0: load_policy(tiny_model.path), 1: load_policy(other.path)}
    assert {r.policy_version for r in results[4:]} == {1}
    for req, res in zip(requests, results, strict=True):
        ref = learner_logprobs(models[res.policy_version], req.prompt_token_ids, res.token_ids)
        assert (ref - torch.tensor(res.logprobs)).abs().max().item() <= 1e-4


def test_update_weights_with_wrong_tensor_names_is_rejected(tiny_model: TinyModel, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"not.a.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    engine = HFEngine(tiny_model.path)
    with pytest.raises(ValueError, match="missing"):
        asyncio.run(engine.update_weights(tmp_path, 1))
    assert engine.policy_version == 0
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        asyncio.run(engine.update_weights(tmp_path / "nowhere", 1))


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"prompt_token_ids": [], "max_new_tokens": 4}, "prompt_token_ids"),
        ({"prompt_token_ids": list(range(64)), "max_new_tokens": 4}, "prompt_token_ids"),
        ({"prompt_token_ids": [5], "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt_token_ids": [5], "max_new_tokens": 4, "temperature": -1.0}, "temperature"),
        ({"prompt_token_ids": [5], "max_new_tokens": 4, "top_p": 0.0}, "top_p"),
    ],
)
def test_invalid_requests_are_rejected_naming_the_field(
    tiny_model: TinyModel, request_kwargs: dict[str, object], field: str
) -> None:
    engine = HFEngine(tiny_model.path, max_model_len=64)
    with pytest.raises(ValueError, match=field):
        run_all(engine, [GenerationRequest(**request_kwargs)])  # type: ignore[arg-type]


def test_rows_stop_at_max_model_len(tiny_model: TinyModel) -> None:
    """Prompt 60 tokens, max_model_len 64: at most 4 tokens are generated, finish_reason length."""
    engine = HFEngine(tiny_model.path, max_model_len=64)
    (res,) = run_all(engine, [GenerationRequest(prompt_token_ids=prompt(60), max_new_tokens=10, seed=0)])
    assert len(res.token_ids) == 4 and res.finish_reason == "length"


def test_closed_engine_refuses_work(tiny_model: TinyModel) -> None:
    engine = HFEngine(tiny_model.path)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        run_all(engine, [GenerationRequest(prompt_token_ids=[5], max_new_tokens=1)])


def test_a_fifo_in_place_of_the_weights_file_is_one_line_naming_it(tiny_model: TinyModel, tmp_path: Path) -> None:
    """The fault replay's FIFO ``model.safetensors``: transformers said "no file named model.safetensors" and the
    generator died with a 48-line traceback. ``posttrain`` prints a ``FileNotFoundError`` as one line."""
    import os
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model.path, model)
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")
    with pytest.raises(FileNotFoundError, match=f"^{model / 'model.safetensors'} is a FIFO, not a regular file"):
        make_engine("hf", model)
    engine = make_engine("hf", tiny_model.path)
    try:
        with pytest.raises(FileNotFoundError, match="is a FIFO"):
            asyncio.run(engine.update_weights(model, 1))
    finally:
        engine.close()
