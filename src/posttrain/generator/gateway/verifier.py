"""Grading a gateway episode with the run's environment, given a task id (``gateway.verifier: environment``).

The environment of the run (``data.env``) starts a fresh episode of the named training task and
is stepped with the episode's action texts in order, exactly as an environment episode would have
been stepped with them; the step that ends the episode gives the reward, finish reason and metrics
(``correct``, ``tool_calls``...). An episode whose actions run out before the environment ends it
gets reward 0.0 and ``length``, as an environment episode that ran out of turns. The environment's
own tools run again during the replay (the calculator, a sandboxed command); the agent's tool
outputs are not read, only what the policy wrote.

Only training tasks can be named: a held-out task's id is refused, so gateway traffic never trains
on the tasks the run is evaluated on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.envs.base import Environment
from posttrain.records import FinishReason, Task


@dataclass(frozen=True)
class Grade:
    """What the environment said about an episode.

    Attributes:
        reward: The episode's reward.
        finish_reason: ``stop``, ``tool_error`` (the environment's), or ``length`` (it never ended).
        metrics: The environment's metrics of its last step.
    """

    reward: float
    finish_reason: FinishReason
    metrics: dict[str, float] = field(default_factory=dict)


class EnvironmentVerifier:
    """Replays action texts through an environment on one of its tasks (module docstring).

    Args:
        env: The run's environment.
        tasks: The tasks that may be named (the run's training tasks).
        timeout_s: Longest replay (seconds, > 0).

    Raises:
        ValueError: ``timeout_s <= 0``.
    """

    def __init__(self, env: Environment, tasks: Sequence[Task], timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
        self.env = env
        self.timeout_s = timeout_s
        self._tasks = {t.task_id: t for t in tasks}

    def task(self, task_id: str) -> Task | None:
        """The training task ``task_id``, or None when the run has no such training task."""
        return self._tasks.get(task_id)

    async def grade(self, task: Task, actions: Sequence[str]) -> Grade:
        """Step a fresh episode of ``task`` with ``actions``; the reward of the step that ends it.

        Raises:
            TimeoutError: the replay took longer than ``timeout_s``.
            Whatever the environment raises (a sandbox that cannot start...).
        """
        return await asyncio.wait_for(self._replay(task, actions), self.timeout_s)

    async def _replay(self, task: Task, actions: Sequence[str]) -> Grade:
        episode = self.env.start(task)
        metrics: dict[str, float] = {}
        try:
            for action in actions:
                step = await episode.step(action)
                metrics = dict(step.metrics)
                if step.done:
                    return Grade(float(step.reward), step.finish_reason, metrics)
        finally:
            episode.close()
        return Grade(0.0, "length", metrics)
