"""Held-out accuracy of a policy on the configured environment's held-out tasks (avg@k of ``correct``).

A sample whose episode failed for the infrastructure (``EpisodeInfraError``: a tool's sandbox died,
the grader could not run) runs again with its seed, at most ``eval.infra_retries`` times; one that
still fails is left out of the accuracy and counted by cause (``infra_*`` scores, one warning line),
and past ``eval.max_infra_error_share`` of the samples no accuracy is reported
(``posttrain.eval.infra``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from posttrain.episodes.runner import EpisodeLimits
from posttrain.eval.infra import AccuracyRefused, refusal, with_infra_retries
from posttrain.eval.infra import scores as infra_scores
from posttrain.records import Rollout, Task
from posttrain.rollout.infra import InfraTally, causes_text
from posttrain.runtime import RunContext

log = logging.getLogger("posttrain.eval")

EngineKind = Literal["auto", "vllm", "hf"]
"""The engines ``posttrain.inference.factory.make_engine`` builds."""


@dataclass
class HeldoutSamples:
    """The samples of a held-out evaluation.

    Attributes:
        rollouts: One graded rollout per sample that ran (the agent's results).
        infra: Samples left out for the infrastructure (``infra_total``, by cause), graded
            (``completed_total``) and retries made (``reissued_total``).
    """

    rollouts: list[Rollout]
    infra: InfraTally = field(default_factory=InfraTally)


def evaluate_policy(ctx: RunContext, model_dir: Path, *, engine_kind: EngineKind | None = None) -> dict[str, float]:
    """Held-out accuracy of ``model_dir`` on ``heldout_tasks`` (at most ``eval.num_tasks``), ``eval.samples_per_task`` samples each.

    Returns:
        ``heldout_scores``: ``accuracy`` (mean of the env's ``correct`` metric over the samples that
        ran, i.e. avg@k), ``reward_mean``, ``action_tokens_mean``, ``num_rollouts`` and the ``infra_*``
        counts.

    Raises:
        posttrain.eval.infra.AccuracyRefused: more than ``eval.max_infra_error_share`` of the samples
            failed for the infrastructure (one line).
    """
    return heldout_scores(heldout_rollouts(ctx, model_dir, engine_kind=engine_kind),
                          max_infra_share=ctx.config.eval.max_infra_error_share)


def heldout_scores(samples: HeldoutSamples, *, max_infra_share: float = 1.0) -> dict[str, float]:
    """``accuracy`` (mean ``correct``), ``reward_mean``, ``action_tokens_mean``, ``num_rollouts`` of the graded rollouts.

    Samples left out for the infrastructure are in none of them: they are counted in ``infra_errors``
    (with ``infra_share``, ``infra_retried`` and ``infra_<cause>``, ``posttrain.eval.infra.scores``) and
    named in one warning line.

    Args:
        samples: The evaluation's samples.
        max_infra_share: ``eval.max_infra_error_share``.

    Raises:
        posttrain.eval.infra.AccuracyRefused: more than ``max_infra_share`` of the samples were left out.
    """
    reason = refusal(samples.infra, max_infra_share, "held-out eval")
    if reason is not None:
        raise AccuracyRefused(reason)
    rollouts = samples.rollouts
    if samples.infra.infra_total:
        log.warning("held-out eval: %d of %d samples failed for the infrastructure (%s) after %d retries and are left "
                    "out of the accuracy", samples.infra.infra_total, samples.infra.infra_total + len(rollouts),
                    causes_text(samples.infra.infra_by_cause), samples.infra.reissued_total)
    n = max(len(rollouts), 1)
    return {
        "accuracy": sum(r.metrics.get("correct", 0.0) for r in rollouts) / n,
        "reward_mean": sum(r.reward for r in rollouts) / n,
        "action_tokens_mean": sum(r.num_action_tokens for r in rollouts) / n,
        "num_rollouts": float(len(rollouts)),
        **infra_scores(samples.infra),
    }


def heldout_tasks(ctx: RunContext) -> list[Any]:
    """The held-out tasks an evaluation runs: the first ``eval.num_tasks`` of ``ctx.tasks("eval")``.

    Fewer than ``eval.num_tasks`` when the held-out split (``data.num_eval_tasks``) or the user's
    ``data.eval_path`` file holds fewer.
    """
    return ctx.tasks("eval")[: ctx.config.eval.num_tasks]


def heldout_rollouts(ctx: RunContext, model_dir: Path, *, engine_kind: EngineKind | None = None) -> HeldoutSamples:
    """One graded ``Rollout`` per (held-out task, sample): ``eval.num_tasks`` x ``eval.samples_per_task``.

    Sample ``k`` of task ``i`` uses seed ``config.seed + i * 1000 + k``; the environment's verifier
    sets ``reward`` and ``metrics["correct"]``. Samples whose infrastructure kept failing are left out
    (``sample_heldout``).
    """
    from posttrain.inference.factory import make_engine
    from posttrain.models.hf import load_tokenizer

    cfg = ctx.config
    gen = cfg.generator
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    engine = make_engine(engine_kind or gen.engine, model_dir, policy_version=0, seed=cfg.seed,
                         max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                         kv_cache_gib=gen.vllm_kv_cache_gib, max_batch=max(gen.episodes_in_flight, 16))
    try:
        return asyncio.run(sample_heldout(engine, load_tokenizer(model_dir), ctx.environment(), heldout_tasks(ctx),
                                          limits, samples_per_task=cfg.eval.samples_per_task, seed=cfg.seed,
                                          temperature=cfg.eval.temperature, concurrency=max(gen.episodes_in_flight, 16),
                                          infra_retries=cfg.eval.infra_retries))
    finally:
        engine.close()


async def sample_heldout(engine: Any, tokenizer: Any, env: Any, tasks: Sequence[Task], limits: EpisodeLimits, *,
                         samples_per_task: int, seed: int, temperature: float, concurrency: int,
                         infra_retries: int) -> HeldoutSamples:
    """Run ``samples_per_task`` episodes of every task, ``concurrency`` at a time (``heldout_rollouts``).

    Args:
        engine: The policy's inference engine.
        tokenizer: Its tokenizer.
        env: The environment (its verifier grades each episode).
        tasks: The held-out tasks.
        limits: Turn, token and time budgets of an episode.
        samples_per_task: k.
        seed: Sample ``k`` of task ``i`` uses ``seed + i * 1000 + k``, every time it runs.
        temperature: Sampling temperature.
        concurrency: Episodes at once.
        infra_retries: ``eval.infra_retries``.

    Returns:
        The graded rollouts in (task, sample) order, and the infrastructure tally.

    Raises:
        posttrain.episodes.runner.EpisodeError: an episode that could not produce a rollout for another reason.
    """
    from posttrain.episodes.runner import run_episode

    tally = InfraTally()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task) -> Rollout | None:
        async with sem:
            out = await with_infra_retries(
                lambda: run_episode(engine, tokenizer, env, task, limits, generator_id="eval", seed=seed + i,
                                    temperature=temperature), infra_retries, tally)
        if isinstance(out, Rollout):
            tally.completed()
            return out
        tally.failed(out.cause, reissued=False)
        log.info("held-out eval: task %s (seed %d) failed for the infrastructure %d times (last: %s: %s); left out of "
                 "the accuracy", task.task_id, seed + i, infra_retries + 1, out.cause, out)
        return None

    jobs = [one(i * 1000 + k, t) for i, t in enumerate(tasks) for k in range(samples_per_task)]
    graded = await asyncio.gather(*jobs)
    return HeldoutSamples([r for r in graded if r is not None], tally)
