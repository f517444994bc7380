"""The ``register_model`` step: register a checkpoint in MLflow as a loadable model, promote it if it is better.

The checkpoint is logged as an MLflow model (transformers flavour) in the MLflow run that trained
it and registered as a new version with its lineage and every evaluate score; the version gets
alias ``challenger``, and ``champion`` moves to it only when it beats the current champion on the
benchmark metric ``promote_on`` (default ``HELDOUT_METRIC``) by the margin
(``posttrain.tracking.promote_if_better``).

Runs in the ``trainer`` image: logging a transformers model loads it (torch). Try it on a prepared Dataset and a checkpoint:
``python -c "from posttrain.kfp.register import register_model;
print(register_model('/tmp/ds', '/tmp/model', {}, {'heldout_accuracy': 0.5}, 'try').text)"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.kfp.artifacts import PipelineStepError, StepOutputs, load_prepared, markdown_table
from posttrain.kfp.evaluate import BENCHMARK_CHOICES, training_run_id

HELDOUT_METRIC = "heldout.accuracy"
"""Default ``promote_on``: the run's held-out accuracy (tag ``eval.heldout.accuracy``)."""


def eval_scores(eval_metrics: Mapping[str, Any]) -> dict[str, float]:
    """The evaluate step's metrics ``<benchmark>_<metric>`` as registry scores ``<benchmark>.<metric>``.

    Keys of no benchmark in ``BENCHMARK_CHOICES`` are left out.
    """
    scores: dict[str, float] = {}
    for key, value in eval_metrics.items():
        for bench in BENCHMARK_CHOICES:
            if key.startswith(bench + "_"):
                scores[f"{bench}.{key[len(bench) + 1:]}"] = float(value)
    return scores


def register_model(
    dataset_dir: Path | str, source: str, model_metadata: Mapping[str, Any], eval_metrics: Mapping[str, Any],
    pipeline_run: str, *, margin: float = 0.0, promote_on: str = HELDOUT_METRIC, local_model_dir: str = "",
) -> StepOutputs:
    """Register the checkpoint as a loadable MLflow model with its lineage and scores; promote it if it is better.

    Args:
        dataset_dir: Dataset artifact (technique, hashes, base model, registered model name).
        source: Checkpoint location (``model_location``), kept as the version's ``posttrain.source``.
        model_metadata: The Model artifact's metadata (``mlflow_run_id``; a cluster SAO run's learner
            run is found by its tag instead, ``training_run_id``).
        eval_metrics: The evaluate step's metrics (``<benchmark>_<metric>``; ``promote_on`` is required).
        pipeline_run: Pipeline run id (lineage ``posttrain.run``).
        margin: Least improvement of ``promote_on`` over the champion to promote (same units).
        promote_on: ``<benchmark>.<metric>`` compared with the champion, e.g. ``heldout.accuracy``,
            ``beyond_aime.accuracy``.
        local_model_dir: A local copy of the checkpoint (KFP downloads input artifacts); "" downloads ``source``.

    Returns:
        ``text`` = ``"<model> v<N> champion: <reason>"`` or ``"... challenger: <reason>"``; metrics
        ``registered_version`` and ``promoted`` (1/0); a Markdown summary with the model URI to load.

    Raises:
        PipelineStepError: ``promote_on`` is not a score of ``eval_metrics``.
        posttrain.tracking.TrackingError: the checkpoint has no ``config.json``, is no transformers
            model, or the registry refuses.
    """
    from posttrain.tracking import (
        Lineage,
        default_tracking_uri,
        experiment_name,
        promote_if_better,
        register_checkpoint,
    )

    scores = eval_scores(eval_metrics)
    if promote_on not in scores:
        wanted = promote_on.replace(".", "_", 1)
        raise PipelineStepError(
            f"promote_on {promote_on!r}: eval_metrics have no {wanted} (evaluate that benchmark; got {sorted(eval_metrics)})"
        )
    cfg, manifest = load_prepared(dataset_dir)
    run_id = training_run_id(cfg, model_metadata)
    lineage = Lineage(run=pipeline_run or cfg.run_name, technique=manifest["technique"],
                      dataset_hash=manifest["dataset_hash"], config_hash=manifest["config_hash"],
                      base_model=manifest["base_model"], mlflow_run_id=run_id,
                      teacher=manifest.get("teacher_model", ""))
    name, uri = cfg.tracking.registered_model, cfg.tracking.tracking_uri or default_tracking_uri()
    version = register_checkpoint(source, registered_model=name, lineage=lineage, eval_scores=scores,
                                  tracking_uri=uri, description=f"{manifest['technique']} run {cfg.run_name}",
                                  local_copy=local_model_dir or None, experiment=experiment_name(cfg))
    decision = promote_if_better(name, version.version, metric=promote_on, margin=margin, tracking_uri=uri)
    alias = "champion" if decision.promoted else "challenger"
    text = f"{name} v{version.version} {alias}: {decision.reason}"
    facts = {"registered model": name, "version": version.version, "alias": alias, "promoted on": promote_on,
             "decision": decision.reason, "load with": f"mlflow.transformers.load_model('models:/{name}/{version.version}')",
             "MLflow run": version.run_id, "checkpoint": version.checkpoint,
             **{f"eval.{k}": v for k, v in scores.items()}}
    return StepOutputs(
        metrics={"registered_version": float(version.version), "promoted": float(decision.promoted)},
        metadata={"registered_model": name, "version": version.version, "alias": alias, "mlflow_run_id": version.run_id},
        markdown=f"# Registration: {name} v{version.version}\n\n" + markdown_table(facts),
        text=text,
    )
