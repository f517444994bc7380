"""Where MLflow is and the names posttrain uses in it: tracking URI, experiment, client, keys, aliases.

Shared by run logging (``runs``), registration (``registry``), promotion (``promotion``) and
listing (``listing``). Nothing here talks to MLflow on import; ``mlflow_client`` imports mlflow.

Example: ``mlflow_client(default_tracking_uri("runs"))`` is a client on ``runs/mlflow.db``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrain.config.run import RunConfig

CHALLENGER = "challenger"
"""Alias every newly registered checkpoint receives."""
CHAMPION = "champion"
"""Alias of the version that serves; moved only by ``promote_if_better`` (or a forced promote)."""
LINEAGE_PREFIX = "posttrain."
"""Prefix of lineage tags on model versions."""
EVAL_PREFIX = "eval."
"""Prefix of eval-score tags on model versions: ``eval.<benchmark>.<metric>``."""


class TrackingError(RuntimeError):
    """A registry operation could not be done (missing checkpoint, unknown model or version, missing metric)."""


def default_tracking_uri(output_dir: str | Path = "runs") -> str:
    """``$MLFLOW_TRACKING_URI`` when set, else ``sqlite:///<output_dir>/mlflow.db`` (absolute)."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    path = Path(output_dir).resolve() / "mlflow.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def experiment_name(config: RunConfig) -> str:
    """The MLflow experiment of a run.

    ``$MLFLOW_EXPERIMENT_NAME`` when set (a tenant's pods get their team's experiment from the
    tenant ConfigMap), else ``tracking.experiment`` of the config.
    """
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or config.tracking.experiment


def mlflow_client(tracking_uri: str | None) -> Any:
    """An ``mlflow.MlflowClient`` for tracking and registry at ``tracking_uri`` (None: ``default_tracking_uri()``)."""
    from mlflow import MlflowClient

    uri = tracking_uri or default_tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def mlflow_error_code(exc: BaseException) -> str:
    """The ``error_code`` of an ``MlflowException`` (``RESOURCE_ALREADY_EXISTS``...), or ""."""
    return str(getattr(exc, "error_code", ""))


def metric_key(name: str) -> str:
    """An MLflow-safe metric/tag key: ``avg@4`` -> ``avg_at_4``; characters MLflow refuses -> ``_``."""
    out = name.replace("@", "_at_")
    return "".join(ch if ch.isalnum() or ch in "_-./ :" else "_" for ch in out)


def experiment_id_for(client: Any, tracking_uri: str, experiment: str, artifact_location: str | None = None) -> str:
    """The id of ``experiment``, created if missing.

    A new experiment's artifact root is ``artifact_location``; when that is None and the tracking
    URI is ``sqlite:///<dir>/mlflow.db``, it is ``<dir>/mlartifacts/<experiment>`` (beside the
    database, never the working directory); else the server's default.
    """
    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return str(exp.experiment_id)
    location = artifact_location
    if location is None and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        location = (db.parent / "mlartifacts" / experiment).resolve().as_uri()
    return str(client.create_experiment(experiment, artifact_location=location))
