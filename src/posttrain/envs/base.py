"""The environment contract used by the agent loop.

An ``Environment`` starts an ``Episode`` for a ``Task``. The agent loop renders the episode's
initial chat messages with the chat template once, then alternates: the policy generates an
action, the loop decodes *only that action's tokens* to text and calls ``Episode.step``; a
returned observation is encoded and appended as observation tokens (``action_mask`` False).
Token ids are never re-encoded from decoded text.

An infrastructure failure under an episode (the sandbox died or could not start, the grader
could not run, a tool was killed by something other than the episode's own limits) is not the
agent's doing: ``Episode.step`` raises ``InfraError`` with its ``cause`` instead of returning an
observation or a reward, and the agent loop ends the episode as ``outcome="infra_error"``, which
is never trained (issue 32).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from posttrain.records import FinishReason, Task

INFRA_CAUSES = ("sandbox_error", "sandbox_unavailable", "tool_killed", "grader_killed", "grader_not_started")
"""The infrastructure-failure causes the shipped environments raise (``InfraError.cause``)."""


class InfraError(RuntimeError):
    """The infrastructure failed under an episode; the episode's result is not the agent's.

    Attributes:
        cause: One word for metrics (``posttrain.records.INFRA_CAUSE_PATTERN``), one of
            ``INFRA_CAUSES`` for the shipped environments: ``sandbox_error`` (the sandbox could not
            start or clean up), ``sandbox_unavailable`` (the isolation asked for does not work
            here: no bubblewrap), ``tool_killed`` (a tool call was killed by something other than
            its own limits, e.g. SIGKILL from outside), ``grader_killed`` (the grading run was),
            ``grader_not_started`` (the grader could not start: its python or pytest missing).
    """

    cause = "sandbox_error"

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        if cause is not None:
            self.cause = cause


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
