"""Generator identity and per-episode sampling seeds, disjoint across the generators of one run.

Every generator of a run has an index ``i`` in ``[0, MAX_GENERATORS)``: ``posttrain run`` numbers
its local generators, a cluster generator pod takes its JobSet job index
(``posttrain generator --generator-index $(POSTTRAIN_GENERATOR_INDEX)``). From it come

* its name ``g<i>`` and its generator seed ``run seed * 1000 + i`` (engine seed, task order), and
* the sampling seed of its ``c``-th episode (``episode_seed``): the run's episodes are numbered
  ``n = c * MAX_GENERATORS + i``, so no two generators of a run ever get the same number, and
  episode ``n`` samples with a seed ``EPISODE_SEED_STRIDE`` apart from every other episode's. Inside
  that stride a group's member ``k`` uses ``+ 1000 k`` (``k < 1024``) and turn ``t`` uses ``+ t``
  (``t < 1000``), so no two requests of a run share a seed, whatever tasks they run.

Seeds stay below 2**53, so the float ``Rollout.metrics["sampling_seed"]`` holds them exactly.

A generator's position (its episode counter ``c``) survives a restart: counters are reserved in
blocks of ``POSITION_BLOCK`` from the run's Redis (``HINCRBY`` on ``StreamKeys.generator_positions``,
field = index), so a restarted generator, whose task order is also seeded by its first reserved
counter, never replays the (task, seed) pairs of its earlier life (the audit saw every rollout of a
restarted generator token-identical to one of its first life, and 8 of 44 trained twice). At most
``POSITION_BLOCK - 1`` numbers are skipped per restart. When Redis loses its data (a group restart
on an empty emptyDir) the learner's checkpoint holds the positions and the resumed learner writes
them back before it sets the version key; a generator reserves its first block only after that key
exists (``posttrain.rollout.positions``, which also says what happens to counters reserved after
the checkpoint). Tested in ``tests/unit/generator/test_seeds.py``,
``tests/integration/test_generator_restart.py`` and ``tests/integration/test_group_restart_fresh_redis.py``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

MAX_GENERATORS = 1024
"""Generators of one run (``generator.num_processes`` and the JobSet's generator replicas are at most this)."""
EPISODE_SEED_STRIDE = 2**20
"""Seeds reserved per episode: group member k < 1024 adds 1000 k, turn t < 1000 adds t; 1023 * 1000 + 999 < 2**20."""
EPISODE_NUMBER_BITS = 33
"""Episode numbers wrap modulo 2**33 (2**23 = 8.4 M episodes per generator before a generator's seeds repeat)."""
_RUN_MIX = 0x9E3779B1
"""Odd constant: spreads run seeds over the episode-number ring so runs with nearby seeds differ."""
_ID = re.compile(r"^g(\d+)$")
POSITION_BLOCK = 64
"""Episode counters a generator reserves from Redis at a time (one ``HINCRBY`` per 64 episodes)."""


def generator_index(index: int | None, generator_id: str | None) -> int:
    """The generator's index: ``index`` when given, else N of a ``g<N>`` ``generator_id``, else 0.

    Raises:
        ValueError: the index is outside ``[0, MAX_GENERATORS)``.
    """
    if index is None:
        match = _ID.match(generator_id or "")
        index = int(match.group(1)) if match else 0
    if not 0 <= index < MAX_GENERATORS:
        raise ValueError(f"generator index: must be in [0, {MAX_GENERATORS}), got {index}")
    return index


def generator_seed(run_seed: int, index: int) -> int:
    """Seed of generator ``index`` (engine seed and task order): ``run_seed * 1000 + index``, as ``posttrain run`` always did."""
    return run_seed * 1000 + index


def generator_identity(run_seed: int, index: int | None = None, generator_id: str | None = None,
                       seed: int | None = None) -> tuple[int, str, int]:
    """``(index, name, seed)`` of a generator from ``posttrain generator``'s options (None: not given).

    ``--generator-index 3`` in a run seeded 7 -> ``(3, "g3", 7003)``; ``--generator-id``/``--seed``
    override the name and seed; ``--generator-id g2`` alone -> ``(2, "g2", 7002)``.

    Raises:
        ValueError: the index is outside ``[0, MAX_GENERATORS)``.
    """
    index = generator_index(index, generator_id)
    return index, generator_id or f"g{index}", generator_seed(run_seed, index) if seed is None else seed


def episode_seed(run_seed: int, index: int, counter: int) -> int:
    """Sampling seed of episode ``counter`` (0, 1, ...) of generator ``index`` in the run seeded ``run_seed``.

    ``((run_seed * _RUN_MIX + counter * MAX_GENERATORS + index) mod 2**33) * EPISODE_SEED_STRIDE``.
    For one run it is injective in ``(index, counter)`` while ``counter < 2**23``. Worked: run seed
    0, generator 1, episode 2 -> (2 * 1024 + 1) * 2**20 = 2049 * 1048576 = 2148532224; generator 0,
    episode 2 -> 2048 * 2**20 = 2147483648.

    Raises:
        ValueError: ``index`` is outside ``[0, MAX_GENERATORS)`` or ``counter`` is negative.
    """
    if not 0 <= index < MAX_GENERATORS:
        raise ValueError(f"generator index: must be in [0, {MAX_GENERATORS}), got {index}")
    if counter < 0:
        raise ValueError(f"episode counter: must be >= 0, got {counter}")
    number = (run_seed * _RUN_MIX + counter * MAX_GENERATORS + index) % 2**EPISODE_NUMBER_BITS
    return number * EPISODE_SEED_STRIDE


class EpisodeSeeds:
    """The seeds of one generator's episodes, in order; shared by all its slots (``next()`` is atomic in asyncio).

    Args:
        run_seed: The run config's ``seed``.
        index: The generator's index (``generator_index``).
        reserve: ``reserve(n)`` reserves the next ``n`` episode counters of this generator for good
            and returns the end of the reserved range (exclusive): the run's Redis in a generator
            (``redis_reserve``), so a restart continues where the last life stopped. None: count
            from 0 in this process only.
        block: Counters reserved per ``reserve`` call (``>= 1``).

    Attributes:
        start: The first counter of this life (0 without ``reserve``): seeds the generator's task order.

    Raises:
        ValueError: ``index`` out of range, ``block < 1``, or ``reserve`` returned an end below ``block``.
    """

    def __init__(self, run_seed: int, index: int, reserve: Callable[[int], int] | None = None,
                 block: int = POSITION_BLOCK) -> None:
        episode_seed(run_seed, index, 0)  # validates
        if block < 1:
            raise ValueError(f"block: must be >= 1, got {block}")
        self.run_seed = run_seed
        self.index = index
        self._reserve = reserve
        self._block = block
        self._counter: itertools.count[int] | None = None if reserve is not None else itertools.count()
        self._next = self._end = 0
        if reserve is not None:
            self._take_block()
        self.start = self._next

    def _take_block(self) -> None:
        assert self._reserve is not None
        end = int(self._reserve(self._block))
        if end < self._block:
            raise ValueError(f"reserve: returned end {end}, below the block of {self._block} just reserved")
        self._next, self._end = end - self._block, end

    def next(self) -> int:
        """The next episode's seed (reserving the next block from ``reserve`` when this one is used up)."""
        if self._counter is not None:
            return episode_seed(self.run_seed, self.index, next(self._counter))
        if self._next >= self._end:
            self._take_block()
        counter, self._next = self._next, self._next + 1
        return episode_seed(self.run_seed, self.index, counter)
