"""Where checkpoints and reports live: a local directory or an S3 bucket, behind one Protocol.

``Storage`` moves whole directories (a HF safetensors checkpoint, an eval report) between this
machine and a location string. ``LocalStorage`` takes plain paths (or ``file://`` URIs);
``S3Storage`` takes ``s3://bucket/prefix`` URIs and talks to any S3 server through boto3
(AWS, MinIO, SeaweedFS). ``storage_for(uri)`` picks one from the URI's scheme.

The S3 endpoint comes from the ``endpoint_url`` argument, else ``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL`` or ``MLFLOW_S3_ENDPOINT_URL`` (in that order), else AWS itself.
Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``...).

Run: ``python -m posttrain.storage ls s3://bucket/prefix`` (also ``get URI DIR``, ``put DIR URI``).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

ENDPOINT_ENV_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MLFLOW_S3_ENDPOINT_URL")
"""Environment variables read, in order, for the S3 endpoint when none is passed."""


class StorageError(RuntimeError):
    """A storage operation failed; the message names the URI and the cause."""


def is_s3_uri(location: str) -> bool:
    """Whether ``location`` is an ``s3://`` URI."""
    return location.startswith("s3://")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/some/prefix`` into ``("bucket", "some/prefix")``.

    The prefix has no leading or trailing slash; it is ``""`` for the bucket root.

    Raises:
        ValueError: the URI does not start with ``s3://``, has no bucket, or the bucket name is
            not 3-63 characters of lowercase letters, digits, dots and hyphens.
    """
    if not is_s3_uri(uri):
        raise ValueError(f"s3 uri {uri!r}: must start with 's3://'")
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"s3 uri {uri!r}: no bucket name")
    if not (3 <= len(bucket) <= 63) or any(ch not in "abcdefghijklmnopqrstuvwxyz0123456789.-" for ch in bucket):
        raise ValueError(
            f"s3 uri {uri!r}: bucket {bucket!r} must be 3-63 characters of lowercase letters, digits, '.', '-'"
        )
    return bucket, prefix.strip("/")


def _safe_relative(rel: str, what: str) -> PurePosixPath:
    """Return ``rel`` as a relative POSIX path, refusing absolute paths and ``..`` components."""
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts) or not p.parts:
        raise StorageError(f"{what}: unsafe relative path {rel!r} (absolute or contains '..')")
    return p


@runtime_checkable
class Storage(Protocol):
    """Moves directories and small objects between this machine and a location string."""

    def upload_dir(self, local_dir: Path, dest: str) -> str:
        """Copy every file under ``local_dir`` to ``dest``; return ``dest``."""
        ...

    def download_dir(self, src: str, local_dir: Path) -> Path:
        """Copy every file under ``src`` into ``local_dir``; return ``local_dir``."""
        ...

    def exists(self, location: str) -> bool:
        """Whether ``location`` is a file/object, or a directory/prefix holding at least one."""
        ...

    def list(self, location: str) -> list[str]:
        """Locations of every file/object under ``location``, sorted."""
        ...

    def write_bytes(self, location: str, data: bytes) -> None:
        """Write one file/object."""
        ...

    def read_bytes(self, location: str) -> bytes:
        """Read one file/object."""
        ...


class LocalStorage:
    """``Storage`` on the local filesystem; locations are paths or ``file://`` URIs."""

    @staticmethod
    def _path(location: str) -> Path:
        if is_s3_uri(location):
            raise StorageError(f"{location}: LocalStorage got an s3:// URI; use S3Storage")
        return Path(location[len("file://") :] if location.startswith("file://") else location)

    def upload_dir(self, local_dir: Path, dest: str) -> str:
        """Copy the tree ``local_dir`` to the directory ``dest`` (merged, files overwritten).

        Raises:
            StorageError: ``local_dir`` is not a directory.
        """
        if not Path(local_dir).is_dir():
            raise StorageError(f"upload_dir: {local_dir} is not a directory")
        shutil.copytree(local_dir, self._path(dest), dirs_exist_ok=True)
        return dest

    def download_dir(self, src: str, local_dir: Path) -> Path:
        """Copy the directory ``src`` into ``local_dir``.

        Raises:
            StorageError: ``src`` is not a directory.
        """
        source = self._path(src)
        if not source.is_dir():
            raise StorageError(f"download_dir: {src} is not a directory")
        shutil.copytree(source, local_dir, dirs_exist_ok=True)
        return Path(local_dir)

    def exists(self, location: str) -> bool:
        """Whether the path is a file or a directory with at least one file below it."""
        p = self._path(location)
        return p.is_file() or (p.is_dir() and any(q.is_file() for q in p.rglob("*")))

    def list(self, location: str) -> list[str]:
        """Paths (as strings) of every file under the directory ``location``, sorted."""
        p = self._path(location)
        if p.is_file():
            return [str(p)]
        return sorted(str(q) for q in p.rglob("*") if q.is_file()) if p.is_dir() else []

    def write_bytes(self, location: str, data: bytes) -> None:
        """Write ``data`` to the file, creating parent directories."""
        p = self._path(location)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)

    def read_bytes(self, location: str) -> bytes:
        """Read the file.

        Raises:
            StorageError: the file does not exist.
        """
        p = self._path(location)
        if not p.is_file():
            raise StorageError(f"read_bytes: {location} does not exist")
        return p.read_bytes()


def s3_endpoint_from_env() -> str | None:
    """The S3 endpoint URL from the first set variable of ``ENDPOINT_ENV_VARS``, or None (AWS)."""
    for name in ENDPOINT_ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


class S3Storage:
    """``Storage`` on an S3 server through boto3; locations are ``s3://bucket/prefix`` URIs.

    Args:
        endpoint_url: S3 endpoint (``http://127.0.0.1:8333``); None reads ``ENDPOINT_ENV_VARS``.
        region_name: Signing region; most self-hosted servers accept ``us-east-1``.
        max_attempts: botocore retry budget per request (bounded, standard mode).
        client: A ready boto3 S3 client to use instead of building one (tests, custom sessions).
    """

    def __init__(
        self,
        endpoint_url: str | None = None,
        *,
        region_name: str | None = None,
        max_attempts: int = 5,
        client: Any = None,
    ) -> None:
        if client is None:
            import boto3
            from botocore.config import Config

            endpoint = endpoint_url or s3_endpoint_from_env()
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=region_name or os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                config=Config(
                    retries={"max_attempts": max_attempts, "mode": "standard"},
                    s3={"addressing_style": "path"},
                ),
            )
        self.client = client

    def _keys(self, bucket: str, prefix: str) -> Iterator[str]:
        """Every key equal to ``prefix`` or below ``prefix/`` (never ``prefix-other/...``)."""
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = self.client.get_paginator("list_objects_v2")
        list_prefix = f"{prefix}/" if prefix else ""
        try:
            if prefix:
                # An object exactly at the prefix (a single file URI).
                for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
                    for obj in page.get("Contents", []):
                        if obj["Key"] == prefix:
                            yield obj["Key"]
            for page in paginator.paginate(Bucket=bucket, Prefix=list_prefix):
                for obj in page.get("Contents", []):
                    yield obj["Key"]
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"list s3://{bucket}/{prefix}: {exc}") from exc

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` unless it already exists (idempotent).

        Raises:
            StorageError: the server refused for another reason.
        """
        from botocore.exceptions import ClientError

        try:
            self.client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise StorageError(f"create bucket {bucket}: {exc}") from exc

    def upload_dir(self, local_dir: Path, dest: str) -> str:
        """Upload every file under ``local_dir`` to ``dest/<relative path>`` (multipart for big files).

        Raises:
            StorageError: ``local_dir`` is not a directory, or an upload failed.
            ValueError: ``dest`` is not a valid ``s3://`` URI.
        """
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, prefix = parse_s3_uri(dest)
        root = Path(local_dir)
        if not root.is_dir():
            raise StorageError(f"upload_dir: {root} is not a directory")
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            key = f"{prefix}/{rel}" if prefix else rel
            try:
                self.client.upload_file(str(path), bucket, key)
            except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
                raise StorageError(f"upload {path} -> s3://{bucket}/{key}: {exc}") from exc
        return dest

    def download_dir(self, src: str, local_dir: Path) -> Path:
        """Download every object below ``src`` into ``local_dir``, keeping relative paths.

        Raises:
            StorageError: nothing exists below ``src``, a key would escape ``local_dir``
                (``..``), or a download failed.
            ValueError: ``src`` is not a valid ``s3://`` URI.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, prefix = parse_s3_uri(src)
        out = Path(local_dir)
        keys = [k for k in self._keys(bucket, prefix) if k != prefix and not k.endswith("/")]
        if not keys:
            raise StorageError(f"download_dir: no objects below {src}")
        for key in keys:
            rel = _safe_relative(key[len(prefix) + 1 :] if prefix else key, f"s3://{bucket}/{key}")
            target = out.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.client.download_file(bucket, key, str(target))
            except (BotoCoreError, ClientError) as exc:
                raise StorageError(f"download s3://{bucket}/{key} -> {target}: {exc}") from exc
        return out

    def exists(self, location: str) -> bool:
        """Whether ``location`` is an object or a prefix with at least one object below it.

        Raises:
            StorageError: listing failed (missing bucket, bad credentials, unreachable server).
        """
        bucket, prefix = parse_s3_uri(location)
        return next(iter(self._keys(bucket, prefix)), None) is not None

    def list(self, location: str) -> list[str]:
        """``s3://`` URIs of every object at or below ``location``, sorted."""
        bucket, prefix = parse_s3_uri(location)
        return sorted(f"s3://{bucket}/{k}" for k in self._keys(bucket, prefix))

    def write_bytes(self, location: str, data: bytes) -> None:
        """Put one object.

        Raises:
            StorageError: the server refused the write.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = parse_s3_uri(location)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"put {location}: {exc}") from exc

    def read_bytes(self, location: str) -> bytes:
        """Get one object.

        Raises:
            StorageError: the object does not exist or the server refused the read.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = parse_s3_uri(location)
        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except (BotoCoreError, ClientError) as exc:
            raise StorageError(f"get {location}: {exc}") from exc

    def read_bytes_if_exists(self, location: str) -> bytes | None:
        """Get one object, or None when it does not exist (``NoSuchKey`` / 404).

        Raises:
            StorageError: the server refused the read for another reason (missing bucket,
                credentials, unreachable after botocore's bounded retries).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = parse_s3_uri(location)
        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise StorageError(f"get {location}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"get {location}: {exc}") from exc

    def delete(self, location: str) -> int:
        """Delete the object at ``location`` and every object below ``location/``; return how many.

        Raises:
            StorageError: listing or deleting failed (the message names the first failed key).
        """
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, prefix = parse_s3_uri(location)
        keys = list(self._keys(bucket, prefix))
        for start in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = keys[start : start + 1000]
            try:
                reply = self.client.delete_objects(
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}
                )
            except (BotoCoreError, ClientError) as exc:
                raise StorageError(f"delete s3://{bucket}/{prefix}: {exc}") from exc
            errors = reply.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"delete s3://{bucket}/{first.get('Key')}: {first.get('Code')} {first.get('Message')} "
                    f"({len(errors)} keys failed)"
                )
        return len(keys)


def storage_for(location: str, *, endpoint_url: str | None = None) -> Storage:
    """``S3Storage`` for ``s3://`` URIs, ``LocalStorage`` for everything else.

    Raises:
        ValueError: an unsupported URI scheme (``gs://``, ``http://``...).
    """
    if is_s3_uri(location):
        return S3Storage(endpoint_url)
    scheme, sep, _ = location.partition("://")
    if sep and scheme != "file":
        raise ValueError(f"location {location!r}: unsupported scheme {scheme!r} (use a path, file:// or s3://)")
    return LocalStorage()


def materialize(location: str, cache_dir: Path, *, endpoint_url: str | None = None) -> Path:
    """Return a local directory holding ``location``'s files, downloading ``s3://`` URIs to ``cache_dir``.

    A local path is returned as is (no copy). An S3 URI is downloaded into
    ``cache_dir/<bucket>/<prefix>`` unless that directory already exists and is non-empty.

    Raises:
        StorageError: the location does not exist or a download failed.
    """
    if not is_s3_uri(location):
        path = LocalStorage._path(location)
        if not path.exists():
            raise StorageError(f"{location}: no such file or directory")
        return path
    bucket, prefix = parse_s3_uri(location)
    target = Path(cache_dir) / bucket / prefix
    if target.is_dir() and any(target.iterdir()):
        return target
    return S3Storage(endpoint_url).download_dir(location, target)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``ls LOCATION``, ``get LOCATION DIR``, ``put DIR LOCATION``."""
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m posttrain.storage ls LOCATION | get LOCATION DIR | put DIR LOCATION"
    try:
        if len(args) == 2 and args[0] == "ls":
            for item in storage_for(args[1]).list(args[1]):
                print(item)
        elif len(args) == 3 and args[0] == "get":
            storage_for(args[1]).download_dir(args[1], Path(args[2]))
        elif len(args) == 3 and args[0] == "put":
            storage_for(args[2]).upload_dir(Path(args[1]), args[2])
        else:
            print(usage, file=sys.stderr)
            return 2
    except (StorageError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
