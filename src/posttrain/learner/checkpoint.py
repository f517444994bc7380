"""Learner checkpoints with ``torch.distributed.checkpoint`` (DCP): sharded, and resumable on any rank count.

Layout of one checkpoint directory (``<run>/checkpoints/iter-000012/``)::

    dcp/                    DCP files: one ``__<rank>_0.distcp`` per rank that wrote it, ``.metadata``
                            (model and optimizer state of each part: ``policy``, ``critic``)
    state.json              iteration, policy_version, consumed_entry_ids, baseline, counters,
                            generator positions (LearnerState),
                            LR scheduler states, the torch RNG, and the layout (ranks, parameter shapes)
    resolved_config.yaml    the run config that produced it

Every rank writes its own shards; DCP records each tensor's global shape and the slice each file
holds, so a checkpoint written by 2 ranks loads on 1 and one written by 1 loads on 2 (FSDP2
parameters are ``DTensor`` s; ``torch.distributed.checkpoint.state_dict`` maps model and optimizer
state to and from that form). The final model is exported as HF safetensors separately
(``learner.export``), gathered from the shards.

``<run>/checkpoints/LATEST`` names the newest complete checkpoint; a checkpoint is written to a
temporary directory and renamed, so a learner killed mid-write leaves the previous one intact.

Stream position: ``consumed_entry_ids`` lists stream entries used by optimizer steps included in
this checkpoint but not yet acknowledged. The learner acknowledges them right after the checkpoint
is durable; a learner killed between the two acknowledges them on restart instead of training on
them again. Entries consumed after the checkpoint are still pending in the consumer group and are
re-delivered, so no rollout is lost and none is trained on twice.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posttrain.learner.types import Trainable
from posttrain.parallel.world import World

FORMAT = "dcp-1"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be loaded into this learner (its message names the file and what differs)."""


@dataclass
class LearnerState:
    """Counters restored on resume.

    Attributes:
        iteration: Learner iterations done (critic warm-up included).
        policy_version: Policy optimizer steps done = weight publications after v0.
        consumed_entry_ids: Stream entry ids trained on since the previous acknowledgement.
        baseline_rewards: Running-mean baseline window (rewards), when used.
        counters: Cumulative counts (``rollouts_trained``, ``stale_dropped``...).
        generator_positions: Generator index -> episode counters reserved, read from the run's
            Redis when the checkpoint was written (``posttrain.rollout.positions``); a learner
            resumed on a Redis that lost them writes them back. Empty in checkpoints from before.
        account: The learner process's time account when the checkpoint was written, every life
            summed (``posttrain.account.StateClock.record``: ``shares`` seconds by state,
            ``used_cpu_s``, ``lives``); a resumed learner adds its own life to it (``StateClock.carry``).
            Empty when no account was kept, and in checkpoints from before (issue 35).
    """

    iteration: int = 0
    policy_version: int = 0
    consumed_entry_ids: list[str] = field(default_factory=list)
    baseline_rewards: list[float] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    generator_positions: dict[str, int] = field(default_factory=dict)
    account: dict[str, Any] = field(default_factory=dict)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    pointer = root / "LATEST"
    if not pointer.exists():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "state.json").exists() else None


def checkpoint_state(path: Path) -> dict[str, Any]:
    """The learner's counters a checkpoint holds, read without loading a tensor.

    ``state.json``'s ``state``: ``iteration``, ``policy_version``, ``counters``...

    Raises:
        OSError: ``state.json`` cannot be read. ValueError: it is not JSON. KeyError: it has no ``state``.
    """
    return dict(json.loads((path / "state.json").read_text(encoding="utf-8"))["state"])


@contextlib.contextmanager
def _single_process_quiet(world: World) -> Iterator[None]:
    """Silence DCP's warning that it saves or loads in one process: with one rank that is the intent."""
    with warnings.catch_warnings():
        if not world.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _shapes(model: nn.Module) -> dict[str, list[int]]:
    """Global shape of every tensor in ``model.state_dict()`` (a ``DTensor`` reports its global shape)."""
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def _dcp_state(parts: dict[str, Trainable]) -> dict[str, Any]:
    """The model and optimizer state dicts DCP saves or loads in place, keyed ``<part>`` / ``<part>_opt``."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    out: dict[str, Any] = {}
    for name, part in parts.items():
        if part.optimizer is not None:
            out[name], out[f"{name}_opt"] = get_state_dict(part.model, part.optimizer)
        else:
            out[name] = get_model_state_dict(part.model)
    return out


def save_checkpoint(root: Path, *, state: LearnerState, parts: dict[str, Trainable], resolved_config_yaml: str,
                    world: World | None = None, keep: int = 2) -> Path:
    """Write a checkpoint atomically (every rank its shards) and point ``LATEST`` at it.

    Every rank must call this with the same ``state``; rank 0 writes ``state.json`` and renames.

    Args:
        root: Checkpoints directory.
        state: Counters and the stream position.
        parts: ``policy`` (and ``critic``): model, optimizer, LR scheduler (optimizer and scheduler
            may be None for a model saved alone).
        resolved_config_yaml: The run config, saved beside the weights.
        world: The learner's ranks (one process when None).
        keep: Older checkpoints kept besides the new one.

    Returns:
        The checkpoint directory.

    Raises:
        OSError: the directory could not be written (the previous checkpoint stays LATEST).
    """
    import torch.distributed.checkpoint as dcp

    world = world or World()
    name = f"iter-{state.iteration:06d}"
    tmp, final = root / f".tmp-{name}", root / name
    if world.is_main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    world.barrier()
    with _single_process_quiet(world):
        dcp.save(_dcp_state(parts), checkpoint_id=str(tmp / "dcp"), no_dist=not world.distributed)
    world.barrier()
    if world.is_main:
        meta = {
            "format": FORMAT,
            "state": asdict(state),
            "schedulers": {n: p.scheduler.state_dict() for n, p in parts.items() if p.scheduler is not None},
            "rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
            "layout": {"ranks": world.size, "shapes": {n: _shapes(p.model) for n, p in parts.items()}},
        }
        (tmp / "resolved_config.yaml").write_text(resolved_config_yaml, encoding="utf-8")
        (tmp / "state.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        pointer_tmp = root / "LATEST.tmp"
        pointer_tmp.write_text(name, encoding="utf-8")
        pointer_tmp.replace(root / "LATEST")
        done = sorted(p for p in root.glob("iter-*") if p.is_dir())
        for old in done[: max(0, len(done) - 1 - keep)]:
            shutil.rmtree(old)
    world.barrier()
    return final


def _check_layout(path: Path, meta: dict[str, Any], parts: dict[str, Trainable]) -> None:
    """Refuse a checkpoint of another format, another model shape, or with shard files missing."""
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path}: format {meta.get('format', 'policy/ + optim.pt (before distributed checkpoints)')!r}, "
            f"this learner reads {FORMAT!r}; start from its policy/ directory as a new run's model.path instead")
    layout = meta["layout"]
    for name, part in parts.items():
        saved = layout["shapes"].get(name)
        if saved is None:
            raise CheckpointError(f"checkpoint {path}: has no {name!r} (it holds {sorted(layout['shapes'])})")
        here = _shapes(part.model)
        for key in sorted(set(saved) | set(here)):
            if saved.get(key) != here.get(key):
                raise CheckpointError(
                    f"checkpoint {path}: {name}.{key} has shape {saved.get(key)} there and {here.get(key)} in this "
                    f"model; a checkpoint of a different model shape cannot be loaded")
    dcp_dir = path / "dcp"
    missing = [f"__{r}_0.distcp" for r in range(int(layout["ranks"])) if not (dcp_dir / f"__{r}_0.distcp").exists()]
    if not (dcp_dir / ".metadata").exists():
        missing.insert(0, ".metadata")
    if missing:
        raise CheckpointError(
            f"checkpoint {path}: written by {layout['ranks']} ranks, but {dcp_dir} lacks {', '.join(missing)}; "
            f"without every shard it cannot be resharded")


def load_checkpoint(path: Path, *, parts: dict[str, Trainable], world: World | None = None) -> LearnerState:
    """Restore ``parts`` (models, optimizers, schedulers) and the RNG from ``path``; return the counters.

    The parts must already be placed and sharded for this world (``posttrain.parallel.placement``)
    and their optimizers built; DCP reads each rank's slices whatever the rank count that wrote them.

    Raises:
        CheckpointError: another format, a different model shape, or shard files missing.
        FileNotFoundError: ``state.json`` is missing.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    world = world or World()
    meta = json.loads((path / "state.json").read_text(encoding="utf-8"))
    _check_layout(path, meta, parts)
    saved = _dcp_state(parts)
    with _single_process_quiet(world):
        dcp.load(saved, checkpoint_id=str(path / "dcp"), no_dist=not world.distributed)
    for name, part in parts.items():
        if part.optimizer is not None:
            set_state_dict(part.model, part.optimizer, model_state_dict=saved[name],
                           optim_state_dict=saved[f"{name}_opt"])
        else:
            set_model_state_dict(part.model, saved[name])
        if part.scheduler is not None and name in meta["schedulers"]:
            part.scheduler.load_state_dict(meta["schedulers"][name])
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(meta["rng"])), dtype=torch.uint8))
    return LearnerState(**meta["state"])
