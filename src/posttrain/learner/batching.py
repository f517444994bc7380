"""Collate rollouts into padded tensors for the learner, and split them into micro-batches.

Rows are right-padded; padding positions have ``action_mask`` False and ``attention_mask`` False,
so every loss and advantage ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posttrain.records import Rollout


@dataclass
class RolloutBatch:
    """Padded tensors of a list of rollouts.

    Attributes:
        token_ids: ``[B, T] int64``. Tokens, right-padded with ``pad_token_id``.
        attention_mask: ``[B, T] bool``. True on real tokens.
        action_mask: ``[B, T] bool``. True on tokens the policy sampled.
        behaviour_logprobs: ``[B, T] float32``. Generator logprobs (0 on non-actions).
        rewards: ``[B] float32``. Scalar reward per rollout.
        policy_versions: ``[B] int64``. Oldest policy version of each rollout.
        token_versions: ``[B, T] int64``. Policy version that sampled each token
            (``Rollout.token_policy_versions``; the rollout's oldest on non-actions and padding).
    """

    token_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    rewards: torch.Tensor
    policy_versions: torch.Tensor
    token_versions: torch.Tensor

    @property
    def num_action_tokens(self) -> int:
        """Action tokens in the batch (tokens)."""
        return int(self.action_mask.sum().item())

    def to(self, device: torch.device) -> RolloutBatch:
        """The same batch on ``device`` (no copy when it is already there)."""
        return RolloutBatch(*(getattr(self, f).to(device) for f in (
            "token_ids", "attention_mask", "action_mask", "behaviour_logprobs", "rewards", "policy_versions",
            "token_versions")))

    def rows(self, index: slice | torch.Tensor) -> RolloutBatch:
        """The rows in ``index`` (a slice, or an int64 index tensor that may reorder), trimmed to their longest real sequence."""
        attn = self.attention_mask[index]
        width = int(attn.sum(dim=1).max().item()) if attn.numel() else 0
        return RolloutBatch(
            token_ids=self.token_ids[index, :width],
            attention_mask=attn[:, :width],
            action_mask=self.action_mask[index, :width],
            behaviour_logprobs=self.behaviour_logprobs[index, :width],
            rewards=self.rewards[index],
            policy_versions=self.policy_versions[index],
            token_versions=self.token_versions[index, :width],
        )


def collate_rollouts(rollouts: Sequence[Rollout], pad_token_id: int) -> RolloutBatch:
    """Pad a list of validated rollouts into a ``RolloutBatch``.

    Raises:
        ValueError: if ``rollouts`` is empty.
        posttrain.records.RecordError: a rollout's ``turn_policy_versions`` does not match its
            runs of action tokens.
    """
    if not rollouts:
        raise ValueError("collate_rollouts: empty list of rollouts")
    width = max(len(r.token_ids) for r in rollouts)
    b = len(rollouts)
    token_ids = torch.full((b, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.bool)
    action = torch.zeros((b, width), dtype=torch.bool)
    behaviour = torch.zeros((b, width), dtype=torch.float32)
    versions = torch.zeros((b, width), dtype=torch.long)
    for i, r in enumerate(rollouts):
        n = len(r.token_ids)
        token_ids[i, :n] = torch.tensor(r.token_ids, dtype=torch.long)
        attention[i, :n] = True
        action[i, :n] = torch.tensor(r.action_mask, dtype=torch.bool)
        behaviour[i, :n] = torch.tensor(r.behaviour_logprobs, dtype=torch.float32)
        versions[i, :n] = torch.from_numpy(r.token_policy_versions())
        versions[i, n:] = r.policy_version
    return RolloutBatch(
        token_ids=token_ids,
        attention_mask=attention,
        action_mask=action,
        behaviour_logprobs=behaviour,
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        policy_versions=torch.tensor([r.policy_version for r in rollouts], dtype=torch.long),
        token_versions=versions,
    )


def select_rows(batch: RolloutBatch, index: Sequence[int]) -> RolloutBatch:
    """The rows ``index`` of ``batch`` (in that order), trimmed to their longest real sequence.

    Shapes as in ``RolloutBatch``: ``[len(index), T'] ``, ``T'`` the longest real row of ``index``.

    Raises:
        ValueError: ``index`` is empty.
    """
    if not index:
        raise ValueError("index: empty")
    return batch.rows(torch.tensor(list(index), dtype=torch.long))


def length_order(batch: RolloutBatch, rows: Sequence[int] | None = None) -> list[int]:
    """Row indices ordered by real sequence length (shortest first; ties keep their order).

    Consecutive micro-batches of length-ordered rows pad each row only up to the longest of a few
    similar rows instead of the longest of the batch (the "group by length" of HF Trainer and
    verl's length-balanced micro-batches). Every loss here is a sum over tokens divided by the
    step's action-token count and every advantage is computed per row or per group, so the row
    order changes no gradient, only the padded tokens each forward pass computes.

    Args:
        batch: Padded rollouts (``attention_mask [B, T] bool``).
        rows: A subset of row indices to order (default: all ``B`` rows).

    Returns:
        The indices of ``rows`` (or ``0..B-1``) sorted by their count of real tokens.
    """
    lengths = batch.attention_mask.sum(dim=1).tolist()
    index = range(batch.token_ids.shape[0]) if rows is None else rows
    return sorted(index, key=lambda i: lengths[i])


def padded_tokens(parts: Sequence[RolloutBatch]) -> int:
    """Tokens (real and padding) one forward pass over ``parts`` computes: sum of rows x width."""
    return sum(int(mb.token_ids.numel()) for mb in parts)


def micro_batches(batch: RolloutBatch, micro_batch_size: int) -> list[RolloutBatch]:
    """Split a batch into consecutive micro-batches of at most ``micro_batch_size`` rows.

    Raises:
        ValueError: if ``micro_batch_size`` < 1.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: must be >= 1, got {micro_batch_size}")
    b = batch.token_ids.shape[0]
    return [batch.rows(slice(i, min(i + micro_batch_size, b))) for i in range(0, b, micro_batch_size)]
