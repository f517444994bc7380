"""Container images the components run in (built from ``images/<role>/Dockerfile``), from ``images/digests.yaml``.

The registry, the tag and each role's digest are set in the lock file ``images/digests.yaml``
(or, for one compile, ``python -m pipelines.compile --registry R --digests FILE``, which sets
``$POSTTRAIN_IMAGE_REGISTRY`` / ``$POSTTRAIN_IMAGE_LOCK`` before this module is imported). A
reference is ``<registry>/<role>:<tag>@sha256:<digest>``, or ``<registry>/<role>:<tag>`` while the
role's digest is empty. Run ``python -m pipelines.compile`` after changing either, so the committed
pipeline YAML picks them up.

* ``BASE_IMAGE``: no torch; data preparation (``prepare_dataset``) and the MLflow server.
* ``TRAINER_IMAGE``: CUDA torch + posttrain + kfp; every step that loads a model (``train_*``,
  ``evaluate``, ``register_model``, which logs a transformers model) and the launcher of the SAO
  JobSet (``train_sao``).
* ``GENERATOR_IMAGE``: vLLM + posttrain; the generator pods of the SAO JobSet.

Run: ``python -m components.images`` prints them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

LOCK_FILE = Path(__file__).resolve().parents[1] / "images" / "digests.yaml"
"""The committed image lock: registry, tag and one digest per role."""
LOCK_ENV = "POSTTRAIN_IMAGE_LOCK"
"""Environment variable naming another lock file (``pipelines.compile --digests``)."""
REGISTRY_ENV = "POSTTRAIN_IMAGE_REGISTRY"
"""Environment variable overriding the lock's registry (``pipelines.compile --registry``)."""
ROLES = ("base", "trainer", "generator")
"""Roles with a posttrain image (``sandbox`` is started by the SWE environment, not by a pipeline)."""

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REPO_PATH = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


class ImageLockError(ValueError):
    """The lock file or the registry override is malformed; the message names the file and field."""


@dataclass(frozen=True)
class ImageLock:
    """Registry, tag and per-role digests of the posttrain images.

    Attributes:
        registry: Registry host and path, e.g. ``ghcr.io/acme/posttrain`` (the host part has a ``.``
            or ``:`` or is ``localhost``, so Kubernetes never resolves it to Docker Hub).
        tag: Image tag shared by the roles.
        digests: Role -> ``sha256:<64 hex>`` or ``""`` (not pinned yet).
    """

    registry: str
    tag: str
    digests: dict[str, str]

    def ref(self, role: str) -> str:
        """``<registry>/<role>:<tag>@<digest>``, or without ``@<digest>`` when the role has none.

        Raises:
            KeyError: ``role`` is not one of ``ROLES``.
        """
        if role not in ROLES:
            raise KeyError(f"role {role!r} is not one of {list(ROLES)}")
        digest = self.digests.get(role, "")
        return f"{self.registry}/{role}:{self.tag}" + (f"@{digest}" if digest else "")


def check_registry(registry: str, where: str) -> str:
    """Return ``registry`` without a trailing ``/`` if its first component is a registry host.

    Raises:
        ImageLockError: empty, no host (``posttrain`` would mean ``docker.io/posttrain``), or a
            path that is not a valid repository name; ``where`` names the file and field.
    """
    registry = (registry or "").strip().rstrip("/")
    host, _, path = registry.partition("/")
    if not registry or not ("." in host or ":" in host or host == "localhost"):
        raise ImageLockError(f"{where}: {registry!r} has no registry host (e.g. ghcr.io/acme/posttrain); "
                             "without one Kubernetes pulls from docker.io")
    if path and not _REPO_PATH.match(path):
        raise ImageLockError(f"{where}: {path!r} is not a repository path (lowercase a-z0-9 separated by . _ - /)")
    return registry


def load_lock(path: Path | str = LOCK_FILE, registry: str | None = None) -> ImageLock:
    """Read and check an image lock file; ``registry`` (if given) replaces the file's registry.

    Raises:
        ImageLockError: the file is missing, not a mapping, or a field is malformed (``file: field``
            in the message).
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ImageLockError(f"{path}: cannot read the image lock: {exc}") from exc
    if not isinstance(data, dict) or set(data) != {"registry", "tag", "digests"}:
        raise ImageLockError(f"{path}: must be a mapping with exactly registry, tag and digests")
    reg = check_registry(registry if registry else str(data["registry"]),
                         "--registry" if registry else f"{path}: registry")
    tag = str(data["tag"])
    if not _TAG.match(tag):
        raise ImageLockError(f"{path}: tag: {tag!r} is not a valid image tag")
    digests = data["digests"]
    if not isinstance(digests, dict) or set(digests) != set(ROLES):
        raise ImageLockError(f"{path}: digests: must name exactly {list(ROLES)}, got {sorted(digests or {})}")
    for role, digest in digests.items():
        if digest and not _DIGEST.match(str(digest)):
            raise ImageLockError(f"{path}: digests.{role}: {digest!r} is not sha256:<64 lowercase hex> or \"\"")
    return ImageLock(registry=reg, tag=tag, digests={r: str(d or "") for r, d in digests.items()})


LOCK = load_lock(os.environ.get(LOCK_ENV) or LOCK_FILE, os.environ.get(REGISTRY_ENV) or None)
"""The lock this process compiles with (read once, at import)."""
REGISTRY = LOCK.registry
TAG = LOCK.tag
BASE_IMAGE = LOCK.ref("base")
TRAINER_IMAGE = LOCK.ref("trainer")
GENERATOR_IMAGE = LOCK.ref("generator")

if __name__ == "__main__":
    print("\n".join((BASE_IMAGE, TRAINER_IMAGE, GENERATOR_IMAGE)))
