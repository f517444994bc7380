"""Eval reports: the ``SampleRecord`` and ``EvalReport`` records, their aggregation and their JSON.

``build_report(samples, ...)`` turns graded samples into one ``EvalReport`` per benchmark: the
headline scores over the fully graded tasks (avg@k with a confidence interval, pass@k),
per-category scores, the range "needs judge" samples could move avg@k, the samples left out
because their infrastructure failed (by cause; no scores past a bound), response-length
statistics (responses truncated at the token budget and prompts longer than the context counted
apart), and how each sample was graded. ``read_report`` loads the JSON written by
``posttrain.eval.report_render.write_reports``, which also renders Markdown, HTML and a PNG.

Example: ``build_report(samples, benchmark="gsm8k", model="runs/x/final", samples_per_task=4,
temperature=0.6, max_new_tokens=1024).scores.avg_at_k``.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import msgspec

from posttrain.eval.infra import INFRA_STATUS, refusal
from posttrain.eval.metrics import LengthStats, ScoreSummary, avg_at_k, length_stats, summarize_scores
from posttrain.rollout.infra import InfraTally

REPORT_SCHEMA_VERSION = 1
"""Version of the ``EvalReport`` JSON layout."""

PROMPT_TOO_LONG = "prompt_too_long"
"""Finish reason (and grading method) of a sample whose prompt alone fills the model's context."""


class SampleRecord(msgspec.Struct, kw_only=True):
    """One graded response (a line of ``samples.jsonl``).

    Attributes:
        task_id: The task.
        sample_index: 0..k-1.
        status: ``correct``, ``wrong``, ``needs_judge``, or ``infra_error`` (its episode or grading
            failed for the infrastructure after the retries: left out of the scores).
        method: What decided it (``math_verify``, ``exact_number``, ``judge``, ``tests``...).
        reason: Grader reason code.
        extracted: Final answer found in the response (math), or None.
        category: The task's category for the breakdown, or "".
        response: Response text (the final answer; cut to its last 4,000 characters).
        num_tokens: Tokens the model generated (action tokens), >= 0.
        finish_reason: ``stop``, ``length`` (truncated at ``max_new_tokens`` or the context),
            ``tool_error``, ``timeout``, or ``prompt_too_long`` (the prompt alone fills the context;
            nothing was sampled).
        judge_reply: The judge's reply when a judge graded it, else "".
        infra_cause: For ``infra_error``, the cause (``grader_killed``, ``sandbox_error``...), else "".
    """

    task_id: str
    sample_index: int
    status: str
    method: str
    reason: str
    extracted: str | None = None
    category: str = ""
    response: str = ""
    num_tokens: int = 0
    finish_reason: str = "stop"
    judge_reply: str = ""
    infra_cause: str = ""


class EvalReport(msgspec.Struct, kw_only=True):
    """Everything measured in one evaluation of one model on one benchmark.

    Attributes:
        schema_version: ``REPORT_SCHEMA_VERSION``.
        benchmark: Registry name.
        model: Model directory or URI evaluated.
        label: Short name for tables and plots (``base``, ``trained``, a run name).
        engine: Engine that sampled (``vllm``, ``hf``).
        samples_per_task: k.
        temperature: Sampling temperature (0 = greedy).
        max_new_tokens: Generation budget per response (tokens).
        num_tasks: Tasks evaluated (graded or not).
        scores: Headline numbers over the fully graded tasks; None when no task was fully graded.
        avg_at_k_bounds: (lower, upper) avg@k over all tasks counting "needs judge" samples as wrong / right.
        num_needs_judge: Samples left ungraded (reported, never scored wrong).
        needs_judge_task_ids: Tasks with at least one ungraded sample (excluded from ``scores``).
        categories: Per-category scores (fully graded tasks of that category).
        response_tokens: Length statistics of every response (tokens); samples with finish reason
            ``prompt_too_long`` have no response and are left out of the three length fields.
        response_tokens_correct: Of correct responses, or None.
        response_tokens_wrong: Of wrong responses, or None.
        finish_reasons: Count of each finish reason (``length`` = truncated at max tokens,
            ``prompt_too_long`` = prompt longer than the context).
        grading_methods: Count of each grading method.
        wall_s: Wall time of the evaluation (seconds).
        created_at: Unix time (seconds).
        details: Free-form strings (SWE backend, judge model, data licence...).
        infra_errors: Samples left out because their episode or grading failed for the
            infrastructure after the retries, by cause (never scored wrong).
        infra_task_ids: Tasks with such a sample (excluded from ``scores``, as "needs judge" ones).
        infra_retried: Runs again of samples whose infrastructure failed (those that then ran included).
        accuracy_refused: Why ``scores`` is None although samples were graded: more than
            ``eval.max_infra_error_share`` of the samples were left out (one line); else "".
    """

    schema_version: int = REPORT_SCHEMA_VERSION
    benchmark: str
    model: str
    label: str = ""
    engine: str = ""
    samples_per_task: int
    temperature: float
    max_new_tokens: int
    num_tasks: int
    scores: ScoreSummary | None
    avg_at_k_bounds: tuple[float, float]
    num_needs_judge: int
    needs_judge_task_ids: list[str] = msgspec.field(default_factory=list)
    categories: dict[str, ScoreSummary] = msgspec.field(default_factory=dict)
    response_tokens: LengthStats | None = None
    response_tokens_correct: LengthStats | None = None
    response_tokens_wrong: LengthStats | None = None
    finish_reasons: dict[str, int] = msgspec.field(default_factory=dict)
    grading_methods: dict[str, int] = msgspec.field(default_factory=dict)
    wall_s: float = 0.0
    created_at: float = msgspec.field(default_factory=time.time)
    details: dict[str, str] = msgspec.field(default_factory=dict)
    infra_errors: dict[str, int] = msgspec.field(default_factory=dict)
    infra_task_ids: list[str] = msgspec.field(default_factory=list)
    infra_retried: int = 0
    accuracy_refused: str = ""


def build_report(
    samples: Sequence[SampleRecord],
    *,
    benchmark: str,
    model: str,
    samples_per_task: int,
    temperature: float,
    max_new_tokens: int,
    label: str = "",
    engine: str = "",
    wall_s: float = 0.0,
    details: dict[str, str] | None = None,
    seed: int = 0,
    infra_retried: int = 0,
    max_infra_error_share: float = 1.0,
) -> EvalReport:
    """Aggregate graded samples into an ``EvalReport``.

    Tasks with any "needs judge" sample are left out of ``scores`` and ``categories`` (and listed
    in ``needs_judge_task_ids``); ``avg_at_k_bounds`` shows the range they could move avg@k over
    all tasks. Tasks with a sample left out for the infrastructure (status ``infra_error``) are left
    out of both (``infra_task_ids``; counts by cause in ``infra_errors``): pass@k needs all k samples of
    a task. When those samples are more than ``max_infra_error_share`` of all, ``scores`` and
    ``categories`` stay empty and ``accuracy_refused`` says why (``posttrain.eval.infra.refusal``).

    Args:
        samples: ``[num_tasks * k]`` graded samples; every task must have exactly ``samples_per_task``.
        benchmark: Registry name.
        model: Model directory or URI.
        samples_per_task: k.
        temperature: Sampling temperature used.
        max_new_tokens: Generation budget used (tokens).
        label: Short name for tables and plots.
        engine: Engine that sampled.
        wall_s: Wall time (seconds).
        details: Extra strings for the report.
        seed: Bootstrap seed for the CI.
        infra_retried: Runs again of samples whose infrastructure failed (reported).
        max_infra_error_share: ``eval.max_infra_error_share``.

    Raises:
        ValueError: no samples, or a task whose sample count differs from ``samples_per_task`` (named).
    """
    if not samples:
        raise ValueError("samples: none to report")
    by_task: dict[str, list[SampleRecord]] = defaultdict(list)
    for s in samples:
        by_task[s.task_id].append(s)
    for task_id, group in by_task.items():
        if len(group) != samples_per_task:
            raise ValueError(f"task {task_id}: {len(group)} samples, expected samples_per_task={samples_per_task}")
    infra_tasks = {t for t, g in by_task.items() if any(s.status == INFRA_STATUS for s in g)}
    tally = InfraTally(reissued_total=infra_retried)
    for s in samples:
        if s.status == INFRA_STATUS:
            tally.failed(s.infra_cause or "unspecified", reissued=False)
        else:
            tally.completed()
    refused = refusal(tally, max_infra_error_share, benchmark) or ""
    graded = {t: g for t, g in by_task.items()
              if t not in infra_tasks and all(s.status != "needs_judge" for s in g) and not refused}
    pending = sorted(t for t, g in by_task.items() if any(s.status == "needs_judge" for s in g))
    counted = [g for t, g in by_task.items() if t not in infra_tasks]
    table = [[s.status == "correct" for s in sorted(g, key=lambda s: s.sample_index)] for g in graded.values()]
    scores = summarize_scores(table, seed=seed) if table else None
    categories: dict[str, ScoreSummary] = {}
    by_cat: dict[str, list[list[bool]]] = defaultdict(list)
    for g in graded.values():
        if g[0].category:
            by_cat[g[0].category].append([s.status == "correct" for s in sorted(g, key=lambda s: s.sample_index)])
    for cat, rows in by_cat.items():
        categories[cat] = summarize_scores(rows, seed=seed)
    lower = avg_at_k([[s.status == "correct" for s in g] for g in counted]) if counted else 0.0
    upper = avg_at_k([[s.status != "wrong" for s in g] for g in counted]) if counted else 0.0

    def _lengths(status: str | None) -> LengthStats | None:
        xs = [
            s.num_tokens for s in samples
            if (status is None or s.status == status) and s.finish_reason not in (PROMPT_TOO_LONG, INFRA_STATUS)
        ]
        return length_stats(xs) if xs else None

    return EvalReport(
        benchmark=benchmark,
        model=model,
        label=label,
        engine=engine,
        samples_per_task=samples_per_task,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        num_tasks=len(by_task),
        scores=scores,
        avg_at_k_bounds=(lower, upper),
        num_needs_judge=sum(s.status == "needs_judge" for s in samples),
        needs_judge_task_ids=pending,
        categories=categories,
        response_tokens=_lengths(None),
        response_tokens_correct=_lengths("correct"),
        response_tokens_wrong=_lengths("wrong"),
        finish_reasons=dict(Counter(s.finish_reason for s in samples)),
        grading_methods=dict(Counter(s.method for s in samples)),
        wall_s=wall_s,
        details=dict(details or {}),
        infra_errors={cause: n for cause, n in sorted(tally.infra_by_cause.items())},
        infra_task_ids=sorted(infra_tasks),
        infra_retried=infra_retried,
        accuracy_refused=refused,
    )


def read_report(path: Path) -> EvalReport:
    """Load an ``EvalReport`` JSON file.

    Raises:
        ValueError: the file is not a valid report (the message names the file and the field).
        OSError: the file cannot be read.
    """
    try:
        report = msgspec.json.decode(Path(path).read_bytes(), type=EvalReport)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"{path}: not an eval report ({exc})") from exc
    if report.schema_version != REPORT_SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {report.schema_version}, this build reads {REPORT_SCHEMA_VERSION}")
    return report
