"""Pieces shared by the technique learners: gradient accumulation and epoch sampling.

``GradientAccumulator``: each micro-batch's summed loss is divided by the global count of the
optimizer step before ``backward`` (times the number of ranks under FSDP2, which averages
gradients over ranks: ``posttrain.parallel.placement.loss_scale``); ``reduce()`` then sums the
loss, the count and the metrics over ranks, so they read the same for any number of ranks.

Every loss in ``posttrain.losses`` returns a sum over its eligible tokens (pairs for DPO); the
step's loss is ``sum over micro-batches of loss_sum / N`` where N is the count over the whole
step, so splitting a batch into micro-batches (or across ranks) leaves the gradient unchanged.

Example::

    acc = GradientAccumulator(total_tokens)
    for mb in micro_batches:
        acc.backward(sft_loss(token_logprobs(model(mb.ids).logits, mb.ids), mb.mask))
    metrics = acc.reduce().metrics("loss/sft")  # then clip_and_step(...)
"""

from __future__ import annotations

import random

from posttrain.losses.types import LossOutput
from posttrain.parallel.placement import loss_scale
from posttrain.parallel.world import World


class GradientAccumulator:
    """Backpropagates micro-batch losses normalised by the step's global count and keeps their metrics.

    Args:
        divisor: Global count of the optimizer step over every rank (action tokens, trained tokens
            or pairs); a step with nothing to train on uses 1, so its zero loss still backpropagates.
        world: The learner's ranks (one when None). Each rank backpropagates its micro-batches'
            losses times ``loss_scale(world, divisor)`` (``world.size / divisor``), so N ranks
            under FSDP2 make one rank's update.

    Raises:
        ValueError: ``divisor`` is negative.
    """

    def __init__(self, divisor: int, world: World | None = None) -> None:
        if divisor < 0:
            raise ValueError(f"divisor: must be >= 0, got {divisor}")
        self.divisor = max(int(divisor), 1)
        self.world = world or World()
        self.scale = loss_scale(self.world, self.divisor)
        self.loss = 0.0
        self.num_tokens = 0
        self._weighted: dict[str, float] = {}

    def backward(self, out: LossOutput, weight: float = 1.0) -> None:
        """``(out.loss_sum * scale * weight).backward()`` and ``record(out, weight)``.

        ``weight`` is 0 for a filler micro-batch (``posttrain.parallel.shares``): it runs forward and
        backward like the others (FSDP2's collectives must match over ranks) and counts for nothing.
        """
        (out.loss_sum * (self.scale * weight)).backward()
        self.record(out, weight)

    def record(self, out: LossOutput, weight: float = 1.0) -> None:
        """Add ``out``'s loss (divided by ``divisor``) and its metrics weighted by its count, without backward.

        With ``weight`` 0 (a filler) only the metric names are kept, so every rank reduces the same keys.
        """
        self.loss += float(out.loss_sum.detach()) * weight / self.divisor
        self.num_tokens += int(out.num_tokens * weight)
        for key, value in out.metrics.items():
            self._weighted[key] = self._weighted.get(key, 0.0) + value * out.num_tokens * weight

    def reduce(self) -> GradientAccumulator:
        """Sum the loss, the count and the weighted metrics over every rank, in place; returns ``self``.

        Every rank must call it (one all-reduce) with the same metric names; with one rank it changes nothing.
        """
        if not self.world.distributed:
            return self
        keys = sorted(self._weighted)
        loss, count, *sums = self.world.sum([self.loss, float(self.num_tokens), *(self._weighted[k] for k in keys)])
        self.loss, self.num_tokens = loss, round(count)
        self._weighted = dict(zip(keys, sums, strict=True))
        return self

    def metrics(self, loss_name: str) -> dict[str, float]:
        """The step's loss under ``loss_name`` plus each micro-batch metric averaged by token (pair) count."""
        count = max(self.num_tokens, 1)
        out = {key: total / count for key, total in self._weighted.items()}
        out[loss_name] = self.loss
        return out


class EpochSampler:
    """Draws item indices in shuffled epochs: every item once per epoch, a new order each epoch.

    Args:
        num_items: Items to draw from (>= 1).
        seed: Shuffling seed; the same seed gives the same sequence of draws.

    Raises:
        ValueError: ``num_items < 1``.
    """

    def __init__(self, num_items: int, seed: int) -> None:
        if num_items < 1:
            raise ValueError(f"num_items: must be >= 1, got {num_items}")
        self.num_items = num_items
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def take(self, count: int) -> list[int]:
        """The next ``count`` indices (an epoch boundary may fall inside them)."""
        out: list[int] = []
        while len(out) < count:
            if not self._order:
                self._order = list(range(self.num_items))
                self._rng.shuffle(self._order)
            out.append(self._order.pop())
        return out
