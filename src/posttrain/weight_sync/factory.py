"""Pick the run's weight store from its config, and the cluster-mode helpers around it.

``open_weight_store(ctx)`` reads one config field, ``weights_uri``:

* None: ``FilesystemWeightStore(<run dir>/weights)`` (one machine, the embedded default);
* a path or ``file://`` URI: ``FilesystemWeightStore`` there (a volume every pod mounts);
* ``s3://bucket/prefix``: ``S3WeightStore`` with its download cache in ``<run dir>/weights-cache``
  (cluster mode: learner and generator pods share no volume).

``fetch_tokenizer`` gives a generator with no shared run directory the learner's tokenizer (every
published version carries it); ``upload_final_model`` copies the learner's final model to
``final_model_uri``.

Example: ``python -c "from posttrain.config import load_config; from posttrain.weight_sync.factory
import open_weight_store; print(open_weight_store(load_config(None, [])))"``.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

from posttrain.config import RunConfig
from posttrain.runtime import RunContext
from posttrain.storage import is_s3_uri, storage_for
from posttrain.weight_sync.s3_store import S3WeightStore
from posttrain.weight_sync.store import TOKENIZER_FILES, FilesystemWeightStore, WeightStore
from posttrain.weight_sync.timed import TimedWeightStore

WEIGHTS_CACHE_DIRNAME = "weights-cache"
"""Directory under the run directory where an S3 store keeps downloaded versions."""


def _local_path(location: str) -> Path:
    return Path(location[len("file://") :] if location.startswith("file://") else location)


def open_weight_store(run: RunContext | RunConfig) -> WeightStore:
    """The weight store named by ``weights_uri`` (see the module docstring).

    Args:
        run: The run's context or config.

    Returns:
        A ``FilesystemWeightStore`` or an ``S3WeightStore``, each operation bounded by
        ``weights_timeout_s`` (``posttrain.weight_sync.timed.TimedWeightStore``).

    Raises:
        ValueError: ``weights_uri`` is an invalid ``s3://`` URI (bucket name).
    """
    ctx = run if isinstance(run, RunContext) else RunContext(run)
    uri = ctx.config.weights_uri
    store: WeightStore
    if uri is None:
        store = FilesystemWeightStore(ctx.weights_dir)
    elif is_s3_uri(uri):
        store = S3WeightStore(uri, ctx.run_dir / WEIGHTS_CACHE_DIRNAME)
    else:
        store = FilesystemWeightStore(_local_path(uri))
    return TimedWeightStore(store, ctx.config.weights_timeout_s)


def has_tokenizer(directory: Path) -> bool:
    """Whether ``directory`` holds a saved transformers tokenizer (``tokenizer_config.json``)."""
    return (Path(directory) / "tokenizer_config.json").is_file()


def fetch_tokenizer(ctx: RunContext, store: WeightStore, *, timeout_s: float = 600.0, poll_s: float = 0.5) -> Path:
    """Fill ``ctx.tokenizer_dir`` from the newest published version unless it holds a tokenizer.

    A generator pod in cluster mode has no run directory prepared by anyone; the learner
    publishes every version with its tokenizer files, so the generator copies them from there
    (the directory appears atomically: a temporary directory renamed into place).

    Args:
        ctx: The run (``tokenizer_dir`` is filled).
        store: The run's weight store.
        timeout_s: Seconds to wait for the first publication.
        poll_s: Seconds between polls of ``LATEST``.

    Returns:
        ``ctx.tokenizer_dir``.

    Raises:
        TimeoutError: nothing was published within ``timeout_s``.
        FileNotFoundError: the published version has no ``tokenizer_config.json``.
    """
    target = ctx.tokenizer_dir
    if has_tokenizer(target):
        return target
    deadline = time.monotonic() + timeout_s
    version = store.latest_version()
    while version is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no weights published in {ctx.config.weights_uri or ctx.weights_dir} after "
                               f"{timeout_s:.0f} s; cannot take the tokenizer from there")
        time.sleep(poll_s)
        version = store.latest_version()
    source = store.path_for(version)
    if not has_tokenizer(source):
        raise FileNotFoundError(f"policy_version {version}: {source} has no tokenizer_config.json (published "
                                "without tokenizer files); give the generator a prepared tokenizer_dir")
    return install_tokenizer(source, target)


def install_tokenizer(source: Path, target: Path) -> Path:
    """Copy the tokenizer files of model directory ``source`` into a new directory ``target``.

    The directory appears atomically (a temporary directory renamed into place); when another
    process installed it first, its copy is kept.

    Returns:
        ``target``.

    Raises:
        OSError: the copy or rename failed and ``target`` holds no tokenizer.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".tokenizer-{uuid.uuid4().hex}"
    tmp.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, tmp / name)
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp)
        if not has_tokenizer(target):  # not a concurrent fetch that won: a real failure
            raise
    return target


def upload_final_model(config: RunConfig, final_dir: Path) -> str | None:
    """Copy the final model directory to ``config.final_model_uri`` when it is set.

    Args:
        config: The run config.
        final_dir: The learner's ``<run dir>/final_model`` (HF safetensors, tokenizer, resolved config).

    Returns:
        The destination (``final_model_uri`` without a trailing slash), or None when it is unset.

    Raises:
        posttrain.storage.StorageError: ``final_dir`` is not a directory, or an upload failed
            (the message names the object).
    """
    if config.final_model_uri is None:
        return None
    dest = config.final_model_uri.rstrip("/")
    return storage_for(dest).upload_dir(Path(final_dir), dest)
