"""open_weight_store picks the store from weights_uri; tokenizer fetch and final-model upload."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures_models import TinyModel
from posttrain.config import ConfigError, load_config
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.runtime import RunContext
from posttrain.weight_sync import FilesystemWeightStore, S3WeightStore, open_weight_store, upload_final_model
from posttrain.weight_sync.factory import fetch_tokenizer


def test_no_weights_uri_means_the_run_directory(tmp_path: Path) -> None:
    ctx = RunContext(load_config(None, [f"output_dir={tmp_path}", "run_name=r"]))
    store = open_weight_store(ctx)
    assert isinstance(store.inner, FilesystemWeightStore) and store.root == tmp_path / "r" / "weights"
    assert isinstance(open_weight_store(ctx.config).inner, FilesystemWeightStore)


def test_a_path_or_file_uri_is_a_shared_directory(tmp_path: Path) -> None:
    for uri in (str(tmp_path / "shared"), f"file://{tmp_path / 'shared'}"):
        store = open_weight_store(load_config(None, [f"output_dir={tmp_path}", f"weights_uri={uri}"]))
        assert isinstance(store.inner, FilesystemWeightStore) and store.root == tmp_path / "shared"


def test_an_s3_uri_is_an_s3_store_caching_under_the_run_directory(tmp_path: Path) -> None:
    cfg = load_config(None, [f"output_dir={tmp_path}", "run_name=r", "weights_uri=s3://team-a/runs/x/weights/"])
    store = open_weight_store(cfg)
    assert isinstance(store.inner, S3WeightStore) and store.timeout_s == 300.0
    assert store.uri == "s3://team-a/runs/x/weights" and store.cache_dir == tmp_path / "r" / "weights-cache"


@pytest.mark.parametrize("field", ["weights_uri", "final_model_uri"])
@pytest.mark.parametrize("bad", ["gs://bucket/x", "s3://", "http://host/x", "''"])
def test_unsupported_locations_are_refused_naming_the_field(field: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be a path, a file:// URI or an s3://bucket/prefix URI"):
        load_config(None, [f"{field}={bad}"])


def test_fetch_tokenizer_copies_it_from_the_newest_version(tiny_model: TinyModel, tmp_path: Path) -> None:
    ctx = RunContext(load_config(None, [f"output_dir={tmp_path}", "run_name=gen"]))
    store = FilesystemWeightStore(tmp_path / "store")
    store.publish(load_policy(tiny_model.path).state_dict(), 0, tiny_model.path)
    assert fetch_tokenizer(ctx, store) == ctx.tokenizer_dir
    assert len(load_tokenizer(ctx.tokenizer_dir)) == tiny_model.vocab_size
    assert not (ctx.tokenizer_dir / "model.safetensors").exists()
    assert fetch_tokenizer(ctx, FilesystemWeightStore(tmp_path / "empty"), timeout_s=0) == ctx.tokenizer_dir


def test_fetch_tokenizer_gives_up_after_its_timeout(tmp_path: Path) -> None:
    ctx = RunContext(load_config(None, [f"output_dir={tmp_path}"]))
    with pytest.raises(TimeoutError, match="no weights published"):
        fetch_tokenizer(ctx, FilesystemWeightStore(tmp_path / "empty"), timeout_s=0.2, poll_s=0.05)


def test_final_model_goes_to_final_model_uri_only_when_set(tmp_path: Path) -> None:
    final = tmp_path / "final_model"
    final.mkdir()
    (final / "config.json").write_text("{}")
    assert upload_final_model(load_config(None, []), final) is None
    dest = tmp_path / "exported"
    assert upload_final_model(load_config(None, [f"final_model_uri={dest}/"]), final) == str(dest)
    assert (dest / "config.json").read_text() == "{}"
