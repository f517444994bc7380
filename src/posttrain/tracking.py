"""MLflow tracking and model registration: run metrics, checkpoint versions with lineage, alias promotion.

* ``Tracker``: one MLflow run on any tracking URI (``sqlite:///...`` by default, ``http://`` for a
  server); params (nested dicts flattened to dotted keys), metrics with a step, artifacts. A
  restarted process resumes the same run by ``run_id``.
* ``register_checkpoint``: a trained checkpoint (a local directory or an ``s3://`` URI, checked
  through ``posttrain.storage``; weights are not copied) becomes a new version of the team's
  registered model, tagged with its lineage (``posttrain.*``: run, technique, dataset hash,
  config hash, base model) and eval scores (``eval.<benchmark>.<metric>``), and gets the
  ``challenger`` alias.
* ``promote_if_better``: moves the ``champion`` alias to a version only if it beats the current
  champion on the configured metric by the configured margin; the decision is recorded as tags.
* ``list_models`` / ``show_model``: what ``posttrain models list|show`` prints.

Aliases replace MLflow's deprecated stages (``models:/<name>@champion`` resolves to the version).

* ``MetricsSink``: the one type of a metrics callback, ``(metrics, step) -> None``, that every
  learner and runner reports through (``posttrain.runners.common.metrics_sink`` builds one).

The command line for the registry is ``posttrain models list|show|promote``.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from posttrain.storage import StorageError, is_s3_uri, storage_for

if TYPE_CHECKING:
    from posttrain.config.run import RunConfig

MetricsSink = Callable[[dict[str, float], int], None]
"""Receives ``(metrics, step)``: metric name -> value, and the policy version or optimizer step it belongs to."""

CHALLENGER = "challenger"
"""Alias every newly registered checkpoint receives."""
CHAMPION = "champion"
"""Alias of the version that serves; moved only by ``promote_if_better`` (or a forced promote)."""
LINEAGE_PREFIX = "posttrain."
"""Prefix of lineage tags on model versions."""
EVAL_PREFIX = "eval."
"""Prefix of eval-score tags on model versions: ``eval.<benchmark>.<metric>``."""
MAX_PARAM_CHARS = 6000
"""MLflow's longest parameter value (characters); longer values are cut with a marker."""


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


def _client(tracking_uri: str | None) -> Any:
    from mlflow import MlflowClient

    uri = tracking_uri or default_tracking_uri()
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _error_code(exc: BaseException) -> str:
    return str(getattr(exc, "error_code", ""))


def metric_key(name: str) -> str:
    """An MLflow-safe metric/tag key: ``avg@4`` -> ``avg_at_4``; characters MLflow refuses -> ``_``."""
    out = name.replace("@", "_at_")
    return "".join(ch if ch.isalnum() or ch in "_-./ :" else "_" for ch in out)


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


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 (hex, first 16 characters) of the config's canonical JSON (sorted keys)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def dataset_hash(paths: Iterable[Path]) -> str:
    """sha256 (hex, first 16 characters) over the bytes of the given files, in sorted path order.

    Raises:
        FileNotFoundError: a path is not a file (named in the message).
    """
    h = hashlib.sha256()
    for path in sorted(Path(p) for p in paths):
        if not path.is_file():
            raise FileNotFoundError(f"dataset_hash: {path} is not a file")
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


class Tracker:
    """One MLflow run: params, metrics, artifacts. Use as a context manager (FAILED on exception).

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
        self.client = _client(self.tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is not None:
            experiment_id = exp.experiment_id
        else:
            location = artifact_location
            if location is None and self.tracking_uri.startswith("sqlite:///"):
                db = Path(self.tracking_uri[len("sqlite:///") :])
                location = (db.parent / "mlartifacts" / experiment).resolve().as_uri()
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        self.experiment_id: str = experiment_id
        if run_id is not None:
            from mlflow.exceptions import MlflowException

            try:
                self.client.get_run(run_id)
            except MlflowException as exc:
                raise TrackingError(f"run_id {run_id!r}: no such MLflow run ({exc})") from exc
            self.client.update_run(run_id, status="RUNNING")
            self.run_id: str = run_id
        else:
            run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
            self.run_id = run.info.run_id
        self.config: RunConfig | None = None

    @classmethod
    def for_run(cls, config: RunConfig, run_dir: Path | None = None) -> Tracker:
        """A new MLflow run for a ``RunConfig``; ``register_model`` then uses the config.

        Tracking URI: ``tracking.tracking_uri``, else ``default_tracking_uri(output_dir)``; experiment
        from ``experiment_name(config)``, run name from the config; tagged with the technique. ``run_dir`` (the run's output directory) is recorded as the tag ``posttrain.run_dir``.
        """
        tags: dict[str, str] = {"posttrain.technique": config.technique}
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
        from mlflow.exceptions import MlflowException

        uri = config.tracking.tracking_uri or default_tracking_uri(config.output_dir)
        client = _client(uri)
        run_id = None
        try:
            exp = client.get_experiment_by_name(experiment_name(config))
            if exp is not None:
                found = client.search_runs(
                    [exp.experiment_id], filter_string=f"tags.`posttrain.learner_of` = '{config.run_name}'",
                    max_results=1, order_by=["attributes.start_time DESC"],
                )
                run_id = found[0].info.run_id if found else None
        except MlflowException as exc:
            raise TrackingError(f"{uri}: searching the learner run of {config.run_name!r} failed ({exc})") from exc
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
    ) -> int:
        """Register ``model_dir`` as a ``challenger`` version of the config's registered model, linked to this run.

        Lineage comes from the config given to ``for_run``: run name, ``config_hash`` of the
        resolved config, base model (``model.path`` or ``tiny``) and ``dataset_hash`` of
        ``data_paths`` (empty when none are given).

        Returns:
            The new version number.

        Raises:
            TrackingError: the tracker was not made by ``for_run``, or the checkpoint is missing.
        """
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
        )
        info = register_checkpoint(
            str(model_dir),
            registered_model=cfg.tracking.registered_model,
            lineage=lineage,
            eval_scores=scores,
            tracking_uri=self.tracking_uri,
        )
        return info.version

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
        self.finish("FAILED" if exc_type is not None else "FINISHED")


class Lineage(msgspec.Struct, kw_only=True, frozen=True):
    """Where a checkpoint came from; stored as ``posttrain.<field>`` tags on its model version.

    Attributes:
        run: Training run name (``RunConfig.run_name``) or pipeline run id.
        technique: ``sft``, ``cpt``, ``dpo``, ``grpo`` or ``sao``.
        dataset_hash: ``dataset_hash(...)`` of the training data.
        config_hash: ``config_hash(...)`` of the resolved run config.
        base_model: Path, URI or name of the model training started from.
        mlflow_run_id: MLflow run that trained it (links the version to the run), or "".
    """

    run: str
    technique: str
    dataset_hash: str
    config_hash: str
    base_model: str
    mlflow_run_id: str = ""


class ModelVersionInfo(msgspec.Struct, kw_only=True):
    """One registered model version as ``show_model`` reports it.

    Attributes:
        name: Registered model name.
        version: Version number (1, 2, ...).
        source: Checkpoint location (absolute local path or ``s3://`` URI).
        run_id: Linked MLflow run, or "".
        aliases: Aliases pointing at this version.
        tags: All version tags (lineage ``posttrain.*``, scores ``eval.*``, promotion notes).
        created_at: Creation time (Unix seconds).
    """

    name: str
    version: int
    source: str
    run_id: str
    aliases: list[str]
    tags: dict[str, str]
    created_at: float


def _version_info(mv: Any, client: Any) -> ModelVersionInfo:
    # Aliases come from the registered model: search results do not always carry them.
    alias_map = client.get_registered_model(mv.name).aliases or {}
    return ModelVersionInfo(
        name=mv.name,
        version=int(mv.version),
        source=mv.source,
        run_id=mv.run_id or "",
        aliases=sorted(a for a, v in alias_map.items() if int(v) == int(mv.version)),
        tags=dict(mv.tags or {}),
        created_at=(mv.creation_timestamp or 0) / 1000.0,
    )


def _check_checkpoint(source: str) -> str:
    """Normalise a checkpoint location and check it holds a ``config.json``.

    Raises:
        TrackingError: the location is missing or has no ``config.json``.
    """
    store = storage_for(source)
    if is_s3_uri(source):
        location = source.rstrip("/")
        marker = f"{location}/config.json"
    else:
        path = Path(source[len("file://") :] if source.startswith("file://") else source).resolve()
        location = str(path)
        marker = str(path / "config.json")
    try:
        found = store.exists(marker)
    except StorageError as exc:
        raise TrackingError(f"checkpoint {source}: cannot be read ({exc})") from exc
    if not found:
        raise TrackingError(f"checkpoint {source}: no config.json (expected a transformers checkpoint directory)")
    return location


def register_checkpoint(
    source: str,
    *,
    registered_model: str,
    lineage: Lineage,
    eval_scores: Mapping[str, float] | None = None,
    tracking_uri: str | None = None,
    alias: str = CHALLENGER,
    description: str = "",
    check_source: bool = True,
) -> ModelVersionInfo:
    """Register a checkpoint as a new version of ``registered_model`` and give it ``alias``.

    The weights stay where they are: the version's ``source`` is the checkpoint directory or
    ``s3://`` URI. Tags: ``posttrain.run``, ``posttrain.technique``, ``posttrain.dataset_hash``,
    ``posttrain.config_hash``, ``posttrain.base_model``, ``posttrain.source`` and one
    ``eval.<benchmark>.<metric>`` per score (``eval_scores`` keys such as ``gsm8k.avg@1`` become
    ``eval.gsm8k.avg_at_1``).

    Args:
        source: Local checkpoint directory or ``s3://bucket/prefix`` (read through boto3).
        registered_model: The team's registered model (created if missing).
        lineage: Where the checkpoint came from.
        eval_scores: ``{"<benchmark>.<metric>": score}``.
        tracking_uri: MLflow URI; None uses ``default_tracking_uri()``.
        alias: Alias to set on the new version (``challenger``).
        description: Version description.
        check_source: Verify that ``source`` holds a ``config.json`` first.

    Returns:
        The new version.

    Raises:
        TrackingError: the checkpoint is missing or unreadable.
    """
    from mlflow.exceptions import MlflowException

    location = _check_checkpoint(source) if check_source else source
    client = _client(tracking_uri)
    try:
        client.create_registered_model(registered_model, description="posttrain policy checkpoints")
    except MlflowException as exc:
        if _error_code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise
    tags = {f"{LINEAGE_PREFIX}{k}": str(v) for k, v in msgspec.structs.asdict(lineage).items() if v != ""}
    tags[f"{LINEAGE_PREFIX}source"] = location
    for key, score in (eval_scores or {}).items():
        tags[metric_key(f"{EVAL_PREFIX}{key}")] = repr(float(score))
    mv = client.create_model_version(
        registered_model,
        source=location,
        run_id=lineage.mlflow_run_id or None,
        tags=tags,
        description=description or None,
    )
    client.set_registered_model_alias(registered_model, alias, mv.version)
    return _version_info(client.get_model_version(registered_model, mv.version), client)


class PromotionDecision(msgspec.Struct, kw_only=True):
    """Outcome of ``promote_if_better``.

    Attributes:
        promoted: Whether the candidate now holds ``champion``.
        champion_version: The version holding ``champion`` afterwards.
        previous_champion: The version that held it before, or None.
        candidate_score: The candidate's value of the metric.
        champion_score: The previous champion's value, or None.
        reason: One sentence, also stored as the tag ``posttrain.promotion`` on the candidate.
    """

    promoted: bool
    champion_version: int
    previous_champion: int | None
    candidate_score: float
    champion_score: float | None
    reason: str


def _score(mv: Any, metric: str) -> float:
    key = metric_key(metric if metric.startswith(EVAL_PREFIX) else f"{EVAL_PREFIX}{metric}")
    value = (mv.tags or {}).get(key)
    if value is None:
        raise TrackingError(f"{mv.name} version {mv.version}: no tag {key!r}; cannot compare on metric {metric!r}")
    try:
        return float(value)
    except ValueError as exc:
        raise TrackingError(f"{mv.name} version {mv.version}: tag {key!r}={value!r} is not a number") from exc


def _get_version(client: Any, name: str, version: int | str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise TrackingError(f"registered model {name!r} has no version {version} ({exc})") from exc


def _alias_version(client: Any, name: str, alias: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if _error_code(exc) in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def promote_if_better(
    registered_model: str,
    version: int | str,
    *,
    metric: str,
    margin: float = 0.0,
    higher_is_better: bool = True,
    tracking_uri: str | None = None,
    force: bool = False,
) -> PromotionDecision:
    """Move ``champion`` to ``version`` if it beats the current champion on ``metric`` by ``margin``.

    With ``delta = candidate - champion`` (negated when lower is better), the candidate is
    promoted when there is no champion yet, or when ``delta > 0`` and ``delta >= margin``. A tie
    never promotes. ``force`` promotes without comparing (the metric is still read if present).
    The decision is stored on the candidate as the tag ``posttrain.promotion``.

    Not atomic: two promotions of the same model at once can both read the old champion. Run
    promotions of one model one at a time (the pipeline's register step does).

    Args:
        registered_model: Registered model name.
        version: Candidate version.
        metric: ``<benchmark>.<metric>`` (``gsm8k.avg@1``) or the full tag key ``eval.gsm8k.avg_at_1``.
        margin: Least improvement required (same units as the metric), >= 0.
        higher_is_better: Direction of the metric.
        tracking_uri: MLflow URI; None uses ``default_tracking_uri()``.
        force: Promote regardless of scores.

    Raises:
        TrackingError: unknown model or version, or a version without the metric tag.
        ValueError: negative ``margin``.
    """
    if margin < 0:
        raise ValueError(f"margin: must be >= 0, got {margin}")
    client = _client(tracking_uri)
    candidate = _get_version(client, registered_model, version)
    current = _alias_version(client, registered_model, CHAMPION)
    try:
        cand_score = _score(candidate, metric)
    except TrackingError:
        if not force:
            raise
        cand_score = float("nan")
    key = metric_key(metric if metric.startswith(EVAL_PREFIX) else f"{EVAL_PREFIX}{metric}")
    if current is not None and int(current.version) == int(candidate.version):
        return PromotionDecision(
            promoted=False,
            champion_version=int(current.version),
            previous_champion=int(current.version),
            candidate_score=cand_score,
            champion_score=cand_score,
            reason=f"version {candidate.version} already holds {CHAMPION}",
        )
    champ_score = None
    if force:
        promote, reason = True, f"forced promotion of version {candidate.version}"
    elif current is None:
        promote, reason = True, f"first {CHAMPION}: version {candidate.version} with {key}={cand_score:.4f}"
    else:
        champ_score = _score(current, metric)
        delta = (cand_score - champ_score) if higher_is_better else (champ_score - cand_score)
        promote = delta > 0 and delta >= margin
        verb = "beats" if promote else "does not beat"
        reason = (
            f"version {candidate.version} {verb} {CHAMPION} version {current.version} on {key}: "
            f"{cand_score:.4f} vs {champ_score:.4f} (improvement {delta:+.4f}, margin {margin:.4f}, "
            f"{'higher' if higher_is_better else 'lower'} is better)"
        )
    client.set_model_version_tag(registered_model, str(candidate.version), f"{LINEAGE_PREFIX}promotion", reason)
    if promote:
        client.set_registered_model_alias(registered_model, CHAMPION, str(candidate.version))
    if promote or current is None:
        champion_version = int(candidate.version)
    else:
        champion_version = int(current.version)
    return PromotionDecision(
        promoted=promote,
        champion_version=champion_version,
        previous_champion=int(current.version) if current is not None else None,
        candidate_score=cand_score,
        champion_score=champ_score,
        reason=reason,
    )


class ModelSummary(msgspec.Struct, kw_only=True):
    """One registered model as ``list_models`` reports it.

    Attributes:
        name: Registered model name.
        latest_version: Highest version number (0 when it has none).
        aliases: ``{alias: version}``.
        description: Model description.
    """

    name: str
    latest_version: int
    aliases: dict[str, int]
    description: str


def list_models(tracking_uri: str | None = None) -> list[ModelSummary]:
    """Every registered model with its latest version and aliases, sorted by name."""
    client = _client(tracking_uri)
    out = []
    for rm in client.search_registered_models():
        versions = client.search_model_versions(f"name='{rm.name}'")
        out.append(
            ModelSummary(
                name=rm.name,
                latest_version=max((int(v.version) for v in versions), default=0),
                aliases={a: int(v) for a, v in (rm.aliases or {}).items()},
                description=rm.description or "",
            )
        )
    return sorted(out, key=lambda m: m.name)


def show_model(name: str, *, version: int | str | None = None, alias: str | None = None, tracking_uri: str | None = None) -> list[ModelVersionInfo]:
    """One version (by ``version`` or ``alias``) or, with neither, every version newest first.

    Raises:
        TrackingError: unknown model, version or alias; or both ``version`` and ``alias`` given.
    """
    from mlflow.exceptions import MlflowException

    if version is not None and alias is not None:
        raise TrackingError("show_model: give version or alias, not both")
    client = _client(tracking_uri)
    if version is not None:
        return [_version_info(_get_version(client, name, version), client)]
    if alias is not None:
        mv = _alias_version(client, name, alias)
        if mv is None:
            raise TrackingError(f"registered model {name!r} has no alias {alias!r}")
        return [_version_info(mv, client)]
    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        raise TrackingError(f"no registered model {name!r} ({exc})") from exc
    versions = client.search_model_versions(f"name='{name}'")
    return sorted((_version_info(v, client) for v in versions), key=lambda v: -v.version)

