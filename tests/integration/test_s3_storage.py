"""S3 storage against a real SeaweedFS server (``weed mini``) started by the test."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from posttrain.services.s3 import S3Server
from posttrain.storage import (
    LocalStorage,
    S3Storage,
    StorageError,
    materialize,
    parse_s3_uri,
    storage_for,
)

pytestmark = pytest.mark.integration



@pytest.fixture()
def s3(s3_server: S3Server) -> S3Storage:
    return S3Storage(client=s3_server.client())


def _make_checkpoint(root: Path) -> dict[str, str]:
    """A fake HF checkpoint: config, a 6 MiB weights file (multipart-sized) and a nested file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"model_type": "qwen2"}')
    (root / "model.safetensors").write_bytes(os.urandom(6 * 1024 * 1024))
    (root / "sub").mkdir()
    (root / "sub" / "tokenizer.json").write_text("{}")
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_parse_s3_uri_splits_bucket_and_prefix() -> None:
    assert parse_s3_uri("s3://ckpts/run1/final/") == ("ckpts", "run1/final")
    assert parse_s3_uri("s3://ckpts") == ("ckpts", "")
    for bad in ("ckpts/run1", "s3://", "s3://Bad_Bucket/x", "s3://ab/x"):
        with pytest.raises(ValueError, match="s3 uri"):
            parse_s3_uri(bad)


def test_checkpoint_directory_round_trips_byte_identical(s3: S3Storage, tmp_path: Path) -> None:
    digests = _make_checkpoint(tmp_path / "ckpt")
    s3.upload_dir(tmp_path / "ckpt", "s3://ckpts/team-a/run1/final")
    assert s3.exists("s3://ckpts/team-a/run1/final")
    assert s3.list("s3://ckpts/team-a/run1/final") == sorted(
        f"s3://ckpts/team-a/run1/final/{rel}" for rel in digests
    )
    out = s3.download_dir("s3://ckpts/team-a/run1/final", tmp_path / "back")
    back = {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}
    assert back == digests


def test_prefix_does_not_match_sibling_with_common_start(s3: S3Storage) -> None:
    s3.write_bytes("s3://ckpts/p/run1/a.txt", b"1")
    s3.write_bytes("s3://ckpts/p/run10/b.txt", b"2")
    assert s3.list("s3://ckpts/p/run1") == ["s3://ckpts/p/run1/a.txt"]
    assert not s3.exists("s3://ckpts/p/run")
    assert s3.read_bytes("s3://ckpts/p/run10/b.txt") == b"2"


def test_missing_object_and_missing_bucket_raise_storage_error(s3: S3Storage, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="s3://ckpts/nope"):
        s3.read_bytes("s3://ckpts/nope")
    with pytest.raises(StorageError, match="no objects below"):
        s3.download_dir("s3://ckpts/nothing-here", tmp_path / "x")
    with pytest.raises(StorageError, match="no-such-bucket"):
        s3.list("s3://no-such-bucket/x")


def test_wrong_credentials_are_refused(s3_server: S3Server) -> None:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=s3_server.endpoint_url, aws_access_key_id="wrong", aws_secret_access_key="wrong",
        region_name="us-east-1",
    )
    with pytest.raises(StorageError):
        S3Storage(client=client).list("s3://ckpts/")


def test_storage_for_picks_backend_from_env_endpoint(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    store = storage_for("s3://ckpts/env/x")
    assert isinstance(store, S3Storage)
    store.write_bytes("s3://ckpts/env/x/f.bin", b"abc")
    local = materialize("s3://ckpts/env/x", tmp_path / "cache")
    assert (local / "f.bin").read_bytes() == b"abc"
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    with pytest.raises(ValueError, match="unsupported scheme"):
        storage_for("gs://bucket/x")


def test_local_storage_round_trip(tmp_path: Path) -> None:
    digests = _make_checkpoint(tmp_path / "ckpt")
    store = LocalStorage()
    store.upload_dir(tmp_path / "ckpt", str(tmp_path / "remote"))
    assert store.exists(str(tmp_path / "remote"))
    assert len(store.list(str(tmp_path / "remote"))) == len(digests)
    out = store.download_dir(f"file://{tmp_path / 'remote'}", tmp_path / "back")
    assert (out / "config.json").read_text() == '{"model_type": "qwen2"}'
