"""Evaluate a model on a registered benchmark: sample through the generator engines, grade, report.

``evaluate(model_dir, benchmark, ...)`` loads the benchmark's tasks, samples ``k`` responses per
task with an inference engine (vLLM by default where it imports, else the transformers ``hf``
engine) through the same token-in/token-out agent loop the generators use (one turn per
episode), grades every response (math: ``posttrain.eval.grading`` with an optional judge; SWE:
``posttrain.eval.swe`` with the ``local`` or ``kubernetes`` backend), and returns an
``EvalReport``; with ``out_dir`` it also writes ``<benchmark>.samples.jsonl`` (one graded
response per line).

Sampling: temperature 0 (greedy) for k = 1, 0.6 for k > 1 unless given; top-p 1. Each (task,
sample) pair has its own seed derived from ``seed``, so a rerun with the same engine reproduces.
A prompt that leaves no room for a response (its chat-formatted tokens fill ``max_model_len``) is
not sampled: it is recorded wrong with finish reason and method ``prompt_too_long``, counted apart
from responses truncated at the token budget (finish reason ``length``). Any other failed episode
is recorded wrong with method ``episode_error``. Both are counted in the report's
``finish_reasons`` and ``grading_methods``.

Infrastructure failures (issue 32; ``posttrain.eval.infra``): a sample whose episode or grading
failed for the infrastructure (``InfraError``: the math-verify worker killed from outside, the SWE
sandbox that could not start) runs again with the same seed, at most ``infra_retries`` times; one
that still fails is recorded with status and method ``infra_error`` and its cause, left out of the
scores (its task with it, as a "needs judge" task is) and counted by cause in the report
(``infra_errors``). Past ``max_infra_error_share`` of the samples the report gives no scores and
says why in one line (``accuracy_refused``).

Run: ``python -m posttrain.eval.cli eval --benchmark gsm8k --model runs/x/final --limit 20``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from posttrain.envs.base import StepResult
from posttrain.eval.benchmarks import Benchmark, BenchmarkDataError, get_benchmark, load_tasks
from posttrain.eval.grading import JudgeClient, grade_math, resolve_with_judge
from posttrain.eval.infra import INFRA_STATUS, InfraFailure, with_infra_retries
from posttrain.eval.report import PROMPT_TOO_LONG, EvalReport, SampleRecord, build_report
from posttrain.records import Task
from posttrain.rollout.infra import InfraTally

log = logging.getLogger(__name__)

SweBackendKind = Literal["local", "kubernetes"]


class EvalError(RuntimeError):
    """An evaluation could not run (unknown benchmark, unusable model, wrong backend); the message says why."""


class _OneTurnEpisode:
    """The task prompt as one user message; the first action ends the episode (graded afterwards)."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.task.prompt}]

    async def step(self, action_text: str) -> StepResult:
        return StepResult(done=True, reward=0.0, finish_reason="stop")

    def close(self) -> None:
        return None


class _EvalEnvironment:
    """``Environment`` for evaluation: one turn, no tools, no reward (grading happens after sampling)."""

    name = "eval"

    def start(self, task: Task) -> _OneTurnEpisode:
        return _OneTurnEpisode(task)


@dataclass(frozen=True)
class _Sample:
    task: Task
    index: int
    text: str
    num_tokens: int
    finish_reason: str
    error: str = ""
    infra_cause: str = ""


def _sample_seed(seed: int, task_index: int, sample_index: int) -> int:
    return (seed * 1_000_003 + task_index * 1_009 + sample_index) % 2**31


async def _sample_all(
    engine: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    *,
    k: int,
    max_new_tokens: int,
    max_model_len: int,
    temperature: float,
    seed: int,
    concurrency: int,
    timeout_s: float,
    infra_retries: int = 0,
    tally: InfraTally | None = None,
) -> list[_Sample]:
    """Run ``k`` one-turn episodes per task, at most ``concurrency`` at once.

    An episode that failed for the infrastructure runs again with its seed, at most ``infra_retries``
    times (each retry counted in ``tally.reissued_total``); then its sample carries the cause.
    """
    from posttrain.chat.format import ChatFormat
    from posttrain.episodes.runner import EpisodeError, EpisodeLimits, run_episode

    chat = ChatFormat(tokenizer)
    env = _EvalEnvironment()
    retries = tally if tally is not None else InfraTally()
    limits = EpisodeLimits(max_turns=1, max_new_tokens=max_new_tokens, max_episode_tokens=max_model_len, timeout_s=timeout_s)
    gate = asyncio.Semaphore(concurrency)

    prompt_tokens = [len(chat.prompt_ids(env.start(t).messages())) for t in tasks]

    async def one(task_index: int, task: Task, i: int) -> _Sample:
        if prompt_tokens[task_index] >= max_model_len:
            # The same condition under which run_episode refuses the prompt; reported as its own
            # finish reason rather than as a response truncated at max tokens.
            return _Sample(
                task, i, "", 0, PROMPT_TOO_LONG,
                error=f"prompt is {prompt_tokens[task_index]} tokens; the context is {max_model_len} tokens",
            )
        async with gate:
            try:
                out = await with_infra_retries(lambda: run_episode(
                    engine,
                    tokenizer,
                    env,
                    task,
                    limits,
                    generator_id="eval",
                    seed=_sample_seed(seed, task_index, i),
                    temperature=temperature,
                    top_p=1.0,
                    chat=chat,
                ), infra_retries, retries)
            except EpisodeError as exc:
                return _Sample(task, i, "", 0, exc.finish_reason or "length", error=str(exc))
        if isinstance(out, InfraFailure):
            return _Sample(task, i, "", 0, INFRA_STATUS, error=str(out), infra_cause=out.cause)
        rollout = out
        actions = [t for t, a in zip(rollout.token_ids, rollout.action_mask, strict=True) if a]
        body = actions[:-1] if actions and actions[-1] == chat.stop_token_id else actions
        text = tokenizer.decode(body, skip_special_tokens=True)
        return _Sample(task, i, text, len(actions), rollout.finish_reason)

    jobs = [one(ti, t, i) for ti, t in enumerate(tasks) for i in range(k)]
    return list(await asyncio.gather(*jobs))


def _category(bench: Benchmark, task: Task) -> str:
    return task.metadata.get(bench.category_key, "") if bench.category_key else ""


def _infra_record(bench: Benchmark, s: _Sample, cause: str, error: str) -> SampleRecord:
    """The record of a sample left out because its infrastructure kept failing (``posttrain.eval.infra``)."""
    return SampleRecord(task_id=s.task.task_id, sample_index=s.index, status=INFRA_STATUS, method=INFRA_STATUS,
                        reason=error[:300], category=_category(bench, s.task), response=s.text[-4000:],
                        num_tokens=s.num_tokens, finish_reason=s.finish_reason, infra_cause=cause)


async def _grade_math(
    bench: Benchmark, samples: Sequence[_Sample], judge: JudgeClient | None, timeout_s: float, concurrency: int,
    infra_retries: int = 0, tally: InfraTally | None = None,
) -> list[SampleRecord]:
    gate = asyncio.Semaphore(concurrency)
    retries = tally if tally is not None else InfraTally()

    async def one(s: _Sample) -> SampleRecord:
        if s.infra_cause:
            return _infra_record(bench, s, s.infra_cause, s.error)
        if s.error:
            method = PROMPT_TOO_LONG if s.finish_reason == PROMPT_TOO_LONG else "episode_error"
            return SampleRecord(task_id=s.task.task_id, sample_index=s.index, status="wrong", method=method,
                                reason=s.error[:300], category=_category(bench, s.task), finish_reason=s.finish_reason)
        async with gate:
            out = await with_infra_retries(lambda: asyncio.to_thread(
                grade_math,
                s.text,
                s.task.reference,
                answer_style=bench.answer_style,
                unparsable_answer_needs_judge=bench.unparsable_answer_needs_judge,
                timeout_s=timeout_s,
            ), infra_retries, retries)
            if isinstance(out, InfraFailure):  # the answer checker kept failing (VerifierError)
                return _infra_record(bench, s, out.cause, str(out))
            g = out
            if judge is not None and g.status == "needs_judge":
                g = await asyncio.to_thread(
                    resolve_with_judge, g, judge, problem=s.task.metadata.get("problem", s.task.prompt),
                    reference=s.task.reference, response=s.text,
                )
        return SampleRecord(
            task_id=s.task.task_id, sample_index=s.index, status=g.status, method=g.method, reason=g.reason,
            extracted=g.extracted, category=_category(bench, s.task), response=s.text[-4000:],
            num_tokens=s.num_tokens, finish_reason=s.finish_reason, judge_reply=g.judge_reply,
        )

    return list(await asyncio.gather(*(one(s) for s in samples)))


def _swe_runner(bench: Benchmark, backend: SweBackendKind, namespace: str, swe_backend_obj: Any) -> Any:
    """A callable ``(task, patch) -> SweRunResult`` for the benchmark and backend.

    Raises:
        EvalError: the backend does not fit the benchmark.
    """
    from posttrain.eval.swe.instances import load_swe_instances
    from posttrain.eval.swe.k8s_backend import KubernetesSweBackend
    from posttrain.eval.swe.local_backend import LocalSweBackend, local_instance_from_task_dir

    if bench.name == "swe_bench_verified":
        if backend != "kubernetes":
            raise EvalError("swe_bench_verified runs in the instances' SWE-bench images: use --backend kubernetes")
        runner = swe_backend_obj or KubernetesSweBackend(namespace=namespace)
        instances = load_swe_instances()
        return lambda task, patch: runner.run(instances[task.task_id], patch)
    if backend != "local":
        raise EvalError(f"{bench.name} is graded on this machine: use --backend local")
    runner = swe_backend_obj or LocalSweBackend()
    return lambda task, patch: runner.run(local_instance_from_task_dir(Path(task.reference)), patch)


async def _grade_swe(
    bench: Benchmark, samples: Sequence[_Sample], run: Any, concurrency: int, infra_retries: int = 0,
    tally: InfraTally | None = None,
) -> list[SampleRecord]:
    from posttrain.eval.swe.patches import extract_patch

    gate = asyncio.Semaphore(concurrency)
    retries = tally if tally is not None else InfraTally()

    async def one(s: _Sample) -> SampleRecord:
        def record(status: str, method: str, reason: str) -> SampleRecord:
            return SampleRecord(
                task_id=s.task.task_id, sample_index=s.index, status=status, method=method, reason=reason[:300],
                category=_category(bench, s.task), response=s.text[-4000:], num_tokens=s.num_tokens,
                finish_reason=s.finish_reason,
            )

        if s.infra_cause:
            return _infra_record(bench, s, s.infra_cause, s.error)
        if s.error:
            return record("wrong", PROMPT_TOO_LONG if s.finish_reason == PROMPT_TOO_LONG else "episode_error", s.error)
        patch = extract_patch(s.text)
        if patch is None:
            return record("wrong", "no_answer", "no diff in the response")
        async with gate:
            out = await with_infra_retries(lambda: asyncio.to_thread(run, s.task, patch), infra_retries, retries)
        if isinstance(out, InfraFailure):  # the grading sandbox kept failing (SweInfraError)
            return _infra_record(bench, s, out.cause, str(out))
        result = out
        status = "correct" if result.grade.resolved else "wrong"
        return record(status, "tests", f"{result.grade.status}: {result.grade.reason}")

    return list(await asyncio.gather(*(one(s) for s in samples)))


def _model_max_len(model_dir: Path) -> int:
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalError(f"model {model_dir}: cannot read config.json ({exc})") from exc
    return int(min(config.get("max_position_embeddings") or 4096, 32768))


def evaluate(
    model_dir: str | Path,
    benchmark: str,
    *,
    engine_kind: Literal["auto", "vllm", "hf"] = "auto",
    limit: int | None = None,
    samples_per_task: int = 1,
    out_dir: Path | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    max_model_len: int | None = None,
    judge: JudgeClient | None = None,
    swe_backend: SweBackendKind = "local",
    namespace: str = "default",
    seed: int = 0,
    concurrency: int = 16,
    verify_timeout_s: float = 10.0,
    episode_timeout_s: float = 3600.0,
    infra_retries: int = 2,
    max_infra_error_share: float = 0.1,
    label: str = "",
    engine: Any = None,
    tokenizer: Any = None,
    swe_backend_obj: Any = None,
) -> EvalReport:
    """Sample, grade and summarise one model on one benchmark.

    Args:
        model_dir: transformers checkpoint directory with its tokenizer, or an ``s3://`` URI
            (downloaded to a temporary directory first).
        benchmark: Registry name (``posttrain.eval.benchmarks.BENCHMARKS``).
        engine_kind: ``auto`` (vLLM where it imports, else ``hf``), ``vllm`` or ``hf``.
        limit: Evaluate only the first ``limit`` tasks.
        samples_per_task: k of avg@k / pass@k.
        out_dir: Where to write ``samples.jsonl`` (no file when None).
        temperature: Sampling temperature; None gives 0 (greedy) for k = 1 and 0.6 for k > 1.
        max_new_tokens: Tokens per response; None uses the benchmark's default.
        max_model_len: Context length (prompt plus response, tokens); None reads the model's
            ``max_position_embeddings`` (at most 32,768).
        judge: Judge for "needs judge" math answers (None: they stay ungraded).
        swe_backend: ``kubernetes`` for SWE-bench Verified, ``local`` for the self-made tasks.
        namespace: Kubernetes namespace of the SWE pods.
        seed: Base sampling seed.
        concurrency: Episodes (and gradings) in flight at once.
        verify_timeout_s: math-verify deadline per answer (seconds).
        episode_timeout_s: Wall-time budget per response (seconds).
        infra_retries: Runs again of a sample whose episode or grading failed for the
            infrastructure (same seed), before it is left out (``eval.infra_retries``).
        max_infra_error_share: Above this share of samples left out the report gives no scores
            (``accuracy_refused``; ``eval.max_infra_error_share``).
        label: Name of the model in reports (``base``, ``trained``...).
        engine: A ready ``InferenceEngine`` to use instead of building one (not closed here).
        tokenizer: A ready tokenizer to use instead of loading the model's.
        swe_backend_obj: A ready SWE backend object (tests, custom clusters).

    Returns:
        The ``EvalReport``.

    Raises:
        EvalError: unknown benchmark, missing data, a model without config or tokenizer, or a SWE
            backend that does not fit the benchmark.
        ValueError: ``samples_per_task``, ``limit`` or ``concurrency`` below 1, ``infra_retries`` below 0.
    """
    if samples_per_task < 1:
        raise ValueError(f"samples_per_task: must be >= 1, got {samples_per_task}")
    if concurrency < 1:
        raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
    if infra_retries < 0:
        raise ValueError(f"infra_retries: must be >= 0, got {infra_retries}")
    try:
        bench = get_benchmark(benchmark)
        tasks = load_tasks(benchmark, limit=limit)
    except KeyError as exc:
        raise EvalError(str(exc.args[0])) from exc
    except BenchmarkDataError as exc:
        raise EvalError(str(exc)) from exc
    swe_run = _swe_runner(bench, swe_backend, namespace, swe_backend_obj) if bench.kind == "swe" else None
    temp = temperature if temperature is not None else (0.0 if samples_per_task == 1 else 0.6)
    new_tokens = max_new_tokens or bench.max_new_tokens

    with tempfile.TemporaryDirectory(prefix="posttrain-eval-model-") as cache:
        from posttrain.storage import StorageError, materialize

        try:
            local_model = materialize(str(model_dir), Path(cache))
        except StorageError as exc:
            # The storage error already names the location.
            raise EvalError(f"model: {exc}") from exc
        context = max_model_len or _model_max_len(local_model)
        if tokenizer is None:
            from posttrain.models.hf import load_tokenizer

            try:
                tokenizer = load_tokenizer(local_model)
            except (OSError, ValueError) as exc:
                raise EvalError(f"model {model_dir}: no usable tokenizer ({exc})") from exc
        own_engine = engine is None
        engine_name = type(engine).__name__ if engine is not None else ""
        if own_engine:
            from posttrain.inference.factory import make_engine

            try:
                engine = make_engine(engine_kind, local_model, seed=seed, max_model_len=context, max_batch=concurrency)
            except (FileNotFoundError, RuntimeError, ValueError) as exc:
                raise EvalError(f"engine {engine_kind}: {exc}") from exc
            engine_name = type(engine).__name__
        started = time.monotonic()
        retried = InfraTally()  # counts the runs again of both stages
        try:
            samples = asyncio.run(
                _sample_all(
                    engine, tokenizer, tasks, k=samples_per_task, max_new_tokens=new_tokens, max_model_len=context,
                    temperature=temp, seed=seed, concurrency=concurrency, timeout_s=episode_timeout_s,
                    infra_retries=infra_retries, tally=retried,
                )
            )
        finally:
            if own_engine:
                engine.close()
    if bench.kind == "math":
        records = asyncio.run(_grade_math(bench, samples, judge, verify_timeout_s, concurrency, infra_retries, retried))
    else:
        records = asyncio.run(_grade_swe(bench, samples, swe_run, concurrency, infra_retries, retried))
    details = {"licence": bench.licence, "context_tokens": str(context)}
    if judge is not None:
        details["judge_model"] = judge.model
    if bench.kind == "swe":
        details["swe_backend"] = swe_backend
    report = build_report(
        records, benchmark=bench.name, model=str(model_dir), samples_per_task=samples_per_task, temperature=temp,
        max_new_tokens=new_tokens, label=label, engine=engine_name, wall_s=time.monotonic() - started,
        details=details, seed=seed, infra_retried=retried.reissued_total, max_infra_error_share=max_infra_error_share,
    )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / f"{bench.name}.samples.jsonl").open("wb") as f:
            for r in records:
                f.write(msgspec.json.encode(r) + b"\n")
    return report
