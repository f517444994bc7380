"""Episodes in flight on one generator, and cancelling those the learner can no longer train.

Used only under ``sao.staleness_rule: episode`` (and by asynchronous GRPO), where the learner
drops a rollout whose oldest generating policy version lags the learner by more than tau
(``sao.max_staleness``; ``posttrain.rollout.admission.is_stale``); under the default token rule
the next turn samples with the newest weights and trains, so nothing is cancelled
(``generator.worker.abort_stale_episodes``). The learner's version only grows, so once an episode's oldest version ``o`` and the learner's latest published
version ``v`` satisfy ``v - o > tau``, the rollout it will produce is already dropped: every further
turn, tool call and second in its episode slot is wasted. On long-tailed agentic workloads these
are the longest episodes, and they hold their slot and admission ticket through their remaining
tool calls. ``InFlightEpisodes`` lets the generator cancel them as soon as a new version is seen
(prime-rl cancels groups past its bound early in the same way, research/peers.md, its row), so
the slot and ticket go to an episode that can still be trained.

Usage (``generator.slots``)::

    running = InFlightEpisodes()
    rollout = await running.run(functools.partial(run_episode, engine, tokenizer, env, task, limits))
    if rollout is None:          # cancelled as stale: release the ticket, count it, next task
        ...
    # from the weight watcher, at each of its wake-ups (a new version, or at most 1 s later):
    running.abort_stale(learner_version, max_staleness)

An episode whose first turn has not returned yet has no policy version and is never cancelled
(its oldest version is not known; the watcher checks it again at its next wake-up). A GRPO group is one
unit: its oldest version is the oldest over its members, and it is cancelled whole, as the
learner drops a group with any stale member.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from posttrain.rollout.admission import is_stale

T = TypeVar("T")


class _Unit:
    """One episode or group in flight: its task, the oldest policy version any of its turns used, its turns."""

    __slots__ = ("aborted", "oldest", "task", "turns")

    def __init__(self) -> None:
        self.oldest: int | None = None
        self.aborted = False
        self.task: asyncio.Future[object] | None = None
        self.turns = 0

    def saw(self, policy_version: int) -> None:
        """Record one turn's policy version (the engine's, when it sampled the turn)."""
        self.oldest = policy_version if self.oldest is None else min(self.oldest, policy_version)
        self.turns += 1


class InFlightEpisodes:
    """The episodes (or GRPO groups) running on one generator's event loop; see the module docstring.

    Not thread-safe: ``run`` and ``abort_stale`` are called on the generator's event loop.

    Attributes:
        aborted_total: Units cancelled by ``abort_stale`` so far.
    """

    def __init__(self) -> None:
        self._units: set[_Unit] = set()
        self.aborted_total = 0

    def __len__(self) -> int:
        return len(self._units)

    async def run(self, start: Callable[[Callable[[int], None]], Awaitable[T]],
                  on_abort: Callable[[int], None] | None = None) -> T | None:
        """Run one unit as its own task and return its result, or None when ``abort_stale`` cancelled it.

        Args:
            start: Called once with the keyword ``on_turn``, the callback ``on_turn(policy_version)``
                the episode calls after each turn's generation (``run_episode(on_turn=...)``, e.g.
                ``functools.partial(run_episode, engine, ...)``); returns the awaitable to run.
            on_abort: Called with the turns the unit had sampled (over its members) when
                ``abort_stale`` cancels it, before ``run`` returns None (length accounting).

        Returns:
            The awaitable's result; None when the unit was cancelled as stale.

        Raises:
            asyncio.CancelledError: the caller itself was cancelled (the generator is stopping); the
                unit is cancelled with it.
            Whatever the unit raises.
        """
        unit = _Unit()
        unit.task = asyncio.ensure_future(start(on_turn=unit.saw))
        self._units.add(unit)
        try:
            return await unit.task  # type: ignore[return-value]
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if unit.aborted and (current is None or current.cancelling() == 0):
                if on_abort is not None:
                    on_abort(unit.turns)
                return None
            raise
        finally:
            self._units.discard(unit)

    def abort_stale(self, learner_version: int, max_staleness: int) -> int:
        """Cancel every unit whose oldest policy version is more than ``max_staleness`` behind ``learner_version``.

        Args:
            learner_version: The learner's latest published policy version.
            max_staleness: tau, in policy versions (``sao.max_staleness``).

        Returns:
            Units cancelled by this call (each one's ``run`` returns None).
        """
        cancelled = 0
        for unit in list(self._units):
            if unit.aborted or unit.oldest is None or unit.task is None:
                continue
            if is_stale(unit.oldest, learner_version, max_staleness) and unit.task.cancel():
                unit.aborted = True
                cancelled += 1
        self.aborted_total += cancelled
        return cancelled
