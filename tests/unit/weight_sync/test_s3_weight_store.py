"""S3WeightStore against a real SeaweedFS server (``weed mini``): versions, LATEST, cache, prune.

Each "machine" is a store object with its own cache directory on the same S3 prefix: the learner
publishes through one, generators read through others.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fixtures_models import TinyModel
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.services.s3 import S3Server
from posttrain.storage import S3Storage, StorageError
from posttrain.weight_sync import S3WeightStore, WeightStore
from posttrain.weight_sync.s3_store import PUBLISHED_FILE

pytestmark = pytest.mark.integration



@pytest.fixture()
def s3(s3_server: S3Server) -> S3Storage:
    return S3Storage(client=s3_server.client())


@pytest.fixture()
def prefix(request: pytest.FixtureRequest) -> str:
    """A fresh prefix per test: ``s3://weights/<test name>``."""
    return f"s3://weights/{request.node.name.replace('_', '-')}"


@pytest.fixture(scope="module")
def state(tiny_model_module: TinyModel) -> dict[str, torch.Tensor]:
    return load_policy(tiny_model_module.path).state_dict()


@pytest.fixture(scope="module")
def tiny_model_module(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    from fixtures_models import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"))


class RecordingStorage(S3Storage):
    """The real S3Storage, logging each write (upload_dir / write_bytes / delete) in order."""

    def __init__(self, client: object, fail_on: str | None = None) -> None:
        super().__init__(client=client)
        self.ops: list[tuple[str, str]] = []
        self.fail_on = fail_on

    def upload_dir(self, local_dir: Path, dest: str) -> str:
        self.ops.append(("upload_dir", dest))
        return super().upload_dir(local_dir, dest)

    def write_bytes(self, location: str, data: bytes) -> None:
        if self.fail_on is not None and location.endswith(self.fail_on):
            raise StorageError(f"put {location}: injected failure")
        self.ops.append(("write_bytes", location))
        super().write_bytes(location, data)


def test_s3_store_satisfies_weight_store_protocol(s3: S3Storage, prefix: str, tmp_path: Path) -> None:
    assert isinstance(S3WeightStore(prefix, tmp_path, storage=s3), WeightStore)


def test_publish_then_another_machine_downloads_a_loadable_version_with_tokenizer(
    s3: S3Storage, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    learner = S3WeightStore(prefix, tmp_path / "learner", storage=s3)
    generator = S3WeightStore(prefix, tmp_path / "generator", storage=s3)
    assert learner.latest_version() is None and generator.latest_version() is None
    local = learner.publish(state, 0, tiny_model_module.path)
    assert local.parent == tmp_path / "learner" and (local / "model.safetensors").is_file()
    assert generator.latest_version() == 0
    assert s3.read_bytes(f"{prefix}/LATEST") == b"0\n"
    path = generator.path_for(0)
    assert path.parent == tmp_path / "generator"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", PUBLISHED_FILE} <= {
        p.name for p in path.iterdir()
    }
    reloaded = load_policy(path)
    for name, tensor in state.items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert len(load_tokenizer(path)) == tiny_model_module.vocab_size
    assert not [p for p in (tmp_path / "generator").iterdir() if p.name.startswith(".")]


def test_path_for_downloads_once_and_reuses_the_cache(
    s3: S3Storage, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """After the first download the weights object is deleted on S3 (marker kept): the cache still serves it."""
    S3WeightStore(prefix, tmp_path / "learner", storage=s3).publish(state, 0, tiny_model_module.path)
    reader = S3WeightStore(prefix, tmp_path / "reader", storage=s3)
    first = reader.path_for(0)
    stamp = first.stat().st_mtime_ns
    s3.delete(f"{prefix}/v000000/model.safetensors")
    again = reader.path_for(0)
    assert again == first and again.stat().st_mtime_ns == stamp
    assert torch.equal(reader.load_state_dict(0)["lm_head.weight"], state["lm_head.weight"])


def test_publish_writes_files_then_marker_then_latest(
    s3_server: S3Server, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    storage = RecordingStorage(s3_server.client())
    S3WeightStore(prefix, tmp_path, storage=storage).publish(state, 0, tiny_model_module.path)
    assert storage.ops == [
        ("upload_dir", f"{prefix}/v000000"),
        ("write_bytes", f"{prefix}/v000000/{PUBLISHED_FILE}"),
        ("write_bytes", f"{prefix}/LATEST"),
    ]


def test_reader_never_sees_a_version_whose_publication_died_before_its_marker(
    s3_server: S3Server, s3: S3Storage, prefix: str, tiny_model_module: TinyModel,
    state: dict[str, torch.Tensor], tmp_path: Path,
) -> None:
    """v0 published; v1's files are uploaded but its marker write fails: LATEST stays 0, v1 is not served."""
    S3WeightStore(prefix, tmp_path / "ok", storage=s3).publish(state, 0, tiny_model_module.path)
    dying = S3WeightStore(prefix, tmp_path / "dying", storage=RecordingStorage(s3_server.client(), PUBLISHED_FILE))
    with pytest.raises(StorageError, match="injected failure"):
        dying.publish({k: v * 2 for k, v in state.items()}, 1, tiny_model_module.path)
    assert s3.exists(f"{prefix}/v000001/model.safetensors")  # the partial upload is there...
    reader = S3WeightStore(prefix, tmp_path / "reader", storage=s3)
    assert reader.latest_version() == 0  # ...but LATEST never pointed at it
    with pytest.raises(FileNotFoundError, match=f"{prefix}/v000001 is not published"):
        reader.path_for(1)
    assert reader.versions() == [0]
    assert not [p for p in (tmp_path / "dying").iterdir() if p.name.startswith(".")]
    # The learner retries the same version: the leftovers are replaced.
    S3WeightStore(prefix, tmp_path / "ok", storage=s3).publish(state, 1, tiny_model_module.path)
    assert reader.latest_version() == 1 and reader.versions() == [0, 1]


def test_overwrite_gives_readers_a_new_directory_with_the_new_weights(
    s3: S3Storage, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """A restarted learner re-publishes v1 (weights x2): the reader's path changes, its old copy is dropped."""
    learner = S3WeightStore(prefix, tmp_path / "learner", storage=s3)
    reader = S3WeightStore(prefix, tmp_path / "reader", storage=s3)
    for version in (0, 1, 3):
        learner.publish(state, version, tiny_model_module.path)
    old = reader.path_for(1)
    with pytest.raises(FileExistsError, match="policy_version 1"):
        learner.publish(state, 1, tiny_model_module.path)
    with pytest.raises(ValueError, match="must exceed the latest published version 3"):
        learner.publish(state, 2, tiny_model_module.path)
    learner.publish({k: v * 2 for k, v in state.items()}, 1, tiny_model_module.path, overwrite=True)
    assert reader.latest_version() == 1
    new = reader.path_for(1)
    assert new != old and not old.exists()
    assert torch.equal(reader.load_state_dict(1)["lm_head.weight"], state["lm_head.weight"] * 2)


def test_malformed_latest_names_the_uri(s3: S3Storage, prefix: str, tmp_path: Path) -> None:
    s3.write_bytes(f"{prefix}/LATEST", b"seven\n")
    with pytest.raises(ValueError, match=f"{prefix}/LATEST: expected a non-negative integer.*'seven'"):
        S3WeightStore(prefix, tmp_path, storage=s3).latest_version()


def test_malformed_marker_names_the_uri(s3: S3Storage, prefix: str, tmp_path: Path) -> None:
    s3.write_bytes(f"{prefix}/v000000/{PUBLISHED_FILE}", b"../../etc")
    with pytest.raises(ValueError, match=f"{prefix}/v000000/{PUBLISHED_FILE}: expected a 32-digit hex publish id"):
        S3WeightStore(prefix, tmp_path, storage=s3).path_for(0)


def test_prune_deletes_old_versions_on_s3_and_in_the_cache(
    s3: S3Storage, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """Versions 0..4 published, keep=2: 0, 1, 2 are deleted and 3, 4 remain."""
    store = S3WeightStore(prefix, tmp_path / "learner", storage=s3, cache_keep=5)
    for version in range(5):
        store.publish(state, version, tiny_model_module.path)
    assert store.prune(keep=2) == [0, 1, 2]
    assert store.versions() == [3, 4]
    assert not s3.exists(f"{prefix}/v000002")
    assert sorted(p.name.partition("-")[0] for p in (tmp_path / "learner").iterdir()) == ["v000003", "v000004"]
    with pytest.raises(FileNotFoundError, match="v000001 is not published"):
        store.path_for(1)
    with pytest.raises(ValueError, match="keep"):
        store.prune(keep=0)


def test_reader_cache_keeps_only_the_newest_versions(
    s3: S3Storage, prefix: str, tiny_model_module: TinyModel, state: dict[str, torch.Tensor], tmp_path: Path
) -> None:
    """cache_keep=2 and versions 0, 1, 2 read in turn: only v1 and v2 stay on the reader's disk."""
    learner = S3WeightStore(prefix, tmp_path / "learner", storage=s3)
    reader = S3WeightStore(prefix, tmp_path / "reader", storage=s3, cache_keep=2)
    for version in range(3):
        learner.publish(state, version, tiny_model_module.path)
        reader.path_for(version)
    assert sorted(p.name.partition("-")[0] for p in (tmp_path / "reader").iterdir()) == ["v000001", "v000002"]


def test_unreachable_server_raises_storage_error_naming_the_uri(tmp_path: Path) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url="http://127.0.0.1:9", aws_access_key_id="x", aws_secret_access_key="x",
        region_name="us-east-1", config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1),
    )
    store = S3WeightStore("s3://weights/nowhere", tmp_path, storage=S3Storage(client=client))
    with pytest.raises(StorageError, match="s3://weights/nowhere/LATEST"):
        store.latest_version()


def test_bad_uri_and_bounds_are_refused(tmp_path: Path, s3: S3Storage) -> None:
    with pytest.raises(ValueError, match="s3 uri"):
        S3WeightStore("weights/x", tmp_path, storage=s3)
    with pytest.raises(ValueError, match="cache_keep"):
        S3WeightStore("s3://weights/x", tmp_path, storage=s3, cache_keep=0)
    with pytest.raises(ValueError, match="policy_version"):
        S3WeightStore("s3://weights/x", tmp_path, storage=s3).path_for(-1)
