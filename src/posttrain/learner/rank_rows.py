"""A batch of rollouts split over the learner's ranks: this rank's micro-batches, and metrics summed over ranks.

Every rank holds the whole batch (``posttrain.parallel.shares``): counts over the batch need no
communication. ``rank_micro_batches`` deals the rows of a length order round-robin over the ranks
and cuts this rank's rows into micro-batches, padded with zero-weight fillers so that every rank
runs as many forward and backward passes as the others (FSDP2's collectives must match). With one
rank it is the batch in micro-batches, as before.

``reduce_means`` and ``reduce_moments`` turn per-micro-batch metrics into the batch's, summed over
ranks, so a metric reads the same whatever the number of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posttrain.learner.batching import RolloutBatch, select_rows
from posttrain.parallel.shares import micro_batch_plan, rank_share
from posttrain.parallel.world import World


@dataclass(frozen=True)
class Piece:
    """One micro-batch of this rank.

    Attributes:
        batch: Its rows, on the learner's device, trimmed to their longest real row.
        lo: First row inside this rank's rows (``RankRows.local``).
        hi: One past its last row there.
        weight: 1.0, or 0.0 for a filler (its loss counts for nothing; its metrics are skipped).
    """

    batch: RolloutBatch
    lo: int
    hi: int
    weight: float

    @property
    def width(self) -> int:
        """Columns (tokens) of the micro-batch."""
        return int(self.batch.token_ids.shape[1])


@dataclass(frozen=True)
class RankRows:
    """This rank's rows of a batch and its micro-batches.

    Attributes:
        rows: Indices into the whole batch (empty when the batch has fewer rows than ranks).
        local: Those rows on the device, trimmed (one filler row when ``rows`` is empty).
        pieces: The micro-batches, as many on every rank.
    """

    rows: list[int]
    local: RolloutBatch
    pieces: list[Piece]

    @property
    def index(self) -> torch.Tensor:
        """``rows`` as an int64 tensor (``[len(rows)]``), for indexing batch-wide tensors."""
        return torch.tensor(self.rows, dtype=torch.long)

    def padded_tokens(self) -> int:
        """Tokens (real and padding) this rank's real micro-batches compute (rows x width)."""
        return sum(int(p.batch.token_ids.numel()) for p in self.pieces if p.weight)


def rank_micro_batches(batch: RolloutBatch, order: Sequence[int], micro_batch_size: int, world: World) -> RankRows:
    """This rank's share of ``order`` (rows of ``batch``) in micro-batches of ``micro_batch_size``.

    Args:
        batch: The whole batch (CPU).
        order: The rows to train, in the order they are dealt (``length_order``); not empty.
        micro_batch_size: Rows per forward pass on each rank (>= 1).
        world: The ranks.

    Raises:
        ValueError: ``order`` is empty, or ``micro_batch_size < 1``.
    """
    if not order:
        raise ValueError("order: no rows to train")
    rows = rank_share(order, world)
    local = select_rows(batch, rows or [order[0]]).to(world.device)
    plan = micro_batch_plan(list(range(len(rows))), micro_batch_size, world, filler=0)
    pieces = []
    for mb in plan:
        lo, hi = mb.rows[0], mb.rows[-1] + 1
        pieces.append(Piece(local.rows(slice(lo, hi)), lo, hi, mb.weight))
    return RankRows(rows, local, pieces)


def reduce_means(world: World, parts: Sequence[dict[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Per-micro-batch metrics made the batch's, over every rank's micro-batches.

    A key ending in ``/max`` or ``/min`` takes the largest or smallest value of the micro-batches
    that count (weight > 0); every other key is the mean weighted by ``weights``. ``parts`` must
    have the same keys on every rank (fillers report theirs with weight 0). A metric that is not
    a per-token mean or an extreme (``ratio/ess``) still depends on how the rows are cut.
    """
    keys = sorted({k for p in parts for k in p})
    extremes = [k for k in keys if k.endswith(("/max", "/min"))]
    means = [k for k in keys if k not in extremes]
    local = [float(sum(weights))] + [sum(p.get(k, 0.0) * w for p, w in zip(parts, weights, strict=True)) for k in means]
    total, *sums = world.sum(local)
    out = {k: v / max(total, 1.0) for k, v in zip(means, sums, strict=True)}
    counted = [p for p, w in zip(parts, weights, strict=True) if w > 0]
    signs = [1.0 if k.endswith("/max") else -1.0 for k in extremes]
    local_ext = [max((sign * p[k] for p in counted if k in p), default=-math.inf) for k, sign in zip(extremes, signs, strict=True)]
    for k, sign, v in zip(extremes, signs, world.max_floats(local_ext), strict=True):
        out[k] = sign * v if math.isfinite(v) else 0.0
    return out


def reduce_moments(world: World, values: torch.Tensor) -> tuple[float, float]:
    """Mean and unbiased standard deviation of ``values`` (any shape) pooled over every rank; 0 when empty."""
    v = values.detach().double()
    n, s, ss = world.sum([float(v.numel()), float(v.sum()), float((v * v).sum())])
    if n < 1:
        return 0.0, 0.0
    mean = s / n
    var = (ss - n * mean * mean) / (n - 1) if n > 1 else 0.0
    return mean, max(var, 0.0) ** 0.5
