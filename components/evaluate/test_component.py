"""``evaluate`` through its KFP python function on a tiny random checkpoint (hf engine, 2 tasks)."""

from kfp.dsl import HTML, Dataset, Metrics, Model

from components.evaluate.component import evaluate


def test_evaluate_scores_heldout_tasks_and_writes_an_html_report(tmp_path, prepared_sao, tiny_checkpoint):
    """2 tasks x 1 sample = 2 rollouts; accuracy is a fraction of them (0, 0.5 or 1)."""
    metrics, report = Metrics(uri=str(tmp_path / "metrics")), HTML(uri=str(tmp_path / "report.html"))
    accuracy = evaluate.python_func(prepared=Dataset(uri=str(prepared_sao)), model=Model(uri=str(tiny_checkpoint)),
                                    metrics=metrics, report=report)
    assert accuracy in (0.0, 0.5, 1.0)
    assert metrics.metadata["heldout_num_rollouts"] == 2.0
    assert metrics.metadata["heldout_accuracy"] == accuracy
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "tiny-sao-run0001" in page and "heldout_accuracy" in page
