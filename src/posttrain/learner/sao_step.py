"""One SAO optimizer step: critic values, skip-observation GAE, K critic updates, DIS policy update.

Implements §7.2 of our SAO notes (Hou et al., arXiv 2607.07508, "Single-Rollout Asynchronous
Optimization"): one rollout per prompt, advantages from a learned critic with token-level GAE that
skips observation tokens (λ_policy = 1 − 1/(α·l), λ_critic = 1), and the DIS loss
−sg(f(r))·A·log π_θ with r = π_θ/π_behav hard-masked outside (1 − ε_low, 1 + ε_high).
Every loss is a sum divided by the global action-token count of the step, so the micro-batch
size does not change the gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from posttrain.advantages import (
    RunningMeanBaseline,
    batch_normalized_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
)
from posttrain.config import SAOConfig
from posttrain.learner.batching import RolloutBatch, length_order, micro_batches, padded_tokens, select_rows
from posttrain.learner.optim import clip_and_step
from posttrain.learner.types import Trainable, TrainStepResult
from posttrain.losses import PolicyLossInputs, sao_loss
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.value import value_loss


def critic_values(critic: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """Values aligned with tokens: ``[B, T] float32`` where position t is V(state before token t).

    The critic's raw output at position t - 1 summarises tokens < t, i.e. the state in which token
    t is chosen; position 0 (no prefix) gets 0.
    """
    raw = critic(batch.token_ids, batch.attention_mask)
    return torch.nn.functional.pad(raw[:, :-1], (1, 0))


def policy_logprobs(policy: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """Recompute ``logprobs [B, T] float32`` of the batch tokens under the current policy (with grad)."""
    logits = policy(input_ids=batch.token_ids, attention_mask=batch.attention_mask.long()).logits
    return token_logprobs(logits, batch.token_ids)


def _mean_metrics(parts: list[dict[str, float]], weights: list[int]) -> dict[str, float]:
    total = max(sum(weights), 1)
    keys = {k for p in parts for k in p}
    return {k: sum(p.get(k, 0.0) * w for p, w in zip(parts, weights, strict=True)) / total for k in keys}


def sao_train_step(
    *,
    policy: Trainable,
    critic: Trainable | None,
    batch: RolloutBatch,
    config: SAOConfig,
    iteration: int,
    baseline: RunningMeanBaseline | None = None,
) -> TrainStepResult:
    """Run one learner iteration on a batch of rollouts.

    Args:
        policy: The policy, its AdamW and scheduler.
        critic: The critic (``config.advantage == "gae"``), else None.
        batch: Padded rollouts; ``batch.rewards [B] float32``, masks ``[B, T] bool``.
        config: SAO settings (DIS band, γ, α, K, warm-up, micro-batch size). Rows are split into
            micro-batches in order of length (``length_order``), which changes no gradient.
        iteration: 0-based learner iteration; iterations < ``config.critic.warmup_steps`` train
            only the critic.
        baseline: Running-mean baseline state for ``advantage == "running_mean"``.

    Returns:
        ``TrainStepResult`` with ``policy_updated`` and the step's metrics, among them
        ``batch/padded_tokens`` (tokens one forward pass over the micro-batches computes) and
        ``batch/real_tokens``.

    Raises:
        ValueError: if the configured advantage needs a critic/baseline that was not given.
        FloatingPointError: if a gradient norm is not finite (the step is skipped).
    """
    metrics: dict[str, float] = {}
    n_tokens = batch.num_action_tokens
    # Rows shortest first: each micro-batch pads to the longest of similar rows (``length_order``).
    batch = select_rows(batch, length_order(batch))
    mbs = micro_batches(batch, config.micro_batch_size)
    metrics["batch/padded_tokens"] = float(padded_tokens(mbs))
    metrics["batch/real_tokens"] = float(batch.attention_mask.sum())
    # Rows [lo, hi) and width (columns) of each micro-batch inside the batch tensors.
    spans = [(i * config.micro_batch_size, i * config.micro_batch_size + mb.token_ids.shape[0], mb.token_ids.shape[1])
             for i, mb in enumerate(mbs)]
    action_lengths = batch.action_mask.sum(dim=1)

    # 1. Advantages (and critic targets).
    if config.advantage == "gae":
        if critic is None:
            raise ValueError("sao.advantage=gae needs a critic")
        critic.model.eval()
        with torch.no_grad():
            old_values = torch.zeros_like(batch.behaviour_logprobs)
            for mb, (lo, hi, width) in zip(mbs, spans, strict=True):
                old_values[lo:hi, :width] = critic_values(critic.model, mb)
            lam_policy = length_adaptive_lambda(action_lengths, config.lam_alpha)
            advantages, _ = skip_observation_gae(
                values=old_values, rewards=batch.rewards, action_mask=batch.action_mask,
                gamma=config.gamma, lam=lam_policy,
            )
            _, returns = skip_observation_gae(
                values=old_values, rewards=batch.rewards, action_mask=batch.action_mask,
                gamma=config.gamma, lam=config.gae_lambda_critic,
            )
        # 2. K critic updates on the same batch ("faster value update").
        critic.model.train()
        for _ in range(config.critic.updates_per_step):
            parts, weights = [], []
            for mb, (lo, hi, width) in zip(mbs, spans, strict=True):
                out = value_loss(
                    critic_values(critic.model, mb), old_values[lo:hi, :width], returns[lo:hi, :width],
                    mb.action_mask, config.critic.value_clip,
                )
                (out.loss_sum / max(n_tokens, 1)).backward()
                parts.append({**out.metrics, "loss/value": float(out.loss_sum.detach()) / max(out.num_tokens, 1)})
                weights.append(out.num_tokens)
            metrics.update(_mean_metrics(parts, weights))
            metrics["critic/grad_norm"] = clip_and_step(
                critic.model, critic.optimizer, critic.scheduler, config.critic.grad_clip
            )
    elif config.advantage == "batch_norm":
        advantages = batch_normalized_advantages(batch.rewards, batch.action_mask)
    else:
        if baseline is None:
            raise ValueError("sao.advantage=running_mean needs a RunningMeanBaseline")
        advantages = baseline.advantages(batch.rewards, batch.action_mask)

    act = batch.action_mask
    metrics["advantage/mean"] = float(advantages[act].mean()) if n_tokens else 0.0
    metrics["advantage/std"] = float(advantages[act].std()) if n_tokens > 1 else 0.0
    metrics["reward/mean"] = float(batch.rewards.mean())
    metrics["response/action_tokens_mean"] = float(action_lengths.float().mean())

    # 3. Policy update with the DIS loss (after the critic-only warm-up).
    warm = config.advantage == "gae" and iteration < config.critic.warmup_steps
    if warm:
        return TrainStepResult(policy_updated=False, metrics=metrics, rows_trained=0,
                               action_tokens_trained=float(batch.num_action_tokens))
    policy.model.train()
    parts, weights = [], []
    for mb, (lo, hi, width) in zip(mbs, spans, strict=True):
        inputs = PolicyLossInputs(
            logprobs=policy_logprobs(policy.model, mb),
            behaviour_logprobs=mb.behaviour_logprobs,
            advantages=advantages[lo:hi, :width],
            action_mask=mb.action_mask,
        )
        out = sao_loss(inputs, config.loss)
        (out.loss_sum / max(n_tokens, 1)).backward()
        parts.append({**out.metrics, "loss/policy": float(out.loss_sum.detach()) / max(out.num_tokens, 1)})
        weights.append(out.num_tokens)
    metrics.update(_mean_metrics(parts, weights))
    metrics["policy/grad_norm"] = clip_and_step(
        policy.model, policy.optimizer, policy.scheduler, config.optim.grad_clip
    )
    metrics["policy/lr"] = float(policy.scheduler.get_last_lr()[0])
    return TrainStepResult(policy_updated=True, metrics=metrics, rows_trained=int(batch.token_ids.shape[0]),
                           action_tokens_trained=float(batch.num_action_tokens))
