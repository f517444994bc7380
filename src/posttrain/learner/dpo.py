"""DPO learner (``technique: dpo``): tokenise preference pairs, reference logprobs, train on the sigmoid loss.

Sigmoid DPO (Rafailov et al., arXiv 2305.18290, eq. 7; ``posttrain.losses.dpo_loss``). Each pair
is rendered as a one-turn chat (the prompt as the user message, the response as the assistant
message) with the same ``render_sft_example`` the SFT data and the agent loop use, so the
sequence log-probability ``log pi(y | x)`` sums exactly the assistant tokens (the response and
its end-of-turn token).

Reference log-probabilities come from a frozen copy of the starting model, either computed
once for every pair before training (``dpo.reference: precompute``; the reference model is then
freed) or for each batch (``per_batch``). Chosen and rejected responses of a micro-batch go
through one forward pass of ``2 x micro_batch_size`` rows; the summed loss is divided by the
step's pair count (``GradientAccumulator``), so micro-batching does not change the gradient.

Under ``torchrun`` with N ranks (FSDP2, ``posttrain.parallel``) every rank draws the same pairs
of a step from the same seeded sampler and trains pairs r, r + N, ... of them (``rank_share``)
in micro-batches padded with zero-weight fillers to the same count on every rank; the divisor
stays the step's pair count and each rank's loss is scaled by N (FSDP2 averages gradients), so N
ranks make one rank's update. Reference log-probabilities and held-out metrics are split the same
way and summed over ranks, so every rank holds all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from posttrain.config.techniques import DPOTechniqueConfig
from posttrain.learner.accumulate import EpochSampler, GradientAccumulator
from posttrain.learner.optim import build_optimizer, clip_and_step, raise_if_nonfinite
from posttrain.losses.dpo import dpo_loss
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.types import LossOutput
from posttrain.parallel.shares import MicroBatch, micro_batch_plan, rank_share
from posttrain.parallel.world import World
from posttrain.records import PreferencePair


@dataclass
class PairTokens:
    """A tokenised preference pair.

    Attributes:
        chosen_ids: ``[Tc]`` int. Prompt and chosen response tokens.
        chosen_mask: ``[Tc]`` bool. True on the response tokens (the log-probability is summed over them).
        rejected_ids: ``[Tr]`` int. Prompt and rejected response tokens.
        rejected_mask: ``[Tr]`` bool. True on the response tokens.
    """

    chosen_ids: list[int]
    chosen_mask: list[bool]
    rejected_ids: list[int]
    rejected_mask: list[bool]


def tokenize_pair(tokenizer: Any, pair: PreferencePair, max_seq_len: int, chat: Any = None) -> PairTokens:
    """Render a pair as two one-turn chats and truncate each to ``max_seq_len`` tokens.

    Args:
        tokenizer: transformers tokenizer with a chat template.
        pair: ``prompt``, ``chosen`` and ``rejected`` text.
        max_seq_len: Longest sequence (tokens).
        chat: A prebuilt ``posttrain.chat.format.ChatFormat`` (built when None).

    Returns:
        The tokenised pair.

    Raises:
        ValueError: ``chosen`` (field ``chosen``) or ``rejected`` (field ``rejected``) has no
            token left after truncation: the prompt alone fills ``max_seq_len``.
    """
    from posttrain.chat.format import render_sft_example

    out: dict[str, tuple[list[int], list[bool]]] = {}
    for name, response in (("chosen", pair.chosen), ("rejected", pair.rejected)):
        ids, mask = render_sft_example(
            tokenizer, [{"role": "user", "content": pair.prompt}, {"role": "assistant", "content": response}], chat
        )
        ids, mask = list(ids[:max_seq_len]), list(mask[:max_seq_len])
        if not any(mask):
            raise ValueError(f"{name}: no response token within max_seq_len={max_seq_len} (the prompt fills it)")
        out[name] = (ids, mask)
    return PairTokens(out["chosen"][0], out["chosen"][1], out["rejected"][0], out["rejected"][1])


def collate_pairs(pairs: Sequence[PairTokens], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stack chosen rows then rejected rows, right-padded.

    Returns:
        ``(token_ids [2B, T] int64, attention_mask [2B, T] bool, response_mask [2B, T] bool)``;
        rows ``0..B-1`` are the chosen responses, rows ``B..2B-1`` the rejected ones.

    Raises:
        ValueError: ``pairs`` is empty.
    """
    if not pairs:
        raise ValueError("pairs: empty")
    seqs = [(p.chosen_ids, p.chosen_mask) for p in pairs] + [(p.rejected_ids, p.rejected_mask) for p in pairs]
    width = max(len(ids) for ids, _ in seqs)
    ids_t = torch.full((len(seqs), width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.bool)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (ids, m) in enumerate(seqs):
        ids_t[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attn[row, : len(ids)] = True
        mask[row, : len(ids)] = torch.tensor(m, dtype=torch.bool)
    return ids_t, attn, mask


def sequence_logprobs(
    model: nn.Module, token_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """Summed log-probability of each row's response tokens.

    Args:
        model: HF causal LM.
        token_ids: [R, T] int64. Right-padded sequences.
        attention_mask: [R, T] bool. True on real tokens.
        response_mask: [R, T] bool. True on the tokens whose log-probabilities are summed.

    Returns:
        [R] float32 (nats), with gradient when ``model`` has one.
    """
    logits = model(input_ids=token_ids, attention_mask=attention_mask.long(), use_cache=False).logits
    logprobs = token_logprobs(logits, token_ids)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return torch.where(response_mask, logprobs, zero).sum(dim=1)


def _pair_plan(num_pairs: int, micro_batch_size: int, world: World) -> list[MicroBatch]:
    """This rank's pairs (``rank_share`` of ``0 .. num_pairs - 1``) in micro-batches, as many on every rank."""
    return micro_batch_plan(rank_share(range(num_pairs), world), micro_batch_size, world, filler=0)


def _pair_logprobs(
    model: nn.Module, pairs: Sequence[PairTokens], piece: MicroBatch, pad_token_id: int, device: torch.device
) -> torch.Tensor:
    """``[2n]`` summed response log-probabilities of the ``n`` pairs of ``piece``: chosen rows, then rejected."""
    ids, attn, mask = (t.to(device) for t in collate_pairs([pairs[i] for i in piece.rows], pad_token_id))
    return sequence_logprobs(model, ids, attn, mask)


@torch.no_grad()
def reference_logprobs(
    reference: nn.Module,
    pairs: Sequence[PairTokens],
    *,
    pad_token_id: int,
    micro_batch_size: int,
    world: World | None = None,
) -> torch.Tensor:
    """Reference-model sequence log-probabilities of every pair.

    Args:
        reference: The frozen reference model (placed, sharded with several ranks).
        pairs: The pairs, the same on every rank.
        pad_token_id: Padding token id.
        micro_batch_size: Pairs per forward pass on each rank.
        world: The learner's ranks (one when None): each rank computes its share of the pairs and
            the shares are summed over ranks, so every rank returns all of them.

    Returns:
        [P, 2] float32 on the CPU: column 0 the chosen, column 1 the rejected response (nats), no gradient.
    """
    world = world or World()
    reference.eval()
    out = torch.zeros((len(pairs), 2), dtype=torch.float32)
    if not pairs:
        return out
    for piece in _pair_plan(len(pairs), micro_batch_size, world):
        seq = _pair_logprobs(reference, pairs, piece, pad_token_id, world.device).float().cpu()
        if piece.counts:
            n, index = len(piece.rows), torch.tensor(piece.rows, dtype=torch.long)
            out[index, 0], out[index, 1] = seq[:n], seq[n:]
    if world.distributed:  # every pair was computed on exactly one rank: the sum gathers them
        out = torch.tensor(world.sum(out.flatten().tolist()), dtype=torch.float32).reshape(len(pairs), 2)
    return out


def dpo_step(
    policy: nn.Module,
    pairs: Sequence[PairTokens],
    ref: torch.Tensor,
    config: DPOTechniqueConfig,
    *,
    pad_token_id: int,
    world: World | None = None,
) -> GradientAccumulator:
    """Forward/backward of one optimizer step's pairs in micro-batches (no optimizer step).

    Args:
        policy: The model being trained (placed, sharded with several ranks).
        pairs: The step's pairs, the same on every rank.
        ref: [P, 2] float32. Reference log-probabilities of ``pairs`` (chosen, rejected).
        config: ``dpo`` section (micro-batch size, beta, label smoothing).
        pad_token_id: Padding token id.
        world: The learner's ranks (one when None): this rank trains ``rank_share`` of the pairs.

    Returns:
        The accumulator, reduced over ranks: ``loss`` (mean DPO loss per pair of the step),
        ``num_tokens`` (the step's pairs) and the metrics of ``dpo_loss`` averaged over pairs.

    Raises:
        ValueError: ``ref`` is not ``[len(pairs), 2]``, or ``pairs`` is empty.
    """
    if ref.shape != (len(pairs), 2):
        raise ValueError(f"ref: expected shape ({len(pairs)}, 2), got {tuple(ref.shape)}")
    if not pairs:
        raise ValueError("pairs: empty")
    world = world or World()
    acc = GradientAccumulator(len(pairs), world)
    for out, weight in _pair_losses(policy, pairs, ref, config, pad_token_id, world):
        acc.backward(out, weight)
    return acc.reduce()


def _pair_losses(policy: nn.Module, pairs: Sequence[PairTokens], ref: torch.Tensor, config: DPOTechniqueConfig,
                 pad_token_id: int, world: World) -> Iterator[tuple[LossOutput, float]]:
    """``dpo_loss`` of each of this rank's micro-batches of pairs, with its weight (0 for a filler)."""
    for piece in _pair_plan(len(pairs), config.micro_batch_size, world):
        seq = _pair_logprobs(policy, pairs, piece, pad_token_id, world.device)
        n, index = len(piece.rows), torch.tensor(piece.rows, dtype=torch.long)
        piece_ref = ref[index].to(seq.device)
        yield dpo_loss(seq[:n], seq[n:], piece_ref[:, 0], piece_ref[:, 1], config.loss), piece.weight


@torch.no_grad()
def preference_metrics(
    policy: nn.Module,
    pairs: Sequence[PairTokens],
    ref: torch.Tensor,
    config: DPOTechniqueConfig,
    *,
    pad_token_id: int,
    world: World | None = None,
) -> dict[str, float]:
    """Preference accuracy and margin of ``policy`` against the reference on ``pairs`` (no gradient).

    Accuracy is the fraction of pairs whose implicit reward margin
    ``beta * [(chosen - ref_chosen) - (rejected - ref_rejected)]`` is > 0; at the start of
    training (policy = reference) every margin is 0 and the accuracy is 0. With several ranks
    (``world``) each rank scores its share of the pairs and the metrics are summed over ranks.

    Returns:
        ``dpo/accuracy``, ``dpo/margin``, ``dpo/chosen_reward``, ``dpo/rejected_reward``,
        ``loss/dpo`` (means over pairs); empty when ``pairs`` is empty.
    """
    if not pairs:
        return {}
    world = world or World()
    was_training = policy.training
    policy.eval()
    acc = GradientAccumulator(len(pairs), world)
    for out, weight in _pair_losses(policy, pairs, ref, config, pad_token_id, world):
        acc.record(out, weight)
    policy.train(was_training)
    return acc.reduce().metrics("loss/dpo")


def train_dpo(
    policy: nn.Module,
    pairs: Sequence[PairTokens],
    ref: torch.Tensor,
    config: DPOTechniqueConfig,
    *,
    pad_token_id: int,
    reference: nn.Module | None = None,
    seed: int = 0,
    start_step: int = 0,
    optimizers: tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    world: World | None = None,
) -> dict[str, float]:
    """Train ``policy`` in place for ``config.steps`` optimizer steps of ``config.batch_size`` pairs.

    With several ranks every rank draws the same pairs and trains its share (module docstring).

    Args:
        policy: HF causal LM being trained.
        pairs: Training pairs (``tokenize_pair``).
        ref: [P, 2] float32. Precomputed reference log-probabilities of ``pairs``; ignored (may
            be empty) when ``reference`` is given.
        config: ``dpo`` section.
        pad_token_id: Padding token id.
        reference: Frozen reference model for ``dpo.reference: per_batch``: each batch's reference
            log-probabilities are computed by it just before the policy forward.
        seed: Pair sampling seed.
        start_step: First step (resuming); steps ``start_step .. config.steps - 1`` run.
        optimizers: ``(optimizer, scheduler)`` to continue with; built from ``config.optim`` when None.
        on_step: Called as ``on_step(step, metrics)`` after each optimizer step (1-based), on every
            rank (the metrics are the step's over all ranks).
        world: The learner's ranks (one when None).

    Returns:
        Metrics of the last step: ``loss/dpo``, ``dpo/accuracy``, ``dpo/margin``,
        ``dpo/chosen_reward``, ``dpo/rejected_reward``, ``policy/grad_norm``, ``policy/lr``, ``dpo/pairs``.

    Raises:
        ValueError: ``pairs`` is empty, or ``ref`` is not ``[len(pairs), 2]`` without ``reference``.
        NonFiniteGradientError: a non-finite gradient norm (``optim.raise_if_nonfinite``).
    """
    if not pairs:
        raise ValueError("pairs: empty")
    if reference is None and ref.shape != (len(pairs), 2):
        raise ValueError(f"ref: expected shape ({len(pairs)}, 2), got {tuple(ref.shape)}")
    optimizer, scheduler = optimizers or build_optimizer(policy, config.optim, config.steps)
    sampler = EpochSampler(len(pairs), seed)
    sampler.take(start_step * config.batch_size)
    policy.train()
    last: dict[str, float] = {}
    for step in range(start_step, config.steps):
        index = sampler.take(config.batch_size)
        batch = [pairs[i] for i in index]
        if reference is not None:
            batch_ref = reference_logprobs(
                reference, batch, pad_token_id=pad_token_id, micro_batch_size=config.micro_batch_size, world=world
            )
        else:
            batch_ref = ref[torch.tensor(index, dtype=torch.long)]
        acc = dpo_step(policy, batch, batch_ref, config, pad_token_id=pad_token_id, world=world)
        last = acc.metrics("loss/dpo")
        last["policy/grad_norm"] = raise_if_nonfinite(
            clip_and_step(policy, optimizer, scheduler, config.optim.grad_clip))
        last["policy/lr"] = float(scheduler.get_last_lr()[0])
        last["dpo/pairs"] = float(acc.num_tokens)
        if on_step is not None:
            on_step(step + 1, last)
    policy.eval()
    return last

