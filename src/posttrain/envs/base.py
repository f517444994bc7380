"""The environment contract used by the agent loop.

An ``Environment`` starts an ``Episode`` for a ``Task``. The agent loop renders the episode's
initial chat messages with the chat template once, then alternates: the policy generates an
action, the loop decodes *only that action's tokens* to text and calls ``Episode.step``; a
returned observation is encoded and appended as observation tokens (``action_mask`` False).
Token ids are never re-encoded from decoded text.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from posttrain.records import FinishReason, Task


class StepResult(msgspec.Struct, kw_only=True):
    """What an episode returns after one action.

    Attributes:
        observation: Tool output to show the policy next turn (text), or ``None`` when done.
        done: Whether the episode has ended.
        reward: Scalar reward; meaningful when ``done``.
        finish_reason: Why it ended, when ``done``.
        metrics: Extra numbers to attach to the rollout (``correct``, ``tool_calls``...).
    """

    observation: str | None = None
    done: bool = False
    reward: float = 0.0
    finish_reason: FinishReason = "stop"
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    """One running episode of one task."""

    def messages(self) -> list[dict[str, str]]:
        """Initial chat messages (``role``/``content``), rendered once by the chat template."""
        ...

    async def step(self, action_text: str) -> StepResult:
        """Consume the policy's action text; return an observation or the final reward."""
        ...

    def close(self) -> None:
        """Release sandboxes and temporary files."""
        ...


@runtime_checkable
class Environment(Protocol):
    """A family of tasks with a verifier (and optionally tools)."""

    name: str

    def start(self, task: Task) -> Episode:
        """Begin an episode for ``task``."""
        ...
