"""Versioned weight store: the learner publishes safetensors, generators poll and reload them.

Layout of a ``FilesystemWeightStore`` rooted at ``root``::

    root/v000000/config.json          (copied from the model directory, with the tokenizer files)
    root/v000000/model.safetensors    (every tensor, always with lm_head.weight)
    root/v000001/...
    root/LATEST                       (text: the newest published policy version, e.g. "1")

Each version directory is a loadable transformers model directory (config, tokenizer and weights),
so a generator reloads it in place, and a generator on another machine takes its tokenizer from it (vLLM ``reload_weights(weights_path=...)``, or the ``hf`` engine's
``load_state_dict``). Versions count weight publications: v0 is the initial weights. A version
directory appears atomically (written under a temporary name, then renamed), and ``LATEST`` is
replaced atomically after it, so a reader that sees ``LATEST = k`` finds ``v{k}`` complete.

``lm_head.weight`` is always written, also for tied-embedding models (a copy of
``model.embed_tokens.weight``): vLLM's in-place reload leaves the LM head unloaded otherwise
(see ``research/data_models_services.md`` §1, "Gotcha for tied embeddings").

``posttrain.weight_sync.s3_store.S3WeightStore`` keeps the same layout under an ``s3://`` prefix;
``posttrain.weight_sync.factory.open_weight_store`` picks one from the run config's ``weights_uri``.

Run the tests: ``python -m pytest -q tests/unit/weight_sync``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

WEIGHTS_FILE = "model.safetensors"
"""Name of the weights file inside a version directory."""

LATEST_FILE = "LATEST"
"""Name of the text file holding the newest published policy version."""

COPIED_CONFIG_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
"""Files copied from the model directory into each version when present (``config.json`` is required).

The tokenizer files make a version directory self-contained: a generator pod with no shared run
directory loads its tokenizer from the weight store (``posttrain.weight_sync.factory.fetch_tokenizer``).
"""

TOKENIZER_FILES = COPIED_CONFIG_FILES[2:]
"""The tokenizer's files among ``COPIED_CONFIG_FILES``."""

LM_HEAD_KEY = "lm_head.weight"
EMBED_KEY = "model.embed_tokens.weight"


@runtime_checkable
class WeightStore(Protocol):
    """Where the learner publishes policy weights and generators find them.

    Implementations: ``FilesystemWeightStore`` (local directory or shared volume) and
    ``posttrain.weight_sync.s3_store.S3WeightStore`` (an ``s3://`` prefix; ``path_for`` downloads
    a published version into a local cache first).
    """

    def publish(
        self,
        state_dict: Mapping[str, Tensor],
        policy_version: int,
        config_dir: Path,
        *,
        overwrite: bool = False,
    ) -> Path:
        """Write the weights of ``policy_version`` and make it the latest; return its directory."""
        ...

    def latest_version(self) -> int | None:
        """Newest published policy version, or None before the first publication."""
        ...

    def path_for(self, policy_version: int) -> Path:
        """Local directory of a published version (a loadable transformers model directory)."""
        ...

    def prune(self, keep: int = 3) -> list[int]:
        """Delete all but the newest ``keep`` versions; return the deleted versions."""
        ...


def version_dirname(policy_version: int) -> str:
    """Directory name of a version: ``v`` plus six zero-padded digits (``v000042``)."""
    return f"v{policy_version:06d}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _config_ties_embeddings(config_dir: Path) -> bool:
    config = json.loads((config_dir / "config.json").read_text(encoding="utf-8"))
    return bool(config.get("tie_word_embeddings", False))


def prepare_state_dict(state_dict: Mapping[str, Tensor], tied_embeddings: bool) -> dict[str, Tensor]:
    """Return CPU, contiguous, storage-independent copies of the tensors, with an explicit LM head.

    Args:
        state_dict: HF checkpoint names (``model.layers.0.self_attn.q_proj.weight`` ...) to tensors
            of any dtype and device.
        tied_embeddings: The model ties the LM head to the input embedding; ``lm_head.weight`` is
            then (re)set to a copy of ``model.embed_tokens.weight``.

    Returns:
        A new dict; every tensor detached, on CPU, contiguous and owning its storage (safetensors
        refuses shared storage, which tied models have).

    Raises:
        ValueError: ``state_dict`` is empty, holds a non-tensor value, or has neither
            ``lm_head.weight`` nor ``model.embed_tokens.weight`` to build the LM head from.
    """
    if not state_dict:
        raise ValueError("state_dict: empty; nothing to publish")
    out: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, Tensor):
            raise ValueError(f"state_dict[{name!r}]: expected a torch.Tensor, got {type(tensor).__name__}")
        out[name] = tensor.detach().to("cpu").contiguous().clone()
    if tied_embeddings or LM_HEAD_KEY not in out:
        if EMBED_KEY not in out:
            raise ValueError(
                f"state_dict: has no {LM_HEAD_KEY!r} and no {EMBED_KEY!r} to copy it from "
                f"(keys start with {sorted(out)[:3]})"
            )
        out[LM_HEAD_KEY] = out[EMBED_KEY].clone()
    return out


def check_publish_order(
    policy_version: int, latest: int | None, *, exists: bool, overwrite: bool, where: str
) -> None:
    """Refuse a publication that would not move the store forward (shared by every store).

    Args:
        policy_version: The version about to be published (>= 0).
        latest: The store's latest published version, None before the first.
        exists: A version directory (or prefix) for ``policy_version`` exists already.
        overwrite: The caller replaces versions on purpose (a restarted learner).
        where: The version's location, named in the error.

    Raises:
        ValueError: negative ``policy_version``, or not above ``latest`` without ``overwrite``.
        FileExistsError: the version exists and ``overwrite`` is False.
    """
    if policy_version < 0:
        raise ValueError(f"policy_version: must be >= 0, got {policy_version}")
    if overwrite:
        return
    if exists:
        raise FileExistsError(f"policy_version {policy_version}: {where} already exists")
    if latest is not None and policy_version <= latest:
        raise ValueError(f"policy_version: must exceed the latest published version {latest}, got {policy_version}")


def write_version_files(
    out_dir: Path, state_dict: Mapping[str, Tensor], policy_version: int, config_dir: Path
) -> list[Path]:
    """Write one version's files into the existing directory ``out_dir`` and fsync them.

    Args:
        out_dir: An empty directory (a temporary one; the caller renames or uploads it).
        state_dict: HF checkpoint names to tensors (see ``prepare_state_dict``).
        policy_version: Recorded in the safetensors metadata (``policy_version``).
        config_dir: Model directory; ``COPIED_CONFIG_FILES`` present there are copied.

    Returns:
        The written files (``model.safetensors`` first).

    Raises:
        FileNotFoundError: ``config_dir`` has no ``config.json``.
        ValueError: a bad ``state_dict`` (see ``prepare_state_dict``).
    """
    config_dir = Path(config_dir)
    if not (config_dir / "config.json").is_file():
        raise FileNotFoundError(f"config_dir {config_dir}: no config.json to copy into the weight store")
    tensors = prepare_state_dict(state_dict, _config_ties_embeddings(config_dir))
    from safetensors.torch import save_file

    written = [out_dir / WEIGHTS_FILE]
    save_file(tensors, str(written[0]), metadata={"policy_version": str(policy_version)})
    for name in COPIED_CONFIG_FILES:
        if (config_dir / name).is_file():
            shutil.copyfile(config_dir / name, out_dir / name)
            written.append(out_dir / name)
    for path in written:
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(out_dir)
    return written


class FilesystemWeightStore:
    """A ``WeightStore`` in a local directory (or a shared volume mounted by every pod).

    Single writer (the learner's rank 0), any number of readers (generators).
    """

    def __init__(self, root: Path | str) -> None:
        """Use (and create) ``root`` as the store directory."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path_for(self, policy_version: int) -> Path:
        """Directory of ``policy_version`` (it may not exist yet).

        Raises:
            ValueError: ``policy_version`` is negative.
        """
        if policy_version < 0:
            raise ValueError(f"policy_version: must be >= 0, got {policy_version}")
        return self.root / version_dirname(policy_version)

    def versions(self) -> list[int]:
        """Published versions present on disk, ascending."""
        found = []
        for entry in self.root.iterdir():
            name = entry.name
            if entry.is_dir() and name.startswith("v") and name[1:].isdigit():
                found.append(int(name[1:]))
        return sorted(found)

    def latest_version(self) -> int | None:
        """The version in ``root/LATEST``, or None if nothing was published.

        Raises:
            ValueError: ``LATEST`` does not hold a non-negative integer (the message names the file).
        """
        path = self.root / LATEST_FILE
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise ValueError(f"{path}: expected a non-negative integer policy version, got {text!r}")
        return int(text)

    def publish(
        self,
        state_dict: Mapping[str, Tensor],
        policy_version: int,
        config_dir: Path,
        *,
        overwrite: bool = False,
    ) -> Path:
        """Write ``v{policy_version}`` atomically, then point ``LATEST`` at it.

        Args:
            state_dict: HF checkpoint names to tensors (any dtype; saved as given). Missing
                ``lm_head.weight`` (or a tied model) gets a copy of ``model.embed_tokens.weight``.
            policy_version: Count of weight publications; 0 is the initial weights. Must exceed
                the latest published version unless ``overwrite``.
            config_dir: Model directory whose ``config.json`` (and the other
                ``COPIED_CONFIG_FILES`` present) is copied, so the version directory is a loadable
                model with its tokenizer.
            overwrite: Replace an existing version directory (a learner restarted from a
                checkpoint re-publishing versions it had published before it stopped); ``LATEST``
                is then set to ``policy_version`` even if it was higher.

        Returns:
            The version directory.

        Raises:
            ValueError: negative ``policy_version``, ``policy_version`` not above the latest one
                without ``overwrite``, or a bad ``state_dict`` (see ``prepare_state_dict``).
            FileNotFoundError: ``config_dir`` has no ``config.json``.
            FileExistsError: the version directory exists and ``overwrite`` is False.
        """
        final = self.path_for(policy_version)
        config_dir = Path(config_dir)
        if not (config_dir / "config.json").is_file():
            raise FileNotFoundError(f"config_dir {config_dir}: no config.json to copy into the weight store")
        check_publish_order(
            policy_version, self.latest_version(), exists=final.exists(), overwrite=overwrite, where=str(final)
        )
        tmp = self.root / f".tmp-{version_dirname(policy_version)}-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            write_version_files(tmp, state_dict, policy_version, config_dir)
            if final.exists():
                trash = self.root / f".old-{version_dirname(policy_version)}-{uuid.uuid4().hex}"
                os.rename(final, trash)
                os.rename(tmp, final)
                shutil.rmtree(trash)
            else:
                os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._write_latest(policy_version)
        return final

    def _write_latest(self, policy_version: int) -> None:
        tmp = self.root / f".{LATEST_FILE}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{policy_version}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / LATEST_FILE)
        _fsync_dir(self.root)

    def prune(self, keep: int = 3) -> list[int]:
        """Delete all but the newest ``keep`` version directories; never the one ``LATEST`` names.

        Readers should reload within ``keep - 1`` publications of polling ``LATEST``, or the
        directory they were told about may be gone.

        Args:
            keep: Versions to keep (>= 1).

        Returns:
            The deleted versions, ascending.

        Raises:
            ValueError: ``keep < 1``.
        """
        if keep < 1:
            raise ValueError(f"keep: must be >= 1, got {keep}")
        latest = self.latest_version()
        present = self.versions()
        doomed = [v for v in present[:-keep] if v != latest]
        for version in doomed:
            shutil.rmtree(self.path_for(version))
        return doomed

    def load_state_dict(self, policy_version: int) -> dict[str, Tensor]:
        """Read back the tensors of a published version (CPU tensors as saved).

        Raises:
            FileNotFoundError: the version was not published or was pruned.
        """
        path = self.path_for(policy_version) / WEIGHTS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"policy_version {policy_version}: {path} does not exist")
        from safetensors.torch import load_file

        return load_file(str(path))


def publish_model(store: WeightStore, model: torch.nn.Module, policy_version: int, config_dir: Path) -> Path:
    """Publish a transformers model's ``state_dict()`` (convenience for the learner and tests).

    Args:
        store: Where to publish.
        model: A causal LM whose ``state_dict`` uses HF checkpoint names.
        policy_version: Version to publish (count of weight publications).
        config_dir: Model directory with ``config.json``.

    Returns:
        The version directory.
    """
    return store.publish(model.state_dict(), policy_version, config_dir)
