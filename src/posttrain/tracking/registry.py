"""Model registration: a checkpoint becomes a registered model version with lineage and eval scores.

``register_checkpoint`` leaves the weights where they are (a local directory or an ``s3://`` URI,
checked through ``posttrain.storage``): the version's ``source`` points at them. The version is
tagged with its lineage (``posttrain.*``: run, technique, dataset hash, config hash, base model)
and eval scores (``eval.<benchmark>.<metric>``), and gets the ``challenger`` alias. Aliases
replace MLflow's deprecated stages (``models:/<name>@champion`` resolves to the version).

Also here: the lineage hashes (``config_hash``, ``dataset_hash``), ``ModelVersionInfo`` and the
version lookups that promotion and listing share.

Example: ``register_checkpoint("runs/x/final", registered_model="team-a-policy", lineage=Lineage(...))``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from posttrain.storage import StorageError, is_s3_uri, storage_for
from posttrain.tracking.client import (
    CHALLENGER,
    EVAL_PREFIX,
    LINEAGE_PREFIX,
    TrackingError,
    metric_key,
    mlflow_client,
    mlflow_error_code,
)


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


def version_info(mv: Any, client: Any) -> ModelVersionInfo:
    """A ``ModelVersionInfo`` for the MLflow ``ModelVersion`` ``mv``, with its aliases.

    Aliases are read from the registered model: search results do not always carry them.
    """
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


def get_model_version(client: Any, name: str, version: int | str) -> Any:
    """The MLflow ``ModelVersion`` ``version`` of registered model ``name``.

    Raises:
        TrackingError: the model or the version does not exist.
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        raise TrackingError(f"registered model {name!r} has no version {version} ({exc})") from exc


def get_alias_version(client: Any, name: str, alias: str) -> Any | None:
    """The MLflow ``ModelVersion`` that ``alias`` points at, or None when the alias (or model) is unset.

    Raises:
        mlflow.exceptions.MlflowException: any other registry error.
    """
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if mlflow_error_code(exc) in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


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
    client = mlflow_client(tracking_uri)
    try:
        client.create_registered_model(registered_model, description="posttrain policy checkpoints")
    except MlflowException as exc:
        if mlflow_error_code(exc) != "RESOURCE_ALREADY_EXISTS":
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
    return version_info(client.get_model_version(registered_model, mv.version), client)
