"""The learner's process group: one ``World`` per process, from ``torchrun``'s environment.

``torchrun --nproc_per_node N`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``; ``init_world`` reads them. Without them (a plain ``python`` process) the
world has one rank and no process group, and every collective below is the identity.

Tensors that train travel over the device's backend (NCCL on CUDA, gloo on the CPU). Control
data (a batch's encoded rollouts, metric sums) travels over a gloo group on the CPU, as bytes or
float64 tensors: no pickle on the wire.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from posttrain.config.sections import LearnerConfig


class DeviceError(RuntimeError):
    """The configured learner device does not exist on this machine (``learner.device``)."""


@dataclass(frozen=True)
class World:
    """This process's place among the learner's ranks.

    Attributes:
        rank: Global rank (0 .. size - 1); rank 0 reads the stream, logs and publishes.
        size: Number of learner processes (ranks).
        local_rank: Rank on this node (selects ``cuda:<local_rank>``).
        device: Where models and batches live.
        control: Process group for control data on the CPU (gloo), or None with one rank.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    control: Any = None

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True with more than one rank (models are sharded with FSDP2)."""
        return self.size > 1

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over all ranks (float64); the values themselves with one rank."""
        if not self.distributed or not values:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, group=self.control)
        return t.tolist()

    def max_floats(self, values: Sequence[float]) -> list[float]:
        """Element-wise maximum of ``values`` over all ranks (float64); the values themselves with one rank."""
        if not self.distributed or not values:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return t.tolist()

    def max(self, value: int) -> int:
        """The largest ``value`` over all ranks."""
        if not self.distributed:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control)
        return int(t.item())

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's ``payload`` on every rank (others pass None); with one rank, ``payload``.

        Raises:
            ValueError: rank 0 passed None.
        """
        if not self.distributed:
            if payload is None:
                raise ValueError("broadcast_bytes: rank 0 must give a payload")
            return payload
        if self.is_main and payload is None:
            raise ValueError("broadcast_bytes: rank 0 must give a payload")
        size = torch.tensor([len(payload) if self.is_main and payload is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.control)
        if self.is_main and payload is not None:
            buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if int(size.item()):
            dist.broadcast(buf, src=0, group=self.control)
        return bytes(buf.numpy().tobytes())

    def all_gather_bytes(self, payload: bytes) -> list[bytes]:
        """Every rank's ``payload``, in rank order, on every rank (``[payload]`` with one rank).

        Two all-gathers over the control group: the lengths, then the bytes padded to the
        longest. Every rank must call it.
        """
        if not self.distributed:
            return [payload]
        size = torch.tensor([len(payload)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(sizes, size, group=self.control)
        longest = max(max(int(n.item()) for n in sizes), 1)
        buf = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]
        dist.all_gather(bufs, buf, group=self.control)
        return [bytes(b[: int(n.item())].numpy().tobytes()) for b, n in zip(bufs, sizes, strict=True)]

    def barrier(self) -> None:
        """Wait until every rank gets here (nothing with one rank)."""
        if self.distributed:
            dist.barrier(group=self.control)


def resolve_device(setting: str, local_rank: int = 0) -> torch.device:
    """The torch device for ``learner.device`` (``auto``, ``cpu`` or ``cuda``).

    Raises:
        DeviceError: ``cuda`` asked for where torch sees no CUDA device.
    """
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise DeviceError(
            f"learner.device: 'cuda' asked for, but torch ({torch.__version__}, {build}) sees no CUDA device "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use 'auto' or 'cpu'"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:  # pragma: no cover - CUDA only
        raise DeviceError(f"learner.device: local rank {local_rank} needs cuda:{local_rank}, but only {count} GPUs")
    return torch.device("cuda", local_rank)  # pragma: no cover - CUDA only


_WORLD: World | None = None


def init_world(config: LearnerConfig) -> World:
    """The process's ``World``, creating the process group on first call when ``torchrun`` started it.

    With ``WORLD_SIZE`` unset or 1: one rank, no process group. Otherwise ``init_process_group``
    with NCCL (CUDA) or gloo (CPU) and a gloo group for control data. Later calls return the
    same world.

    Raises:
        DeviceError: ``learner.device`` is ``cuda`` and there is none.
        ValueError: ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` are not integers.
    """
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        int(os.environ.get("RANK", "0"))  # checked here, read again by init_process_group
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as exc:
        raise ValueError(f"RANK, WORLD_SIZE and LOCAL_RANK must be integers (torchrun sets them): {exc}") from exc
    device = resolve_device(config.device, local_rank)
    if size <= 1:
        _WORLD = World(device=device)
        return _WORLD
    if not dist.is_initialized():
        if device.type == "cuda":  # pragma: no cover - CUDA only
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    control = dist.new_group(backend="gloo") if device.type == "cuda" else None  # pragma: no branch
    _WORLD = World(rank=dist.get_rank(), size=dist.get_world_size(), local_rank=local_rank, device=device,
                   control=control)
    return _WORLD


def shutdown_world() -> None:
    """Destroy the process group (if any) and forget the world; the next ``init_world`` starts afresh."""
    global _WORLD
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _WORLD = None
