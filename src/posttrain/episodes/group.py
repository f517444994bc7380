"""One GRPO group: ``group_size`` episodes of one task run concurrently, sharing a fresh ``group_id``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from posttrain.chat.format import ChatFormat
from posttrain.envs.base import Environment
from posttrain.episodes.runner import EpisodeLimits, run_episode
from posttrain.inference.base import InferenceEngine
from posttrain.records import Rollout, Task


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
) -> list[Rollout]:
    """Run ``group_size`` episodes of one task concurrently; they share a fresh ``group_id``.

    Args:
        engine: Samples action tokens with behaviour logprobs.
        tokenizer: The policy's tokenizer (a transformers tokenizer with a chat template).
        env: The environment that runs ``task``.
        task: The prompt.
        limits: Turn, token and wall-time budgets of each episode.
        group_size: G.
        seed: Episode ``k`` samples with seed ``seed + 1000 * k``.
        generator_id: Stored in each rollout.
        temperature: Sampling temperature.
        top_p: Nucleus mass.
        chat: Prebuilt ``ChatFormat``.
        arrays: Per-token fields as numpy arrays (see ``run_episode``).
        on_turn: Called with every member's turn policy versions (see ``run_episode``).

    Returns:
        G validated rollouts.

    Raises:
        Whatever an episode raises (``EpisodeError``, engine errors): a partial group is never returned.
    """
    group_id = uuid.uuid4().hex
    return list(
        await asyncio.gather(
            *(
                run_episode(
                    engine, tokenizer, env, task, limits, generator_id=generator_id, seed=seed + 1000 * k,
                    temperature=temperature, top_p=top_p, group_id=group_id, chat=chat, arrays=arrays,
                    on_turn=on_turn,
                )
                for k in range(group_size)
            )
        )
    )
