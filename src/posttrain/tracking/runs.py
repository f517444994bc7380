"""MLflow run logging: ``Tracker`` (one run's params, metrics, artifacts) and the ``MetricsSink`` type.

``Tracker`` works on any tracking URI (``sqlite:///...`` by default, ``http://`` for a server);
params are nested dicts flattened to dotted keys, metrics carry a step. A restarted learner
resumes its run by ``run_id`` (``Tracker.for_learner``). ``Tracker.register_model`` hands a
checkpoint to ``promotion.register_and_promote`` with the run's lineage.

Example::

    with Tracker("sqlite:///runs/mlflow.db", "posttrain", run_name="sft-1") as t:
        t.log_metrics({"loss": 0.5}, step=1)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from posttrain.account import run_tenant
from posttrain.tracking.client import (
    TrackingError,
    default_tracking_uri,
    experiment_id_for,
    experiment_name,
    metric_key,
    mlflow_client,
)
from posttrain.tracking.registry import Lineage, config_hash, dataset_hash

if TYPE_CHECKING:
    from posttrain.config.run import RunConfig
    from posttrain.tracking.promotion import Registration

MetricsSink = Callable[[dict[str, float], int], None]
"""Receives ``(metrics, step)``: metric name -> value, and the policy version or optimizer step it belongs to."""

MAX_PARAM_CHARS = 6000
"""MLflow's longest parameter value (characters); longer values are cut with a marker."""


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested mappings to dotted keys with string values (lists as JSON), cut to ``MAX_PARAM_CHARS``.

    Example: ``{"sao": {"loss": {"mask_eps_low": 0.3}}}`` -> ``{"sao.loss.mask_eps_low": "0.3"}``.
    """
    out: dict[str, str] = {}
    for key, value in params.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_params(value, prefix=f"{full}."))
            continue
        text = json.dumps(value) if isinstance(value, list | tuple) else str(value)
        if len(text) > MAX_PARAM_CHARS:
            text = text[: MAX_PARAM_CHARS - 20] + "...[truncated]"
        out[metric_key(full)] = text
    return out


class Tracker:
    """One MLflow run: params, metrics, artifacts. Use as a context manager (FAILED on exception, KILLED on Ctrl-C or SIGTERM).

    Args:
        tracking_uri: MLflow URI; None uses ``default_tracking_uri()``.
        experiment: Experiment name (created if missing; per tenant in a cluster).
        run_name: Display name of a new run.
        run_id: Resume this existing run instead of creating one (a restarted learner).
        tags: Tags for a new run.
        artifact_location: Artifact root for a newly created experiment (``s3://bucket/prefix``);
            None puts sqlite-backed artifacts beside the database, else the server's default.

    Raises:
        TrackingError: ``run_id`` does not exist.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "posttrain",
        *,
        run_name: str | None = None,
        run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.client = mlflow_client(self.tracking_uri)
        self.experiment_id: str = experiment_id_for(self.client, self.tracking_uri, experiment, artifact_location)
        if run_id is not None:
            from mlflow.exceptions import MlflowException

            try:
                self.client.get_run(run_id)
            except MlflowException as exc:
                raise TrackingError(f"run_id {run_id!r}: no such MLflow run ({exc})") from exc
            self.client.update_run(run_id, status="RUNNING")
            self.run_id: str = run_id
        else:
            run = self.client.create_run(self.experiment_id, run_name=run_name, tags=dict(tags or {}))
            self.run_id = run.info.run_id
        self.config: RunConfig | None = None

    @classmethod
    def for_run(cls, config: RunConfig, run_dir: Path | None = None) -> Tracker:
        """A new MLflow run for a ``RunConfig``; ``register_model`` then uses the config.

        Tracking URI: ``tracking.tracking_uri``, else ``default_tracking_uri(output_dir)``; experiment
        from ``experiment_name(config)``, run name from the config; tagged with the technique and the
        tenant (``posttrain.tenant``: ``POSTTRAIN_TENANT``, ``posttrain.account.run_tenant``). ``run_dir`` (the run's output directory) is recorded as the tag ``posttrain.run_dir``.
        """
        tags: dict[str, str] = {"posttrain.technique": config.technique, "posttrain.tenant": run_tenant()}
        if run_dir is not None:
            tags["posttrain.run_dir"] = str(Path(run_dir).resolve())
        tracker = cls(
            config.tracking.tracking_uri or default_tracking_uri(config.output_dir),
            experiment_name(config),
            run_name=config.run_name,
            tags=tags,
        )
        tracker.config = config
        return tracker

    @classmethod
    def for_learner(cls, config: RunConfig) -> Tracker:
        """The MLflow run of a learner process that may be a restart: resumed when it exists.

        A learner pod of a cluster run that a JobSet restarts logs into the same MLflow run as its
        predecessor: the newest run of the experiment tagged ``posttrain.learner_of=<run_name>``;
        the first pod creates it. Tracking URI and experiment as in ``for_run``.

        Raises:
            TrackingError: the tracking server refused the search or the run.
        """
        uri = config.tracking.tracking_uri or default_tracking_uri(config.output_dir)
        run_id = find_learner_run(uri, experiment_name(config), config.run_name) or None
        tracker = cls(uri, experiment_name(config), run_name=config.run_name, run_id=run_id,
                      tags={"posttrain.technique": config.technique, "posttrain.learner_of": config.run_name})
        tracker.config = config
        return tracker

    def log_params_from_config(self, config: RunConfig) -> None:
        """Log the resolved config as params (dotted keys) and as the artifact ``resolved_config.json``."""
        resolved = config.model_dump(mode="json")
        self.log_params(resolved)
        self.log_dict(resolved, "resolved_config.json")

    def register_model(
        self,
        model_dir: Path | str,
        *,
        technique: str,
        scores: Mapping[str, float],
        data_paths: Iterable[Path] = (),
        teacher: str = "",
    ) -> Registration:
        """Register ``model_dir`` as a version of the config's registered model, linked to this run, and promote it.

        ``promotion.register_and_promote``: a checkpoint registered before (a re-run of a finished
        run) is not registered again; a new version becomes ``champion`` when it is the model's first
        or beats the champion on ``heldout.accuracy`` (which ``scores`` must hold), else stays
        ``challenger``. Lineage comes from the config given to ``for_run``: run name, ``config_hash``
        of the resolved config, base model (``model.path`` or ``tiny``), ``dataset_hash`` of
        ``data_paths`` (empty when none are given) and GKD's ``teacher`` ("" for no tag).

        Returns:
            The version, its alias, whether it was registered before, and the promotion decision.

        Raises:
            TrackingError: the tracker was not made by ``for_run``, the checkpoint is missing, or
                ``scores`` has no ``heldout.accuracy``.
        """
        from posttrain.tracking.promotion import register_and_promote

        if self.config is None:
            raise TrackingError("register_model: this Tracker has no RunConfig; build it with Tracker.for_run")
        cfg = self.config
        paths = list(data_paths)
        lineage = Lineage(
            run=cfg.run_name,
            technique=technique,
            dataset_hash=dataset_hash(paths) if paths else "",
            config_hash=config_hash(cfg.model_dump(mode="json")),
            base_model=cfg.model.path or "tiny",
            mlflow_run_id=self.run_id,
            teacher=teacher,
        )
        return register_and_promote(str(model_dir), registered_model=cfg.tracking.registered_model, lineage=lineage,
                                    eval_scores=scores, tracking_uri=self.tracking_uri)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log parameters; nested mappings become dotted keys (``flatten_params``)."""
        from mlflow.entities import Param

        flat = flatten_params(params)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Log metrics at ``step`` (optimizer steps or policy versions); keys pass through ``metric_key``."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(metric_key(k), float(v), now, step or 0) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(metric_key(k), str(v)) for k, v in tags.items()])

    def log_artifacts(self, local_dir: Path, artifact_path: str | None = None) -> None:
        """Upload a directory as run artifacts (under ``artifact_path``)."""
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Upload one file as a run artifact."""
        self.client.log_artifact(self.run_id, str(local_path), artifact_path)

    def log_dict(self, data: Mapping[str, Any], artifact_file: str) -> None:
        """Store a JSON-serialisable mapping as an artifact file (``resolved_config.json``...)."""
        self.client.log_dict(self.run_id, dict(data), artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run with ``FINISHED``, ``FAILED`` or ``KILLED``."""
        self.client.set_terminated(self.run_id, status=status)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A Ctrl-C or SIGTERM (a learner that stopped after its final checkpoint exits 130 or 143) is KILLED.
        killed = exc_type is not None and (issubclass(exc_type, KeyboardInterrupt)
                                           or getattr(exc, "exit_code", None) in (130, 143))
        self.finish("KILLED" if killed else "FAILED" if exc_type is not None else "FINISHED")


def find_learner_run(tracking_uri: str, experiment: str, run_name: str) -> str:
    """The newest run of ``experiment`` tagged ``posttrain.learner_of=<run_name>`` (a cluster learner's), or "".

    Raises:
        TrackingError: the tracking server refused the search.
    """
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            return ""
        found = client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`posttrain.learner_of` = '{run_name}'",
            max_results=1, order_by=["attributes.start_time DESC"],
        )
    except MlflowException as exc:
        raise TrackingError(f"{tracking_uri}: searching the learner run of {run_name!r} failed ({exc})") from exc
    return found[0].info.run_id if found else ""


def run_link(tracking_uri: str, run_id: str) -> str:
    """Where a person finds MLflow run ``run_id``: its page URL on an ``http(s)://`` server, else ``<uri> run <id>``.

    Raises:
        TrackingError: the run does not exist.
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return f"{tracking_uri} run {run_id}"
    from mlflow.exceptions import MlflowException

    try:
        experiment_id = mlflow_client(tracking_uri).get_run(run_id).info.experiment_id
    except MlflowException as exc:
        raise TrackingError(f"run_id {run_id!r}: no such MLflow run ({exc})") from exc
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def metric_history(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of metric ``key`` of run ``run_id``, in step order (empty when never logged).

    Raises:
        TrackingError: the run does not exist.
    """
    from mlflow.exceptions import MlflowException

    try:
        history = mlflow_client(tracking_uri).get_metric_history(run_id, metric_key(key))
    except MlflowException as exc:
        raise TrackingError(f"run_id {run_id!r}: cannot read metric {key!r} ({exc})") from exc
    return sorted((int(m.step), float(m.value)) for m in history)
