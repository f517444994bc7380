"""Learner checkpoints mirrored to a real S3 server (SeaweedFS): pointer order, pruning, bad copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.learner.remote_checkpoint import (
    fetch_checkpoint,
    fetch_start_model,
    mirror_checkpoint,
    mirror_start_model,
)
from posttrain.services.s3 import S3Server
from posttrain.storage import S3Storage, StorageError

URI = "s3://ckpt/team-a/run-1/checkpoints"



@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Storage:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    storage = S3Storage(client=s3_server.client())
    storage.delete(URI)
    return storage


def _checkpoint(root: Path, iteration: int) -> Path:
    path = root / f"iter-{iteration:06d}"
    (path / "policy").mkdir(parents=True)
    (path / "policy" / "config.json").write_text("{}")
    (path / "state.json").write_text(f'{{"iteration": {iteration}}}')
    return path


def test_nothing_mirrored_fetches_nothing(s3: S3Storage, tmp_path: Path) -> None:
    assert fetch_checkpoint(URI, tmp_path / "ckpts") is None
    assert fetch_start_model(URI, tmp_path / "sft_model") is False


def test_the_fetched_checkpoint_is_the_newest_mirrored_one(s3: S3Storage, tmp_path: Path) -> None:
    """Four checkpoints mirrored with keep=2: the newest and two older copies stay, LATEST names the
    newest, and a fetch into an empty directory gets it with a local LATEST."""
    for it in (2, 4, 6, 8):
        mirror_checkpoint(_checkpoint(tmp_path / "local", it), URI, keep=2)
    assert s3.read_bytes(f"{URI}/LATEST") == b"iter-000008"
    names = sorted({u.split("/checkpoints/")[1].split("/")[0] for u in s3.list(URI)})
    assert names == ["LATEST", "iter-000004", "iter-000006", "iter-000008"]
    got = fetch_checkpoint(URI, tmp_path / "pod" / "ckpts")
    assert got == tmp_path / "pod" / "ckpts" / "iter-000008"
    assert (got / "state.json").read_text() == '{"iteration": 8}'
    assert (tmp_path / "pod" / "ckpts" / "LATEST").read_text() == "iter-000008"


def test_a_copy_without_state_json_is_refused(s3: S3Storage, tmp_path: Path) -> None:
    """A copy whose upload never finished (no state.json) but that LATEST names: an error, not a resume
    from a partial checkpoint; nothing is left in the local directory."""
    s3.write_bytes(f"{URI}/iter-000003/policy/config.json", b"{}")
    s3.write_bytes(f"{URI}/LATEST", b"iter-000003")
    with pytest.raises(StorageError, match="no state.json"):
        fetch_checkpoint(URI, tmp_path / "ckpts")
    assert not any((tmp_path / "ckpts").iterdir())


def test_a_malformed_pointer_is_refused(s3: S3Storage, tmp_path: Path) -> None:
    s3.write_bytes(f"{URI}/LATEST", b"../../etc")
    with pytest.raises(ValueError, match="not a checkpoint name"):
        fetch_checkpoint(URI, tmp_path / "ckpts")


def test_the_start_model_round_trips_only_after_its_pointer(s3: S3Storage, tmp_path: Path) -> None:
    """Files without the START_MODEL pointer (an upload cut short) are not taken."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"a": 1}')
    s3.upload_dir(model, f"{URI}/start_model")
    assert fetch_start_model(URI, tmp_path / "pod" / "sft_model") is False
    mirror_start_model(model, URI)
    assert fetch_start_model(URI, tmp_path / "pod" / "sft_model") is True
    assert (tmp_path / "pod" / "sft_model" / "config.json").read_text() == '{"a": 1}'


def test_only_s3_uris_are_accepted(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an s3:// URI"):
        fetch_checkpoint(str(tmp_path), tmp_path / "ckpts")
