"""Putting a model where the learner computes: device, bf16 autocast, activation checkpointing, FSDP2.

``prepare_model`` is the one place every technique's policy, critic and reference model pass
through before their optimizer is built (FSDP2 replaces parameters with sharded ``DTensor`` s, so
the optimizer must see the sharded ones):

1. move to ``world.device`` (with several ranks, after sharding: each device receives only its
   1/N of every parameter; each process still reads the whole model into host memory first);
2. with ``learner.activation_checkpointing``, recompute each transformer block in backward
   (transformers' ``gradient_checkpointing_enable``, non-reentrant);
3. with more than one rank, ``fully_shard`` each transformer block, then the root (FSDP2: each
   rank keeps 1/N of every parameter, gradient and AdamW state; a block's parameters are
   all-gathered for its forward and backward only);
4. with bf16, run ``forward`` under ``torch.autocast(bfloat16)``. Parameters, gradients and
   optimizer state stay fp32 (the master copy; FSDP2 gathers and reduces them in fp32). The
   output head (the LM head, the critic's value head) runs outside autocast on fp32 hidden
   states, so logits and values, and the log-probabilities computed from them
   (``posttrain.losses.logprobs.token_logprobs``), are fp32: the DIS ratio and the logprob-parity
   check compare against them.

Gradients under FSDP2 are averaged over ranks; a step therefore scales each rank's summed loss
by ``world.size / global_count`` (``loss_scale``), so N ranks make the update one rank makes on
the same batch (``posttrain.parallel.shares``).
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from posttrain.config.sections import LearnerConfig
from posttrain.parallel.world import World


def resolve_precision(setting: str, device: torch.device) -> Literal["fp32", "bf16"]:
    """``learner.precision`` on ``device``: ``auto`` is bf16 on CUDA and fp32 on the CPU."""
    if setting == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return "bf16" if setting == "bf16" else "fp32"


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks, in order: the classes its transformers models name unsplittable.

    transformers lists a model's block class in ``_no_split_modules`` (``Qwen2DecoderLayer``...);
    the blocks of a critic's backbone are found the same way.

    Raises:
        ValueError: the model names no block class, or none is found (FSDP2 would then shard
            the whole model as one unit and gather all of it at once).
    """
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no transformer blocks found to shard (_no_split_modules={sorted(names)})")
    return blocks


def prepare_model(model: nn.Module, world: World, config: LearnerConfig, *, trainable: bool = True) -> nn.Module:
    """Place, checkpoint, shard and autocast ``model`` (module docstring); returns the same module.

    Args:
        model: A transformers model, or a module holding one (the SAO critic).
        world: Ranks and device (``posttrain.parallel.world.init_world``).
        config: The ``learner`` section.
        trainable: False for a frozen model (the DPO/GRPO reference): no activation checkpointing,
            and it is put in eval mode.

    Raises:
        ValueError: sharding was needed and no transformer block was found.
    """
    if not world.distributed:
        model.to(world.device)
    precision = resolve_precision(config.precision, world.device)
    if trainable and config.activation_checkpointing:
        target = model if hasattr(model, "gradient_checkpointing_enable") else getattr(model, "backbone", None)
        if target is None or not hasattr(target, "gradient_checkpointing_enable"):
            raise ValueError(f"learner.activation_checkpointing: {type(model).__name__} does not support it")
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if world.distributed:
        from torch.distributed.fsdp import fully_shard

        # Sharded while still on the CPU: fully_shard moves each block's parameters to the device and
        # keeps 1/N of them, so a device never holds the whole model (moving it first would).
        for block in transformer_blocks(model):
            fully_shard(block)
        fully_shard(model)
        model.to(world.device)
    if precision == "bf16":
        autocast = torch.autocast(device_type=world.device.type, dtype=torch.bfloat16)
        model.forward = functools.wraps(model.forward)(autocast(model.forward))  # type: ignore[method-assign]
        for head in output_heads(model):
            _run_in_fp32(head, world.device.type)
    if not trainable:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
    return model


def output_heads(model: nn.Module) -> list[nn.Module]:
    """The layers whose outputs feed the losses: the LM head (``get_output_embeddings``) and a ``value_head``."""
    heads: list[nn.Module] = []
    get = getattr(model, "get_output_embeddings", None)
    lm_head = get() if callable(get) else None
    if isinstance(lm_head, nn.Module):
        heads.append(lm_head)
    value_head = getattr(model, "value_head", None)
    if isinstance(value_head, nn.Module):
        heads.append(value_head)
    return heads


def _run_in_fp32(module: nn.Module, device_type: str) -> None:
    """Make ``module.forward`` compute in fp32 on fp32 inputs even inside an autocast region."""
    inner = module.forward

    @functools.wraps(inner)
    def forward(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        with torch.autocast(device_type=device_type, enabled=False):
            return inner(x.float(), *args, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def loss_scale(world: World, global_count: int) -> float:
    """Factor for a rank's summed loss: ``world.size / global_count`` (FSDP2 averages gradients over ranks).

    ``global_count`` is the step's count over all ranks (action tokens, trained tokens or pairs);
    a step with nothing to count uses 1.
    """
    return world.size / max(int(global_count), 1)


def full_state_dict(model: nn.Module, world: World) -> dict[str, torch.Tensor]:
    """The model's complete weights on the CPU, on rank 0 (``{}`` on other ranks).

    Under FSDP2 every rank must call this (the shards are all-gathered); with one rank it is
    ``model.state_dict()`` moved to the CPU.
    """
    if not world.distributed:
        return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return full if world.is_main else {}


def replicated_float(value: torch.Tensor | float) -> float:
    """A Python float from a scalar that may be a replicated ``DTensor`` (FSDP2's gradient norm)."""
    if isinstance(value, DTensor):
        value = value.full_tensor()
    return float(value)
