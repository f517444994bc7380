"""The GKD train step (``technique: gkd``): the student learns the teacher's distributions on a mixed batch.

GKD (Agarwal et al., "On-Policy Distillation of Language Models: Learning from Self-Generated
Mistakes", ICLR 2024, arXiv 2306.13649, Algorithm 1) trains the student on its own samples (the
on-policy share lambda) and on fixed sequences, minimising a divergence between the teacher's and
the student's next-token distributions at every trained position (``posttrain.losses.gkd``).

A batch has ``gkd.batch_size`` rows (``mixed_batch``): first the on-policy rollouts the generators
sampled from the student (through the inference engine, the rollout stream and admission, as
SAO's; their action tokens are trained), then ``gkd.fixed_rows`` fixed sequences drawn in
shuffled epochs from ``gkd.data_path`` (their assistant tokens are trained). The paper draws a
whole batch on-policy with probability lambda; mixing inside each batch gives the same expected
share with less variance, and keeps one admission batch of on-policy rollouts per policy version.

The teacher is frozen and placed like the student (``prepare_model(..., trainable=False)``: FSDP2
shards it per block over the learner's ranks, so a teacher bigger than one device still fits
beside the student). Each micro-batch runs the student with gradient and the teacher without;
the summed loss is scaled by ``ranks / trained tokens of the step``, so micro-batching and the
number of ranks leave the update unchanged (``docs/distributed.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posttrain.config.techniques import GKDTechniqueConfig
from posttrain.data.tasks import OnBadRow
from posttrain.learner.accumulate import EpochSampler
from posttrain.learner.batching import RolloutBatch, collate_rollouts, length_order
from posttrain.learner.grpo_step import rollout_logits
from posttrain.learner.optim import clip_and_step
from posttrain.learner.rank_rows import rank_micro_batches, reduce_means
from posttrain.learner.sft import TokenExample
from posttrain.learner.types import Trainable, TrainStepResult
from posttrain.losses.gkd import DISTILL_LOSSES, DistillLossInputs
from posttrain.parallel.placement import loss_scale
from posttrain.parallel.world import World
from posttrain.records import Rollout


def mixed_batch(rollouts: Sequence[Rollout], fixed: Sequence[TokenExample], pad_token_id: int,
                learner_version: int) -> RolloutBatch:
    """One padded batch: the on-policy ``rollouts`` first, then the ``fixed`` sequences.

    A fixed sequence's ``action_mask`` is its ``loss_mask`` (the tokens trained), its behaviour
    log-probabilities and reward are 0 and its policy versions ``learner_version`` (it has no sampler).

    Args:
        rollouts: The stream's rollouts (may be empty only when ``fixed`` is not).
        fixed: Fixed sequences (``TokenExample``: ``token_ids [T]``, ``loss_mask [T]``).
        pad_token_id: Padding id.
        learner_version: The learner's policy version (policy versions of the fixed rows).

    Returns:
        ``RolloutBatch`` of ``len(rollouts) + len(fixed)`` rows, ``[B, T]`` with T the longest row.

    Raises:
        ValueError: both lists are empty, or a fixed sequence's mask length differs from its tokens'.
    """
    if not rollouts and not fixed:
        raise ValueError("mixed_batch: no rollout and no fixed sequence")
    for i, example in enumerate(fixed):
        if len(example.loss_mask) != len(example.token_ids):
            raise ValueError(f"fixed[{i}]: loss_mask has {len(example.loss_mask)} entries for "
                             f"{len(example.token_ids)} tokens")
    on = collate_rollouts(rollouts, pad_token_id) if rollouts else None
    width = max(([int(on.token_ids.shape[1])] if on is not None else []) + [len(e.token_ids) for e in fixed])
    rows = len(rollouts) + len(fixed)
    batch = RolloutBatch(
        token_ids=torch.full((rows, width), pad_token_id, dtype=torch.long),
        attention_mask=torch.zeros((rows, width), dtype=torch.bool),
        action_mask=torch.zeros((rows, width), dtype=torch.bool),
        behaviour_logprobs=torch.zeros((rows, width), dtype=torch.float32),
        rewards=torch.zeros(rows, dtype=torch.float32),
        policy_versions=torch.full((rows,), learner_version, dtype=torch.long),
        token_versions=torch.full((rows, width), learner_version, dtype=torch.long),
    )
    if on is not None:
        n, w = on.token_ids.shape
        for name in ("token_ids", "attention_mask", "action_mask", "behaviour_logprobs", "token_versions"):
            getattr(batch, name)[:n, :w] = getattr(on, name)
        batch.rewards[:n] = on.rewards
        batch.policy_versions[:n] = on.policy_versions
    for i, example in enumerate(fixed, start=len(rollouts)):
        n = len(example.token_ids)
        batch.token_ids[i, :n] = torch.tensor(example.token_ids, dtype=torch.long)
        batch.attention_mask[i, :n] = True
        batch.action_mask[i, :n] = torch.tensor(example.loss_mask, dtype=torch.bool)
    return batch


class FixedSequences:
    """The fixed sequences of a GKD run, drawn ``per_batch`` at a time in shuffled epochs.

    The draws depend only on the seed and the learner iteration, so every rank draws the same rows
    and a resumed learner continues the sequence where its checkpoint left it (``take`` replays the
    draws of the iterations it did not see).

    Args:
        examples: The sequences (``gkd.data_path`` tokenised); may be empty when ``per_batch`` is 0.
        per_batch: Sequences per batch (``gkd.fixed_rows``).
        seed: Shuffling seed (the run's).

    Raises:
        ValueError: ``per_batch > 0`` with no example.
    """

    def __init__(self, examples: Sequence[TokenExample], per_batch: int, seed: int) -> None:
        if per_batch and not examples:
            raise ValueError(f"gkd.data_path: no fixed sequence to draw {per_batch} per batch from")
        self.examples, self.per_batch, self.seed = list(examples), per_batch, seed
        self._sampler = EpochSampler(len(self.examples), seed) if per_batch else None
        self._next_iteration = 0

    def take(self, iteration: int) -> list[TokenExample]:
        """The sequences of learner iteration ``iteration`` (0-based; the same for the same iteration).

        Raises:
            ValueError: ``iteration`` is negative.
        """
        if iteration < 0:
            raise ValueError(f"iteration: must be >= 0, got {iteration}")
        if self._sampler is None:
            return []
        if iteration < self._next_iteration:  # asked again (a retried iteration): draw afresh from the start
            self._sampler, self._next_iteration = EpochSampler(len(self.examples), self.seed), 0
        self._sampler.take((iteration - self._next_iteration) * self.per_batch)
        self._next_iteration = iteration + 1
        return [self.examples[i] for i in self._sampler.take(self.per_batch)]


def gkd_train_step(
    *,
    policy: Trainable,
    teacher: nn.Module,
    batch: RolloutBatch,
    on_policy_rows: int,
    config: GKDTechniqueConfig,
    world: World | None = None,
) -> TrainStepResult:
    """One optimizer step of the student on a mixed batch (module docstring).

    Args:
        policy: The student, its AdamW and scheduler.
        teacher: The frozen teacher (same vocabulary), placed like the student.
        batch: ``mixed_batch`` rows: ``token_ids [B, T] int64``, ``action_mask [B, T] bool`` (tokens
            trained), ``behaviour_logprobs [B, T] float32``, ``rewards [B] float32``; the first
            ``on_policy_rows`` rows are the student's rollouts.
        on_policy_rows: How many leading rows are on-policy rollouts.
        config: The ``gkd`` section (micro-batch size, loss, optimizer's grad clip).
        world: The learner's ranks (one when None): each trains every N-th row of the batch's
            length order; losses are scaled so N ranks make one rank's update.

    Returns:
        ``TrainStepResult``: ``policy_updated`` False when the optimizer step was skipped for a
        non-finite gradient norm (``skipped_nonfinite`` 1); ``rows_trained`` the on-policy rows and
        ``action_tokens_trained`` their action tokens (0 when skipped); metrics ``loss/gkd`` (mean
        divergence per trained token), the loss's ``gkd/*`` per-token means over the whole batch
        (``gkd/divergence``, ``gkd/forward_kl``, ``gkd/reverse_kl``, ``gkd/agreement``,
        ``gkd/teacher_logprob``, ``gkd/student_logprob``; ``gkd/is_weight``, ``gkd/is_truncated`` with
        the sampled variant), ``gkd/on_policy_share`` (rows), ``gkd/on_policy_token_share``
        (trained tokens), ``gkd/trained_tokens``, ``reward/mean`` and ``response/action_tokens_mean``
        of the on-policy rollouts (the student's training accuracy), ``policy/grad_norm``,
        ``policy/lr``, ``batch/padded_tokens`` and ``batch/real_tokens``.

    Raises:
        ValueError: ``on_policy_rows`` outside ``[0, B]``, no trained token in the batch, or the
            loss's refusals (a teacher of another vocabulary, a non-finite logit).
    """
    world = world or World()
    rows = int(batch.token_ids.shape[0])
    if not 0 <= on_policy_rows <= rows:
        raise ValueError(f"on_policy_rows: must lie in [0, {rows}], got {on_policy_rows}")
    count = int(batch.action_mask.sum())
    if count == 0:
        raise ValueError("batch: no token to train on (action_mask all False)")
    loss_fn = DISTILL_LOSSES[config.loss.divergence]
    share = rank_micro_batches(batch, length_order(batch), config.micro_batch_size, world)
    scale = loss_scale(world, count)
    policy.model.train()
    teacher.eval()
    loss_sum, parts, weights = 0.0, [], []
    for p in share.pieces:
        logits = rollout_logits(policy.model, p.batch)
        with torch.no_grad():
            teacher_logits = rollout_logits(teacher, p.batch)
        out = loss_fn(DistillLossInputs(logits, teacher_logits, p.batch.token_ids, p.batch.action_mask,
                                        p.batch.behaviour_logprobs), config.loss)
        (out.loss_sum * (scale * p.weight)).backward()
        loss_sum += float(out.loss_sum.detach()) * p.weight
        parts.append(out.metrics)
        weights.append(out.num_tokens * p.weight)
        del logits, teacher_logits
    metrics = reduce_means(world, parts, weights)
    metrics["loss/gkd"] = world.sum([loss_sum])[0] / count
    metrics["policy/grad_norm"] = clip_and_step(policy.model, policy.optimizer, policy.scheduler,
                                                config.optim.grad_clip)
    metrics["policy/lr"] = float(policy.scheduler.get_last_lr()[0])
    on_tokens = int(batch.action_mask[:on_policy_rows].sum())
    metrics.update({
        "gkd/on_policy_share": on_policy_rows / rows,
        "gkd/on_policy_token_share": on_tokens / count,
        "gkd/trained_tokens": float(count),
        "batch/padded_tokens": world.sum([float(share.padded_tokens())])[0],
        "batch/real_tokens": float(batch.attention_mask.sum()),
    })
    if on_policy_rows:
        metrics["reward/mean"] = float(batch.rewards[:on_policy_rows].mean())
        metrics["response/action_tokens_mean"] = on_tokens / on_policy_rows
    stepped = math.isfinite(metrics["policy/grad_norm"])
    return TrainStepResult(policy_updated=stepped, metrics=metrics, rows_trained=on_policy_rows if stepped else 0,
                           action_tokens_trained=float(on_tokens) if stepped else 0.0,
                           skipped_nonfinite=int(not stepped))


def load_fixed_sequences(path: str | None, tokenizer: Any, *, max_seq_len: int, limit: int | None,
                         on_bad_row: OnBadRow, quarantine_path: Path) -> list[TokenExample]:
    """``gkd.data_path`` (chat rows, docs/data.md) rendered as the agent loop renders an episode.

    Each row's assistant tokens are trained (``chat.format.render_sft_example``); rows are cut to
    ``max_seq_len`` tokens, and one with no assistant token left is a bad row (field ``messages``)
    under ``data.on_bad_row``, as for SFT. Quarantine writes are idempotent, so every rank may load.

    Args:
        path: The JSONL file; None or "" gives no sequence.
        tokenizer: The student's (and teacher's) tokenizer.
        max_seq_len: ``gkd.max_seq_len``.
        limit: ``gkd.max_examples``.
        on_bad_row: ``data.on_bad_row``.
        quarantine_path: Where bad rows go under ``quarantine``.

    Raises:
        posttrain.data.tasks.DatasetError: a bad row under ``stop`` (file, line, field), or no valid row.
        FileNotFoundError: ``path`` does not exist.
    """
    from posttrain.chat.format import ChatFormat, render_sft_example
    from posttrain.data.formats import RowPolicy, load_rows
    from posttrain.data.tasks import DatasetError

    if not path:
        return []
    loaded = load_rows(path, "sft", on_bad_row=on_bad_row, quarantine_path=quarantine_path, limit=limit)
    bad_rows = RowPolicy(Path(path), on_bad_row, quarantine_path)
    chat = ChatFormat(tokenizer)
    out: list[TokenExample] = []
    for record, line in zip(loaded.records, loaded.lines, strict=True):
        ids, mask = render_sft_example(tokenizer, record.messages, chat)
        if not any(mask[1:max_seq_len]):
            bad_rows.bad(DatasetError(Path(path), line, "messages",
                                      f"no assistant token within gkd.max_seq_len={max_seq_len}"),
                         {"id": record.example_id, "messages": record.messages})
            continue
        out.append(TokenExample(list(ids[:max_seq_len]), [False, *mask[1:max_seq_len]]))
    if not out:
        raise DatasetError(Path(path), 0, "<file>", "no usable fixed sequence (every row was bad)")
    return out
