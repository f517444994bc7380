"""Sequence packing and the SFT/CPT learner loop over packed rows (``technique: sft`` and ``cpt``).

Packing puts several tokenised examples into one row of at most ``max_len`` tokens. Position
ids restart at 0 for each example; the model is called with ``position_ids``, no
``attention_mask`` and ``use_cache=False``, and transformers (``masking_utils.find_packed_sequence_indices``) turns the
restarts into a block-diagonal causal mask, so no token attends across examples. The first token
of every example is never trained on: its log-probability would come from the previous example's
last position. Padding at the end of a row has ``loss_mask`` False.

With packing off each example is its own row, through the same code path, which makes
"packed loss == unpacked loss" a direct test (``tests/unit/learner/test_packing.py``).

The loss is ``sft_loss`` (summed NLL of masked tokens) divided by the global count of trained
tokens of the optimizer step (``GradientAccumulator``), with the shared AdamW/scheduler builder.

Under ``torchrun`` with N ranks (FSDP2, ``posttrain.parallel``) every rank draws the same rows
of a step from the same seeded sampler; rank r trains rows r, r + N, ... of them
(``rank_share``), in micro-batches padded with zero-weight fillers to the same count on every
rank (``micro_batch_plan``). The divisor stays the step's trained-token count over all rows and
each rank's loss is scaled by N (FSDP2 averages gradients), so N ranks make one rank's update;
loss and metrics are summed over ranks. With one rank this is the loop it always was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from posttrain.config.techniques import SFTTechniqueConfig
from posttrain.learner.accumulate import EpochSampler, GradientAccumulator
from posttrain.learner.optim import build_optimizer, clip_and_step, raise_if_nonfinite
from posttrain.learner.sft import TokenExample
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.sft import sft_loss
from posttrain.parallel.shares import micro_batch_plan, rank_share
from posttrain.parallel.world import World


@dataclass
class PackedRow:
    """One training row holding one or more examples.

    Attributes:
        token_ids: ``[N]`` int. Tokens of the examples, concatenated.
        loss_mask: ``[N]`` bool. True on trained tokens; False on each example's first token.
        position_ids: ``[N]`` int. Position within its own example (restarts at 0).
        example_lengths: Tokens of each example in the row, in order.
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    example_lengths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(self, example: TokenExample) -> None:
        """Append an example (its first token gets ``loss_mask`` False)."""
        n = len(example.token_ids)
        self.token_ids.extend(example.token_ids)
        self.loss_mask.extend([False] + list(example.loss_mask[1:n]))
        self.position_ids.extend(range(n))
        self.example_lengths.append(n)


def truncate_example(example: TokenExample, max_len: int) -> TokenExample:
    """The first ``max_len`` tokens of ``example`` (unchanged when it is shorter).

    Raises:
        ValueError: ``max_len < 2`` or ``token_ids`` and ``loss_mask`` differ in length.
    """
    if max_len < 2:
        raise ValueError(f"max_len: must be >= 2, got {max_len}")
    if len(example.token_ids) != len(example.loss_mask):
        raise ValueError(
            f"loss_mask: {len(example.loss_mask)} entries for {len(example.token_ids)} token_ids"
        )
    return TokenExample(list(example.token_ids[:max_len]), list(example.loss_mask[:max_len]))


def pack_examples(examples: Sequence[TokenExample], max_len: int, *, packing: bool = True) -> list[PackedRow]:
    """Greedily pack examples, in order, into rows of at most ``max_len`` tokens.

    An example longer than ``max_len`` is truncated to it; an example never spans two rows.
    With ``packing=False`` every example gets its own row.

    Args:
        examples: Tokenised examples (``token_ids`` and ``loss_mask`` of equal length >= 1).
        max_len: Row capacity (tokens), >= 2.
        packing: Pack several examples per row.

    Returns:
        The rows, in example order.

    Raises:
        ValueError: ``max_len < 2``, an empty example, or mismatched ``loss_mask`` length.
    """
    rows: list[PackedRow] = []
    current = PackedRow()
    for i, example in enumerate(examples):
        if not example.token_ids:
            raise ValueError(f"examples[{i}].token_ids: empty")
        ex = truncate_example(example, max_len)
        if current.token_ids and (not packing or len(current) + len(ex.token_ids) > max_len):
            rows.append(current)
            current = PackedRow()
        current.add(ex)
    if current.token_ids:
        rows.append(current)
    return rows


def collate_packed(rows: Sequence[PackedRow], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad rows into tensors; padding continues the positions of the row's last example.

    Returns:
        ``(token_ids [B, N] int64, position_ids [B, N] int64, loss_mask [B, N] bool)`` with N the
        longest row; padding has ``loss_mask`` False (being after every real token of a causal
        row, it changes no real token's output).

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not rows:
        raise ValueError("rows: empty")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        n = len(row)
        ids[b, :n] = torch.tensor(row.token_ids, dtype=torch.long)
        mask[b, :n] = torch.tensor(row.loss_mask, dtype=torch.bool)
        last_start = row.position_ids[-1]
        positions[b, :n] = torch.tensor(row.position_ids, dtype=torch.long)
        positions[b, n:] = torch.arange(last_start + 1, last_start + 1 + width - n)
    return ids, positions, mask


def packed_logprobs(model: nn.Module, token_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """``logprobs [B, N] float32`` of packed rows (block-diagonal causal attention), with gradient.

    Args:
        model: HF causal LM whose attention builds its mask with ``transformers.masking_utils``.
        token_ids: [B, N] int64. Packed tokens.
        position_ids: [B, N] int64. Positions restarting at 0 per example.
    """
    # No KV cache: transformers only derives the packed (block-diagonal) mask without one.
    logits = model(input_ids=token_ids, position_ids=position_ids, use_cache=False).logits
    return token_logprobs(logits, token_ids)


def sft_step(
    model: nn.Module,
    rows: Sequence[PackedRow],
    *,
    pad_token_id: int,
    micro_batch_size: int,
    world: World | None = None,
) -> GradientAccumulator:
    """Forward/backward of one optimizer step's rows in micro-batches (no optimizer step).

    The summed NLL of each micro-batch is divided by the trained-token count of all ``rows``, so
    the gradient does not depend on ``micro_batch_size`` (nor on the number of ranks).

    Args:
        model: HF causal LM (placed, and sharded with several ranks: ``prepare_model``).
        rows: The step's rows, the same on every rank.
        pad_token_id: Padding token id.
        micro_batch_size: Rows per forward pass on each rank.
        world: The learner's ranks (one when None): this rank trains ``rank_share`` of the rows,
            on ``world.device``.

    Returns:
        The accumulator, reduced over ranks (``loss`` = mean NLL per trained token of the step,
        ``num_tokens`` = the step's trained tokens, metrics).

    Raises:
        ValueError: ``micro_batch_size < 1`` or ``rows`` is empty.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: must be >= 1, got {micro_batch_size}")
    if not rows:
        raise ValueError("rows: empty")
    world = world or World()
    total = sum(sum(r.loss_mask) for r in rows)
    acc = GradientAccumulator(total, world)
    mine = rank_share(range(len(rows)), world)
    for piece in micro_batch_plan(mine, micro_batch_size, world, filler=0):
        ids, positions, mask = (t.to(world.device) for t in collate_packed([rows[i] for i in piece.rows], pad_token_id))
        acc.backward(sft_loss(packed_logprobs(model, ids, positions), mask), piece.weight)
    return acc.reduce()


def train_sft_packed(
    model: nn.Module,
    rows: Sequence[PackedRow],
    config: SFTTechniqueConfig,
    *,
    pad_token_id: int,
    seed: int = 0,
    start_step: int = 0,
    optimizers: tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    world: World | None = None,
) -> dict[str, float]:
    """Train ``model`` in place on packed rows for ``config.steps`` optimizer steps.

    Rows are drawn in shuffled epochs, ``config.batch_size`` per step; with several ranks every
    rank draws the same rows and trains its share of them (module docstring).

    Args:
        model: HF causal LM.
        rows: Packed rows (``pack_examples``).
        config: ``sft`` section: steps, batch and micro-batch sizes, optimizer.
        pad_token_id: Padding token id.
        seed: Shuffling seed.
        start_step: First step number (resuming); steps ``start_step .. config.steps - 1`` run.
        optimizers: ``(optimizer, scheduler)`` to continue with; built from ``config.optim`` when None.
        on_step: Called as ``on_step(step, metrics)`` after each optimizer step (1-based step), on
            every rank (the metrics are the step's over all ranks).
        world: The learner's ranks (one when None).

    Returns:
        Metrics of the last step: ``loss/sft`` (mean NLL per trained token, nats), ``sft/nll``,
        ``policy/grad_norm``, ``policy/lr``, ``sft/tokens`` (trained tokens in the step).

    Raises:
        ValueError: no row has a trained token.
        NonFiniteGradientError: a non-finite gradient norm (``optim.raise_if_nonfinite``).
    """
    if not any(any(r.loss_mask) for r in rows):
        raise ValueError("rows: no row has a token to train on (loss_mask all False)")
    optimizer, scheduler = optimizers or build_optimizer(model, config.optim, config.steps)
    sampler = EpochSampler(len(rows), seed)
    sampler.take(start_step * config.batch_size)  # replay the draws of the steps already done
    model.train()
    last: dict[str, float] = {}
    for step in range(start_step, config.steps):
        batch = [rows[i] for i in sampler.take(config.batch_size)]
        acc = sft_step(model, batch, pad_token_id=pad_token_id, micro_batch_size=config.micro_batch_size,
                       world=world)
        last = acc.metrics("loss/sft")
        last["policy/grad_norm"] = raise_if_nonfinite(
            clip_and_step(model, optimizer, scheduler, config.optim.grad_clip))
        last["policy/lr"] = float(scheduler.get_last_lr()[0])
        last["sft/tokens"] = float(acc.num_tokens)
        if on_step is not None:
            on_step(step + 1, last)
    model.eval()
    return last
