"""One SAO optimizer step: critic values, skip-observation GAE, K critic updates, DIS policy update.

Implements §7.2 of our SAO notes (Hou et al., arXiv 2607.07508, "Single-Rollout Asynchronous
Optimization"): one rollout per prompt, advantages from a learned critic with token-level GAE that
skips observation tokens (λ_policy = 1 − 1/(α·l), λ_critic = 1), and the DIS loss
−sg(f(r))·A·log π_θ with r = π_θ/π_behav hard-masked outside (1 − ε_low, 1 + ε_high).
Every loss is a sum divided by the global action-token count of the step, so the micro-batch
size does not change the gradient.

Per-token staleness (``stale_tokens``): an action token sampled more than ``sao.max_staleness``
versions before the learner's version gets no policy gradient (``losses.sao``, counted in
``mask/frac_stale``); the critic and the advantages still use every token of the episode.

Critic practice options (issue 29; defaults keep the step as it was):

* ``sao.critic.head_bias_init: first_batch_mean``: at learner iteration 0, before the critic's
  first forward, the value head's bias becomes the batch's mean reward (pooled over ranks).
* ``sao.critic.warmup_steps``: critic-only iterations (value pretraining on the start policy's
  rollouts).
* ``sao.whiten_advantages``: advantages whitened with the mean / std of the batch's fresh action
  tokens over every rank (OpenRLHF).
* ``value/explained_variance_before``: the critic's explained variance on the batch before any of
  its K updates on it (held-out for the critic), next to ``value/explained_variance`` (at the
  last of the K updates, after K - 1 of them).
* ``sao.loss.denominator: fresh_tokens``: the policy loss divided by the batch's action tokens not
  masked for staleness instead of all of its action tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posttrain.advantages import (
    RunningMeanBaseline,
    batch_normalized_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
    whiten,
)
from posttrain.config import SAOConfig
from posttrain.learner.batching import RolloutBatch, length_order, select_rows
from posttrain.learner.optim import clip_and_step
from posttrain.learner.rank_rows import rank_micro_batches, reduce_means, reduce_moments
from posttrain.learner.token_metrics import PolicyTokenStats, RowTokenStats, empty_rows, turn_diagnostics
from posttrain.learner.types import Trainable, TrainStepResult
from posttrain.losses import PolicyLossInputs, sao_loss
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.sao import applied_band, dis_band
from posttrain.losses.value import explained_variance, explained_variance_sums, value_loss
from posttrain.parallel.placement import loss_scale
from posttrain.parallel.world import World


def critic_values(critic: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """Values aligned with tokens: ``[B, T] float32`` where position t is V(state before token t).

    The critic's raw output at position t - 1 summarises tokens < t, i.e. the state in which token
    t is chosen; position 0 (no prefix) gets 0.
    """
    raw = critic(batch.token_ids, batch.attention_mask)
    return torch.nn.functional.pad(raw[:, :-1], (1, 0))


def policy_logprobs(policy: nn.Module, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The current policy on the batch (with grad): ``(logits [B, T, V], logprobs [B, T] float32)``."""
    logits = policy(input_ids=batch.token_ids, attention_mask=batch.attention_mask.long()).logits
    return logits, token_logprobs(logits, batch.token_ids)


def stale_tokens(action_mask: torch.Tensor, token_versions: torch.Tensor, learner_version: int | None,
                 max_staleness: int) -> torch.Tensor:
    """Action tokens too old to get policy gradient: ``learner_version - token_version > max_staleness``.

    Args:
        action_mask: [B, T] bool. Tokens sampled by the policy.
        token_versions: [B, T] int64. Policy version that sampled each token (``RolloutBatch.token_versions``).
        learner_version: The learner's policy version when it trains the batch; None: no token is stale.
        max_staleness: tau (policy versions, >= 0).

    Returns:
        [B, T] bool, False off the action tokens.
    """
    if learner_version is None:
        return torch.zeros_like(action_mask)
    return action_mask & (learner_version - token_versions > max_staleness)


def set_head_bias_to_mean_reward(critic: nn.Module, rewards: torch.Tensor, world: World) -> float:
    """Set the critic's value-head bias to the mean of ``rewards`` pooled over every rank; return that mean.

    With the head's weight still zero (a fresh ``CriticModel``), every value becomes the mean reward:
    the critic starts from the running-mean baseline instead of 0 (``sao.critic.head_bias_init``).
    Every rank must call this (the mean is a ``world.sum``); under FSDP2 each rank fills its shard.

    Args:
        critic: A ``CriticModel`` (possibly FSDP2-sharded).
        rewards: [n] float. This rank's rollouts' rewards (may be empty).
        world: The learner's ranks.

    Returns:
        The mean reward (reward units), 0.0 when no rank has a rollout.

    Raises:
        TypeError: ``critic`` has no ``nn.Linear`` ``value_head``.
    """
    n, total = world.sum([float(rewards.numel()), float(rewards.double().sum())])
    mean = total / n if n else 0.0
    head = critic.value_head
    if not isinstance(head, nn.Linear):
        raise TypeError(f"critic: expected a CriticModel with an nn.Linear value_head, got {type(head).__name__}")
    with torch.no_grad():
        head.bias.fill_(mean)
    return mean


def sao_train_step(
    *,
    policy: Trainable,
    critic: Trainable | None,
    batch: RolloutBatch,
    config: SAOConfig,
    iteration: int,
    baseline: RunningMeanBaseline | None = None,
    world: World | None = None,
    learner_version: int | None = None,
) -> TrainStepResult:
    """Run one learner iteration on a batch of rollouts.

    Args:
        policy: The policy, its AdamW and scheduler.
        critic: The critic (``config.advantage == "gae"``), else None.
        batch: Padded rollouts (CPU, the whole batch on every rank); ``batch.rewards [B] float32``,
            masks ``[B, T] bool``.
        config: SAO settings (DIS band, γ, α, K, warm-up, micro-batch size). Rows are split into
            micro-batches in order of length (``length_order``), which changes no gradient.
        iteration: 0-based learner iteration (the checkpoint keeps it, so a resumed run continues
            the count); iterations < ``config.critic.warmup_steps`` train only the critic, and
            iteration 0 sets the critic's head bias under ``critic.head_bias_init: first_batch_mean``.
        baseline: Running-mean baseline state for ``advantage == "running_mean"``.
        world: The learner's ranks (one when None). Each rank trains every N-th row of the length
            order (``learner.rank_rows``); losses are scaled so N ranks make one rank's update.
        learner_version: The learner's policy version (the one this step would move from): action
            tokens sampled more than ``config.max_staleness`` versions before it get no policy
            gradient (``stale_tokens``). None masks no token for its age (tests, benchmarks of the
            step alone).

    Returns:
        ``TrainStepResult`` with ``policy_updated`` and the step's metrics (over all ranks), among
        them ``batch/padded_tokens`` (tokens the forward passes over the micro-batches compute),
        ``batch/real_tokens``, ``policy/entropy`` and the masked / unmasked mismatch
        (``learner.token_metrics``), and the critic's ``value/*`` of the last of its K updates
        (``value/explained_variance`` over the whole batch's action tokens, from sums pooled over
        micro-batches and ranks), ``value/explained_variance_before`` (the same, of the values
        before the critic's first update on the batch), ``critic/head_bias_init`` (the bias set at
        iteration 0 under ``first_batch_mean``), ``advantage/fresh_mean`` / ``advantage/fresh_std`` (over
        the action tokens not masked for staleness) and ``batch/policy_loss_tokens`` (the policy loss's
        denominator, ``sao.loss.denominator``).

        A critic or policy step whose gradient norm is not finite is skipped (``clip_and_step``)
        and counted in ``skipped_nonfinite``; a skipped policy step makes no version.
        ``row_tokens`` holds each rollout's trained / stale-masked / DIS-masked token counts and
        the version range of its trained tokens (all zero in a critic-only warm-up iteration), and its
        per-turn mean advantage, value and return (``token_metrics.TURN_KEYS``);
        ``staleness/token_lag_mean`` and ``/token_lag_max`` are over the batch's action tokens,
        ``mask/frac_stale`` over those of the policy update.

    Raises:
        ValueError: if the configured advantage needs a critic/baseline that was not given.
    """
    world = world or World()
    metrics: dict[str, float] = {}
    n_tokens = batch.num_action_tokens
    scale = loss_scale(world, n_tokens)
    if config.loss.denominator == "fresh_tokens":  # the whole batch is on every rank: no reduction needed
        stale_all = stale_tokens(batch.action_mask, batch.token_versions, learner_version, config.max_staleness)
        policy_tokens = int((batch.action_mask & ~stale_all).sum())
    else:
        policy_tokens = n_tokens
    policy_scale = loss_scale(world, policy_tokens)
    metrics["batch/policy_loss_tokens"] = float(policy_tokens)
    # Rows shortest first, dealt over the ranks: each micro-batch pads to the longest of similar rows.
    order = length_order(batch)
    mine = rank_micro_batches(batch, order, config.micro_batch_size, world)
    local, pieces = mine.local, mine.pieces
    padded, real = world.sum([float(mine.padded_tokens()), float(local.attention_mask.sum()) if mine.rows else 0.0])
    metrics["batch/padded_tokens"], metrics["batch/real_tokens"] = padded, real
    action_lengths = batch.action_mask.sum(dim=1)
    if learner_version is not None:
        lags = (learner_version - batch.token_versions)[batch.action_mask].double()
        metrics["staleness/token_lag_mean"] = float(lags.mean()) if lags.numel() else 0.0
        metrics["staleness/token_lag_max"] = float(lags.max()) if lags.numel() else 0.0
    skipped = 0  # optimizer steps skipped for a non-finite gradient norm

    # 1. Advantages (and critic targets) of this rank's rows.
    if config.advantage == "gae":
        if critic is None:
            raise ValueError("sao.advantage=gae needs a critic")
        if iteration == 0 and config.critic.head_bias_init == "first_batch_mean":
            own_rewards = local.rewards if mine.rows else local.rewards.new_zeros(0)
            metrics["critic/head_bias_init"] = set_head_bias_to_mean_reward(critic.model, own_rewards, world)
        critic.model.eval()
        with torch.no_grad():
            old_values = torch.zeros_like(local.behaviour_logprobs)
            for p in pieces:
                old_values[p.lo : p.hi, : p.width] = critic_values(critic.model, p.batch)
            lam_policy = length_adaptive_lambda(local.action_mask.sum(dim=1), config.lam_alpha)
            advantages, _ = skip_observation_gae(
                values=old_values, rewards=local.rewards, action_mask=local.action_mask,
                gamma=config.gamma, lam=lam_policy,
            )
            _, returns = skip_observation_gae(
                values=old_values, rewards=local.rewards, action_mask=local.action_mask,
                gamma=config.gamma, lam=config.gae_lambda_critic,
            )
            # Before any update on this batch: data the critic has not fitted yet.
            before = (explained_variance_sums(old_values, returns, local.action_mask) if mine.rows
                      else [0.0] * 5)
        metrics["value/explained_variance_before"] = explained_variance(world.sum(before))
        # 2. K critic updates on the same batch ("faster value update").
        critic.model.train()
        for _ in range(config.critic.updates_per_step):
            parts, weights = [], []
            ev_sums = [0.0] * 5
            for p in pieces:
                values = critic_values(critic.model, p.batch)
                targets = returns[p.lo : p.hi, : p.width]
                out = value_loss(values, old_values[p.lo : p.hi, : p.width], targets, p.batch.action_mask,
                                 config.critic.value_clip)
                (out.loss_sum * (scale * p.weight)).backward()
                parts.append({**out.metrics, "loss/value": float(out.loss_sum.detach()) / max(out.num_tokens, 1)})
                weights.append(out.num_tokens * p.weight)
                if p.weight:  # fillers count for nothing
                    ev_sums = [a + b for a, b in zip(ev_sums, explained_variance_sums(values, targets,
                                                                                     p.batch.action_mask), strict=True)]
            metrics.update(reduce_means(world, parts, weights))
            # Over the whole batch (every rank's rows), not a mean of micro-batches' values.
            metrics["value/explained_variance"] = explained_variance(world.sum(ev_sums))
            metrics["critic/grad_norm"] = clip_and_step(
                critic.model, critic.optimizer, critic.scheduler, config.critic.grad_clip
            )
            skipped += int(not math.isfinite(metrics["critic/grad_norm"]))
        metrics["critic/lr"] = float(critic.scheduler.get_last_lr()[0])
    else:
        # In length order, as the running-mean window has always seen the batch's rewards.
        ordered = select_rows(batch, order)
        if config.advantage == "batch_norm":
            by_order = batch_normalized_advantages(ordered.rewards, ordered.action_mask)
        elif baseline is None:
            raise ValueError("sao.advantage=running_mean needs a RunningMeanBaseline")
        else:
            by_order = baseline.advantages(ordered.rewards, ordered.action_mask)
        whole = torch.zeros_like(batch.behaviour_logprobs)
        whole[torch.tensor(order, dtype=torch.long), : by_order.shape[1]] = by_order
        advantages = whole[mine.index if mine.rows else torch.zeros(1, dtype=torch.long), : local.token_ids.shape[1]]
        advantages = advantages.to(world.device)

    gae = config.advantage == "gae"
    turns = turn_diagnostics(local.action_mask, mine.rows, int(batch.token_ids.shape[0]), advantages,
                             old_values if gae else None, returns if gae else None, world)
    act = local.action_mask
    # The tokens that can train (not stale-masked), over every rank's rows.
    fresh = act & ~stale_tokens(act, local.token_versions, learner_version, config.max_staleness)
    if config.whiten_advantages:
        mean, std = reduce_moments(world, advantages[fresh] if mine.rows else advantages.new_zeros(0))
        advantages = whiten(advantages, act, mean, std)
    own = advantages[act] if mine.rows else advantages.new_zeros(0)
    metrics["advantage/mean"], metrics["advantage/std"] = reduce_moments(world, own)
    metrics["advantage/fresh_mean"], metrics["advantage/fresh_std"] = reduce_moments(
        world, advantages[fresh] if mine.rows else advantages.new_zeros(0))
    metrics["reward/mean"] = float(batch.rewards.mean())
    metrics["response/action_tokens_mean"] = float(action_lengths.float().mean())

    # 3. Policy update with the DIS loss (after the critic-only warm-up).
    warm = config.advantage == "gae" and iteration < config.critic.warmup_steps
    if warm:
        return TrainStepResult(policy_updated=False, metrics=metrics, rows_trained=0,
                               action_tokens_trained=float(batch.num_action_tokens), skipped_nonfinite=skipped,
                               row_tokens=[{**r, **t} for r, t in zip(empty_rows(len(turns)), turns, strict=True)])
    policy.model.train()
    parts, weights = [], []
    tokens = PolicyTokenStats(config.loss.log_ratio_clamp)
    per_row = RowTokenStats(int(batch.token_ids.shape[0]))
    for p in pieces:
        logits, logprobs = policy_logprobs(policy.model, p.batch)
        stale = stale_tokens(p.batch.action_mask, p.batch.token_versions, learner_version, config.max_staleness)
        inputs = PolicyLossInputs(
            logprobs=logprobs,
            behaviour_logprobs=p.batch.behaviour_logprobs,
            advantages=advantages[p.lo : p.hi, : p.width],
            action_mask=p.batch.action_mask,
            stale_mask=stale,
        )
        out = sao_loss(inputs, config.loss)
        if p.weight:  # entropy and the masked / unmasked mismatch of the tokens that train
            band = applied_band(dis_band(logprobs, p.batch.behaviour_logprobs, p.batch.action_mask,
                                         config.loss.mask_eps_low, config.loss.mask_eps_high,
                                         config.loss.log_ratio_clamp, stale), config.loss.correction)
            tokens.add(logits, logprobs, p.batch.behaviour_logprobs, p.batch.action_mask, band)
            per_row.add(mine.rows[p.lo : p.hi], band, p.batch.token_versions)
        del logits
        (out.loss_sum * (policy_scale * p.weight)).backward()
        parts.append({**out.metrics, "loss/policy": float(out.loss_sum.detach()) / max(out.num_tokens, 1)})
        weights.append(out.num_tokens * p.weight)
    metrics.update(reduce_means(world, parts, weights))
    metrics.update(tokens.metrics(world))
    metrics["policy/grad_norm"] = clip_and_step(
        policy.model, policy.optimizer, policy.scheduler, config.optim.grad_clip
    )
    metrics["policy/lr"] = float(policy.scheduler.get_last_lr()[0])
    stepped = math.isfinite(metrics["policy/grad_norm"])
    return TrainStepResult(policy_updated=stepped, metrics=metrics,
                           rows_trained=int(batch.token_ids.shape[0]) if stepped else 0,
                           action_tokens_trained=float(batch.num_action_tokens),
                           skipped_nonfinite=skipped + int(not stepped),
                           row_tokens=[{**r, **t} for r, t in zip(per_row.rows(world), turns, strict=True)])
