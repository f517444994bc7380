"""``evaluate`` through its KFP python function on a tiny random checkpoint (hf engine)."""

import pytest
from kfp.dsl import HTML, Dataset, Markdown, Metrics, Model

from components.evaluate.component import evaluate
from posttrain.kfp.artifacts import PipelineStepError


def run(tmp_path, prepared, checkpoint, benchmarks, limit, metadata=None):
    metrics, report, items = (Metrics(uri=str(tmp_path / "metrics")), HTML(uri=str(tmp_path / "report.html")),
                              Markdown(uri=str(tmp_path / "items.md")))
    link = evaluate.python_func(prepared=Dataset(uri=str(prepared)), model=Model(uri=str(checkpoint),
                                metadata=metadata or {}), benchmarks=benchmarks, limit=limit,
                                metrics=metrics, report=report, items=items)
    return link, metrics.metadata, (tmp_path / "report.html").read_text(), (tmp_path / "items.md").read_text()


def test_evaluate_scores_heldout_and_beyond_aime_with_a_row_per_item(tmp_path, prepared_sao, tiny_checkpoint):
    """heldout: 2 tasks x 1 sample; beyond_aime: its first task x 1 sample, graded by math-verify."""
    _, scores, page, items = run(tmp_path, prepared_sao, tiny_checkpoint, "heldout, beyond_aime", 1)
    assert scores["heldout_num_rollouts"] == 1.0  # the limit caps heldout's eval.num_tasks (2) too
    assert scores["heldout_accuracy"] in (0.0, 1.0)
    assert scores["beyond_aime_num_tasks"] == 1.0
    assert 0.0 <= scores["beyond_aime_avg_at_k_low"] <= scores["beyond_aime_avg_at_k_high"] <= 1.0
    assert page.startswith("<!doctype html>") and "tiny-sao-run0001" in page and "heldout_accuracy" in page
    rows = [line for line in items.splitlines() if line.startswith("| heldout |") or line.startswith("| beyond_aime |")]
    assert len(rows) == 2, items
    assert page.count("<td>beyond_aime</td>") == 1


def test_an_unknown_benchmark_is_refused_before_any_model_is_loaded(tmp_path, prepared_sao):
    with pytest.raises(PipelineStepError, match="benchmarks: 'gsm8k' is not one of"):
        run(tmp_path, prepared_sao, tmp_path / "no-model", "heldout,gsm8k", 0)
