"""Synchronous GRPO in one process: generate a whole batch with the current weights, train, publish, repeat.

It composes the two roles' parts (an inference engine and the episode runners; the learner's
GRPO step, checkpoints and ledger), so it lives with the technique runners, not in ``learner``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from posttrain.config import RunConfig
from posttrain.episodes.group import run_group
from posttrain.learner.accumulate import EpochSampler
from posttrain.learner.batching import (
    collate_rollouts,
)
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.types import Trainable
from posttrain.records import Rollout

MetricsSink = Callable[[dict[str, float], int], None]


def run_grpo_sync(
    config: RunConfig,
    *,
    start_model_dir: Path,
    sink: MetricsSink | None = None,
    progress: bool = True,
) -> Any:
    """Synchronous GRPO: generate a whole batch with the current weights, train, publish, repeat.

    Resumes from the newest checkpoint in ``<run>/checkpoints`` when there is one. Every
    ``grpo.checkpoint_every`` iterations (and at the end) writes a learner checkpoint; the final
    policy goes to ``<run>/final_model`` (HF safetensors, tokenizer, ``resolved_config.yaml``), and
    also to ``final_model_uri`` when the config sets it. Every iteration appends its batch to
    ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``).

    Args:
        config: Run config with ``technique: grpo`` and ``grpo.async`` false.
        start_model_dir: Policy to start from (the warm-started model); also the reference policy.
        sink: Receives ``(metrics, policy_version)`` after each iteration.
        progress: Show a progress bar.

    Returns:
        ``posttrain.learner.sao_loop.LearnerSummary`` (``counters``: ``rollouts_trained``,
        ``generator_busy_fraction``, ``skipped_batches``...).

    Raises:
        posttrain.episodes.runner.EpisodeError: an episode could not produce a rollout.
        FloatingPointError: a non-finite gradient norm.
    """
    from tqdm import tqdm

    from posttrain.chat.format import ChatFormat
    from posttrain.episodes.runner import EpisodeLimits
    from posttrain.inference.factory import make_engine
    from posttrain.inference.metering import GeneratorStats, MeteredEngine
    from posttrain.learner.checkpoint import (
        LearnerState,
        latest_checkpoint,
        load_checkpoint_state,
        save_checkpoint,
    )
    from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
    from posttrain.learner.optim import build_optimizer
    from posttrain.learner.types import LearnerSummary
    from posttrain.models.hf import load_policy, load_tokenizer
    from posttrain.runtime import RunContext
    from posttrain.weight_sync.factory import open_weight_store, upload_final_model

    ctx = RunContext(config)
    grpo = config.grpo
    gen = config.generator
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ckpt = latest_checkpoint(ctx.checkpoints_dir)
    model: Any = load_policy(ckpt / "policy" if ckpt else start_model_dir)  # a transformers PreTrainedModel
    optimizer, scheduler = build_optimizer(model, grpo.optim, grpo.steps * grpo.mini_batches)
    policy = Trainable(model, optimizer, scheduler)
    optimizers = {"policy_opt": optimizer, "policy_sched": scheduler}
    reference = load_policy(start_model_dir).eval() if grpo.loss.kl_coef > 0 else None
    state = load_checkpoint_state(ckpt, critic=None, optimizers=optimizers) if ckpt else LearnerState()
    counters = {"rollouts_trained": 0.0, "rollouts_kept": 0.0, "action_tokens_trained": 0.0,
                "skipped_batches": 0.0, **state.counters}

    store = open_weight_store(ctx)
    store.publish(model.state_dict(), state.policy_version, start_model_dir, overwrite=True)
    stats = GeneratorStats()
    engine = MeteredEngine(
        make_engine(gen.engine, store.path_for(state.policy_version), policy_version=state.policy_version,
                    seed=config.seed, max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                    kv_cache_gib=gen.vllm_kv_cache_gib, max_batch=max(gen.episodes_in_flight, grpo.batch_rollouts)),
        stats,
    )
    env = ctx.environment()
    chat = ChatFormat(tokenizer)
    tasks = ctx.tasks("train")
    sampler = EpochSampler(len(tasks), config.seed)
    sampler.take(state.iteration * grpo.prompts_per_step)
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)

    def checkpoint() -> None:
        state.counters = dict(counters)
        save_checkpoint(ctx.checkpoints_dir, state=state, policy=model, tokenizer=tokenizer, critic=None,
                        optimizers=optimizers, resolved_config_yaml=ctx.resolved_config_yaml())

    async def generate(iteration: int) -> list[Rollout]:
        prompts = [tasks[i] for i in sampler.take(grpo.prompts_per_step)]
        seeds = random.Random(config.seed * 1_000_003 + iteration)
        groups = await asyncio.gather(*(
            run_group(engine, tokenizer, env, task, limits, group_size=grpo.group_size,
                      seed=seeds.randrange(2**31), temperature=gen.temperature, top_p=gen.top_p, chat=chat)
            for task in prompts
        ))
        return [r for g in groups for r in g]

    async def loop() -> None:
        bar = tqdm(total=grpo.steps, initial=state.iteration, desc="grpo", disable=not progress, leave=False)
        stats.mark_started()
        t_start = time.monotonic()
        trained_before = counters["rollouts_trained"]
        tokens_before = counters["action_tokens_trained"]
        while state.iteration < grpo.steps:
            t0 = time.monotonic()
            rollouts = await generate(state.iteration)
            gen_s = time.monotonic() - t0
            stats.rollouts += len(rollouts)
            stats.action_tokens += sum(r.num_action_tokens for r in rollouts)
            stats.total_tokens += sum(len(r.token_ids) for r in rollouts)
            batch = collate_rollouts(rollouts, pad_id)
            t1 = time.monotonic()
            result = await asyncio.to_thread(
                grpo_train_step, policy=policy, batch=batch, group_ids=[str(r.group_id) for r in rollouts],
                config=grpo, reference=reference, temperature=gen.temperature,
            )
            step_s = time.monotonic() - t1
            state.iteration += 1
            counters["rollouts_trained"] += len(rollouts)
            counters["rollouts_kept"] += result.metrics["grpo/rollouts_kept"]
            counters["action_tokens_trained"] += result.metrics["grpo/action_tokens_kept"]
            if result.policy_updated:
                state.policy_version += 1
                path = await asyncio.to_thread(store.publish, model.state_dict(), state.policy_version, start_model_dir,
                                               overwrite=True)
                await engine.update_weights(path, state.policy_version)
                store.prune(keep=2)
            else:
                counters["skipped_batches"] += 1
            append_ledger(ctx.run_dir / LEDGER_NAME, ledger_line(state.iteration, state.policy_version, rollouts))
            elapsed = max(time.monotonic() - t_start, 1e-9)
            snap = stats.snapshot()
            metrics = dict(result.metrics)
            metrics.update({
                "learner/step_s": step_s,
                "learner/iteration": float(state.iteration),
                "generator/batch_s": gen_s,
                "generator/busy_fraction_mean": snap["busy_fraction"],
                "throughput/rollouts_per_s": (counters["rollouts_trained"] - trained_before) / elapsed,
                "throughput/action_tokens_per_s": batch.num_action_tokens / max(step_s, 1e-9),
                "throughput/trained_action_tokens_per_s": (counters["action_tokens_trained"] - tokens_before) / elapsed,
                "rollouts/correct_mean": sum(r.metrics.get("correct", 0.0) for r in rollouts) / len(rollouts),
            })
            if sink is not None:
                sink(metrics, state.policy_version)
            bar.update(1)
            if state.iteration % grpo.checkpoint_every == 0 or state.iteration >= grpo.steps:
                checkpoint()
        bar.close()
        counters["generator_busy_fraction"] = stats.snapshot()["busy_fraction"]

    try:
        asyncio.run(loop())
    finally:
        engine.close()
    final_dir = ctx.final_model_dir
    model.save_pretrained(str(final_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(final_dir))
    (final_dir / "resolved_config.yaml").write_text(ctx.resolved_config_yaml(), encoding="utf-8")
    upload_final_model(config, final_dir)
    return LearnerSummary(state.policy_version, state.iteration, final_dir, counters)
