"""Where MLflow is and the names posttrain uses in it: tracking URI, experiment, client, keys, aliases.

Shared by run logging (``runs``), registration (``registry``), promotion (``promotion``) and
listing (``listing``). Nothing here talks to MLflow on import; ``mlflow_client`` imports mlflow.

Example: ``mlflow_client(default_tracking_uri("runs"))`` is a client on ``runs/mlflow.db``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
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


STORE_LOCK_TIMEOUT_S = 300.0
"""Longest wait (seconds) for another process to finish creating a sqlite store's tables."""

_READY_STORES: set[str] = set()
"""sqlite tracking URIs whose tables this process has seen created (``mlflow_client``)."""


@contextmanager
def _store_lock(db: Path, timeout_s: float = STORE_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<db>.lock`` (beside the database) for the block.

    Raises:
        TrackingError: the lock was not free within ``timeout_s`` seconds (names the lock file).
    """
    import fcntl
    import time

    lock_path = db.with_name(db.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TrackingError(f"MLflow store {db}: another process held {lock_path} for over "
                                        f"{timeout_s:.0f} s while creating the tables") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def mlflow_client(tracking_uri: str | None) -> Any:
    """An ``mlflow.MlflowClient`` for tracking and registry at ``tracking_uri`` (None: ``default_tracking_uri()``).

    On a ``sqlite:///`` URI the first client of each process creates (or migrates) the store's tables under a
    file lock beside the database, so runs started together on a fresh ``mlflow.db`` do not run MLflow's
    migrations at once (three demos started together failed in alembic with ``expected to match one row``).

    Raises:
        TrackingError: another process held the store's lock for over ``STORE_LOCK_TIMEOUT_S`` seconds.
    """
    from mlflow import MlflowClient

    uri = tracking_uri or default_tracking_uri()
    if not uri.startswith("sqlite:///") or uri in _READY_STORES:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    with _store_lock(Path(uri[len("sqlite:///") :])):
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)  # may create the store already
        client.search_experiments(max_results=1)  # the tracking store: creates or migrates the tables
        client.search_registered_models(max_results=1)  # the registry store on the same file
    _READY_STORES.add(uri)
    return client


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
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(experiment)
    if exp is not None:
        return str(exp.experiment_id)
    location = artifact_location
    if location is None and tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        location = (db.parent / "mlartifacts" / experiment).resolve().as_uri()
    try:
        return str(client.create_experiment(experiment, artifact_location=location))
    except MlflowException as exc:  # another run created it since the lookup (runs started together)
        exp = client.get_experiment_by_name(experiment) if mlflow_error_code(exc) == "RESOURCE_ALREADY_EXISTS" else None
        if exp is None:
            raise
        return str(exp.experiment_id)
