"""FilesystemWeightStore: versioned, atomic, always with an explicit LM head, prunable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures_models import TinyModel, build_tiny
from posttrain.models.hf import load_policy
from posttrain.weight_sync import FilesystemWeightStore, WeightStore
from posttrain.weight_sync.store import LATEST_FILE, prepare_state_dict


def test_filesystem_store_satisfies_weight_store_protocol(tmp_path: Path) -> None:
    assert isinstance(FilesystemWeightStore(tmp_path), WeightStore)


def test_publish_writes_loadable_version_dir_and_latest(tiny_model: TinyModel, tmp_path: Path) -> None:
    store = FilesystemWeightStore(tmp_path / "store")
    assert store.latest_version() is None
    model = load_policy(tiny_model.path)
    path = store.publish(model.state_dict(), 0, tiny_model.path)
    assert path == tmp_path / "store" / "v000000"
    assert store.latest_version() == 0
    assert (tmp_path / "store" / LATEST_FILE).read_text().strip() == "0"
    assert sorted(p.name for p in path.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    reloaded = load_policy(path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]


def test_publish_rejects_versions_not_above_latest_unless_overwrite(
    tiny_model: TinyModel, tmp_path: Path
) -> None:
    store = FilesystemWeightStore(tmp_path)
    state = load_policy(tiny_model.path).state_dict()
    store.publish(state, 0, tiny_model.path)
    store.publish(state, 2, tiny_model.path)
    with pytest.raises(FileExistsError, match="policy_version 2"):
        store.publish(state, 2, tiny_model.path)
    with pytest.raises(ValueError, match="policy_version: must exceed the latest published version 2"):
        store.publish(state, 1, tiny_model.path)
    doubled = {k: v * 2 for k, v in state.items()}
    store.publish(doubled, 2, tiny_model.path, overwrite=True)
    assert torch.equal(store.load_state_dict(2)["lm_head.weight"], state["lm_head.weight"] * 2)
    store.publish(state, 1, tiny_model.path, overwrite=True)
    assert store.latest_version() == 1


def test_tied_model_gets_explicit_lm_head_copied_from_embeddings(tmp_path: Path) -> None:
    """Tied weights share storage; the store writes lm_head.weight as its own copy of the embedding."""
    tied = build_tiny(tmp_path / "tied", tie_word_embeddings=True)
    model = load_policy(tied.path)
    state = model.state_dict()
    state.pop("lm_head.weight", None)
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(state, 0, tied.path)
    saved = store.load_state_dict(0)
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])


def test_prepare_state_dict_without_head_or_embedding_names_the_keys() -> None:
    with pytest.raises(ValueError, match="lm_head.weight"):
        prepare_state_dict({"model.norm.weight": torch.ones(4)}, tied_embeddings=False)
    with pytest.raises(ValueError, match="state_dict: empty"):
        prepare_state_dict({}, tied_embeddings=False)


def test_prune_keeps_newest_versions_and_latest(tiny_model: TinyModel, tmp_path: Path) -> None:
    """Versions 0..4 published, keep=2: 0, 1, 2 are deleted and 3, 4 remain."""
    store = FilesystemWeightStore(tmp_path)
    state = load_policy(tiny_model.path).state_dict()
    for version in range(5):
        store.publish(state, version, tiny_model.path)
    assert store.prune(keep=2) == [0, 1, 2]
    assert store.versions() == [3, 4]
    with pytest.raises(ValueError, match="keep"):
        store.prune(keep=0)


def test_corrupt_latest_file_is_reported_with_its_path(tmp_path: Path) -> None:
    (tmp_path / LATEST_FILE).write_text("seven\n")
    with pytest.raises(ValueError, match=f"{tmp_path / LATEST_FILE}.*'seven'"):
        FilesystemWeightStore(tmp_path).latest_version()


def test_publish_needs_config_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        FilesystemWeightStore(tmp_path / "s").publish({"lm_head.weight": torch.ones(2, 2)}, 0, tmp_path)
