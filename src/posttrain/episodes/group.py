"""One GRPO group: ``group_size`` episodes of one task run concurrently, sharing a fresh ``group_id``.

Infrastructure failures (issue 32; ``EpisodeInfraError``: the sandbox died, the grader could not run,
a tool was killed from outside) are not the agent's: with ``infra_retries > 0`` the failed member's
episode runs again in its group (a new seed; the others keep theirs), at most ``infra_retries``
times, each failure told to ``on_infra``. Synchronous GRPO re-runs members this way: its weights do
not change while a batch is sampled, so the re-run member is a sample of the same policy as its
siblings. The asynchronous generator re-issues a failed group's task whole instead
(``generator.slots``), since its weights move between turns.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from posttrain.chat.format import ChatFormat
from posttrain.envs.base import Environment
from posttrain.episodes.runner import EpisodeInfraError, EpisodeLimits, run_episode
from posttrain.inference.base import InferenceEngine
from posttrain.records import Rollout, Task


def member_seed(seed: int, member: int, group_size: int, attempt: int = 0) -> int:
    """The sampling seed of member ``member`` of a group, on its ``attempt``-th run (0 first).

    ``seed + 1000 * (member + group_size * attempt)``: the first runs use ``seed + 1000 * k``; a re-run
    never takes a sibling's seed.
    """
    return seed + 1000 * (member + group_size * attempt)


async def run_group(
    engine: InferenceEngine,
    tokenizer: Any,
    env: Environment,
    task: Task,
    limits: EpisodeLimits,
    *,
    group_size: int,
    seed: int,
    generator_id: str = "sync",
    temperature: float = 1.0,
    top_p: float = 1.0,
    chat: ChatFormat | None = None,
    arrays: bool = False,
    on_turn: Callable[[int], None] | None = None,
    infra_retries: int = 0,
    on_infra: Callable[[EpisodeInfraError, bool], None] | None = None,
    on_member_done: Callable[[], None] | None = None,
) -> list[Rollout]:
    """Run ``group_size`` episodes of one task concurrently; they share a fresh ``group_id``.

    Args:
        engine: Samples action tokens with behaviour logprobs.
        tokenizer: The policy's tokenizer (a transformers tokenizer with a chat template).
        env: The environment that runs ``task``.
        task: The prompt.
        limits: Turn, token and wall-time budgets of each episode.
        group_size: G.
        seed: Episode ``k`` samples with seed ``seed + 1000 * k`` (``member_seed``).
        generator_id: Stored in each rollout.
        temperature: Sampling temperature.
        top_p: Nucleus mass.
        chat: Prebuilt ``ChatFormat``.
        arrays: Per-token fields as numpy arrays (see ``run_episode``).
        on_turn: Called with every member's turn policy versions (see ``run_episode``).
        infra_retries: Times a member whose episode failed for the infrastructure runs again (module
            docstring); 0 raises at the first failure.
        on_infra: Called with each infrastructure failure and whether the member runs again.
        on_member_done: Called once per member when it ends (returned, raised or cancelled), while
            the others may still run: the time account's "waiting for the group"
            (``posttrain.inference.metering``).

    Returns:
        G validated rollouts.

    Raises:
        EpisodeInfraError: a member failed for the infrastructure ``infra_retries + 1`` times.
        Whatever an episode raises (``EpisodeError``, engine errors): a partial group is never
            returned, and the members still running are cancelled first.
    """
    group_id = uuid.uuid4().hex

    async def member(k: int) -> Rollout:
        try:
            return await attempts(k)
        finally:
            if on_member_done is not None:
                on_member_done()

    async def attempts(k: int) -> Rollout:
        for attempt in range(infra_retries + 1):
            try:
                return await run_episode(
                    engine, tokenizer, env, task, limits, generator_id=generator_id,
                    seed=member_seed(seed, k, group_size, attempt), temperature=temperature, top_p=top_p,
                    group_id=group_id, chat=chat, arrays=arrays, on_turn=on_turn,
                )
            except EpisodeInfraError as exc:
                again = attempt < infra_retries
                if on_infra is not None:
                    on_infra(exc, again)
                if not again:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    members = [asyncio.ensure_future(member(k)) for k in range(group_size)]
    try:
        return list(await asyncio.gather(*members))
    except BaseException:
        for m in members:
            m.cancel()
        await asyncio.gather(*members, return_exceptions=True)
        raise
