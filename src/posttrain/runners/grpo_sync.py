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

**On N ranks** (``torchrun --nproc_per_node N -m posttrain.cli run CONFIG``) the policy (and the
reference) is sharded with FSDP2 and every rank generates:

1. each published version's full weights are gathered from the shards (``full_state_dict``),
   written to the weight store by rank 0, and loaded by every rank into its own unsharded engine;
2. every rank draws the same prompts and group seeds from the same seeded sampler; rank r runs
   groups r, r + N, ... of them (``rank_share``);
3. the groups are all-gathered as msgpack bytes (``encode_rollout``, no pickle) and put back in
   prompt order, so every rank holds the whole batch, as the GRPO step expects
   (``posttrain.parallel.shares``), and the batch is the one a single rank would have sampled
   with the same seeds;
4. ``grpo_train_step`` trains each rank's share of it; rank 0 writes the ledger and metrics.

**Infrastructure failures** (issue 32; ``EpisodeInfraError``: the sandbox died, the grader could not
run, a tool was killed from outside) are treated as the asynchronous generator treats them: never
trained as reward 0. The failed member's episode runs again in its group (``run_group(infra_retries=)``,
a new seed, at most ``generator.infra_retries`` times); a group whose member still fails is given up
and the batch trains on the other groups (an iteration left with no group, or fewer rollouts than
ranks, takes no step). Failures are counted by cause in an ``InfraTally`` summed over the ranks, with
the asynchronous runtime's metrics (``infra/*``, ``posttrain.rollout.infra.infra_metrics``), the
summary's row, and its bound: past ``generator.max_infra_error_share`` of the finished episodes (after
``generator.infra_min_episodes``) the run checkpoints and stops with one line
(``posttrain.learner.liveness.InfraShareBound``). The tally is checkpointed with the counters.

Why not rank 0 generating alone and broadcasting: generation is most of a synchronous GRPO
iteration (the learner waits for the slowest rollout), so N engines cut it about N-fold, while an
inference copy of the weights costs far less memory than the training state a rank already holds
(no gradients or AdamW moments). The price is one engine per rank; with vLLM on GPUs each rank's
engine must sit on that rank's device (unverified here: the CPU tests use the ``hf`` engine).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from pathlib import Path

import msgspec
import torch
from tqdm import tqdm

from posttrain.account import LEARNER_STATES, StateClock, StateTimer
from posttrain.chat.format import ChatFormat
from posttrain.config import RunConfig
from posttrain.episodes.group import run_group
from posttrain.episodes.runner import EpisodeInfraError, EpisodeLimits
from posttrain.inference.factory import make_engine
from posttrain.inference.metering import (
    ACCOUNT_LIVES,
    ENGINE_ACCOUNT,
    SLOTS_ACCOUNT,
    GeneratorStats,
    MeteredEngine,
)
from posttrain.learner.accumulate import EpochSampler
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.checkpoint import save_checkpoint
from posttrain.learner.export import save_final_model
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
from posttrain.learner.liveness import InfraShareBound, LearnerStopped
from posttrain.learner.optim import NonFiniteStreak
from posttrain.learner.progress import IterationOutcome, ProgressWatch, outcome_of, print_line
from posttrain.learner.resume import resume_policy
from posttrain.learner.types import LearnerSummary, TrainStepResult
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.parallel.placement import full_state_dict, prepare_model
from posttrain.parallel.shares import rank_share
from posttrain.parallel.world import World, init_world
from posttrain.records import Rollout, Task, decode_rollout, encode_rollout
from posttrain.rollout.infra import InfraTally, infra_metrics
from posttrain.runtime import RunContext
from posttrain.tracking import MetricsSink
from posttrain.weight_sync.factory import open_weight_store

_GROUPS = msgspec.msgpack.Decoder(list[tuple[int, list[bytes]]])

log = logging.getLogger("posttrain.runners.grpo_sync")


def gather_groups(world: World, index: list[int], groups: list[list[Rollout]]) -> list[Rollout]:
    """Every rank's groups, in prompt order, on every rank (module docstring, step 3).

    Args:
        world: The ranks.
        index: This rank's prompt indices (into the step's prompts), one per group.
        groups: This rank's groups, in the order of ``index``.

    Returns:
        The rollouts of all groups, ordered by prompt index (with one rank: ``groups`` flattened).

    Raises:
        posttrain.records.RecordError: a rollout that does not encode or decode.
    """
    if not world.distributed:
        return [r for g in groups for r in g]
    payload = msgspec.msgpack.encode([(i, [encode_rollout(r) for r in g]) for i, g in zip(index, groups, strict=True)])
    every = [item for part in world.all_gather_bytes(payload) for item in _GROUPS.decode(part)]
    return [decode_rollout(b) for _, group in sorted(every, key=lambda item: item[0]) for b in group]


class SyncGRPO:
    """One synchronous GRPO run (module docstring); ``run()`` trains it to ``grpo.steps`` iterations.

    Args:
        config: Run config with ``technique: grpo`` and ``grpo.async`` false.
        start_model_dir: Policy to start from (the warm-started model); also the reference policy.
        world: The learner's ranks (``init_world(config.learner)`` when None: one rank without torchrun).
        clock: The learner process's time account (``posttrain.account.LEARNER_STATES``); generating a
            batch is ``waiting_for_batch``, the GRPO step ``training``, publishing the version and
            loading it into the engine ``publishing``, checkpoints ``checkpointing``. A fresh one when None.

    Raises:
        FileNotFoundError: no tokenizer in the run directory, or no model at ``start_model_dir``.
    """

    def __init__(self, config: RunConfig, start_model_dir: Path, world: World | None = None,
                 clock: StateClock | None = None) -> None:
        self.config, self.ctx, self.start_model_dir = config, RunContext(config), start_model_dir
        self.clock = clock or StateClock(LEARNER_STATES)
        self.timer = StateTimer(self.clock)
        self.world = world = world or init_world(config.learner)
        grpo, gen = config.grpo, config.generator
        torch.manual_seed(config.seed)
        self.tokenizer = load_tokenizer(self.ctx.tokenizer_dir)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        resumed = resume_policy(self.ctx.checkpoints_dir, start_model_dir, grpo.optim, grpo.steps * grpo.mini_batches,
                                world=world, learner=config.learner)
        self.policy, self.parts, self.state = resumed.policy, resumed.parts, resumed.state
        if self.state.account:  # resumed: the earlier lives' learner account, as of their last checkpoint
            self.clock.carry(self.state.account)
        self.reference = (prepare_model(load_policy(start_model_dir), world, config.learner, trainable=False)
                          if grpo.loss.kl_coef > 0 else None)
        self.counters = {"rollouts_trained": 0.0, "rollouts_kept": 0.0, "action_tokens_trained": 0.0,
                         "skipped_batches": 0.0, "skipped_nonfinite": 0.0, **self.state.counters}
        self.counters_at_start, self.iterations_at_start = dict(self.counters), self.state.iteration  # as resumed
        self.nonfinite = NonFiniteStreak(grpo.max_nonfinite_iterations, "grpo.max_nonfinite_iterations")
        self.progress = ProgressWatch(config.learner.max_iterations_without_progress,
                                      print_line if world.is_main else None)
        self.store = open_weight_store(self.ctx)
        self.stats = GeneratorStats()
        version = self.state.policy_version
        self.engine = MeteredEngine(
            make_engine(gen.engine, self.publish(version), policy_version=version, seed=config.seed,
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
        self.infra = InfraTally.from_metrics(self.counters)  # the run's, summed over ranks; counts on after a resume
        self.infra_bound = InfraShareBound(lambda: self.infra, gen.max_infra_error_share, gen.infra_min_episodes,
                                           logs="the run log's lines")

    def publish(self, version: int) -> Path:
        """Publish ``version``: the weights gathered from every rank, written by rank 0; its directory.

        Every rank must call it; it returns once the version is in the store.
        """
        weights = full_state_dict(self.policy.model, self.world)
        if self.world.is_main:
            self.store.publish(weights, version, self.start_model_dir, overwrite=True)
        self.world.barrier()
        return self.store.path_for(version)

    async def generate(self) -> list[Rollout]:
        """The next ``prompts_per_step`` prompts, ``group_size`` rollouts each, sampled with the current weights.

        With several ranks each samples its share of the groups and every rank returns the whole
        batch (module docstring).
        """
        grpo, gen = self.config.grpo, self.config.generator
        prompts = [self.tasks[i] for i in self.sampler.take(grpo.prompts_per_step)]
        seeds = random.Random(self.config.seed * 1_000_003 + self.state.iteration)
        group_seeds = [seeds.randrange(2**31) for _ in prompts]
        mine = rank_share(range(len(prompts)), self.world)
        tally = InfraTally()
        started = len(mine) * grpo.group_size
        for _ in range(started):  # the time account: each member runs until the whole batch is done
            self.stats.episode_started()

        async def group(i: int) -> list[Rollout] | None:
            try:
                rollouts = await run_group(
                    self.engine, self.tokenizer, self.env, prompts[i], self.limits, group_size=grpo.group_size,
                    seed=group_seeds[i], temperature=gen.temperature, top_p=gen.top_p, chat=self.chat,
                    infra_retries=gen.infra_retries, on_infra=functools.partial(self._infra_failed, tally, prompts[i]),
                    on_member_done=self.stats.member_finished)
            except EpisodeInfraError:  # counted and logged in _infra_failed: the group is given up
                return None
            tally.completed(len(rollouts))
            return rollouts

        try:
            groups = await asyncio.gather(*(group(i) for i in mine))
        finally:
            for _ in range(started):
                self.stats.episode_finished()
        kept = [(i, g) for i, g in zip(mine, groups, strict=True) if g is not None]
        rollouts = gather_groups(self.world, [i for i, _ in kept], [g for _, g in kept])
        self.infra.add(self._summed(tally))
        return rollouts

    def _infra_failed(self, tally: InfraTally, task: Task, exc: EpisodeInfraError, again: bool) -> None:
        """Count one infrastructure failure of a member of ``task``'s group (run again, or its group given up)."""
        tally.failed(exc.cause, reissued=again)
        if again:
            log.info("synchronous GRPO: an episode of %s failed for the infrastructure (%s: %s); not trained, it runs "
                     "again in its group (generator.infra_retries=%d)", task.task_id, exc.cause, exc,
                     self.config.generator.infra_retries)
        else:
            log.warning("synchronous GRPO: an episode of %s failed for the infrastructure %d times in a row (last: %s: "
                        "%s); its group is given up, the batch trains without it (generator.infra_retries=%d)",
                        task.task_id, self.config.generator.infra_retries + 1, exc.cause, exc,
                        self.config.generator.infra_retries)

    def _summed(self, tally: InfraTally) -> InfraTally:
        """``tally`` summed over the ranks (each samples its own groups), the same on every rank."""
        if not self.world.distributed:
            return tally
        total = InfraTally()
        for part in self.world.all_gather_bytes(msgspec.msgpack.encode(tally)):
            total.add(msgspec.msgpack.decode(part, type=InfraTally))
        return total

    async def train_one(self, rollouts: list[Rollout]) -> TrainStepResult:
        """One GRPO step on the batch; after an update, publish the version and load it into the engine.

        A batch with fewer rollouts than ranks (every group given up for the infrastructure) takes no
        step: the iteration is counted, skipped and makes no progress.
        """
        if len(rollouts) < max(self.world.size, 1):
            return self._skip_empty(rollouts)
        batch = collate_rollouts(rollouts, self.pad_id)
        self.clock.switch("training")
        result = await asyncio.to_thread(
            grpo_train_step, policy=self.policy, batch=batch, group_ids=[str(r.group_id) for r in rollouts],
            config=self.config.grpo, reference=self.reference, temperature=self.config.generator.temperature,
            world=self.world,
        )
        self.state.iteration += 1
        self.counters["rollouts_trained"] += len(rollouts)
        self.counters["rollouts_kept"] += result.metrics["grpo/rollouts_kept"]
        self.counters["action_tokens_trained"] += result.metrics["grpo/action_tokens_kept"]
        self.counters["skipped_nonfinite"] += result.skipped_nonfinite
        if result.policy_updated:
            self.state.policy_version += 1
            with self.timer("publishing"):
                path = await asyncio.to_thread(self.publish, self.state.policy_version)
                await self.engine.update_weights(path, self.state.policy_version)
                if self.world.is_main:
                    self.store.prune(keep=2)
        else:
            self.counters["skipped_batches"] += 1
        if self.world.is_main:
            append_ledger(self.ctx.run_dir / LEDGER_NAME, ledger_line(self.state.iteration, self.state.policy_version,
                                                                      rollouts))
        self.nonfinite.observe(result.skipped_nonfinite)  # the same on every rank: the norm is global
        self.progress.observe(outcome_of(result, len(rollouts)))  # the same on every rank: the whole batch's
        return result

    def _skip_empty(self, rollouts: list[Rollout]) -> TrainStepResult:
        """The iteration of a batch too small to train (its groups given up): counted, skipped, no progress."""
        self.state.iteration += 1
        self.counters["skipped_batches"] += 1
        if self.world.is_main:
            append_ledger(self.ctx.run_dir / LEDGER_NAME, ledger_line(self.state.iteration, self.state.policy_version,
                                                                      rollouts))
        self.progress.observe(IterationOutcome(published=False, rollouts=len(rollouts)))
        return TrainStepResult(policy_updated=False, metrics={})

    def save_checkpoint(self) -> None:
        """A learner checkpoint of the policy, its optimizer and the counters (every rank writes its shards)."""
        self.counters.update(infra_metrics(self.infra))
        self.state.counters = dict(self.counters)
        self.state.account = self.clock.record()  # a resumed run sums its lives (``StateClock.carry``)
        with self.timer("checkpointing"):
            save_checkpoint(self.ctx.checkpoints_dir, state=self.state, parts=self.parts,
                            resolved_config_yaml=self.ctx.resolved_config_yaml(), world=self.world)

    async def _loop(self, sink: MetricsSink | None, progress: bool) -> None:
        grpo = self.config.grpo
        bar = tqdm(total=grpo.steps, initial=self.state.iteration, desc="grpo",
                   disable=not progress or not self.world.is_main, leave=False)
        self.stats.mark_started(units=len(rank_share(range(grpo.prompts_per_step), self.world)) * grpo.group_size)
        t_start = time.monotonic()
        trained_before, tokens_before = self.counters["rollouts_trained"], self.counters["action_tokens_trained"]
        while self.state.iteration < grpo.steps:
            t0 = time.monotonic()
            self.stats.learner_phase(waiting=False)
            self.clock.switch("waiting_for_batch")
            rollouts = await self.generate()
            self.stats.learner_phase(waiting=True)
            self.clock.switch("other")
            gen_s = time.monotonic() - t0
            self.stats.rollouts += len(rollouts)
            self.stats.action_tokens += sum(r.num_action_tokens for r in rollouts)
            self.stats.total_tokens += sum(len(r.token_ids) for r in rollouts)
            t1 = time.monotonic()
            result = await self.train_one(rollouts)
            self.clock.switch("other")
            step_s = time.monotonic() - t1
            elapsed = max(time.monotonic() - t_start, 1e-9)
            metrics = {**result.metrics, **self.progress.metrics(), **infra_metrics(self.infra)}
            metrics.update({
                "learner/step_s": step_s,
                "learner/iteration": float(self.state.iteration),
                "learner/skipped_nonfinite": self.counters["skipped_nonfinite"],
                "generator/batch_s": gen_s,
                "generator/busy_fraction_mean": self.stats.snapshot()["busy_fraction"],
                "throughput/rollouts_per_s": (self.counters["rollouts_trained"] - trained_before) / elapsed,
                "throughput/action_tokens_per_s": sum(r.num_action_tokens for r in rollouts) / max(step_s, 1e-9),
                "throughput/trained_action_tokens_per_s": (self.counters["action_tokens_trained"] - tokens_before)
                / elapsed,
                "rollouts/correct_mean": sum(r.metrics.get("correct", 0.0) for r in rollouts) / max(len(rollouts), 1),
            })
            if sink is not None and self.world.is_main:
                sink(metrics, self.state.policy_version)
            bar.update(1)
            reason = self.progress.reason or self.infra_bound.check()  # the same on every rank (summed tally)
            stalled = reason is not None and self.state.iteration < grpo.steps
            if self.state.iteration % grpo.checkpoint_every == 0 or self.state.iteration >= grpo.steps or stalled:
                self.save_checkpoint()
            if stalled:
                bar.close()
                raise LearnerStopped(f"synchronous GRPO stopped at iteration {self.state.iteration} of {grpo.steps} "
                                     f"(policy version {self.state.policy_version}): {reason}", 1)
        bar.close()
        self.stats.learner_phase(waiting=False)
        self.counters["generator_busy_fraction"] = self.stats.snapshot()["busy_fraction"]
        self.counters.update(infra_metrics(self.infra))

    def run(self, sink: MetricsSink | None = None, progress: bool = True) -> LearnerSummary:
        """Train to ``grpo.steps`` iterations, checkpointing on the way; write the final model.

        Raises:
            posttrain.episodes.runner.EpisodeError: an episode could not produce a rollout.
            posttrain.learner.optim.NonFiniteGradientError: ``grpo.max_nonfinite_iterations`` iterations in a
                row skipped an optimizer step for a non-finite gradient norm.
            posttrain.learner.liveness.LearnerStopped: ``learner.max_iterations_without_progress`` iterations
                in a row trained no token (every group uniform: ``posttrain.learner.progress``), or more than
                ``generator.max_infra_error_share`` of the finished episodes failed for the infrastructure;
                raised after a checkpoint (one line, exit status 1).
        """
        try:
            asyncio.run(self._loop(sink, progress))
        finally:
            self.engine.close()
        engine_stats = self.engine_account_all_ranks()
        final_dir = save_final_model(self.ctx, self.policy.model, self.tokenizer, self.world)
        return LearnerSummary(self.state.policy_version, self.state.iteration, final_dir, self.counters,
                              generator_stats=[engine_stats], counters_at_start=self.counters_at_start,
                              iterations_at_start=self.iterations_at_start)

    def engine_account_all_ranks(self) -> dict[str, float]:
        """This rank's final engine snapshot, its time account summed over every rank's engine (collective).

        On N ranks each rank runs its own engine on its share of the prompts; the run's generator
        account is all of them: the engine's and the slots' seconds by state, wall, CPU-seconds and
        lives (``account/lives``: one per rank) are summed with one all-reduce (gloo on the CPU,
        float64). Every rank must call it; the other fields stay this rank's own.
        """
        snapshot = self.stats.snapshot()
        if not self.world.distributed:
            return snapshot
        keys = sorted(k for k in snapshot if k.startswith((ENGINE_ACCOUNT, SLOTS_ACCOUNT)) or k == ACCOUNT_LIVES)
        summed = self.world.sum([snapshot[k] for k in keys])  # the same keys on every rank: the states are fixed
        snapshot.update(zip(keys, summed, strict=True))
        return snapshot


def run_grpo_sync(
    config: RunConfig,
    *,
    start_model_dir: Path,
    sink: MetricsSink | None = None,
    progress: bool = True,
    world: World | None = None,
    clock: StateClock | None = None,
) -> LearnerSummary:
    """Synchronous GRPO (module docstring): resume if a checkpoint exists, train, write the final model.

    Every ``grpo.checkpoint_every`` iterations (and at the end) writes a learner checkpoint; the final
    policy goes to ``<run>/final_model`` (and to ``final_model_uri`` when set); every iteration appends
    its batch to ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``).

    Args:
        config: Run config with ``technique: grpo`` and ``grpo.async`` false.
        start_model_dir: Policy to start from (the warm-started model); also the reference policy.
        sink: Receives ``(metrics, policy_version)`` after each iteration (on rank 0).
        progress: Show a progress bar (on rank 0).
        world: The learner's ranks (``init_world(config.learner)`` when None).
        clock: The learner process's time account (``SyncGRPO``).

    Returns:
        ``LearnerSummary`` (``generator_stats``: the engine's, with its time account; ``counters``: ``rollouts_trained``, ``rollouts_kept``,
        ``generator_busy_fraction``, ``skipped_batches``, ``skipped_nonfinite``, ``infra/*``...).

    Raises:
        posttrain.episodes.runner.EpisodeError: an episode could not produce a rollout.
        posttrain.learner.optim.NonFiniteGradientError: ``grpo.max_nonfinite_iterations`` iterations in a row
            skipped an optimizer step for a non-finite gradient norm.
        posttrain.learner.liveness.LearnerStopped: ``learner.max_iterations_without_progress`` iterations in a
            row trained no token, or the infrastructure-failure share passed ``generator.max_infra_error_share``;
            raised after a checkpoint (one line).
    """
    return SyncGRPO(config, start_model_dir, world, clock).run(sink, progress)
