"""MLflow tracking and model registration: run metrics, checkpoint versions with lineage, alias promotion.

* ``runs``: ``Tracker``, one MLflow run on any tracking URI (``sqlite:///...`` by default,
  ``http://`` for a server): params (nested dicts flattened to dotted keys), metrics with a step,
  artifacts; a restarted process resumes the same run by ``run_id``. ``MetricsSink`` is the one
  type of a metrics callback, ``(metrics, step) -> None``, that every learner and runner reports
  through (``posttrain.runners.common.metrics_sink`` builds one).
* ``registry``: ``register_checkpoint`` logs a trained checkpoint (a local directory or an
  ``s3://`` URI, checked through ``posttrain.storage``) as an MLflow model (transformers
  flavour) in the run that trained it and registers it as a new version of the team's
  registered model, tagged with its lineage (``posttrain.*``: run, technique, dataset hash,
  config hash, base model, the checkpoint's location ``posttrain.source``) and eval scores
  (``eval.<benchmark>.<metric>``), with the ``challenger`` alias;
  ``mlflow.transformers.load_model("models:/<name>@<alias>")`` loads it.
* ``promotion``: ``promote_if_better`` moves the ``champion`` alias to a version only if it beats
  the current champion on the configured metric by the configured margin; the decision is
  recorded as tags. ``register_and_promote`` (what ``posttrain run`` does at its end) registers a
  final model once per checkpoint and promotes it on ``heldout.accuracy``: the first version of a
  registered model becomes its ``champion``.
* ``runs`` also finds a cluster learner's run (``find_learner_run``), links to a run
  (``run_link``) and reads a metric's history (``metric_history``, the SAO reward curve).
* ``listing``: ``list_models`` / ``show_model``, what ``posttrain models list|show`` prints.
* ``client``: tracking URI, experiment name, the MLflow client, metric keys and alias names.

Aliases replace MLflow's deprecated stages (``models:/<name>@champion`` resolves to the version).
The names below are importable from this package, where runners, KFP steps and the CLI import
them. The command line for the registry is ``posttrain models list|show|promote``.
"""

from posttrain.tracking.client import (
    CHALLENGER,
    CHAMPION,
    EVAL_PREFIX,
    LINEAGE_PREFIX,
    TrackingError,
    default_tracking_uri,
    experiment_name,
    metric_key,
)
from posttrain.tracking.listing import ModelSummary, list_models, show_model
from posttrain.tracking.promotion import (
    HELDOUT_METRIC,
    PromotionDecision,
    Registration,
    promote_if_better,
    register_and_promote,
)
from posttrain.tracking.registry import (
    Lineage,
    ModelVersionInfo,
    checkpoint_digest,
    config_hash,
    dataset_hash,
    register_checkpoint,
)
from posttrain.tracking.runs import (
    MAX_PARAM_CHARS,
    MetricsSink,
    Tracker,
    find_learner_run,
    flatten_params,
    metric_history,
    run_link,
)

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "EVAL_PREFIX",
    "HELDOUT_METRIC",
    "LINEAGE_PREFIX",
    "MAX_PARAM_CHARS",
    "Lineage",
    "MetricsSink",
    "ModelSummary",
    "ModelVersionInfo",
    "PromotionDecision",
    "Registration",
    "Tracker",
    "TrackingError",
    "checkpoint_digest",
    "config_hash",
    "dataset_hash",
    "default_tracking_uri",
    "experiment_name",
    "find_learner_run",
    "flatten_params",
    "list_models",
    "metric_history",
    "metric_key",
    "promote_if_better",
    "register_and_promote",
    "register_checkpoint",
    "run_link",
    "show_model",
]
