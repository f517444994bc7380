"""Eval reports: the ``EvalReport`` record and its JSON, Markdown, HTML and PNG renderings.

``write_reports(reports, out_dir, baseline=...)`` writes, for a trained model's reports and
optionally the base model's reports on the same benchmarks:

* ``<benchmark>.json``: one ``EvalReport`` each (read back with ``read_report``);
* ``report.md``: a score table (base vs trained with the difference when a baseline is given),
  per-category tables, response-length statistics (with responses truncated at the token budget
  and prompts longer than the context counted apart), how each sample was graded (math-verify,
  exact number, verbatim match, judge, needs judge...) and the "needs judge" counts;
* ``report.html``: the same, self-contained (the plot embedded as a data URI), for the KFP UI;
* ``comparison.png``: bars of avg@k with confidence intervals, base vs trained, per benchmark
  (matplotlib, Agg backend; only with a baseline).

Run: ``python -m posttrain.eval.report OUT_DIR TRAINED.json [...] [--baseline BASE.json ...]``.
"""

from __future__ import annotations

import base64
import html
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import msgspec

from posttrain.eval.metrics import LengthStats, ScoreSummary, avg_at_k, length_stats, summarize_scores

REPORT_SCHEMA_VERSION = 1

PROMPT_TOO_LONG = "prompt_too_long"
"""Finish reason (and grading method) of a sample whose prompt alone fills the model's context."""

METHOD_LABELS: dict[str, str] = {
    "math_verify": "math-verify (symbolic equivalence)",
    "exact_number": "exact number",
    "exact_match": "verbatim match",
    "judge": "LLM judge",
    "none": "needs judge (ungraded)",
    "no_answer": "no final answer found",
    "tests": "repository tests",
    "episode_error": "episode failed",
    PROMPT_TOO_LONG: "prompt longer than the context",
}
"""Readable name of each ``SampleRecord.method`` in the Markdown and HTML reports (others show raw)."""
"""Version of the ``EvalReport`` JSON layout."""


class SampleRecord(msgspec.Struct, kw_only=True):
    """One graded response (a line of ``samples.jsonl``).

    Attributes:
        task_id: The task.
        sample_index: 0..k-1.
        status: ``correct``, ``wrong`` or ``needs_judge``.
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
) -> EvalReport:
    """Aggregate graded samples into an ``EvalReport``.

    Tasks with any "needs judge" sample are left out of ``scores`` and ``categories`` (and listed
    in ``needs_judge_task_ids``); ``avg_at_k_bounds`` shows the range they could move avg@k over
    all tasks.

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
    graded = {t: g for t, g in by_task.items() if all(s.status != "needs_judge" for s in g)}
    pending = sorted(t for t in by_task if t not in graded)
    table = [[s.status == "correct" for s in sorted(g, key=lambda s: s.sample_index)] for g in graded.values()]
    scores = summarize_scores(table, seed=seed) if table else None
    categories: dict[str, ScoreSummary] = {}
    by_cat: dict[str, list[list[bool]]] = defaultdict(list)
    for g in graded.values():
        if g[0].category:
            by_cat[g[0].category].append([s.status == "correct" for s in sorted(g, key=lambda s: s.sample_index)])
    for cat, rows in by_cat.items():
        categories[cat] = summarize_scores(rows, seed=seed)
    lower = avg_at_k([[s.status == "correct" for s in g] for g in by_task.values()])
    upper = avg_at_k([[s.status != "wrong" for s in g] for g in by_task.values()])

    def _lengths(status: str | None) -> LengthStats | None:
        xs = [
            s.num_tokens for s in samples
            if (status is None or s.status == status) and s.finish_reason != PROMPT_TOO_LONG
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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _headline(r: EvalReport | None) -> str:
    if r is None or r.scores is None:
        return "n/a"
    s = r.scores
    return f"{_pct(s.avg_at_k)} [{_pct(s.ci_low)}, {_pct(s.ci_high)}]"


def _pass_k(r: EvalReport | None) -> str:
    if r is None or r.scores is None:
        return "n/a"
    return ", ".join(f"@{k}: {_pct(v)}" for k, v in sorted(r.scores.pass_at_k.items()))


def _match(reports: Sequence[EvalReport], baseline: Sequence[EvalReport] | None) -> list[tuple[EvalReport, EvalReport | None]]:
    by_name = {b.benchmark: b for b in baseline or []}
    return [(r, by_name.get(r.benchmark)) for r in reports]


def _delta(r: EvalReport, b: EvalReport | None) -> str:
    if b is None or r.scores is None or b.scores is None:
        return "n/a"
    return f"{100 * (r.scores.avg_at_k - b.scores.avg_at_k):+.1f}"


def _length_row(label: str, s: LengthStats | None) -> list[str]:
    if s is None:
        return [label, "0", "-", "-", "-", "-"]
    return [label, str(s.count), f"{s.mean:.0f}", f"{s.p50:.0f}", str(s.p90), str(s.max)]


def _tables(reports: Sequence[EvalReport], baseline: Sequence[EvalReport] | None) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, shared by the Markdown and HTML renderings."""
    pairs = _match(reports, baseline)
    has_base = any(b is not None for _, b in pairs)
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    header = ["benchmark", "k", "tasks graded", "avg@k % [95% CI]", "pass@k %", "needs judge", "mean tokens"]
    if has_base:
        header = ["benchmark", "k", "tasks graded", "base avg@k % [95% CI]", "trained avg@k % [95% CI]", "Δ points",
                  "trained pass@k %", "needs judge (base/trained)"]
    rows = []
    for r, b in pairs:
        graded = f"{r.scores.num_tasks if r.scores else 0}/{r.num_tasks}"
        if has_base:
            rows.append([r.benchmark, str(r.samples_per_task), graded, _headline(b), _headline(r), _delta(r, b), _pass_k(r),
                         f"{b.num_needs_judge if b else '-'}/{r.num_needs_judge}"])
        else:
            mean = f"{r.response_tokens.mean:.0f}" if r.response_tokens else "-"
            rows.append([r.benchmark, str(r.samples_per_task), graded, _headline(r), _pass_k(r), str(r.num_needs_judge), mean])
    tables.append(("Scores", header, rows))
    for r, b in pairs:
        if not r.categories:
            continue
        base_cats = b.categories if b else {}
        cat_header = ["category", "tasks", "avg@k %"] + (["base avg@k %", "Δ points"] if has_base else [])
        cat_rows = []
        for cat, s in sorted(r.categories.items()):
            row = [cat, str(s.num_tasks), _pct(s.avg_at_k)]
            if has_base:
                bs = base_cats.get(cat)
                row += [_pct(bs.avg_at_k) if bs else "n/a", f"{100 * (s.avg_at_k - bs.avg_at_k):+.1f}" if bs else "n/a"]
            cat_rows.append(row)
        tables.append((f"{r.benchmark}: per category", cat_header, cat_rows))
    for r, b in pairs:
        len_rows = []
        for who, rep in (("base", b), (r.label or "trained", r)):
            if rep is None:
                continue
            len_rows.append(_length_row(f"{who}: all", rep.response_tokens))
            len_rows.append(_length_row(f"{who}: correct", rep.response_tokens_correct))
            len_rows.append(_length_row(f"{who}: wrong", rep.response_tokens_wrong))
            total = sum(rep.finish_reasons.values()) or 1
            for reason, text in (("length", "truncated at max tokens"), (PROMPT_TOO_LONG, "prompt longer than the context")):
                n = rep.finish_reasons.get(reason, 0)
                if n or reason == "length":
                    len_rows.append([f"{who}: {text}", str(n), f"{100 * n / total:.1f}%", "", "", ""])
        tables.append((f"{r.benchmark}: response length (tokens)", ["responses", "count", "mean", "median", "p90", "max"], len_rows))
    for r, b in pairs:
        tables.append((f"{r.benchmark}: grading methods", *_method_table(r, b)))
    return tables


def _method_table(r: EvalReport, b: EvalReport | None) -> tuple[list[str], list[list[str]]]:
    """(header, rows) counting how the samples of ``r`` (and of the baseline ``b``) were graded."""
    who = r.label or "trained"
    reps = [(who, r)] if b is None else [("base", b), (who, r)]
    methods = sorted({m for _, rep in reps for m in rep.grading_methods}, key=lambda m: (-r.grading_methods.get(m, 0), m))
    header = ["method"] + [f"{name}: samples" for name, _ in reps] + [f"{name}: %" for name, _ in reps]
    rows = []
    for m in methods:
        counts = [rep.grading_methods.get(m, 0) for _, rep in reps]
        shares = [f"{100 * c / (sum(rep.grading_methods.values()) or 1):.1f}" for c, (_, rep) in zip(counts, reps, strict=True)]
        rows.append([METHOD_LABELS.get(m, m), *map(str, counts), *shares])
    return header, rows


def render_markdown(reports: Sequence[EvalReport], baseline: Sequence[EvalReport] | None = None) -> str:
    """The Markdown report (score table, categories, lengths, needs-judge notes)."""
    lines = ["# Evaluation report", ""]
    for r in reports:
        lines.append(
            f"- **{r.benchmark}**: model `{r.model}`, engine {r.engine or '?'}, k={r.samples_per_task}, "
            f"temperature {r.temperature}, max {r.max_new_tokens} new tokens, {r.num_tasks} tasks, {r.wall_s:.0f} s"
        )
    lines.append("")
    for title, header, rows in _tables(reports, baseline):
        lines += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        lines.append("")
    notes = [r for r in reports if r.num_needs_judge]
    if notes:
        lines += ["## Needs judge", ""]
        for r in notes:
            lo, hi = r.avg_at_k_bounds
            lines.append(
                f"- {r.benchmark}: {r.num_needs_judge} samples on {len(r.needs_judge_task_ids)} tasks could not be graded "
                f"automatically and are excluded from the scores above; counting them all wrong / all right gives "
                f"avg@k between {_pct(lo)}% and {_pct(hi)}%."
            )
        lines.append("")
    lines.append("CI: Wilson score interval for k=1, percentile bootstrap over tasks for k>1. pass@k: unbiased estimator (Chen et al. 2021).")
    return "\n".join(lines) + "\n"


def plot_comparison(reports: Sequence[EvalReport], baseline: Sequence[EvalReport], path: Path) -> Path:
    """Bar chart of avg@k (%) with confidence intervals, base vs trained, one group per benchmark.

    Raises:
        ValueError: no benchmark has both a trained and a base score.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [(r, b) for r, b in _match(reports, baseline) if b is not None and r.scores and b.scores]
    if not pairs:
        raise ValueError("plot_comparison: no benchmark has both a base and a trained score")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.8 * len(pairs) + 1.5), 3.6), dpi=110)
    width = 0.38
    for offset, who, color in ((-width / 2, "base", "#9aa5b1"), (width / 2, "trained", "#2f6fdb")):
        xs, ys, err_lo, err_hi = [], [], [], []
        for i, (r, b) in enumerate(pairs):
            rep = b if who == "base" else r
            s = rep.scores
            assert s is not None
            xs.append(i + offset)
            ys.append(100 * s.avg_at_k)
            err_lo.append(100 * (s.avg_at_k - s.ci_low))
            err_hi.append(100 * (s.ci_high - s.avg_at_k))
        label = who if who == "base" else (pairs[0][0].label or "trained")
        ax.bar(xs, ys, width, yerr=[err_lo, err_hi], capsize=3, color=color, label=label)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels([f"{r.benchmark}\n(avg@{r.samples_per_task})" for r, _ in pairs], fontsize=8)
    ax.set_ylabel("score (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title("base vs trained (bars: 95% CI)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def render_html(reports: Sequence[EvalReport], baseline: Sequence[EvalReport] | None = None, plot_png: bytes | None = None) -> str:
    """A self-contained HTML report (tables; the PNG plot embedded as a data URI). All text is escaped."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>posttrain evaluation</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        "th{background:#f0f3f7}</style></head><body>",
        "<h1>Evaluation report</h1><ul>",
    ]
    for r in reports:
        parts.append(
            f"<li><b>{esc(r.benchmark)}</b>: model <code>{esc(r.model)}</code>, engine {esc(r.engine or '?')}, "
            f"k={r.samples_per_task}, temperature {r.temperature}, {r.num_tasks} tasks</li>"
        )
    parts.append("</ul>")
    if plot_png:
        data = base64.b64encode(plot_png).decode("ascii")
        parts.append(f"<img alt='base vs trained' src='data:image/png;base64,{data}'>")
    for title, header, rows in _tables(reports, baseline):
        parts.append(f"<h2>{esc(title)}</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
        parts.append("</table>")
    for r in reports:
        if r.num_needs_judge:
            lo, hi = r.avg_at_k_bounds
            parts.append(
                f"<p>{esc(r.benchmark)}: {r.num_needs_judge} samples need a judge and are excluded from the scores "
                f"(all wrong / all right: {_pct(lo)}% / {_pct(hi)}%).</p>"
            )
    parts.append("<p>CI: Wilson (k=1) or bootstrap over tasks (k&gt;1). pass@k: unbiased estimator (Chen et al. 2021).</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_reports(
    reports: Sequence[EvalReport], out_dir: Path, baseline: Sequence[EvalReport] | None = None
) -> dict[str, Path]:
    """Write ``<benchmark>.json`` per report, ``report.md``, ``report.html`` and, with a baseline, ``comparison.png``.

    Returns:
        ``{"<benchmark>.json" | "markdown" | "html" | "plot": path}``.

    Raises:
        ValueError: no reports.
        OSError: the directory cannot be written.
    """
    if not reports:
        raise ValueError("reports: nothing to write")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for r in reports:
        p = out / f"{r.benchmark}.json"
        p.write_bytes(msgspec.json.format(msgspec.json.encode(r), indent=2))
        paths[p.name] = p
    png = None
    if baseline and any(b is not None for _, b in _match(reports, baseline)):
        try:
            paths["plot"] = plot_comparison(reports, baseline, out / "comparison.png")
            png = paths["plot"].read_bytes()
        except ValueError as exc:  # nothing comparable (no graded scores); tables still say n/a
            print(f"warning: no comparison plot: {exc}", file=sys.stderr)
    paths["markdown"] = out / "report.md"
    paths["markdown"].write_text(render_markdown(reports, baseline), encoding="utf-8")
    paths["html"] = out / "report.html"
    paths["html"].write_text(render_html(reports, baseline, png), encoding="utf-8")
    return paths


def main(argv: list[str] | None = None) -> int:
    """Render reports from JSON files: ``OUT_DIR TRAINED.json ... [--baseline BASE.json ...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m posttrain.eval.report OUT_DIR TRAINED.json [...] [--baseline BASE.json ...]", file=sys.stderr)
        return 2
    out, rest = Path(args[0]), args[1:]
    cut = rest.index("--baseline") if "--baseline" in rest else len(rest)
    try:
        trained = [read_report(Path(p)) for p in rest[:cut]]
        base = [read_report(Path(p)) for p in rest[cut + 1 :]] or None
        for name, path in write_reports(trained, out, base).items():
            print(f"{name}: {path}")
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
