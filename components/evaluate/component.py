"""KFP component ``evaluate``: score a trained checkpoint on the chosen benchmarks.

``benchmarks`` is a comma-separated subset of ``heldout`` (the run's held-out tasks, graded by the
environment's verifier), ``beyond_aime``, ``imo_answerbench`` and ``swe_bench_verified``, each on its
first ``limit`` tasks (``posttrain.kfp.evaluate.evaluate``). Writes per-benchmark Metrics, a
Markdown and an HTML page with one row per graded sample and the MLflow run's link, and logs the
scores into the training run. Runs in the ``trainer`` image.
"""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Model, Output

from components.images import TRAINER_IMAGE


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate(
    prepared: Input[Dataset],
    model: Input[Model],
    benchmarks: str,
    limit: int,
    metrics: Output[Metrics],
    report: Output[HTML],
    items: Output[Markdown],
) -> str:
    """Evaluate ``model`` on ``benchmarks``; returns the MLflow run's link (or "").

    Args:
        prepared: Dataset artifact of ``prepare_dataset`` (config and eval.jsonl).
        model: Checkpoint from a ``train_*`` step.
        benchmarks: Comma-separated: heldout, beyond_aime, imo_answerbench, swe_bench_verified.
        limit: Tasks per benchmark; 0 = heldout's ``eval.num_tasks`` and every task of the others.
        metrics: ``<benchmark>_accuracy`` (avg@k) and counts per benchmark.
        report: HTML page: run, checkpoint, MLflow run link, scores, one row per graded sample.
        items: The same as Markdown.
    """
    from posttrain.kfp.artifacts import write_outputs
    from posttrain.kfp.evaluate import evaluate, model_location

    where = model_location(model.uri, model.path, model.metadata)
    result = evaluate(prepared.path, where, local_model_dir=model.path, benchmarks=benchmarks, limit=limit,
                      model_metadata=model.metadata)
    write_outputs(result, metrics=metrics, html_report=report, markdown=items)
    return result.metadata["mlflow_run"]
