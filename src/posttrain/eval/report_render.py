"""Eval report renderings: Markdown, HTML and a PNG plot of ``EvalReport``s, and the files they go to.

``write_reports(reports, out_dir, baseline=...)`` writes, for a trained model's reports and
optionally the base model's reports on the same benchmarks:

* ``<benchmark>.json``: one ``EvalReport`` each (read back with ``report.read_report``);
* ``report.md``: a score table (base vs trained with the difference when a baseline is given),
  per-category tables, response-length statistics (with responses truncated at the token budget
  and prompts longer than the context counted apart), how each sample was graded (math-verify,
  exact number, verbatim match, judge, needs judge...) and the "needs judge" counts;
* ``report.html``: the same, self-contained (the plot embedded as a data URI), for the KFP UI;
* ``comparison.png``: bars of avg@k with confidence intervals, base vs trained, per benchmark
  (matplotlib, Agg backend; only with a baseline).

Run: ``python -m posttrain.eval.report_render OUT_DIR TRAINED.json [...] [--baseline BASE.json ...]``.
"""

from __future__ import annotations

import base64
import html
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from posttrain.eval.infra import INFRA_STATUS
from posttrain.eval.metrics import LengthStats
from posttrain.eval.report import PROMPT_TOO_LONG, EvalReport, read_report

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
    INFRA_STATUS: "left out: infrastructure failed",
}
"""Readable name of each ``SampleRecord.method`` in the Markdown and HTML reports (others show raw)."""


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


def _infra_note(r: EvalReport) -> str:
    """One sentence on the samples of ``r`` left out because their infrastructure failed (or the refusal)."""
    if r.accuracy_refused:
        return r.accuracy_refused
    causes = ", ".join(f"{cause} {n}" for cause, n in sorted(r.infra_errors.items()))
    return (f"{r.benchmark}: {sum(r.infra_errors.values())} samples on {len(r.infra_task_ids)} tasks failed for the "
            f"infrastructure ({causes}) after {r.infra_retried} runs again in all; they are not the model's answers, so "
            "their tasks are left out of the scores above")


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
    infra = [r for r in reports if r.infra_errors or r.accuracy_refused]
    if infra:
        lines += ["## Infrastructure failures", ""]
        lines += [f"- {_infra_note(r)}" for r in infra]
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
    for r in reports:
        if r.infra_errors or r.accuracy_refused:
            parts.append(f"<p>{esc(_infra_note(r))}</p>")
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
        print("usage: python -m posttrain.eval.report_render OUT_DIR TRAINED.json [...] [--baseline BASE.json ...]", file=sys.stderr)
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
