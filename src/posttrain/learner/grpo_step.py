"""The GRPO train step (``technique: grpo``): group-relative advantages, PPO clipping, sync or async.

GRPO (DeepSeekMath, arXiv 2402.03300 §4.1) samples G rollouts per prompt and uses each rollout's
reward relative to its group, ``A_i = (r_i - mean_g) / (std_g + eps)``, as the advantage of every
action token; the loss is ``posttrain.losses.grpo_loss`` (PPO clipped surrogate with DAPO's
separate ``clip_eps_low`` / ``clip_eps_high``, optional k3 KL to a frozen reference policy).

* **Synchronous** (``posttrain.runners.grpo_sync``): generate ``prompts_per_step x group_size`` rollouts with
  the current weights in this process, wait for every one of them, then train; the PPO anchor
  pi_old is the learner's own log-probabilities at the start of the step. The engine is idle
  while the learner trains and the learner idles while the slowest rollout finishes; the
  throughput metrics (``throughput/rollouts_per_s``, ``throughput/trained_action_tokens_per_s``,
  ``generator/busy_fraction_mean``) have the same names as SAO's, so the two compare directly.
* **Asynchronous** (``grpo.async: true``): the SAO runtime (generator processes, Redis stream,
  staleness bound) produces groups of rollouts that share a ``group_id``; the learner's
  ``batch_source.GroupSource`` assembles complete groups and ``grpo_train_step`` trains on them with
  the DIS mask against the behaviour logprobs (arXiv 2607.07508's "GRPO + DIS" baseline; the
  behaviour logprobs are the PPO anchor, "bypass" mode). Both roles read the ``grpo`` section
  through ``posttrain.config.roles``.

Groups whose rewards are all equal give zero advantage; with ``drop_uniform_groups`` they are
dropped before the forward pass and counted (``grpo/uniform_groups_frac``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from posttrain.advantages import group_relative_advantages
from posttrain.config.techniques import GRPOTechniqueConfig
from posttrain.learner.batching import (
    RolloutBatch,
    length_order,
)
from posttrain.learner.optim import clip_and_step
from posttrain.learner.rank_rows import rank_micro_batches, reduce_means
from posttrain.learner.token_metrics import PolicyTokenStats
from posttrain.learner.types import Trainable, TrainStepResult
from posttrain.losses import PolicyLossInputs, grpo_loss
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.sao import dis_band
from posttrain.parallel.placement import loss_scale
from posttrain.parallel.world import World


def rollout_logits(model: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """``logits [B, T, V]`` of ``model`` on the batch tokens (gradient if enabled)."""
    return model(input_ids=batch.token_ids, attention_mask=batch.attention_mask.long(), use_cache=False).logits


def rollout_logprobs(model: nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> torch.Tensor:
    """``logprobs [B, T] float32`` of the batch tokens under ``model`` at ``temperature`` (gradient if enabled)."""
    return token_logprobs(rollout_logits(model, batch), batch.token_ids, temperature)


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into ``parts`` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    out, lo = [], 0
    for p in range(parts):
        hi = lo + size + (1 if p < extra else 0)
        out.append(items[lo:hi])
        lo = hi
    return out


def _mean_of(parts: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for p in parts for k in p}
    return {k: sum(p.get(k, 0.0) for p in parts) / len(parts) for k in keys}


def grpo_train_step(
    *,
    policy: Trainable,
    batch: RolloutBatch,
    group_ids: Sequence[str],
    config: GRPOTechniqueConfig,
    reference: nn.Module | None = None,
    temperature: float = 1.0,
    world: World | None = None,
) -> TrainStepResult:
    """Train on one batch of groups: group-relative advantages, then ``config.mini_batches`` optimizer steps.

    Each mini-batch (whole groups) is one optimizer step; inside it, micro-batches of
    ``config.micro_batch_size`` rollouts accumulate gradients of ``grpo_loss`` divided by the
    mini-batch's action-token count. The PPO anchor is the learner's log-probabilities before the
    first update (synchronous), or the behaviour logprobs (``config.async_``: bypass mode with the
    DIS mask of ``config.loss``).

    Args:
        policy: The policy, its AdamW and scheduler.
        batch: Padded rollouts: ``token_ids [B, T] int64``, masks ``[B, T] bool``,
            ``behaviour_logprobs [B, T] float32``, ``rewards [B] float32``.
        group_ids: B group ids; rollouts of one prompt share one.
        config: ``grpo`` section.
        reference: Frozen reference policy; required when ``config.loss.kl_coef > 0``.
        temperature: Sampling temperature of the behaviour policy; learner logprobs use it too.
        world: The learner's ranks (one when None): each trains every N-th row of a mini-batch's
            length order; losses are scaled so N ranks make one rank's update.

    Returns:
        ``TrainStepResult``: ``policy_updated`` False when every group was dropped as uniform or
        every optimizer step was skipped for a non-finite gradient norm (``clip_and_step``; counted
        in ``skipped_nonfinite``, ``grpo/optimizer_steps`` counts the steps taken); metrics
        ``reward/mean``, ``reward/std``, ``advantage/mean``, ``advantage/std``,
        ``response/action_tokens_mean``, ``grpo/groups``, ``grpo/uniform_groups_frac``,
        ``grpo/rollouts_kept``, ``grpo/action_tokens_kept`` and, after an update, ``loss/policy``,
        the ``grpo_loss`` metrics (``clip/*``, ``ppo_ratio/*``, ``kl/ref_k3``, mismatch, ``mask/*``
        with DIS), ``policy/grad_norm`` and ``policy/lr`` (means over mini-batches), ``policy/entropy``
        and the masked / unmasked mismatch over the whole update (``learner.token_metrics``),
        ``batch/padded_tokens`` (tokens the forward passes of the update computed; kept rows are
        split into micro-batches in order of length, ``length_order``) and ``batch/real_tokens``.

    Raises:
        ValueError: ``len(group_ids)`` differs from B, or ``kl_coef > 0`` without ``reference``.
    """
    world = world or World()
    rows = batch.token_ids.shape[0]
    if len(group_ids) != rows:
        raise ValueError(f"group_ids: expected {rows} ids like batch rows, got {len(group_ids)}")
    if config.loss.kl_coef > 0 and reference is None:
        raise ValueError(f"reference: required when grpo.loss.kl_coef > 0 (kl_coef={config.loss.kl_coef})")
    advantages, degenerate = group_relative_advantages(
        batch.rewards, list(group_ids), batch.action_mask, normalize_std=config.normalize_std
    )
    members: OrderedDict[str, list[int]] = OrderedDict()
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    uniform = [g for g, idx in members.items() if bool(degenerate[idx[0]])]
    kept = [g for g in members if not (config.drop_uniform_groups and g in uniform)]
    kept_rows = [i for g in kept for i in members[g]]
    act = batch.action_mask
    metrics: dict[str, float] = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std()) if rows > 1 else 0.0,
        "response/action_tokens_mean": float(act.sum(dim=1).float().mean()),
        "grpo/groups": float(len(members)),
        "grpo/uniform_groups_frac": len(uniform) / len(members),
        "grpo/rollouts_kept": float(len(kept_rows)),
        "grpo/action_tokens_kept": float(act[kept_rows].sum()) if kept_rows else 0.0,
    }
    kept_adv = advantages[kept_rows][act[kept_rows]] if kept_rows else advantages.new_zeros(0)
    metrics["advantage/mean"] = float(kept_adv.mean()) if kept_adv.numel() else 0.0
    metrics["advantage/std"] = float(kept_adv.std()) if kept_adv.numel() > 1 else 0.0
    if not kept_rows:
        return TrainStepResult(policy_updated=False, metrics=metrics)

    # Each mini-batch's rows shortest first, dealt over the ranks (``learner.rank_rows``).
    mbs = config.micro_batch_size
    chunks = _split(kept, min(config.mini_batches, len(kept)))
    chunk_rows = [length_order(batch, [i for g in chunk for i in members[g]]) for chunk in chunks]
    shares = [rank_micro_batches(batch, rows, mbs, world) for rows in chunk_rows]
    olds: list[torch.Tensor | None] = [None] * len(shares)
    if not config.async_ and len(chunks) > 1:
        # PPO's pi_old: the learner's log-probabilities before the first update of this batch.
        policy.model.eval()
        with torch.no_grad():
            for k, share in enumerate(shares):
                old_k = torch.zeros_like(share.local.behaviour_logprobs)
                for p in share.pieces:
                    old_k[p.lo : p.hi, : p.width] = rollout_logprobs(policy.model, p.batch, temperature)
                olds[k] = old_k
    parts: list[dict[str, float]] = []
    skipped = 0  # optimizer steps skipped for a non-finite gradient norm
    tokens = PolicyTokenStats(config.loss.log_ratio_clamp, temperature)
    policy.model.train()
    for rows, share, old_k in zip(chunk_rows, shares, olds, strict=True):
        count = int(batch.action_mask[rows].sum())
        scale = loss_scale(world, count)
        local_adv = advantages[share.index if share.rows else torch.zeros(1, dtype=torch.long),
                               : share.local.token_ids.shape[1]].to(world.device)
        loss_sum, mb_metrics, mb_weights = 0.0, [], []
        for p in share.pieces:
            logits = rollout_logits(policy.model, p.batch)
            logprobs = token_logprobs(logits, p.batch.token_ids, temperature)
            if config.async_:
                old = None
            elif old_k is not None:
                old = old_k[p.lo : p.hi, : p.width]
            else:
                old = logprobs.detach()
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref = rollout_logprobs(reference, p.batch, temperature)
            inputs = PolicyLossInputs(
                logprobs=logprobs,
                behaviour_logprobs=p.batch.behaviour_logprobs,
                advantages=local_adv[p.lo : p.hi, : p.width],
                action_mask=p.batch.action_mask,
                ref_logprobs=ref,
                old_logprobs=old,
            )
            out = grpo_loss(inputs, config.loss)
            if p.weight:  # entropy and the masked / unmasked mismatch of the tokens that train
                band = dis_band(logprobs, p.batch.behaviour_logprobs, p.batch.action_mask, config.loss.mask_eps_low,
                                config.loss.mask_eps_high, config.loss.log_ratio_clamp) if config.loss.dis_mask else None
                tokens.add(logits, logprobs, p.batch.behaviour_logprobs, p.batch.action_mask, band)
            del logits
            (out.loss_sum * (scale * p.weight)).backward()
            loss_sum += float(out.loss_sum.detach()) * p.weight
            mb_metrics.append(out.metrics)
            mb_weights.append(out.num_tokens * p.weight)
        step_metrics = reduce_means(world, mb_metrics, mb_weights)
        step_metrics["loss/policy"] = world.sum([loss_sum])[0] / max(count, 1)
        step_metrics["policy/grad_norm"] = clip_and_step(
            policy.model, policy.optimizer, policy.scheduler, config.optim.grad_clip
        )
        step_metrics["policy/lr"] = float(policy.scheduler.get_last_lr()[0])
        skipped += int(not math.isfinite(step_metrics["policy/grad_norm"]))
        parts.append(step_metrics)
    metrics.update(_mean_of(parts))
    metrics.update(tokens.metrics(world))
    metrics["grpo/optimizer_steps"] = float(len(chunks) - skipped)
    metrics["batch/padded_tokens"] = world.sum([float(sum(share.padded_tokens() for share in shares))])[0]
    metrics["batch/real_tokens"] = float(batch.attention_mask[kept_rows].sum())
    stepped = skipped < len(chunks)
    return TrainStepResult(policy_updated=stepped, metrics=metrics, rows_trained=len(kept_rows) if stepped else 0,
                           action_tokens_trained=metrics["grpo/action_tokens_kept"] if stepped else 0.0,
                           skipped_nonfinite=skipped)
