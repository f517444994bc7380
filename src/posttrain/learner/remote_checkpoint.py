"""Learner checkpoints and the start model mirrored to S3, so a restarted learner pod resumes.

In cluster mode a learner pod has only its own disk, which a JobSet restart replaces. With
``checkpoints_uri: s3://bucket/prefix`` set (``posttrain.kfp.train_cluster.train_sao_cluster``
sets it to ``<run prefix>/checkpoints``), the learner keeps, besides its local checkpoints::

    <checkpoints_uri>/iter-000012/...     a copy of the local checkpoint directory
    <checkpoints_uri>/LATEST              text: the newest complete copy (``iter-000012``)
    <checkpoints_uri>/start_model/...     the SFT warm-started model the run started from
    <checkpoints_uri>/START_MODEL         text: ``start_model``, written after that upload

A pointer object is written only after every file it names is uploaded, so a learner killed
mid-upload leaves the previous checkpoint as the one a restarted learner fetches. A restarted pod
fetches the start model (instead of repeating the warm start, whose result would differ in the
last bits) and the newest checkpoint, then resumes exactly as a local learner does
(``learner.checkpoint`` explains the stream position).

Run the tests: ``python -m pytest -q tests/integration/test_s3_weights_cluster_sao.py``.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

from posttrain.storage import S3Storage, StorageError, is_s3_uri, storage_for

LATEST_OBJECT = "LATEST"
"""Pointer object naming the newest complete checkpoint copy below ``checkpoints_uri``."""

START_MODEL_PREFIX = "start_model"
"""Prefix (below ``checkpoints_uri``) of the start model's files."""

START_MODEL_OBJECT = "START_MODEL"
"""Pointer object written after the start model's upload completed."""

_CHECKPOINT_NAME = re.compile(r"iter-\d{6,}")


def _s3(uri: str) -> S3Storage:
    if not is_s3_uri(uri):
        raise ValueError(f"checkpoints_uri: {uri!r} is not an s3:// URI")
    store = storage_for(uri)
    if not isinstance(store, S3Storage):
        raise TypeError(f"checkpoints_uri: {uri!r} did not open an S3 storage")
    return store


def _join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *parts])


def _download_complete(store: S3Storage, src: str, dest: Path, required: str) -> Path:
    """Download ``src`` into a temporary sibling of ``dest``, check ``required`` is there, rename.

    Raises:
        posttrain.storage.StorageError: a download failed, or the copy lacks ``required``.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}-{uuid.uuid4().hex[:8]}"
    store.download_dir(src, tmp)
    if not (tmp / required).is_file():
        shutil.rmtree(tmp)
        raise StorageError(f"{src}: no {required}; the copy is incomplete")
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return dest


def mirror_checkpoint(checkpoint_dir: Path, uri: str, *, keep: int = 2) -> str:
    """Upload one local checkpoint directory, then point ``<uri>/LATEST`` at it; drop old copies.

    Args:
        checkpoint_dir: A complete local checkpoint (``.../checkpoints/iter-000012``).
        uri: ``checkpoints_uri`` (``s3://bucket/prefix``).
        keep: Older copies kept besides the new one (as ``save_checkpoint`` does locally).

    Returns:
        The URI of the uploaded copy.

    Raises:
        TypeError: the storage opened for ``uri`` is not S3 (never for an ``s3://`` URI).
        ValueError: ``uri`` is not ``s3://``, or ``checkpoint_dir`` is not named ``iter-NNNNNN``.
        posttrain.storage.StorageError: an upload or delete failed (names the key).
    """
    name = Path(checkpoint_dir).name
    if not _CHECKPOINT_NAME.fullmatch(name):
        raise ValueError(f"checkpoint directory {checkpoint_dir} is not named iter-NNNNNN")
    store = _s3(uri)
    dest = _join(uri, name)
    store.delete(dest)  # a copy left half-uploaded by a learner killed earlier
    store.upload_dir(Path(checkpoint_dir), dest)
    store.write_bytes(_join(uri, LATEST_OBJECT), name.encode())
    prefix = _join(uri, "")
    names = sorted({u[len(prefix):].split("/", 1)[0] for u in store.list(uri) if u.startswith(prefix)})
    copies = [n for n in names if _CHECKPOINT_NAME.fullmatch(n) and n <= name]
    for old in copies[: max(0, len(copies) - 1 - keep)]:
        store.delete(_join(uri, old))
    return dest


def fetch_checkpoint(uri: str, root: Path) -> Path | None:
    """Download the checkpoint ``<uri>/LATEST`` names into ``root`` (the local checkpoints dir).

    Args:
        uri: ``checkpoints_uri``.
        root: Local checkpoints directory; gets ``iter-NNNNNN/`` and its ``LATEST`` file.

    Returns:
        The local checkpoint directory, or None when nothing was mirrored yet.

    Raises:
        ValueError: ``uri`` is not ``s3://``, or ``<uri>/LATEST`` names no ``iter-NNNNNN``.
        posttrain.storage.StorageError: a download failed, or the named copy lacks ``state.json``.
    """
    store = _s3(uri)
    pointer = store.read_bytes_if_exists(_join(uri, LATEST_OBJECT))
    if pointer is None:
        return None
    name = pointer.decode("utf-8", errors="replace").strip()
    if not _CHECKPOINT_NAME.fullmatch(name):
        raise ValueError(f"{_join(uri, LATEST_OBJECT)}: {name[:40]!r} is not a checkpoint name (iter-NNNNNN)")
    root = Path(root)
    final = _download_complete(store, _join(uri, name), root / name, "state.json")
    pointer_tmp = root / "LATEST.tmp"
    pointer_tmp.write_text(name, encoding="utf-8")
    pointer_tmp.replace(root / "LATEST")
    return final


def mirror_start_model(model_dir: Path, uri: str) -> str:
    """Upload the learner's start model, then write ``<uri>/START_MODEL``.

    Args:
        model_dir: The SFT warm-started model directory (config, weights, tokenizer).
        uri: ``checkpoints_uri``.

    Returns:
        The URI of the uploaded model.

    Raises:
        ValueError: ``uri`` is not ``s3://``.
        posttrain.storage.StorageError: an upload failed.
    """
    store = _s3(uri)
    dest = _join(uri, START_MODEL_PREFIX)
    store.upload_dir(Path(model_dir), dest)
    store.write_bytes(_join(uri, START_MODEL_OBJECT), START_MODEL_PREFIX.encode())
    return dest


def fetch_start_model(uri: str, dest: Path) -> bool:
    """Download the mirrored start model into ``dest`` (atomically); False when none was mirrored.

    Raises:
        ValueError: ``uri`` is not ``s3://``.
        posttrain.storage.StorageError: a download failed, or the copy has no ``config.json``.
    """
    store = _s3(uri)
    if store.read_bytes_if_exists(_join(uri, START_MODEL_OBJECT)) is None:
        return False
    _download_complete(store, _join(uri, START_MODEL_PREFIX), Path(dest), "config.json")
    return True
