"""Where a step's inputs are: config and data files, the base model, the run's name.

Pipeline parameters name files as paths (looked up as given, then under ``$POSTTRAIN_HOME``),
``s3://`` URIs, or, for the model, ``models:/<name>@<alias>`` / ``models:/<name>/<version>`` in the
MLflow registry. ``resolve_location`` and ``local_file`` find files, ``resolve_model`` resolves the
model parameter, ``check_checkpoint`` fails early on a directory that is no checkpoint,
``local_model`` downloads an ``s3://`` base model before training, ``run_name_for`` names one
pipeline run and ``publish_checkpoint`` copies a trained checkpoint under the tenant's S3 prefix.

Try it: ``python -c "from posttrain.kfp.locations import resolve_location;
print(resolve_location('configs/sao_demo_cpu.yaml', 'config'))"``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.kfp.artifacts import PipelineStepError
from posttrain.kfp.config_fields import with_fields

SOURCE_ROOT_ENV = "POSTTRAIN_HOME"
"""Directory that relative config paths are also looked up in (default ``/opt/posttrain``, the images' source root)."""
DEFAULT_SOURCE_ROOT = "/opt/posttrain"

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>[0-9]+))$")


def resolve_location(location: str, what: str) -> str:
    """Normalise a file location: ``s3://`` URIs pass through, paths are looked up in two places.

    A path is tried as given, then under ``$POSTTRAIN_HOME`` (default ``/opt/posttrain``, where the
    images keep ``configs/``).

    Args:
        location: Path (absolute or relative) or ``s3://`` URI.
        what: Name of the parameter, for the error message.

    Raises:
        PipelineStepError: an empty location or a path found in neither place.
    """
    if not location:
        raise PipelineStepError(f"{what}: empty; give a file path or an s3:// URI")
    if location.startswith("s3://"):
        return location
    path = Path(location[len("file://") :] if location.startswith("file://") else location)
    if path.exists():
        return str(path.resolve())
    root = Path(os.environ.get(SOURCE_ROOT_ENV, DEFAULT_SOURCE_ROOT))
    if not path.is_absolute() and (root / path).exists():
        return str((root / path).resolve())
    raise PipelineStepError(f"{what}: {location} not found (looked in {Path.cwd()} and {root})")


def local_file(location: str, dest: Path, what: str) -> Path:
    """A local path for one file: a path as found, or an ``s3://`` object downloaded to ``dest``.

    Paths are not copied, so a later error about a row names the user's file.

    Raises:
        PipelineStepError: it does not exist or cannot be read (named by ``what``).
    """
    from posttrain.storage import StorageError, storage_for

    source = resolve_location(location, what)
    if not source.startswith("s3://"):
        if not Path(source).is_file():
            raise PipelineStepError(f"{what}: {location} is not a file")
        return Path(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        dest.write_bytes(storage_for(source).read_bytes(source))
    except StorageError as exc:
        raise PipelineStepError(f"{what}: cannot read {location}: {exc}") from exc
    return dest


def resolve_model(model: str, tracking_uri: str | None) -> tuple[str, str]:
    """Turn the pipeline's ``model`` parameter into a checkpoint location and a lineage label.

    Args:
        model: "" (the config's model), a path, an ``s3://`` URI, or ``models:/<name>@<alias>`` /
            ``models:/<name>/<version>`` (resolved now, through the MLflow registry, to that
            version's source: a scheduled retrain starts from whatever is ``champion`` when it runs).
        tracking_uri: MLflow URI for ``models:/`` lookups (None: ``$MLFLOW_TRACKING_URI`` or the default).

    Returns:
        ``(location, label)``; ``("", "")`` for "".

    Raises:
        PipelineStepError: a ``models:/`` URI that does not parse or names no version.
    """
    if not model:
        return "", ""
    if not model.startswith("models:/"):
        return model, model
    match = _MODELS_URI.match(model)
    if match is None:
        raise PipelineStepError(f"model: {model!r} is not models:/<name>@<alias> or models:/<name>/<version>")
    from posttrain.tracking import TrackingError, show_model

    try:
        (version,) = show_model(
            match["name"], version=match["version"], alias=match["alias"], tracking_uri=tracking_uri
        )
    except TrackingError as exc:
        raise PipelineStepError(f"model: {model}: {exc}") from exc
    return version.checkpoint, f"{model} = {version.name} version {version.version} ({version.checkpoint})"


def check_checkpoint(location: str, what: str) -> None:
    """Fail early unless ``location`` ("" = none) holds a transformers checkpoint (``config.json``).

    Raises:
        PipelineStepError: no ``config.json`` there, or it cannot be read.
    """
    if not location:
        return
    from posttrain.storage import StorageError, storage_for

    try:
        found = storage_for(location).exists(location.rstrip("/") + "/config.json")
    except (StorageError, ValueError) as exc:
        raise PipelineStepError(f"{what}: cannot read {location}: {exc}") from exc
    if not found:
        raise PipelineStepError(f"{what}: {location} has no config.json (expected a transformers checkpoint directory)")


def local_model(cfg: RunConfig, work: Path) -> RunConfig:
    """``cfg`` with an ``s3://`` ``model.path`` (and GKD's ``gkd.teacher.path``) downloaded into ``work``.

    Training reads local directories.

    Raises:
        posttrain.storage.StorageError: a checkpoint cannot be downloaded.
    """
    from posttrain.storage import materialize

    values = {}
    for dotted, folder in (("model.path", "base-model-download"), ("gkd.teacher.path", "teacher-download")):
        section, name = dotted.split(".", 1)
        location = cfg.model.path if section == "model" else (cfg.gkd.teacher.path if cfg.technique == "gkd" else None)
        if location and location.startswith("s3://"):
            values[dotted] = str(materialize(location, work / folder))
    return with_fields(cfg, values) if values else cfg


def run_name_for(base: str, run_id: str) -> str:
    """Run name of one pipeline run: ``<config run_name>-<first 8 alphanumerics of the run id>``.

    The MLflow run, the Redis keys and the run directory derive from it, so two pipeline runs of
    the same config never share a stream. An empty ``run_id`` keeps ``base``.
    """
    suffix = re.sub(r"[^A-Za-z0-9]", "", run_id)[:8].lower()
    return f"{base[: 100 - len(suffix) - 1]}-{suffix}" if suffix else base


MODELS_URI_ENV = "POSTTRAIN_MODELS_URI"
"""Where training steps copy their final checkpoints (``s3://`` prefix); default ``$S3_PREFIX/models``."""


def models_uri() -> str:
    """``$POSTTRAIN_MODELS_URI``, else ``$S3_PREFIX`` + ``models`` (tenant ConfigMap), else "" (no copy)."""
    explicit = os.environ.get(MODELS_URI_ENV)
    if explicit:
        return explicit.rstrip("/")
    prefix = os.environ.get("S3_PREFIX")
    return prefix.rstrip("/") + "/models" if prefix else ""


def publish_checkpoint(checkpoint_dir: Path, run_name: str) -> str:
    """Copy a trained checkpoint to ``<models_uri()>/<run_name>/final_model``; its URI, or "" when unset.

    KFP keeps Model artifacts under its pipeline root (``minio://mlpipeline`` by default), a store
    the tenant's S3 endpoint does not serve; the register step and a later retrain read this copy.

    Raises:
        PipelineStepError: the upload failed (the message names the destination).
    """
    base = models_uri()
    if not base:
        return ""
    from posttrain.storage import StorageError, storage_for

    dest = f"{base}/{run_name}/final_model"
    try:
        storage_for(dest).upload_dir(Path(checkpoint_dir), dest)
    except StorageError as exc:
        raise PipelineStepError(f"{MODELS_URI_ENV} / S3_PREFIX: cannot copy the checkpoint to {dest}: {exc}") from exc
    return dest
