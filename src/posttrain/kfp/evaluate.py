"""The ``evaluate`` step: score a checkpoint on the chosen benchmarks; where a Model artifact's checkpoint is.

``evaluate`` runs each benchmark of ``benchmarks`` (``BENCHMARK_CHOICES``): ``heldout`` is the
run's own held-out tasks graded by the environment's verifier (``posttrain.eval.heldout``);
``beyond_aime``, ``imo_answerbench`` and ``swe_bench_verified`` are the registered benchmarks of
``posttrain.eval`` (the same runner as ``posttrain eval``), each on its first ``limit`` tasks. It
reports per-benchmark Metrics (``<benchmark>_accuracy`` = avg@k, ...), a Markdown and an HTML
page with one row per graded sample, the link to the training run in MLflow, and logs the scores
into that run. ``model_location`` tells the evaluate and register steps where the checkpoint of a
Model artifact lives (a cluster run leaves it outside the pipeline root) and ``training_run_id``
which MLflow run trained it.

Runs in the ``trainer`` image. Try it on a prepared Dataset and a checkpoint directory:
``python -c "from posttrain.kfp.evaluate import evaluate; print(evaluate('/tmp/ds', '/tmp/model',
benchmarks='heldout,beyond_aime', limit=2).metrics)"``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.config import RunConfig
from posttrain.kfp.artifacts import (
    PipelineStepError,
    StepOutputs,
    html_table,
    load_prepared,
    markdown_table,
    workspace,
)

HELDOUT = "heldout"
"""The run's own held-out tasks (``eval.num_tasks`` of the config's environment)."""
BENCHMARK_CHOICES = (HELDOUT, "beyond_aime", "imo_answerbench", "swe_bench_verified")
"""Benchmarks the pipeline's evaluate step can run (``posttrain.eval.benchmarks`` names, plus ``heldout``)."""
RESPONSE_CHARS = 160
"""Characters of each response shown in the per-item tables (its end, where the answer is)."""


def parse_benchmarks(value: str) -> list[str]:
    """The benchmarks of a comma-separated list, in order, each once; "" means ``heldout``.

    Raises:
        PipelineStepError: a name that is not in ``BENCHMARK_CHOICES``.
    """
    names: list[str] = []
    for raw in value.split(","):
        name = raw.strip()
        if not name or name in names:
            continue
        if name not in BENCHMARK_CHOICES:
            raise PipelineStepError(f"benchmarks: {name!r} is not one of {list(BENCHMARK_CHOICES)}")
        names.append(name)
    return names or [HELDOUT]


def model_location(uri: str, path: str, metadata: Mapping[str, Any]) -> str:
    """Where a Model artifact's checkpoint is, for reading or registering.

    ``metadata["checkpoint_uri"]`` when a step recorded one (cluster SAO writes the checkpoint
    outside the pipeline root; the other training steps copy it under the tenant's S3 prefix);
    else the artifact's ``uri`` when it is an object-store URI (``minio://`` becomes ``s3://``: the
    same bucket through the S3 API); else the local ``path``.
    """
    if metadata.get("checkpoint_uri"):
        return str(metadata["checkpoint_uri"])
    if uri.startswith("s3://"):
        return uri
    if uri.startswith("minio://"):
        return "s3://" + uri[len("minio://") :]
    return path


def training_run_id(cfg: RunConfig, metadata: Mapping[str, Any]) -> str:
    """The MLflow run that trained a Model artifact: ``metadata["mlflow_run_id"]``, else the cluster learner's run.

    A cluster SAO learner logs into the run tagged ``posttrain.learner_of=<run_name>``
    (``Tracker.for_learner``), which the step that launched it cannot see directly. "" when neither exists.

    Raises:
        posttrain.tracking.TrackingError: the tracking server refused the search.
    """
    if metadata.get("mlflow_run_id"):
        return str(metadata["mlflow_run_id"])
    from posttrain.tracking import default_tracking_uri, experiment_name, find_learner_run

    uri = cfg.tracking.tracking_uri or default_tracking_uri()
    return find_learner_run(uri, experiment_name(cfg), cfg.run_name)


def _heldout(cfg: RunConfig, local: Path, limit: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    from posttrain.eval.heldout import heldout_rollouts, heldout_scores
    from posttrain.eval.infra import AccuracyRefused
    from posttrain.runtime import RunContext

    if limit:
        cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"num_tasks": min(cfg.eval.num_tasks, limit)})})
    samples = heldout_rollouts(RunContext(cfg), local)
    rows = [{"task": r.task_id, "status": "correct" if r.metrics.get("correct", 0.0) >= 1.0 else "wrong",
             "reward": r.reward, "tokens": r.num_action_tokens, "answer": ""} for r in samples.rollouts]
    try:
        return heldout_scores(samples, max_infra_share=cfg.eval.max_infra_error_share), rows
    except AccuracyRefused as exc:
        raise PipelineStepError(f"benchmarks: {HELDOUT}: {exc}") from exc


def _benchmark(cfg: RunConfig, local: Path, name: str, limit: int, out_dir: Path) -> tuple[dict[str, float], list[dict[str, Any]]]:
    import msgspec

    from posttrain.eval.report import SampleRecord
    from posttrain.eval.runner import EvalError
    from posttrain.eval.runner import evaluate as run_benchmark

    try:
        report = run_benchmark(
            local, name, engine_kind=cfg.generator.engine, limit=limit or None,
            samples_per_task=cfg.eval.samples_per_task, out_dir=out_dir, seed=cfg.seed, label=cfg.run_name,
            infra_retries=cfg.eval.infra_retries, max_infra_error_share=cfg.eval.max_infra_error_share,
            swe_backend="kubernetes" if name == "swe_bench_verified" else "local",
            namespace=os.environ.get("POSTTRAIN_NAMESPACE", "default"),
        )
    except EvalError as exc:
        raise PipelineStepError(f"benchmarks: {name}: {exc}") from exc
    if report.accuracy_refused:
        raise PipelineStepError(f"benchmarks: {report.accuracy_refused}")
    records = [msgspec.json.decode(line, type=SampleRecord)
               for line in (out_dir / f"{name}.samples.jsonl").read_bytes().splitlines() if line.strip()]
    metrics = {"num_tasks": float(report.num_tasks), "needs_judge": float(report.num_needs_judge),
               "avg_at_k_low": report.avg_at_k_bounds[0], "avg_at_k_high": report.avg_at_k_bounds[1],
               "infra_errors": float(sum(report.infra_errors.values())), "infra_retried": float(report.infra_retried),
               **{f"infra_{cause}": float(n) for cause, n in report.infra_errors.items()}}
    if report.scores is not None:  # None: no task fully graded; the accuracy is then unknown, not 0
        metrics["accuracy"] = report.scores.avg_at_k
        metrics["graded_tasks"] = float(report.scores.num_tasks)
    if report.response_tokens is not None:
        metrics["response_tokens_mean"] = report.response_tokens.mean
    rows = [{"task": r.task_id, "status": r.status, "reward": 1.0 if r.status == "correct" else 0.0,
             "tokens": r.num_tokens, "answer": r.extracted or "", "finish": r.finish_reason,
             "response": r.response[-RESPONSE_CHARS:]} for r in records]
    return metrics, rows


def _item_tables(items: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, str]:
    """A Markdown and an HTML table with one row per graded sample of every benchmark."""
    cols = ["benchmark", "task", "status", "reward", "tokens", "answer", "finish", "response"]
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    body = []
    for bench, rows in items.items():
        for row in rows:
            cells = [bench] + [str(row.get(c, "")) for c in cols[1:]]
            md.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"
    return "\n".join(md) + "\n", f"<table border='1' cellspacing='0'>{head}{''.join(body)}</table>"


def evaluate(
    dataset_dir: Path | str, model_dir: str, *, local_model_dir: str = "", benchmarks: str = HELDOUT, limit: int = 0,
    model_metadata: Mapping[str, Any] | None = None,
) -> StepOutputs:
    """Score a checkpoint on each of ``benchmarks``; log the scores into the MLflow run that trained it.

    ``heldout``: avg@k over ``eval.num_tasks`` held-out tasks (at most ``limit``) with
    ``eval.samples_per_task`` samples each, graded by the environment's verifier. The others:
    ``posttrain.eval.runner.evaluate`` on the first ``limit`` tasks (all when 0) with the config's
    engine and ``eval.samples_per_task`` samples, graded by math-verify (math) or the tests
    (``swe_bench_verified``, in Kubernetes pods of ``$POSTTRAIN_NAMESPACE``).

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_dir: Checkpoint location (``model_location``): a directory or ``s3://`` URI.
        local_model_dir: A local copy of it when the caller has one (KFP downloads artifacts).
        benchmarks: Comma-separated names from ``BENCHMARK_CHOICES``.
        limit: Tasks per benchmark (0: heldout's ``eval.num_tasks``, every task of the others).
        model_metadata: The Model artifact's metadata (``mlflow_run_id``); None skips MLflow.

    Returns:
        Metrics ``<benchmark>_<metric>``: ``accuracy`` (avg@k in [0, 1]; absent for a benchmark
        with no fully graded task), and for heldout ``reward_mean``, ``action_tokens_mean``,
        ``num_rollouts``, for the others ``num_tasks``, ``graded_tasks``, ``needs_judge``,
        ``avg_at_k_low`` / ``avg_at_k_high`` (ungraded samples counted wrong / right),
        ``response_tokens_mean``; for all, ``infra_errors`` (samples left out because their
        infrastructure failed, ``infra_<cause>`` by cause) and ``infra_retried``; Markdown and HTML
        pages with the scores, the MLflow run and one row per graded sample.

    Raises:
        PipelineStepError: an unknown benchmark, a negative ``limit``, a benchmark that cannot run, or
            one whose samples failed for the infrastructure past ``eval.max_infra_error_share``.
        posttrain.storage.StorageError: the checkpoint cannot be read.
    """
    from posttrain.storage import materialize
    from posttrain.tracking import TrackingError, default_tracking_uri, run_link
    from posttrain.tracking.client import mlflow_client

    names = parse_benchmarks(benchmarks)
    if limit < 0:
        raise PipelineStepError(f"benchmark_limit: must be >= 0 (0 = all tasks), got {limit}")
    cfg, manifest = load_prepared(dataset_dir)
    metrics: dict[str, float] = {}
    items: dict[str, list[dict[str, Any]]] = {}
    with workspace(f"{cfg.run_name}-eval") as work:
        cfg, _ = load_prepared(dataset_dir, work)
        local = Path(local_model_dir) if local_model_dir and Path(local_model_dir, "config.json").is_file() \
            else materialize(model_dir, work / "checkpoint")
        for name in names:
            if name == HELDOUT:
                scores, rows = _heldout(cfg, local, limit)
            else:
                scores, rows = _benchmark(cfg, local, name, limit, work / "benchmarks")
            metrics.update({f"{name}_{k}": float(v) for k, v in scores.items()})
            items[name] = rows
    uri = cfg.tracking.tracking_uri or default_tracking_uri()
    run_id = training_run_id(cfg, model_metadata) if model_metadata is not None else ""
    link = ""
    if run_id:
        try:
            link = run_link(uri, run_id)
            mlflow_client(uri).log_batch(run_id, metrics=_mlflow_metrics(metrics))
        except TrackingError as exc:
            raise PipelineStepError(f"mlflow_run_id: {exc}") from exc
    facts = {"run": cfg.run_name, "technique": manifest["technique"], "environment": cfg.data.env,
             "checkpoint": model_dir, "benchmarks": ", ".join(names), "tasks per benchmark": limit or "all",
             "samples per task": cfg.eval.samples_per_task, "MLflow run": link or "(none)", **metrics}
    item_md, item_html = _item_tables(items)
    md = (f"# Evaluation: {cfg.run_name}\n\n" + markdown_table(facts) + "\n## Per item\n\n" + item_md)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>Evaluation {html.escape(cfg.run_name)}</title>"
            "<style>body{font-family:sans-serif}th{text-align:left;padding-right:2em}</style></head><body>"
            f"<h1>Evaluation: {html.escape(cfg.run_name)}</h1>{_link_html(link)}{html_table(facts)}"
            f"<h2>Per item</h2>{item_html}</body></html>\n")
    return StepOutputs(metrics=metrics, metadata={"checkpoint": model_dir, "mlflow_run": link}, markdown=md, html=page)


def _link_html(link: str) -> str:
    if link.startswith(("http://", "https://")):
        return f"<p>MLflow run: <a href='{html.escape(link)}'>{html.escape(link)}</a></p>"
    return ""


def _mlflow_metrics(metrics: Mapping[str, float]) -> list[Any]:
    """The step's metrics as MLflow ``Metric``s ``eval/<name>`` at step 0."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(f"eval/{k}", float(v), now, 0) for k, v in metrics.items()]
