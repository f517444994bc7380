"""Eval report aggregation and its JSON / Markdown / HTML / PNG renderings."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.eval.report import SampleRecord, build_report, read_report
from posttrain.eval.report_render import render_markdown, write_reports


def _s(task: str, i: int, status: str, cat: str = "", tokens: int = 10, finish: str = "stop") -> SampleRecord:
    method = {"correct": "math_verify", "wrong": "math_verify", "needs_judge": "none"}[status]
    return SampleRecord(task_id=task, sample_index=i, status=status, method=method, reason="r", category=cat,
                        num_tokens=tokens, finish_reason=finish)


SAMPLES = [
    _s("A", 0, "correct", "Algebra", 10), _s("A", 1, "wrong", "Algebra", 30, "length"),
    _s("B", 0, "correct", "Geometry", 20), _s("B", 1, "correct", "Geometry", 20),
    _s("C", 0, "needs_judge", "Algebra", 40), _s("C", 1, "wrong", "Algebra", 50),
]


def _report(samples=SAMPLES, label: str = "trained", model: str = "runs/x/final"):
    return build_report(samples, benchmark="imo_answerbench", model=model, samples_per_task=2, temperature=0.6,
                        max_new_tokens=64, label=label, engine="hf")


def test_build_report_excludes_needs_judge_tasks_and_bounds_them() -> None:
    """Graded tasks A [c, w], B [c, c]: avg@2 = (0.5 + 1) / 2 = 0.75; pass@1 = 0.75; pass@2 = (1 + 1) / 2 = 1.
    Task C [needs judge, w] is excluded. Bounds over A, B, C: lower (judge -> wrong) = (0.5 + 1 + 0) / 3 = 0.5,
    upper (judge -> right) = (0.5 + 1 + 0.5) / 3 = 2/3.
    Categories: Algebra = A only = 0.5; Geometry = B = 1.0.
    Lengths: all six [10, 30, 20, 20, 40, 50] mean 28.33; correct [10, 20, 20] mean 16.67; wrong [30, 50] mean 40.
    """
    r = _report()
    assert r.scores is not None
    assert (r.scores.num_tasks, r.scores.avg_at_k, r.scores.pass_at_k) == (2, 0.75, {1: 0.75, 2: 1.0})
    assert r.avg_at_k_bounds == pytest.approx((0.5, 2 / 3))
    assert (r.num_needs_judge, r.needs_judge_task_ids, r.num_tasks) == (1, ["C"], 3)
    assert r.categories["Algebra"].avg_at_k == 0.5 and r.categories["Geometry"].avg_at_k == 1.0
    assert r.response_tokens.mean == pytest.approx(170 / 6)
    assert r.response_tokens_correct.mean == pytest.approx(50 / 3)
    assert r.response_tokens_wrong.mean == 40.0
    assert r.finish_reasons == {"stop": 5, "length": 1}
    assert r.grading_methods == {"math_verify": 5, "none": 1}


def test_build_report_rejects_uneven_sample_counts() -> None:
    with pytest.raises(ValueError, match="task B: 1 samples"):
        build_report(SAMPLES[:3], benchmark="b", model="m", samples_per_task=2, temperature=0, max_new_tokens=8)


def test_all_tasks_needing_a_judge_gives_no_score_but_still_renders(tmp_path: Path) -> None:
    r = _report([_s("C", 0, "needs_judge"), _s("C", 1, "needs_judge")])
    assert r.scores is None and r.avg_at_k_bounds == (0.0, 1.0)
    paths = write_reports([r], tmp_path)
    assert "n/a" in paths["markdown"].read_text()


def test_reports_written_in_json_markdown_html_and_png_with_baseline(tmp_path: Path) -> None:
    trained = _report(model="runs/<script>x</script>")
    base = _report([_s("A", 0, "wrong"), _s("A", 1, "wrong"), _s("B", 0, "correct"), _s("B", 1, "wrong"),
                    _s("C", 0, "wrong"), _s("C", 1, "wrong")], label="base", model="<base & model>")
    paths = write_reports([trained], tmp_path, baseline=[base])
    assert set(paths) == {"imo_answerbench.json", "markdown", "html", "plot"}
    assert read_report(paths["imo_answerbench.json"]) == trained
    md = paths["markdown"].read_text()
    # base avg@2 = (0 + 0.5 + 0) / 3 = 16.7 %, trained 75.0 %: delta +58.3 points
    assert "| imo_answerbench | 2 | 2/3 |" in md and "+58.3" in md and "Needs judge" in md
    html_text = paths["html"].read_text()
    assert html_text.startswith("<!DOCTYPE html>") and "data:image/png;base64," in html_text
    assert "<script>" not in html_text and "&lt;script&gt;" in html_text
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_without_baseline_has_single_model_columns() -> None:
    md = render_markdown([_report()])
    assert "avg@k % [95% CI]" in md and "base avg@k" not in md
    assert "75.0 [" in md


def test_read_report_names_the_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"benchmark": 3}')
    with pytest.raises(ValueError, match="bad.json"):
        read_report(bad)


def test_prompt_too_long_is_counted_apart_from_truncation_and_left_out_of_lengths() -> None:
    """4 samples: 10 tokens (stop), 30 tokens (length), and two prompt_too_long (0 tokens). Lengths
    cover the 2 responses only (mean 20); the Markdown shows 1 truncated (25.0%) and 2 prompts longer
    than the context (50.0%) on separate rows."""
    samples = [
        _s("A", 0, "correct", tokens=10), _s("A", 1, "wrong", tokens=30, finish="length"),
        SampleRecord(task_id="B", sample_index=0, status="wrong", method="prompt_too_long", reason="r",
                     finish_reason="prompt_too_long"),
        SampleRecord(task_id="B", sample_index=1, status="wrong", method="prompt_too_long", reason="r",
                     finish_reason="prompt_too_long"),
    ]
    r = _report(samples)
    assert r.finish_reasons == {"stop": 1, "length": 1, "prompt_too_long": 2}
    assert r.response_tokens is not None and (r.response_tokens.count, r.response_tokens.mean) == (2, 20.0)
    assert r.response_tokens_wrong is not None and r.response_tokens_wrong.count == 1
    md = render_markdown([r])
    assert "| trained: truncated at max tokens | 1 | 25.0% |" in md
    assert "| trained: prompt longer than the context | 2 | 50.0% |" in md


def test_markdown_counts_grading_methods_for_trained_and_base() -> None:
    """SAMPLES: 5 graded by math-verify, 1 needs a judge (method "none") -> 83.3% / 16.7%.
    The base run: 2 math-verify of 2 -> 100.0%, 0 needing a judge."""
    md = render_markdown([_report()])
    assert "## imo_answerbench: grading methods" in md
    assert "| math-verify (symbolic equivalence) | 5 | 83.3 |" in md
    assert "| needs judge (ungraded) | 1 | 16.7 |" in md
    base = _report([_s("A", 0, "correct"), _s("A", 1, "wrong")], label="base")
    both = render_markdown([_report()], baseline=[base])
    assert "| method | base: samples | trained: samples | base: % | trained: % |" in both
    assert "| math-verify (symbolic equivalence) | 2 | 5 | 100.0 | 83.3 |" in both
    assert "| needs judge (ungraded) | 0 | 1 | 0.0 | 16.7 |" in both
