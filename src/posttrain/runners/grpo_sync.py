"""Synchronous GRPO in one process: generate a whole batch with the current weights, train, publish, repeat.

GRPO (DeepSeekMath, arXiv 2402.03300 §4.1) as the baseline SAO is measured against: each
iteration samples ``prompts_per_step x group_size`` rollouts with the current weights, waits for
every one of them, trains on the batch (``posttrain.learner.grpo_step``), and loads the new
weights into the engine. The engine idles while the learner trains and the learner idles while
the slowest rollout finishes; its metrics carry the same names as the asynchronous learner's
(``throughput/*``, ``generator/busy_fraction_mean``), so the two compare directly.

It composes both roles' parts in one process (an inference engine and the episode runners; the
learner's GRPO step, checkpoints and ledger), so it lives with the technique runners. The steps
follow the learners' shared skeleton: ``setup`` (resume, publish, engine), ``generate``,
``train_one``, ``save_checkpoint``, ``run``; the final model is written by
``posttrain.learner.export``.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from posttrain.chat.format import ChatFormat
from posttrain.config import RunConfig
from posttrain.episodes.group import run_group
from posttrain.episodes.runner import EpisodeLimits
from posttrain.inference.factory import make_engine
from posttrain.inference.metering import GeneratorStats, MeteredEngine
from posttrain.learner.accumulate import EpochSampler
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.checkpoint import save_checkpoint
from posttrain.learner.export import save_final_model
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
from posttrain.learner.resume import resume_policy
from posttrain.learner.types import LearnerSummary, TrainStepResult
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.records import Rollout
from posttrain.runtime import RunContext
from posttrain.tracking import MetricsSink
from posttrain.weight_sync.factory import open_weight_store


class SyncGRPO:
    """One synchronous GRPO run (module docstring); ``run()`` trains it to ``grpo.steps`` iterations.

    Args:
        config: Run config with ``technique: grpo`` and ``grpo.async`` false.
        start_model_dir: Policy to start from (the warm-started model); also the reference policy.

    Raises:
        FileNotFoundError: no tokenizer in the run directory, or no model at ``start_model_dir``.
    """

    def __init__(self, config: RunConfig, start_model_dir: Path) -> None:
        self.config, self.ctx, self.start_model_dir = config, RunContext(config), start_model_dir
        grpo, gen = config.grpo, config.generator
        torch.manual_seed(config.seed)
        self.tokenizer = load_tokenizer(self.ctx.tokenizer_dir)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        resumed = resume_policy(self.ctx.checkpoints_dir, start_model_dir, grpo.optim, grpo.steps * grpo.mini_batches)
        self.policy, self.parts, self.state = resumed.policy, resumed.parts, resumed.state
        self.reference = load_policy(start_model_dir).eval() if grpo.loss.kl_coef > 0 else None
        self.counters = {"rollouts_trained": 0.0, "rollouts_kept": 0.0, "action_tokens_trained": 0.0,
                         "skipped_batches": 0.0, **self.state.counters}
        self.store = open_weight_store(self.ctx)
        self.store.publish(self.policy.model.state_dict(), self.state.policy_version, start_model_dir, overwrite=True)
        self.stats = GeneratorStats()
        version = self.state.policy_version
        self.engine = MeteredEngine(
            make_engine(gen.engine, self.store.path_for(version), policy_version=version, seed=config.seed,
                        max_model_len=gen.max_episode_tokens + gen.max_new_tokens, kv_cache_gib=gen.vllm_kv_cache_gib,
                        max_batch=max(gen.episodes_in_flight, grpo.batch_rollouts)),
            self.stats,
        )
        self.env = self.ctx.environment()
        self.chat = ChatFormat(self.tokenizer)
        self.tasks = self.ctx.tasks("train")
        self.sampler = EpochSampler(len(self.tasks), config.seed)
        self.sampler.take(self.state.iteration * grpo.prompts_per_step)
        self.limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                                    max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)

    async def generate(self) -> list[Rollout]:
        """The next ``prompts_per_step`` prompts, ``group_size`` rollouts each, sampled with the current weights."""
        grpo, gen = self.config.grpo, self.config.generator
        prompts = [self.tasks[i] for i in self.sampler.take(grpo.prompts_per_step)]
        seeds = random.Random(self.config.seed * 1_000_003 + self.state.iteration)
        groups = await asyncio.gather(*(
            run_group(self.engine, self.tokenizer, self.env, task, self.limits, group_size=grpo.group_size,
                      seed=seeds.randrange(2**31), temperature=gen.temperature, top_p=gen.top_p, chat=self.chat)
            for task in prompts
        ))
        return [r for g in groups for r in g]

    async def train_one(self, rollouts: list[Rollout]) -> TrainStepResult:
        """One GRPO step on the batch; after an update, publish the version and load it into the engine."""
        batch = collate_rollouts(rollouts, self.pad_id)
        result = await asyncio.to_thread(
            grpo_train_step, policy=self.policy, batch=batch, group_ids=[str(r.group_id) for r in rollouts],
            config=self.config.grpo, reference=self.reference, temperature=self.config.generator.temperature,
        )
        self.state.iteration += 1
        self.counters["rollouts_trained"] += len(rollouts)
        self.counters["rollouts_kept"] += result.metrics["grpo/rollouts_kept"]
        self.counters["action_tokens_trained"] += result.metrics["grpo/action_tokens_kept"]
        if result.policy_updated:
            self.state.policy_version += 1
            path = await asyncio.to_thread(self.store.publish, self.policy.model.state_dict(), self.state.policy_version,
                                           self.start_model_dir, overwrite=True)
            await self.engine.update_weights(path, self.state.policy_version)
            self.store.prune(keep=2)
        else:
            self.counters["skipped_batches"] += 1
        append_ledger(self.ctx.run_dir / LEDGER_NAME, ledger_line(self.state.iteration, self.state.policy_version,
                                                                  rollouts))
        return result

    def save_checkpoint(self) -> None:
        """A learner checkpoint of the policy, its optimizer and the counters."""
        self.state.counters = dict(self.counters)
        save_checkpoint(self.ctx.checkpoints_dir, state=self.state, parts=self.parts,
                        resolved_config_yaml=self.ctx.resolved_config_yaml())

    async def _loop(self, sink: MetricsSink | None, progress: bool) -> None:
        grpo = self.config.grpo
        bar = tqdm(total=grpo.steps, initial=self.state.iteration, desc="grpo", disable=not progress, leave=False)
        self.stats.mark_started()
        t_start = time.monotonic()
        trained_before, tokens_before = self.counters["rollouts_trained"], self.counters["action_tokens_trained"]
        while self.state.iteration < grpo.steps:
            t0 = time.monotonic()
            rollouts = await self.generate()
            gen_s = time.monotonic() - t0
            self.stats.rollouts += len(rollouts)
            self.stats.action_tokens += sum(r.num_action_tokens for r in rollouts)
            self.stats.total_tokens += sum(len(r.token_ids) for r in rollouts)
            t1 = time.monotonic()
            result = await self.train_one(rollouts)
            step_s = time.monotonic() - t1
            elapsed = max(time.monotonic() - t_start, 1e-9)
            metrics = dict(result.metrics)
            metrics.update({
                "learner/step_s": step_s,
                "learner/iteration": float(self.state.iteration),
                "generator/batch_s": gen_s,
                "generator/busy_fraction_mean": self.stats.snapshot()["busy_fraction"],
                "throughput/rollouts_per_s": (self.counters["rollouts_trained"] - trained_before) / elapsed,
                "throughput/action_tokens_per_s": sum(r.num_action_tokens for r in rollouts) / max(step_s, 1e-9),
                "throughput/trained_action_tokens_per_s": (self.counters["action_tokens_trained"] - tokens_before)
                / elapsed,
                "rollouts/correct_mean": sum(r.metrics.get("correct", 0.0) for r in rollouts) / len(rollouts),
            })
            if sink is not None:
                sink(metrics, self.state.policy_version)
            bar.update(1)
            if self.state.iteration % grpo.checkpoint_every == 0 or self.state.iteration >= grpo.steps:
                self.save_checkpoint()
        bar.close()
        self.counters["generator_busy_fraction"] = self.stats.snapshot()["busy_fraction"]

    def run(self, sink: MetricsSink | None = None, progress: bool = True) -> LearnerSummary:
        """Train to ``grpo.steps`` iterations, checkpointing on the way; write the final model.

        Raises:
            posttrain.episodes.runner.EpisodeError: an episode could not produce a rollout.
            FloatingPointError: a non-finite gradient norm.
        """
        try:
            asyncio.run(self._loop(sink, progress))
        finally:
            self.engine.close()
        final_dir = save_final_model(self.ctx, self.policy.model, self.tokenizer)
        return LearnerSummary(self.state.policy_version, self.state.iteration, final_dir, self.counters)


def run_grpo_sync(
    config: RunConfig,
    *,
    start_model_dir: Path,
    sink: MetricsSink | None = None,
    progress: bool = True,
) -> LearnerSummary:
    """Synchronous GRPO (module docstring): resume if a checkpoint exists, train, write the final model.

    Every ``grpo.checkpoint_every`` iterations (and at the end) writes a learner checkpoint; the final
    policy goes to ``<run>/final_model`` (and to ``final_model_uri`` when set); every iteration appends
    its batch to ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``).

    Args:
        config: Run config with ``technique: grpo`` and ``grpo.async`` false.
        start_model_dir: Policy to start from (the warm-started model); also the reference policy.
        sink: Receives ``(metrics, policy_version)`` after each iteration.
        progress: Show a progress bar.

    Returns:
        ``LearnerSummary`` (``counters``: ``rollouts_trained``, ``rollouts_kept``,
        ``generator_busy_fraction``, ``skipped_batches``...).

    Raises:
        posttrain.episodes.runner.EpisodeError: an episode could not produce a rollout.
        FloatingPointError: a non-finite gradient norm.
    """
    return SyncGRPO(config, start_model_dir).run(sink, progress)
