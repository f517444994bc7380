"""Held-out accuracy of a policy on the configured environment's held-out tasks (avg@k of ``correct``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from posttrain.runtime import RunContext


def evaluate_policy(ctx: RunContext, model_dir: Path, *, engine_kind: str | None = None) -> dict[str, float]:
    """Held-out accuracy of ``model_dir`` on ``heldout_tasks`` (at most ``eval.num_tasks``), ``eval.samples_per_task`` samples each.

    Returns:
        ``accuracy`` (mean of the env's ``correct`` metric, i.e. avg@k), ``reward_mean``,
        ``action_tokens_mean`` and ``num_rollouts``.
    """
    return heldout_scores(heldout_rollouts(ctx, model_dir, engine_kind=engine_kind))


def heldout_scores(rollouts: list[Any]) -> dict[str, float]:
    """``accuracy`` (mean ``correct``), ``reward_mean``, ``action_tokens_mean``, ``num_rollouts`` of graded rollouts."""
    n = max(len(rollouts), 1)
    return {
        "accuracy": sum(r.metrics.get("correct", 0.0) for r in rollouts) / n,
        "reward_mean": sum(r.reward for r in rollouts) / n,
        "action_tokens_mean": sum(r.num_action_tokens for r in rollouts) / n,
        "num_rollouts": float(len(rollouts)),
    }


def heldout_tasks(ctx: RunContext) -> list[Any]:
    """The held-out tasks an evaluation runs: the first ``eval.num_tasks`` of ``ctx.tasks("eval")``.

    Fewer than ``eval.num_tasks`` when the held-out split (``data.num_eval_tasks``) or the user's
    ``data.eval_path`` file holds fewer.
    """
    return ctx.tasks("eval")[: ctx.config.eval.num_tasks]


def heldout_rollouts(ctx: RunContext, model_dir: Path, *, engine_kind: str | None = None) -> list[Any]:
    """One graded ``Rollout`` per (held-out task, sample): ``eval.num_tasks`` x ``eval.samples_per_task``.

    Sample ``k`` of task ``i`` uses seed ``config.seed + i * 1000 + k``; the environment's verifier
    sets ``reward`` and ``metrics["correct"]``.
    """
    from posttrain.episodes.runner import EpisodeLimits, run_episode
    from posttrain.inference.factory import make_engine
    from posttrain.models.hf import load_tokenizer

    cfg = ctx.config
    gen = cfg.generator
    tasks = heldout_tasks(ctx)
    tokenizer = load_tokenizer(model_dir)
    env = ctx.environment()
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    engine = make_engine(engine_kind or gen.engine, model_dir, policy_version=0, seed=cfg.seed,
                         max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                         kv_cache_gib=gen.vllm_kv_cache_gib, max_batch=max(gen.episodes_in_flight, 16))

    async def go() -> list[Any]:
        sem = asyncio.Semaphore(max(gen.episodes_in_flight, 16))

        async def one(i: int, task: Any) -> Any:
            async with sem:
                return await run_episode(engine, tokenizer, env, task, limits, generator_id="eval", seed=cfg.seed + i,
                                         temperature=cfg.eval.temperature)

        jobs = [one(i * 1000 + k, t) for i, t in enumerate(tasks) for k in range(cfg.eval.samples_per_task)]
        return await asyncio.gather(*jobs)

    try:
        return list(asyncio.run(go()))
    finally:
        engine.close()
