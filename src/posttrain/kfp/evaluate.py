"""The ``evaluate`` step: score a checkpoint on the prepared held-out tasks; where a Model artifact's checkpoint is.

``evaluate`` reports avg@k of the environment's verifier (``posttrain.eval.heldout.evaluate_policy``)
as Metrics, Markdown and HTML; ``model_location`` tells the evaluate and register steps where the
checkpoint of a Model artifact lives (a cluster run leaves it outside the pipeline root).

Runs in the ``trainer`` image. Try it on a prepared Dataset and a checkpoint directory:
``python -c "from posttrain.kfp.evaluate import evaluate; print(evaluate('/tmp/ds', '/tmp/model').metrics)"``.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.kfp.artifacts import StepOutputs, html_table, load_prepared, markdown_table, workspace


def model_location(uri: str, path: str, metadata: Mapping[str, Any]) -> str:
    """Where a Model artifact's checkpoint is, for reading or registering.

    ``metadata["checkpoint_uri"]`` when a step recorded one (cluster SAO writes the checkpoint
    outside the pipeline root); else the artifact's ``uri`` when it is an object-store URI
    (``minio://`` becomes ``s3://``: the same bucket through the S3 API); else the local ``path``.
    """
    if metadata.get("checkpoint_uri"):
        return str(metadata["checkpoint_uri"])
    if uri.startswith("s3://"):
        return uri
    if uri.startswith("minio://"):
        return "s3://" + uri[len("minio://") :]
    return path


def evaluate(dataset_dir: Path | str, model_dir: str, *, local_model_dir: str = "") -> StepOutputs:
    """Score a checkpoint on the held-out tasks of the prepared dataset (``eval.json`` of the run).

    avg@k over ``eval.num_tasks`` tasks with ``eval.samples_per_task`` samples each, graded by the
    environment's verifier (``posttrain.eval.heldout.evaluate_policy``).

    Args:
        dataset_dir: Dataset artifact from ``prepare_dataset``.
        model_dir: Checkpoint location (``model_location``): a directory or ``s3://`` URI.
        local_model_dir: A local copy of it when the caller has one (KFP downloads artifacts).

    Returns:
        Metrics ``heldout_accuracy``, ``heldout_reward_mean``, ``heldout_action_tokens_mean``,
        ``heldout_rollouts``; Markdown and HTML reports.

    Raises:
        posttrain.storage.StorageError: the checkpoint cannot be read.
    """
    from posttrain.eval.heldout import evaluate_policy
    from posttrain.runtime import RunContext
    from posttrain.storage import materialize

    cfg, manifest = load_prepared(dataset_dir)
    with workspace(f"{cfg.run_name}-eval") as work:
        cfg, _ = load_prepared(dataset_dir, work)
        local = Path(local_model_dir) if local_model_dir and Path(local_model_dir, "config.json").is_file() \
            else materialize(model_dir, work / "checkpoint")
        scores = evaluate_policy(RunContext(cfg), local)
    metrics = {f"heldout_{k}": float(v) for k, v in scores.items()}
    facts = {"run": cfg.run_name, "technique": manifest["technique"], "environment": cfg.data.env,
             "checkpoint": model_dir, "tasks": min(cfg.eval.num_tasks, manifest["eval_rows"]),
             "samples per task": cfg.eval.samples_per_task, **metrics}
    md = f"# Held-out evaluation: {cfg.run_name}\n\n" + markdown_table(facts)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>Evaluation {html.escape(cfg.run_name)}</title>"
            "<style>body{font-family:sans-serif}th{text-align:left;padding-right:2em}</style></head><body>"
            f"<h1>Held-out evaluation: {html.escape(cfg.run_name)}</h1>{html_table(facts)}</body></html>\n")
    return StepOutputs(metrics=metrics, metadata={"checkpoint": model_dir}, markdown=md, html=page)
