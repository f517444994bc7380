"""Model registration: a checkpoint becomes a registered model version with lineage and eval scores.

``register_checkpoint`` logs the checkpoint (a local directory or an ``s3://`` URI, checked
through ``posttrain.storage``) as an MLflow model with the transformers flavour, inside the MLflow
run that trained it, and registers that model: ``mlflow.transformers.load_model(
"models:/<name>@champion")`` (or ``mlflow.pyfunc.load_model``) loads any version, and every
version carries its run id. The checkpoint's own location stays in the tag ``posttrain.source``
(``ModelVersionInfo.checkpoint``), which a retrain reads. The version is tagged with its lineage
(``posttrain.*``: run, technique, dataset hash, config hash, base model) and eval scores
(``eval.<benchmark>.<metric>``), and gets the ``challenger`` alias. Aliases replace MLflow's
deprecated stages (``models:/<name>@champion`` resolves to the version).

Also here: the lineage hashes (``config_hash``, ``dataset_hash``), ``ModelVersionInfo`` and the
version lookups that promotion and listing share.

Example: ``register_checkpoint("runs/x/final", registered_model="team-a-policy", lineage=Lineage(...))``.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import msgspec

from posttrain.storage import StorageError, is_s3_uri, materialize, storage_for
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


CHECKPOINT_DIGEST_TAG = f"{LINEAGE_PREFIX}checkpoint_sha256"
"""Version tag holding ``checkpoint_digest`` of the registered checkpoint (``skip_if_registered``)."""

RUN_CONFIG_FILE = "resolved_config.yaml"
"""The run config a final model directory carries beside the model; it names the run, not the model."""


def checkpoint_digest(directory: Path | str) -> str:
    """sha256 (hex, first 32 characters) over a checkpoint directory: every regular file's relative path and bytes.

    Two directories with the same weights, config and tokenizer get the same digest wherever they lie;
    ``resolved_config.yaml`` (the run's config, which names the run and its output directory) is left out.

    Raises:
        FileNotFoundError: ``directory`` is not a directory.
    """
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint_digest: {root} is not a directory")
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != RUN_CONFIG_FILE):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:32]


class Lineage(msgspec.Struct, kw_only=True, frozen=True):
    """Where a checkpoint came from; stored as ``posttrain.<field>`` tags on its model version.

    Attributes:
        run: Training run name (``RunConfig.run_name``) or pipeline run id.
        technique: ``sft``, ``cpt``, ``dpo``, ``grpo``, ``sao`` or ``gkd``.
        dataset_hash: ``dataset_hash(...)`` of the training data.
        config_hash: ``config_hash(...)`` of the resolved run config.
        base_model: Path, URI or name of the model training started from.
        mlflow_run_id: MLflow run that trained it (links the version to the run), or "".
        teacher: GKD's teacher (path, URI, ``models:/`` resolution, or how the run built it), or "" (no tag).
    """

    run: str
    technique: str
    dataset_hash: str
    config_hash: str
    base_model: str
    mlflow_run_id: str = ""
    teacher: str = ""


class ModelVersionInfo(msgspec.Struct, kw_only=True):
    """One registered model version as ``show_model`` reports it.

    Attributes:
        name: Registered model name.
        version: Version number (1, 2, ...).
        source: What MLflow registered: the logged model (``models:/m-...``), or the checkpoint
            location for a version registered with ``log_model=False``.
        checkpoint: The transformers checkpoint directory or ``s3://`` URI the version came from
            (tag ``posttrain.source``); what a retrain starts from.
        run_id: Linked MLflow run, or "".
        aliases: Aliases pointing at this version.
        tags: All version tags (lineage ``posttrain.*``, scores ``eval.*``, promotion notes).
        created_at: Creation time (Unix seconds).
        reused: True when ``register_checkpoint(..., skip_if_registered=True)`` found this checkpoint
            registered already and created nothing (this is that earlier version).
    """

    name: str
    version: int
    source: str
    checkpoint: str
    run_id: str
    aliases: list[str]
    tags: dict[str, str]
    created_at: float
    reused: bool = False


def version_info(mv: Any, client: Any, *, reused: bool = False) -> ModelVersionInfo:
    """A ``ModelVersionInfo`` for the MLflow ``ModelVersion`` ``mv``, with its aliases.

    Aliases are read from the registered model: search results do not always carry them.
    """
    alias_map = client.get_registered_model(mv.name).aliases or {}
    tags = dict(mv.tags or {})
    return ModelVersionInfo(
        name=mv.name,
        version=int(mv.version),
        source=mv.source,
        checkpoint=tags.get(f"{LINEAGE_PREFIX}source", mv.source),
        run_id=mv.run_id or "",
        aliases=sorted(a for a, v in alias_map.items() if int(v) == int(mv.version)),
        tags=tags,
        created_at=(mv.creation_timestamp or 0) / 1000.0,
        reused=reused,
    )


def find_registered_checkpoint(client: Any, name: str, digest: str) -> Any | None:
    """The oldest version of registered model ``name`` tagged with checkpoint digest ``digest``, or None."""
    versions = [mv for mv in client.search_model_versions(f"name='{name}'")
                if (mv.tags or {}).get(CHECKPOINT_DIGEST_TAG) == digest]
    return min(versions, key=lambda mv: int(mv.version)) if versions else None


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


MODEL_ARTIFACT = "model"
"""Name of the logged MLflow model inside its run (``runs:/<run id>/model``)."""


def _pinned(package: str) -> str:
    """``package==<installed version>`` (MLflow's own inference imports torchvision, which we lack)."""
    try:
        return f"{package}=={installed_version(package)}"
    except PackageNotFoundError:
        return package


def log_transformers_model(checkpoint_dir: Path, *, tracking_uri: str, run_id: str) -> Any:
    """Log a transformers checkpoint directory as an MLflow model (transformers flavour) in run ``run_id``.

    The model (weights and tokenizer) is copied into the run's artifact store as a
    ``text-generation`` pipeline, with ``transformers`` and ``torch`` pinned to the installed
    versions as its requirements; nothing is downloaded from the Hub.

    Args:
        checkpoint_dir: Local directory with ``config.json``, safetensors weights and the tokenizer.
        tracking_uri: MLflow URI.
        run_id: The run the model belongs to (it is resumed, then ended again).

    Returns:
        MLflow's ``ModelInfo`` (``model_uri`` ``models:/m-...``, ``model_id``).

    Raises:
        TrackingError: the checkpoint cannot be loaded as a transformers model.
    """
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    with mlflow.start_run(run_id=run_id):
        try:
            return mlflow.transformers.log_model(
                transformers_model=str(checkpoint_dir), name=MODEL_ARTIFACT, task="text-generation",
                pip_requirements=[_pinned("transformers"), _pinned("torch")],
            )
        except (OSError, ValueError) as exc:
            raise TrackingError(f"checkpoint {checkpoint_dir}: cannot be logged as a transformers model ({exc})") from exc


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
    log_model: bool = True,
    local_copy: str | Path | None = None,
    experiment: str = "posttrain",
    skip_if_registered: bool = False,
) -> ModelVersionInfo:
    """Register a checkpoint as a new version of ``registered_model`` and give it ``alias``.

    With ``log_model`` (the default) the checkpoint is logged as an MLflow model with the
    transformers flavour (``log_transformers_model``) in the run ``lineage.mlflow_run_id``, or in a
    new run ``register-<lineage.run>`` of ``experiment`` when there is none, and the version's
    source is that logged model: ``mlflow.transformers.load_model("models:/<name>@<alias>")`` and
    ``mlflow.pyfunc.load_model(...)`` load it. With ``log_model=False`` the version's source is the
    checkpoint location itself (nothing is copied; MLflow cannot load such a version). Tags:
    ``posttrain.run``, ``posttrain.technique``, ``posttrain.dataset_hash``,
    ``posttrain.config_hash``, ``posttrain.base_model``, ``posttrain.mlflow_run_id``, ``posttrain.teacher``
    (GKD), ``posttrain.source`` (the checkpoint location) and one ``eval.<benchmark>.<metric>`` per score
    (``eval_scores`` keys such as ``gsm8k.avg@1`` become ``eval.gsm8k.avg_at_1``).

    Args:
        source: Local checkpoint directory or ``s3://bucket/prefix`` (read through boto3).
        registered_model: The team's registered model (created if missing).
        lineage: Where the checkpoint came from.
        eval_scores: ``{"<benchmark>.<metric>": score}``.
        tracking_uri: MLflow URI; None uses ``default_tracking_uri()``.
        alias: Alias to set on the new version (``challenger``).
        description: Version description.
        check_source: Verify that ``source`` holds a ``config.json`` first.
        log_model: Log the checkpoint as a loadable MLflow model (see above).
        local_copy: A local directory holding the same checkpoint as ``source`` (a KFP step has
            one); it is logged instead of downloading ``source``.
        experiment: MLflow experiment of the run created when ``lineage`` names none.
        skip_if_registered: Tag the version with the checkpoint's ``checkpoint_digest``
            (``posttrain.checkpoint_sha256``, read from the local directory or ``local_copy``), and when
            a version of ``registered_model`` already carries that digest, create nothing and return
            that version with ``reused=True`` (its aliases untouched): a re-run of a finished run
            registers its checkpoint once. An ``s3://`` source without ``local_copy`` is downloaded
            for the digest only when the model is logged anyway (``log_model``); otherwise the check
            is skipped.

    Returns:
        The new version (or, with ``skip_if_registered``, the earlier version of the same checkpoint).

    Raises:
        TrackingError: the checkpoint is missing, unreadable or not a transformers model, or
            ``lineage.mlflow_run_id`` names no run.
    """
    from mlflow.exceptions import MlflowException

    from posttrain.tracking.client import default_tracking_uri, experiment_id_for

    location = _check_checkpoint(source) if check_source else source
    uri = tracking_uri or default_tracking_uri()
    client = mlflow_client(uri)
    try:
        client.create_registered_model(registered_model, description="posttrain policy checkpoints")
    except MlflowException as exc:
        if mlflow_error_code(exc) != "RESOURCE_ALREADY_EXISTS":
            raise
    run_id = lineage.mlflow_run_id
    model_source, model_id, digest = location, None, ""
    local = Path(local_copy) if local_copy and Path(local_copy, "config.json").is_file() else None
    if local is None and "://" not in location and Path(location).is_dir():
        local = Path(location)
    with tempfile.TemporaryDirectory(prefix="posttrain-register-") as cache:
        if local is None and log_model:
            try:
                local = materialize(location, Path(cache))
            except StorageError as exc:
                raise TrackingError(f"checkpoint {source}: cannot be read ({exc})") from exc
        if skip_if_registered and local is not None:
            digest = checkpoint_digest(local)
            earlier = find_registered_checkpoint(client, registered_model, digest)
            if earlier is not None:
                return version_info(earlier, client, reused=True)
        if log_model:
            assert local is not None  # materialized above
            if not run_id:
                run = client.create_run(experiment_id_for(client, uri, experiment), run_name=f"register-{lineage.run}",
                                        tags={f"{LINEAGE_PREFIX}technique": lineage.technique})
                run_id = run.info.run_id
                client.set_terminated(run_id)
            try:
                info = log_transformers_model(local, tracking_uri=uri, run_id=run_id)
            except MlflowException as exc:
                raise TrackingError(f"mlflow_run_id {run_id!r}: cannot log the model there ({exc})") from exc
            model_source, model_id = info.model_uri, info.model_id
    tags = {f"{LINEAGE_PREFIX}{k}": str(v) for k, v in msgspec.structs.asdict(lineage).items() if v != ""}
    if digest:
        tags[CHECKPOINT_DIGEST_TAG] = digest
    if run_id:
        tags[f"{LINEAGE_PREFIX}mlflow_run_id"] = run_id
    tags[f"{LINEAGE_PREFIX}source"] = location
    for key, score in (eval_scores or {}).items():
        tags[metric_key(f"{EVAL_PREFIX}{key}")] = repr(float(score))
    mv = client.create_model_version(
        registered_model,
        source=model_source,
        run_id=run_id or None,
        tags=tags,
        description=description or None,
        model_id=model_id,
    )
    client.set_registered_model_alias(registered_model, alias, mv.version)
    return version_info(client.get_model_version(registered_model, mv.version), client)
