"""What one pod asks Kubernetes for (``PodResources``), and Kubernetes quantities (``"8"``, ``"64Gi"``).

The one place that decides what a valid quantity is: the run config's ``learner.resources`` and
``generator.resources``, the SAO JobSet builder (``posttrain.cluster.jobset``) and the tenant
renderer (``posttrain.cluster.tenant``) all check quantities here.

Try it: ``python -c "from posttrain.config.resources import PodResources; print(PodResources(cpu=8,
memory='64Gi', gpus=1))"``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from posttrain.config.common import _Strict

QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
"""A plain decimal Kubernetes quantity with an optional suffix (no exponent form such as ``1e3``)."""
_QUANTITY_FACTOR: dict[str | None, float] = {
    None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
QUANTITY_HINT = "a Kubernetes quantity such as '8', '500m' or '64Gi'"
"""How error messages describe a valid quantity."""
MAX_GPUS_PER_POD = 64
"""Upper bound of ``PodResources.gpus`` (devices on one node)."""


def is_quantity(value: object) -> bool:
    """True when ``value`` is a string that ``QUANTITY`` accepts (``"8"``, ``"500m"``, ``"64Gi"``)."""
    return isinstance(value, str) and QUANTITY.match(value) is not None


def quantity_value(quantity: str) -> float:
    """Convert a Kubernetes quantity to a number (cores or bytes): ``"500m"`` -> 0.5, ``"2Ki"`` -> 2048.0.

    Raises:
        ValueError: not a plain decimal quantity with an optional suffix.
    """
    match = QUANTITY.match(quantity) if isinstance(quantity, str) else None
    if not match:
        raise ValueError(f"{quantity!r} is not {QUANTITY_HINT}")
    return float(match.group(1)) * _QUANTITY_FACTOR[match.group(3)]


def quantity_bytes(quantity: str) -> int:
    """Convert a Kubernetes quantity to a whole number: ``"8Gi"`` -> 8589934592, ``"500m"`` -> 0 (rounded down).

    Raises:
        ValueError: not a plain decimal quantity with an optional suffix.
    """
    return int(quantity_value(quantity))


class PodResources(_Strict):
    """What one pod of a replicatedJob asks for; requests equal limits for memory and GPUs.

    Numbers are accepted where YAML gives them (``cpu: 32`` is ``"32"``). Frozen, so one instance
    can serve as a default.

    Raises (on construction):
        pydantic.ValidationError: a field is not a quantity, ``gpus`` is outside [0, 64], ``cpu`` or
            ``memory`` is zero, or ``shm`` exceeds ``memory``; the error's location names the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: str
    """CPU request (cores, a quantity such as ``"8"`` or ``"500m"``); no CPU limit is set."""
    memory: str
    """Memory request and limit (bytes, a quantity such as ``"64Gi"``); includes ``shm``."""
    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_POD)
    """``nvidia.com/gpu`` request and limit (devices); > 0 also adds the GPU toleration."""
    shm: str | None = None
    """Size of the memory-backed ``/dev/shm`` (bytes, a quantity), or None for the container
    runtime's 64 MiB default. vLLM, NCCL and torch data loaders need more."""

    @field_validator("cpu", "memory", "shm", mode="before")
    @classmethod
    def _number_as_text(cls, value: Any) -> Any:
        """YAML reads ``cpu: 32`` as an int; a quantity is text."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("cpu", "memory", "shm")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not is_quantity(value):
            raise ValueError(f"not {QUANTITY_HINT}")
        return value

    @field_validator("cpu", "memory")
    @classmethod
    def _positive(cls, value: str) -> str:
        if quantity_value(value) <= 0:
            raise ValueError("must be greater than 0")
        return value

    @model_validator(mode="after")
    def _shm_within_memory(self) -> PodResources:
        """``/dev/shm`` is memory-backed and counts against the pod's memory limit."""
        if self.shm is not None and quantity_value(self.shm) > quantity_value(self.memory):
            raise ValueError(
                f"shm ({self.shm}) must not exceed memory ({self.memory}): /dev/shm counts against the memory limit"
            )
        return self


def fill_resources(default: PodResources, value: Any) -> Any:
    """Complete a partial ``resources`` mapping from a section's default.

    So ``learner.resources.gpus=4`` keeps the learner's default ``cpu``, ``memory`` and ``shm``.
    Anything but a mapping is returned unchanged (and validated as usual).
    """
    if isinstance(value, dict):
        return {**default.model_dump(), **value}
    return value

