"""What a learner or generator pod of a cluster SAO run fetches before its role starts.

A JobSet pod gets only ``--config s3://.../config.yaml``: no shared run directory, no prepared
tokenizer, no task files on disk. ``posttrain learner`` and ``posttrain generator`` therefore call:

* ``localize_inputs(config)``: downloads ``s3://`` task files (``data.train_path``,
  ``data.eval_path``) and an ``s3://`` ``model.path`` into ``<run dir>/inputs/`` and returns the
  config pointing at the local copies (a config without ``s3://`` inputs comes back unchanged);
* ``learner_start_model(ctx)`` (learner): the SFT warm-started policy ``<run dir>/sft_model``,
  built on the spot when absent (tokenizer and base model, then the warm start; the same steps
  as ``mode="local"``), so the learner publishes v0 from it;
* ``generator_ready(config)`` (generator): the tokenizer, copied from the newest version in the
  weight store (every version carries the learner's tokenizer files).

On one machine (``posttrain run``) these find everything in place and do nothing.
Example: ``posttrain learner --config s3://bucket/runs/sao-x/config.yaml`` with ``REDIS_URL`` and
``AWS_ENDPOINT_URL`` set.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.runtime import RunContext
from posttrain.storage import is_s3_uri, materialize, storage_for

INPUTS_DIRNAME = "inputs"
"""Directory under the run directory holding the downloaded inputs."""


def _download_file(uri: str, dest: Path) -> Path:
    """Download one object to ``dest`` once (a temporary file renamed into place)."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
    tmp.write_bytes(storage_for(uri).read_bytes(uri))
    tmp.replace(dest)
    return dest


def localize_inputs(config: RunConfig) -> RunConfig:
    """``config`` with its ``s3://`` inputs downloaded into ``<run dir>/inputs`` and pointed at.

    Args:
        config: A run config whose ``data.train_path``, ``data.eval_path`` and ``model.path`` may be
            ``s3://`` URIs.

    Returns:
        The same config object when nothing is on S3; else a copy with local paths.

    Raises:
        posttrain.storage.StorageError: an object is missing or a download failed (names the URI).
    """
    inputs = RunContext(config).run_dir / INPUTS_DIRNAME
    data_updates: dict[str, str] = {}
    for field, name in (("train_path", "train.jsonl"), ("eval_path", "eval.jsonl")):
        location = getattr(config.data, field)
        if location and is_s3_uri(location):
            data_updates[field] = str(_download_file(location, inputs / name))
    model_updates: dict[str, str] = {}
    if config.model.path and is_s3_uri(config.model.path):
        model_updates["path"] = str(materialize(config.model.path, inputs / "model"))
    if not data_updates and not model_updates:
        return config
    return config.model_copy(update={
        "data": config.data.model_copy(update=data_updates),
        "model": config.model.model_copy(update=model_updates),
    })


def learner_start_model(ctx: RunContext) -> Path:
    """The learner's start policy: ``<run dir>/sft_model``, prepared and warm-started when absent.

    With ``checkpoints_uri`` set, a start model mirrored there by an earlier pod of the run is
    downloaded instead (with its tokenizer), and a freshly warm-started one is mirrored there.

    Returns:
        ``ctx.sft_model_dir`` (a transformers model directory with the tokenizer).

    Raises:
        posttrain.data.tasks.DatasetError: a malformed task row (while training the tiny tokenizer
            or building warm-start examples).
    """
    if (ctx.sft_model_dir / "config.json").is_file():
        return ctx.sft_model_dir
    from posttrain.learner.remote_checkpoint import fetch_start_model, mirror_start_model
    from posttrain.runners.common import prepare, warm_start
    from posttrain.weight_sync.factory import has_tokenizer, install_tokenizer

    uri = ctx.config.checkpoints_uri
    if uri and fetch_start_model(uri, ctx.sft_model_dir):  # a restarted pod: the same start model
        if not has_tokenizer(ctx.tokenizer_dir):
            install_tokenizer(ctx.sft_model_dir, ctx.tokenizer_dir)
        return ctx.sft_model_dir
    prepare(ctx)
    start = warm_start(ctx)
    if uri:
        mirror_start_model(start, uri)
    return start


def generator_ready(config: RunConfig, *, timeout_s: float = 600.0) -> RunConfig:
    """Localize the inputs and make sure the tokenizer directory is filled; return the config to serve.

    Raises:
        TimeoutError: no weights were published within ``timeout_s`` seconds.
        FileNotFoundError: the published version carries no tokenizer.
        posttrain.storage.StorageError: a download failed.
    """
    from posttrain.weight_sync.factory import fetch_tokenizer, open_weight_store

    config = localize_inputs(config)
    ctx = RunContext(config)
    fetch_tokenizer(ctx, open_weight_store(ctx), timeout_s=timeout_s)
    return config
