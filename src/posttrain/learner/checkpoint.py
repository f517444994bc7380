"""Learner checkpoints: policy, critic, optimizers, policy version and the stream position.

Layout of one checkpoint directory (``<run>/checkpoints/iter-000012/``)::

    policy/                 HF model directory (config.json + model.safetensors) + tokenizer
    critic.safetensors      critic weights (when the run has a critic)
    optim.pt                optimizer and scheduler states (torch.save, loaded weights_only)
    state.json              iteration, policy_version, consumed_entry_ids, baseline, staleness
    resolved_config.yaml    the run config that produced it

``<run>/checkpoints/LATEST`` names the newest complete checkpoint; a checkpoint is written to a
temporary directory and renamed, so a learner killed mid-write leaves the previous one intact.

Stream position: ``consumed_entry_ids`` lists stream entries used by optimizer steps included in
this checkpoint but not yet acknowledged. The learner acknowledges them right after the checkpoint
is durable; a learner killed between the two acknowledges them on restart instead of training on
them again. Entries consumed after the checkpoint are still pending in the consumer group and are
re-delivered, so no rollout is lost and none is trained on twice.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass
class LearnerState:
    """Counters restored on resume.

    Attributes:
        iteration: Learner iterations done (critic warm-up included).
        policy_version: Policy optimizer steps done = weight publications after v0.
        consumed_entry_ids: Stream entry ids trained on since the previous acknowledgement.
        baseline_rewards: Running-mean baseline window (rewards), when used.
        counters: Cumulative counts (``rollouts_trained``, ``stale_dropped``...).
    """

    iteration: int = 0
    policy_version: int = 0
    consumed_entry_ids: list[str] = field(default_factory=list)
    baseline_rewards: list[float] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    pointer = root / "LATEST"
    if not pointer.exists():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "state.json").exists() else None


def save_checkpoint(
    root: Path,
    *,
    state: LearnerState,
    policy: nn.Module,
    tokenizer: Any,
    critic: nn.Module | None,
    optimizers: dict[str, Any],
    resolved_config_yaml: str,
    keep: int = 2,
) -> Path:
    """Write a checkpoint atomically and point ``LATEST`` at it.

    Args:
        root: Checkpoints directory.
        state: Counters and the stream position.
        policy: HF causal LM (saved with ``save_pretrained``, safetensors).
        tokenizer: Saved beside the policy so the directory is a loadable model.
        critic: Critic module or None.
        optimizers: Name → object with ``state_dict()`` (optimizers, schedulers).
        resolved_config_yaml: The run config, saved beside the weights.
        keep: Older checkpoints kept besides the new one.

    Returns:
        The checkpoint directory.
    """
    root.mkdir(parents=True, exist_ok=True)
    name = f"iter-{state.iteration:06d}"
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    policy.save_pretrained(str(tmp / "policy"), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp / "policy"))
    (tmp / "policy" / "resolved_config.yaml").write_text(resolved_config_yaml, encoding="utf-8")
    if critic is not None:
        save_file({k: v.detach().contiguous() for k, v in critic.state_dict().items()}, str(tmp / "critic.safetensors"))
    torch.save({k: v.state_dict() for k, v in optimizers.items()}, tmp / "optim.pt")
    (tmp / "resolved_config.yaml").write_text(resolved_config_yaml, encoding="utf-8")
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=1), encoding="utf-8")
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    pointer_tmp = root / "LATEST.tmp"
    pointer_tmp.write_text(name, encoding="utf-8")
    pointer_tmp.replace(root / "LATEST")
    done = sorted(p for p in root.glob("iter-*") if p.is_dir())
    for old in done[: max(0, len(done) - 1 - keep)]:
        shutil.rmtree(old)
    return final


def load_checkpoint_state(path: Path, *, critic: nn.Module | None, optimizers: dict[str, Any]) -> LearnerState:
    """Restore critic weights and optimizer states from ``path``; return the counters.

    The policy itself is loaded from ``path / "policy"`` by the caller (it is a model directory).

    Raises:
        FileNotFoundError: if ``state.json`` is missing.
    """
    state = LearnerState(**json.loads((path / "state.json").read_text(encoding="utf-8")))
    if critic is not None and (path / "critic.safetensors").exists():
        critic.load_state_dict(load_file(str(path / "critic.safetensors")))
    saved = torch.load(path / "optim.pt", weights_only=True)
    for key, obj in optimizers.items():
        if key in saved:
            obj.load_state_dict(saved[key])
    return state
