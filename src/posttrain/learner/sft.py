"""Supervised fine-tuning on token sequences with a loss mask (the RL warm start and ``technique: sft``).

Each example is ``(token_ids, loss_mask)`` rendered by the same chat/segment logic the agent loop
uses, so SFT data and RL rollouts tokenise identically. The loss is the summed negative
log-likelihood of masked tokens divided by the global count of masked tokens in the optimizer step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm import tqdm

from posttrain.config import SFTConfig
from posttrain.learner.optim import build_optimizer, clip_and_step, raise_if_nonfinite
from posttrain.losses.logprobs import token_logprobs
from posttrain.losses.sft import sft_loss


@dataclass
class TokenExample:
    """One training sequence.

    Attributes:
        token_ids: ``[T]`` int tokens.
        loss_mask: ``[T]`` bool, True where the token is trained on (assistant tokens).
    """

    token_ids: list[int]
    loss_mask: list[bool]


def pad_examples(examples: Sequence[TokenExample], pad_token_id: int, max_len: int) -> tuple[torch.Tensor, ...]:
    """Right-pad and truncate to ``max_len`` tokens.

    Returns:
        ``(token_ids [B, T] int64, attention_mask [B, T] bool, loss_mask [B, T] bool)``.
    """
    width = min(max(len(e.token_ids) for e in examples), max_len)
    b = len(examples)
    ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.bool)
    mask = torch.zeros((b, width), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = min(len(e.token_ids), width)
        ids[i, :n] = torch.tensor(e.token_ids[:n], dtype=torch.long)
        attn[i, :n] = True
        mask[i, :n] = torch.tensor(e.loss_mask[:n], dtype=torch.bool)
    return ids, attn, mask


def train_sft(
    model: nn.Module,
    examples: Sequence[TokenExample],
    config: SFTConfig,
    *,
    pad_token_id: int,
    micro_batch_size: int = 16,
    seed: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Train ``model`` in place for ``config.steps`` optimizer steps.

    Args:
        model: HF causal LM.
        examples: Training sequences; sampled in shuffled epochs.
        config: Steps, batch size (examples per step), max sequence length, optimizer.
        pad_token_id: Padding token id.
        micro_batch_size: Examples per forward/backward (gradient accumulation inside a step).
        seed: Shuffling seed.
        on_step: Called with ``(step, metrics)`` after each optimizer step.
        progress: Show a progress bar.

    Returns:
        Metrics of the last step (``loss/sft``, ``sft/grad_norm``, ``sft/tokens``).

    Raises:
        ValueError: if ``examples`` is empty or no example has a masked token.
    """
    if not examples:
        raise ValueError("train_sft: no examples")
    if not any(any(e.loss_mask) for e in examples):
        raise ValueError("train_sft: no example has a token to train on (loss_mask all False)")
    rng = random.Random(seed)
    order: list[int] = []
    optimizer, scheduler = build_optimizer(model, config.optim, config.steps)
    model.train()
    last: dict[str, float] = {}
    for step in tqdm(range(config.steps), desc="sft", disable=not progress, leave=False):
        batch: list[TokenExample] = []
        while len(batch) < config.batch_size:
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            batch.append(examples[order.pop()])
        ids, attn, mask = pad_examples(batch, pad_token_id, config.max_seq_len)
        total = int(mask.sum())
        loss_total = 0.0
        for lo in range(0, len(batch), micro_batch_size):
            sl = slice(lo, lo + micro_batch_size)
            logits = model(input_ids=ids[sl], attention_mask=attn[sl].long()).logits
            out = sft_loss(token_logprobs(logits, ids[sl]), mask[sl])
            (out.loss_sum / max(total, 1)).backward()
            loss_total += float(out.loss_sum.detach())
        norm = raise_if_nonfinite(clip_and_step(model, optimizer, scheduler, config.optim.grad_clip))
        last = {"loss/sft": loss_total / max(total, 1), "sft/grad_norm": norm, "sft/tokens": float(total)}
        if on_step is not None:
            on_step(step, last)
    model.eval()
    return last
