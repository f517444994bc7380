"""Which rows of a batch each rank trains, in micro-batches whose count is equal on every rank.

Every rank holds the whole batch (rank 0 read it and broadcast it), so counts over the batch
(action tokens, pairs) and model-free quantities (group advantages, batch-normalised advantages)
are computed alike everywhere without communication. The rows are then dealt round-robin in
length order (``rank_share``): rank r trains rows r, r + N, r + 2N... of that order, which
balances tokens across ranks.

FSDP2 needs every rank to run the same number of forward and backward passes. A rank with fewer
rows pads its plan with filler micro-batches (``micro_batch_plan``): a real row whose loss is
multiplied by 0, so its gradient is zero and the collectives still match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.parallel.world import World


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward of a rank's plan.

    Attributes:
        rows: Indices into the whole batch.
        counts: False for a filler micro-batch (loss weight 0; metrics skip it).
    """

    rows: list[int]
    counts: bool = True

    @property
    def weight(self) -> float:
        """1.0 for a real micro-batch, 0.0 for a filler."""
        return 1.0 if self.counts else 0.0


def rank_share(order: Sequence[int], world: World) -> list[int]:
    """This rank's rows: every ``world.size``-th of ``order`` starting at ``world.rank``."""
    return list(order[world.rank :: world.size])


def micro_batch_plan(rows: Sequence[int], micro_batch_size: int, world: World, *, filler: int) -> list[MicroBatch]:
    """``rows`` in chunks of ``micro_batch_size``, padded with fillers to the largest count over ranks.

    Args:
        rows: This rank's rows (indices into the whole batch), in the order they train.
        micro_batch_size: Rows per forward pass (>= 1).
        world: The ranks (the count is agreed over them; one all-reduce).
        filler: A row of the whole batch that fillers use when this rank has no row at all.

    Returns:
        At least one micro-batch; the same number on every rank.

    Raises:
        ValueError: ``micro_batch_size < 1``.
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: must be >= 1, got {micro_batch_size}")
    plan = [MicroBatch(list(rows[i : i + micro_batch_size])) for i in range(0, len(rows), micro_batch_size)]
    count = max(world.max(len(plan)), 1)
    pad_row = rows[0] if rows else filler
    plan.extend(MicroBatch([pad_row], counts=False) for _ in range(count - len(plan)))
    return plan
