"""The ``register_model`` step: register a checkpoint in MLflow with its lineage, promote it if it is better.

The new version gets alias ``challenger``; ``champion`` moves to it only when its held-out accuracy
(``HELDOUT_METRIC``) beats the current champion's by the margin (``posttrain.tracking.promote_if_better``).

Runs in the torch-free ``base`` image. Try it on a prepared Dataset and a checkpoint:
``python -c "from posttrain.kfp.register import register_model;
print(register_model('/tmp/ds', '/tmp/model', {}, {'heldout_accuracy': 0.5}, 'try').text)"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.kfp.artifacts import PipelineStepError, StepOutputs, load_prepared, markdown_table

HELDOUT_METRIC = "heldout.accuracy"
"""Eval-score key registered on model versions (tag ``eval.heldout.accuracy``) and used for promotion."""


def register_model(
    dataset_dir: Path | str, source: str, model_metadata: Mapping[str, Any], eval_metrics: Mapping[str, Any],
    pipeline_run: str, *, margin: float = 0.0,
) -> StepOutputs:
    """Register the checkpoint with its lineage and scores; promote it to ``champion`` if it is better.

    Args:
        dataset_dir: Dataset artifact (technique, hashes, base model, registered model name).
        source: Checkpoint location (``model_location``); weights are not copied.
        model_metadata: The Model artifact's metadata (``mlflow_run_id`` links the version to its run).
        eval_metrics: The evaluate step's metrics (``heldout_accuracy`` is required).
        pipeline_run: Pipeline run id (lineage ``posttrain.run``).
        margin: Least improvement in held-out accuracy (fraction) over the champion to promote.

    Returns:
        ``text`` = ``"<model> v<N> champion: <reason>"`` or ``"... challenger: <reason>"``; metrics
        ``registered_version`` and ``promoted`` (1/0); a Markdown summary.

    Raises:
        PipelineStepError: ``heldout_accuracy`` missing from ``eval_metrics``.
        posttrain.tracking.TrackingError: the checkpoint has no ``config.json`` or the registry refuses.
    """
    from posttrain.tracking import Lineage, promote_if_better, register_checkpoint

    if "heldout_accuracy" not in eval_metrics:
        raise PipelineStepError(f"eval_metrics: no heldout_accuracy (got {sorted(eval_metrics)})")
    cfg, manifest = load_prepared(dataset_dir)
    scores = {f"heldout.{k[len('heldout_'):]}": float(v) for k, v in eval_metrics.items() if k.startswith("heldout_")}
    lineage = Lineage(run=pipeline_run or cfg.run_name, technique=manifest["technique"],
                      dataset_hash=manifest["dataset_hash"], config_hash=manifest["config_hash"],
                      base_model=manifest["base_model"], mlflow_run_id=str(model_metadata.get("mlflow_run_id", "")))
    name, uri = cfg.tracking.registered_model, cfg.tracking.tracking_uri
    version = register_checkpoint(source, registered_model=name, lineage=lineage, eval_scores=scores,
                                  tracking_uri=uri, description=f"{manifest['technique']} run {cfg.run_name}")
    decision = promote_if_better(name, version.version, metric=HELDOUT_METRIC, margin=margin, tracking_uri=uri)
    alias = "champion" if decision.promoted else "challenger"
    text = f"{name} v{version.version} {alias}: {decision.reason}"
    facts = {"registered model": name, "version": version.version, "alias": alias, "decision": decision.reason,
             "source": version.source, **{f"eval.{k}": v for k, v in scores.items()}}
    return StepOutputs(
        metrics={"registered_version": float(version.version), "promoted": float(decision.promoted)},
        metadata={"registered_model": name, "version": version.version, "alias": alias},
        markdown=f"# Registration: {name} v{version.version}\n\n" + markdown_table(facts),
        text=text,
    )
