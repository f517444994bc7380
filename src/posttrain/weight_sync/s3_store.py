"""Versioned weight store on S3: the cluster-mode twin of ``FilesystemWeightStore``.

Learner and generator pods of one SAO JobSet share no volume; they share the tenant's S3
prefix. Layout under ``s3://bucket/prefix`` (the same as the filesystem store, plus a marker)::

    prefix/v000000/model.safetensors   every tensor, always with lm_head.weight
    prefix/v000000/config.json ...     config and tokenizer files (``store.COPIED_CONFIG_FILES``)
    prefix/v000000/PUBLISHED           written after the files: a random publish id
    prefix/LATEST                      written after PUBLISHED: the newest policy version, e.g. "3" and a newline

S3 has no directory rename, so completeness comes from write order: a version's files, then its
``PUBLISHED`` marker, then ``LATEST``. A reader that sees ``LATEST = k`` therefore finds ``vk``
complete; ``path_for`` refuses a version without a marker. An overwrite (a restarted learner
re-publishing a version) deletes the marker first, and the new marker carries a new publish id,
so a download that overlapped the overwrite is detected (marker before != marker after) and done
again, a bounded number of times.

``path_for(v)`` downloads a version once into ``cache_dir/vNNNNNN-<publish id>`` (a temporary
directory renamed into place), so the returned directory is a loadable transformers model
directory, as for the filesystem store, and an overwritten version gets a new directory. The
cache keeps the newest ``cache_keep`` versions.

Every S3 request goes through ``posttrain.storage.S3Storage`` (botocore's bounded retries); a
failure raises ``posttrain.storage.StorageError`` naming the URI.

Run the tests: ``python -m pytest -q tests/unit/weight_sync/test_s3_weight_store.py``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from posttrain.storage import S3Storage, StorageError, parse_s3_uri
from posttrain.weight_sync.store import (
    LATEST_FILE,
    WEIGHTS_FILE,
    check_publish_order,
    version_dirname,
    write_version_files,
)

PUBLISHED_FILE = "PUBLISHED"
"""Marker object written last inside a version prefix; its text is the publish id."""


def _parse_version_dirname(name: str) -> int | None:
    """``v000042`` -> 42; anything else -> None."""
    return int(name[1:]) if name.startswith("v") and name[1:].isdigit() else None


class S3WeightStore:
    """A ``WeightStore`` under an ``s3://bucket/prefix`` URI, with a local download cache.

    Single writer (the learner), any number of readers (generators), on any machines that reach
    the S3 server.

    Args:
        uri: ``s3://bucket/prefix`` of the store.
        cache_dir: Local directory for downloaded (and, on the learner, just published) versions.
        storage: The S3 client wrapper; None builds one from the environment
            (``AWS_ENDPOINT_URL``... see ``posttrain.storage``).
        cache_keep: Versions kept in ``cache_dir`` (>= 1); older ones are deleted after each new
            version arrives there.
        download_attempts: Downloads of one version before giving up when it keeps changing
            underneath (a concurrent overwrite) or its objects vanish mid-download.

    Raises:
        ValueError: ``uri`` is not a valid ``s3://`` URI, or ``cache_keep`` / ``download_attempts`` < 1.
    """

    def __init__(
        self,
        uri: str,
        cache_dir: Path | str,
        *,
        storage: S3Storage | None = None,
        cache_keep: int = 2,
        download_attempts: int = 3,
    ) -> None:
        bucket, prefix = parse_s3_uri(uri)
        if cache_keep < 1:
            raise ValueError(f"cache_keep: must be >= 1, got {cache_keep}")
        if download_attempts < 1:
            raise ValueError(f"download_attempts: must be >= 1, got {download_attempts}")
        self.uri = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.storage = storage if storage is not None else S3Storage()
        self.cache_dir = Path(cache_dir)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.cache_keep = cache_keep
        self.download_attempts = download_attempts

    # ------------------------------------------------------------------------------ locations
    def version_uri(self, policy_version: int) -> str:
        """``s3://.../vNNNNNN`` of a version.

        Raises:
            ValueError: ``policy_version`` is negative.
        """
        if policy_version < 0:
            raise ValueError(f"policy_version: must be >= 0, got {policy_version}")
        return f"{self.uri}/{version_dirname(policy_version)}"

    def _publish_id(self, policy_version: int) -> str | None:
        """The version's publish id (32 hex digits), or None when it has no marker.

        Raises:
            ValueError: the marker holds something else (it names a cache directory, so it is checked).
        """
        location = f"{self.version_uri(policy_version)}/{PUBLISHED_FILE}"
        data = self.storage.read_bytes_if_exists(location)
        if data is None:
            return None
        text = data.decode("utf-8", errors="replace").strip()
        if len(text) != 32 or any(ch not in "0123456789abcdef" for ch in text):
            raise ValueError(f"{location}: expected a 32-digit hex publish id, got {text[:80]!r}")
        return text

    def _version_prefixes(self) -> list[int]:
        """Every version with at least one object (complete or not), ascending."""
        found: set[int] = set()
        for location in self.storage.list(self.uri):
            rel = location[len(self.uri) + 1 :]
            head, sep, _ = rel.partition("/")
            version = _parse_version_dirname(head) if sep else None
            if version is not None:
                found.add(version)
        return sorted(found)

    def versions(self) -> list[int]:
        """Published versions (those with a ``PUBLISHED`` marker), ascending.

        Raises:
            posttrain.storage.StorageError: listing failed.
        """
        return [v for v in self._version_prefixes() if self._publish_id(v) is not None]

    # --------------------------------------------------------------------------------- reading
    def latest_version(self) -> int | None:
        """The version in ``<uri>/LATEST``, or None if nothing was published.

        Raises:
            ValueError: ``LATEST`` does not hold a non-negative integer (the message names the URI).
            posttrain.storage.StorageError: the read failed for another reason than a missing object.
        """
        location = f"{self.uri}/{LATEST_FILE}"
        data = self.storage.read_bytes_if_exists(location)
        if data is None:
            return None
        text = data.decode("utf-8", errors="replace").strip()
        if not text.isdigit():
            raise ValueError(f"{location}: expected a non-negative integer policy version, got {text!r}")
        return int(text)

    def path_for(self, policy_version: int) -> Path:
        """Local directory of a published version, downloaded into the cache the first time.

        One GET of the version's marker per call; the download happens only when the cache has
        no directory for this version's current publish id.

        Args:
            policy_version: A published version (count of weight publications).

        Returns:
            ``cache_dir/vNNNNNN-<publish id>``: ``model.safetensors``, config and tokenizer files.

        Raises:
            ValueError: ``policy_version`` is negative.
            FileNotFoundError: the version is not published (no marker: never published, pruned,
                or being overwritten right now).
            posttrain.storage.StorageError: the download failed, or the version changed during
                each of ``download_attempts`` downloads.
        """
        source = self.version_uri(policy_version)
        publish_id = self._publish_id(policy_version)
        last_error = ""
        for _ in range(self.download_attempts):
            if publish_id is None:
                raise FileNotFoundError(f"policy_version {policy_version}: {source} is not published "
                                        f"(no {PUBLISHED_FILE} marker)")
            final = self.cache_dir / f"{version_dirname(policy_version)}-{publish_id}"
            if final.is_dir():
                return final
            tmp = self.cache_dir / f".download-{version_dirname(policy_version)}-{uuid.uuid4().hex}"
            try:
                self.storage.download_dir(source, tmp)
            except StorageError as exc:  # objects deleted by a concurrent overwrite or prune
                shutil.rmtree(tmp, ignore_errors=True)
                last_error = str(exc)
                publish_id = self._publish_id(policy_version)
                continue
            after = self._publish_id(policy_version)
            if after != publish_id:  # overwritten while downloading: the files may be mixed
                shutil.rmtree(tmp, ignore_errors=True)
                last_error = f"publish id changed from {publish_id} to {after} during the download"
                publish_id = after
                continue
            return self._commit_to_cache(tmp, final, policy_version)
        raise StorageError(
            f"path_for({policy_version}): {source} changed or vanished during {self.download_attempts} "
            f"downloads; last error: {last_error}"
        )

    def load_state_dict(self, policy_version: int) -> dict[str, Tensor]:
        """Read back the tensors of a published version (CPU tensors as saved).

        Raises:
            FileNotFoundError: the version is not published.
            posttrain.storage.StorageError: the download failed.
        """
        from safetensors.torch import load_file

        return load_file(str(self.path_for(policy_version) / WEIGHTS_FILE))

    # --------------------------------------------------------------------------------- writing
    def publish(
        self,
        state_dict: Mapping[str, Tensor],
        policy_version: int,
        config_dir: Path,
        *,
        overwrite: bool = False,
    ) -> Path:
        """Upload ``v{policy_version}``, then its ``PUBLISHED`` marker, then point ``LATEST`` at it.

        Args:
            state_dict: HF checkpoint names to tensors (any dtype; saved as given). Missing
                ``lm_head.weight`` (or a tied model) gets a copy of ``model.embed_tokens.weight``.
            policy_version: Count of weight publications; 0 is the initial weights. Must exceed
                the latest published version unless ``overwrite``.
            config_dir: Model directory whose config and tokenizer files are copied
                (``store.COPIED_CONFIG_FILES``; ``config.json`` is required).
            overwrite: Replace an existing version (a restarted learner); its old marker and
                objects are deleted first, and ``LATEST`` is then set to ``policy_version`` even
                if it was higher.

        Returns:
            The version's local cache directory (what ``path_for`` returns for it).

        Raises:
            ValueError: negative ``policy_version``, ``policy_version`` not above the latest one
                without ``overwrite``, or a bad ``state_dict``.
            FileNotFoundError: ``config_dir`` has no ``config.json``.
            FileExistsError: the version is published and ``overwrite`` is False.
            posttrain.storage.StorageError: an upload or delete failed (the message names the URI).
        """
        target = self.version_uri(policy_version)
        config_dir = Path(config_dir)
        if not (config_dir / "config.json").is_file():
            raise FileNotFoundError(f"config_dir {config_dir}: no config.json to copy into the weight store")
        existing = self._publish_id(policy_version)
        check_publish_order(
            policy_version, self.latest_version(), exists=existing is not None, overwrite=overwrite, where=target
        )
        publish_id = uuid.uuid4().hex
        tmp = self.cache_dir / f".publish-{version_dirname(policy_version)}-{publish_id}"
        tmp.mkdir()
        try:
            write_version_files(tmp, state_dict, policy_version, config_dir)
            # Marker first: from here on readers see "not published", never a mix of two versions.
            self.storage.delete(f"{target}/{PUBLISHED_FILE}")
            self.storage.delete(target)  # leftovers of an overwritten or half-uploaded version
            self.storage.upload_dir(tmp, target)
            self.storage.write_bytes(f"{target}/{PUBLISHED_FILE}", publish_id.encode())
            (tmp / PUBLISHED_FILE).write_text(publish_id, encoding="utf-8")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.storage.write_bytes(f"{self.uri}/{LATEST_FILE}", f"{policy_version}\n".encode())
        final = self.cache_dir / f"{version_dirname(policy_version)}-{publish_id}"
        return self._commit_to_cache(tmp, final, policy_version)

    def prune(self, keep: int = 3) -> list[int]:
        """Delete all but the newest ``keep`` versions on S3 and in the cache; never ``LATEST``'s.

        A version's marker is deleted before its other objects, so a reader never downloads a
        half-deleted version. Readers should reload within ``keep - 1`` publications of polling
        ``LATEST``.

        Args:
            keep: Versions to keep (>= 1).

        Returns:
            The deleted versions, ascending (half-uploaded ones included).

        Raises:
            ValueError: ``keep < 1``.
            posttrain.storage.StorageError: listing or deleting failed.
        """
        if keep < 1:
            raise ValueError(f"keep: must be >= 1, got {keep}")
        latest = self.latest_version()
        doomed = [v for v in self._version_prefixes()[:-keep] if v != latest]
        for version in doomed:
            self.storage.delete(f"{self.version_uri(version)}/{PUBLISHED_FILE}")
            self.storage.delete(self.version_uri(version))
            for _, cached in self._cached(version):
                shutil.rmtree(cached)
        return doomed

    # ----------------------------------------------------------------------------------- cache
    def _cached(self, policy_version: int | None = None) -> list[tuple[int, Path]]:
        """Cache directories ``(version, path)`` of one version (or all), oldest version first."""
        out = []
        for entry in self.cache_dir.iterdir():
            head, sep, _ = entry.name.partition("-")
            version = _parse_version_dirname(head) if sep and entry.is_dir() else None
            if version is not None and (policy_version is None or version == policy_version):
                out.append((version, entry))
        return sorted(out)

    def _commit_to_cache(self, tmp: Path, final: Path, policy_version: int) -> Path:
        """Rename ``tmp`` to ``final`` (another process may have won the race), then trim the cache."""
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            shutil.rmtree(tmp)  # the same publish id arrived through another process: identical files
        newest = sorted({version for version, _ in self._cached()})[-self.cache_keep :]
        for version, path in self._cached():
            if path != final and (version == policy_version or version not in newest):
                # An overwritten publication of this version, or a version older than the newest kept.
                shutil.rmtree(path, ignore_errors=True)
        return final
