"""The inference-engine contract shared by the vLLM and transformers engines.

An engine turns prompt token ids into sampled token ids plus the per-token behaviour
log-probabilities the SAO ratio needs. It is asynchronous: many episodes await ``generate`` at
once and the engine batches them (continuous batching in vLLM, padded batches in ``hf``).
Weights are swapped in place between requests with ``update_weights``.
"""

from __future__ import annotations

import stat
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


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
"""Names an engine reads a model's weights from (``check_weight_files``)."""


def check_weight_files(model_dir: Path | str) -> None:
    """Refuse a model directory whose weights file is there but not a regular file (a FIFO, a socket, a directory).

    transformers reported a FIFO ``model.safetensors`` as "no file named model.safetensors" and the
    generator died with a 48-line traceback; reading one would block until a writer opened it.

    Raises:
        FileNotFoundError: one line naming the file and what it is instead of a regular file.
    """
    for name in WEIGHT_FILES:
        path = Path(model_dir) / name
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "not a regular file")
            raise FileNotFoundError(f"{path} is {kind}, not a regular file: an engine cannot load weights from it")
