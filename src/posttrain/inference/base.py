"""The inference-engine contract shared by the vLLM and transformers engines.

An engine turns prompt token ids into sampled token ids plus the per-token behaviour
log-probabilities the SAO ratio needs. It is asynchronous: many episodes await ``generate`` at
once and the engine batches them (continuous batching in vLLM, padded batches in ``hf``).
Weights are swapped in place between requests with ``update_weights``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import msgspec


class GenerationRequest(msgspec.Struct, kw_only=True, frozen=True):
    """One generation call.

    Attributes:
        prompt_token_ids: ``[P]`` int. Everything the model conditions on (token in).
        max_new_tokens: Upper bound on sampled tokens (tokens), >= 1.
        stop_token_ids: Sampling stops after emitting any of these (the stop token is kept).
        temperature: Sampling temperature; SAO training uses 1.0.
        top_p: Nucleus mass; SAO training uses 1.0 so behaviour logprobs are the full softmax.
        seed: Optional per-request sampling seed.
    """

    prompt_token_ids: list[int]
    max_new_tokens: int
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


class GenerationResult(msgspec.Struct, kw_only=True):
    """What an engine returns for one request.

    Attributes:
        token_ids: ``[A]`` int. Sampled tokens (token out), including a final stop token.
        logprobs: ``[A]`` float. log π_behav(token | prefix) in nats, of the distribution actually
            sampled from (after temperature); finite and <= 0.
        finish_reason: ``stop`` (a stop token was sampled) or ``length`` (``max_new_tokens`` hit).
        policy_version: Weight version that sampled every token of this result.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine that samples tokens with behaviour logprobs and reloads weights in place."""

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served (count of weight publications)."""
        ...

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one continuation; safe to call from many coroutines at once."""
        ...

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        """Swap in the safetensors weights in ``weights_dir``; in-flight requests finish first."""
        ...

    def close(self) -> None:
        """Release processes and memory."""
        ...
