"""Building the asynchronous learner: its transport, models, optimizers, resume, first publication.

``build_learner(config, transport, start_model_dir=...)`` returns a ``Learner``: everything the
loop (``posttrain.learner.loop``) touches, with one small method per step of the algorithm.
The transport (queue, admission, version key, weight store, announcements, generator telemetry)
is an argument, so a test hands it the in-memory twins; ``redis_transport`` builds the real one.

Resume (``learner.resume``): the newest checkpoint in ``<run>/checkpoints`` (or, when
``checkpoints_uri`` is set and the disk is empty, the one mirrored there) restores policy, critic,
optimizers, baseline and counters, and gives the generators back their positions where Redis lost
them (``posttrain.rollout.positions``). Entries the checkpoint covers are acknowledged at once, never trained again. The
weights the learner starts from are (re)published, replacing versions a dead predecessor
published after its last checkpoint, and the version key is set.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posttrain.advantages import RunningMeanBaseline
from posttrain.config import ConfigError, RunConfig, SAOConfig
from posttrain.config.roles import AsyncRLSettings, async_rl_settings, samples_on_policy
from posttrain.config.sections import LearnerConfig
from posttrain.learner.batch_source import (
    BatchSource,
    DropRecorder,
    FixedOnlySource,
    RankBatchSource,
    make_batch_source,
)
from posttrain.learner.checkpoint import LearnerState
from posttrain.learner.checkpointer import Checkpointer
from posttrain.learner.critic import CriticModel
from posttrain.learner.export import save_final_model
from posttrain.learner.gkd_step import FixedSequences, load_fixed_sequences
from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
from posttrain.learner.liveness import INTERRUPTED, GeneratorWatch, InfraShareBound, LearnerStopped
from posttrain.learner.metrics import learner_metrics
from posttrain.learner.optim import NonFiniteStreak, build_optimizer
from posttrain.learner.progress import IterationOutcome, ProgressWatch, outcome_of, print_line
from posttrain.learner.publish import WeightPublisher
from posttrain.learner.resume import resume_policy
from posttrain.learner.steps import GKDStep, GRPOStep, SAOStep, TrainStep
from posttrain.learner.types import LearnerSummary, Trainable, TrainStepResult
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.parallel.placement import full_state_dict, prepare_model
from posttrain.parallel.world import World
from posttrain.rollout.admission import (
    AdmissionController,
    RedisAdmissionController,
    StalenessStats,
    batch_staleness_metrics,
    infra_metrics,
)
from posttrain.rollout.lengths import count_batch
from posttrain.rollout.liveness import live_generators
from posttrain.rollout.positions import read_positions, restore_positions
from posttrain.rollout.queue import PolicyVersionStore, QueueEntry, RolloutLimits, RolloutQueue
from posttrain.rollout.redis_streams import (
    RedisPolicyVersionStore,
    RedisStreamQueue,
    check_reachable,
    connect,
)
from posttrain.rollout.telemetry import read_generator_stats
from posttrain.runtime import RunContext, check_model_dir
from posttrain.weight_sync.announce import announce_weights
from posttrain.weight_sync.factory import open_weight_store
from posttrain.weight_sync.store import WeightStore

log = logging.getLogger("posttrain.learner")


@dataclass
class LearnerTransport:
    """How the learner reaches the generators: only through these (docs/architecture.md).

    Attributes:
        queue: The rollout stream, seen by the learner's consumer.
        admission: Admission control (drops and untrained rows give their places back).
        versions: The shared policy-version key.
        store: The weight store generators load from.
        announce: Tells generators a version is published (``policy_version -> anything``).
        generator_stats: Returns generator id -> latest stats (empty when none reported).
        live_generators: Returns the ids of generators with a live heartbeat; None: not watched
            (in-memory tests), the learner then waits for rollouts without a deadline.
        return_dead_leases: Returns the admission tickets of generators whose heartbeat lapsed
            (returns how many); None with ``live_generators``.
        read_positions: Returns the generators' positions (index -> episode counters reserved,
            ``posttrain.rollout.positions``), recorded in each checkpoint; None: not recorded.
        restore_positions: Raises the generators' positions to at least the given ones (never
            lowers one) and returns the indexes it raised; None: nothing restored.
        starts_empty: The Redis is the embedded server ``posttrain run`` started for this call
            (``posttrain.services.embedded_redis``): it starts empty on every run, so a resumed learner
            finding the admission counters and generator positions behind its checkpoint is the
            expected case, said in an info line of the run log. False (an external Redis): the same
            finding means the server lost its data, a warning.
    """

    queue: RolloutQueue
    admission: AdmissionController
    versions: PolicyVersionStore
    store: WeightStore
    announce: Callable[[int], object]
    generator_stats: Callable[[], dict[str, dict[str, float]]]
    live_generators: Callable[[], list[str]] | None = None
    return_dead_leases: Callable[[], int] | None = None
    read_positions: Callable[[], dict[str, int]] | None = None
    restore_positions: Callable[[dict[str, int]], list[str]] | None = None
    starts_empty: bool = False


def redis_transport(config: RunConfig, redis_url: str, *, starts_empty: bool = False) -> LearnerTransport:
    """The learner's transport over the run's Redis and its configured weight store.

    The queue delivers per-token fields as numpy views of the payload (``arrays=True``), which
    collation copies into tensors without a per-token Python loop. ``starts_empty``: ``redis_url`` is
    the embedded server ``posttrain run`` started for this call (``LearnerTransport.starts_empty``).

    Raises:
        posttrain.config.ConfigError: the technique does not use the asynchronous runtime.
        posttrain.rollout.queue.RedisUnreachableError: no answer from ``redis_url`` within
            ``queue.reconnect_window_s``.
    """
    ctx = RunContext(config)
    settings = async_rl_settings(config)
    # Every command retries over queue.reconnect_window_s (the client's own backoff), so the objects retry no more.
    client = connect(redis_url, reconnect_window_s=config.queue.reconnect_window_s)
    check_reachable(client, redis_url, config.queue.reconnect_window_s)
    admission = RedisAdmissionController(client, ctx.keys, batch_size=settings.batch_rollouts,
                                         max_staleness=settings.max_staleness, retries=0)
    return LearnerTransport(
        queue=RedisStreamQueue(client, ctx.keys, consumer="learner-0", maxlen=config.queue.maxlen, arrays=True,
                               retries=0),
        admission=admission,
        versions=RedisPolicyVersionStore(client, ctx.keys, retries=0),
        store=open_weight_store(ctx),
        announce=lambda version: announce_weights(client, ctx.keys, version),
        generator_stats=lambda: read_generator_stats(client, ctx.keys),
        live_generators=lambda: live_generators(client, ctx.keys),
        return_dead_leases=admission.return_leases_of_dead,
        read_positions=lambda: read_positions(client, ctx.keys),
        restore_positions=lambda positions: restore_positions(client, ctx.keys, positions),
        starts_empty=starts_empty,
    )


@dataclass
class Learner:
    """The asynchronous learner's parts, built by ``build_learner``; one method per step of the loop.

    Attributes:
        ctx: The run.
        settings: The runtime's shared numbers (``posttrain.config.roles``).
        transport: Queue, admission, version key, weight store, announcements, telemetry.
        state: Iteration, policy version, consumed entries (checkpointed).
        counters: ``rollouts_trained``, ``action_tokens_trained``, ``stale_dropped``... (checkpointed).
        policy: The policy with its optimizer and schedule.
        tokenizer: The policy's tokenizer.
        source: Where batches come from (drops handled inside).
        step: The train step (SAO or asynchronous GRPO).
        publisher: Weight store, version key, announcement (rank 0's; None elsewhere).
        checkpointer: Checkpoint then acknowledge.
        staleness: Staleness statistics of consumed and dropped rollouts.
        nonfinite: Iterations in a row that skipped a step for a non-finite gradient norm; stops
            the run at ``max_nonfinite_iterations``.
        world: The learner's ranks; only rank 0 touches the transport (it is None elsewhere).
        watch: Rank 0's watch on generator heartbeats (None: not watched).
        progress: Iterations in a row that trained no token (``learner.progress``); stops the run at
            ``learner.max_iterations_without_progress``.
        infra_bound: Rank 0's check of the run's infrastructure-failure share
            (``generator.max_infra_error_share``; None elsewhere).
        publishes: Whether each version's weights go to the weight store for generators (False for GKD at
            ``gkd.lmbda: 0``, which has none: a version is then a count, and the final model is written as
            for any run).
        stop_requested: Set by the SIGTERM or SIGINT handler (the reason); the loop checkpoints and stops.
    """

    ctx: RunContext
    settings: AsyncRLSettings
    transport: LearnerTransport | None
    state: LearnerState
    counters: dict[str, float]
    policy: Trainable
    tokenizer: Any
    source: BatchSource
    step: TrainStep
    publisher: WeightPublisher | None
    checkpointer: Checkpointer
    staleness: StalenessStats
    nonfinite: NonFiniteStreak
    world: World = field(default_factory=World)
    watch: GeneratorWatch | None = None
    progress: ProgressWatch = field(default_factory=lambda: ProgressWatch(LearnerConfig().max_iterations_without_progress))
    infra_bound: InfraShareBound | None = None
    publishes: bool = True
    stop_requested: str | None = None
    drops_seen: float = 0.0
    iterations_here: int = 0
    last_step_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    counters_at_start: dict[str, float] = field(default_factory=dict)
    iterations_at_start: int = 0

    def finished(self, max_iterations: int | None) -> bool:
        """True once the last policy version is published, or after ``max_iterations`` in this process."""
        if max_iterations is not None and self.iterations_here >= max_iterations:
            return True
        return self.state.policy_version >= self.settings.steps

    def stop_reason(self, waiting: bool) -> str | None:
        """Why the learner must stop now (SIGTERM, no progress, no live generator for too long), the same on every rank.

        Args:
            waiting: The last ``next_batch`` gave nothing: only then does the time without a live
                generator count (``GeneratorWatch.check``, which returns dead generators' tickets
                at every call).

        Returns:
            The reason (one line), or None to go on.
        """
        reason = self.stop_requested or self.progress.reason
        if reason is None and self.watch is not None:
            reason = self.watch.check(waiting)
        if reason is None and self.infra_bound is not None:
            reason = self.infra_bound.check()
        if self.world.distributed:
            flag = self.world.broadcast_bytes((reason or "").encode() if self.world.is_main else None)
            reason = flag.decode() or None
        return reason

    def stopped(self, reason: str) -> LearnerStopped:
        """The error that ends a stopped learner (call after the final checkpoint); SIGTERM exits 143, SIGINT 130, else 1.

        It carries the learner's summary (``summary()``: counters, iterations, those it started from), so the
        stopped life's time account charges what it trained (``posttrain.runners.accounting.record_failed_account``).
        """
        self.counters["stopped_early"] = 1.0
        code = 143 if reason.startswith("SIGTERM") else 130 if reason.startswith(INTERRUPTED) else 1
        return LearnerStopped(f"learner stopped at policy version {self.state.policy_version} of "
                              f"{self.settings.steps}: {reason}", code, summary=self.summary())

    def train(self, entries: list[QueueEntry]) -> TrainStepResult:
        """Observe the batch's staleness and run the train step on it (timed in ``last_step_s``).

        The result's metrics gain the batch's per-rollout staleness (``batch_staleness_metrics``).
        """
        lags = [self.staleness.observe(e.rollout.policy_version, self.state.policy_version) for e in entries]
        if self.transport is not None:  # an entry refunded when dropped by a dead predecessor takes its place back
            self.transport.admission.settle(trained=[e.entry_id for e in entries])
        t0 = time.monotonic()
        result = self.step(entries, self.state.iteration, self.world, self.state.policy_version)
        self.last_step_s = time.monotonic() - t0
        result.metrics.update(batch_staleness_metrics(lags, self.settings.max_staleness))
        return result

    def refund_untrained(self, entries: Sequence[QueueEntry], result: TrainStepResult) -> None:
        """Give back the admission places of a batch that made no policy version (critic warm-up, all groups uniform).

        Admission counts capacity in policy versions, ``(v + tau + 1) * B`` rollouts: each version
        pays for one batch of B. A batch that made no version would otherwise hold B places for the
        whole run, so all of them come back. A batch that made a version refunds nothing, even for
        rows that trained nothing (GRPO's uniform groups): the version already added B places, and
        refunding those rows as well let admitted, unread rollouts grow by that many every version
        until the excess went stale.
        """
        if self.transport is not None and not result.policy_updated:  # by entry: a replay after a crash refunds once
            self.transport.admission.refund(len(entries), [e.entry_id for e in entries])

    def record(self, entries: Sequence[QueueEntry], result: TrainStepResult) -> None:
        """Count the iteration (skipped steps too), append its ledger line, keep its entries for the next checkpoint.

        The entries dropped while the batch was assembled are written in the same line and join
        the checkpoint's entries: acknowledged, like the batch, only after the checkpoint that
        covers this line (issue 32). Rank 0 also adds the batch and its drops to the length
        accounting (``rollout.lengths``, ``length/*`` and ``tokens/*`` counters, checkpointed with
        the others).
        """
        self.state.iteration += 1
        self.iterations_here += 1
        self.state.consumed_entry_ids.extend(e.entry_id for e in entries)
        version = self.state.policy_version + int(result.policy_updated)
        if self.world.is_main:
            dropped = self.source.drops.take_for_ledger()
            append_ledger(self.ctx.run_dir / LEDGER_NAME, ledger_line(
                self.state.iteration, version, [e.rollout for e in entries], [e.entry_id for e in entries],
                [(e.rollout, r) for e, r in dropped], learner_version=self.state.policy_version,
                max_staleness=self.settings.max_staleness, row_tokens=result.row_tokens,
                dropped_entry_ids=[e.entry_id for e, _ in dropped]))
            self.state.consumed_entry_ids.extend(e.entry_id for e, _ in dropped)
            count_batch(self.counters, [e.rollout for e in entries],
                        [e.rollout for e, _ in dropped if e.rollout.outcome != "infra_error"], result.row_tokens)
        self.counters["rollouts_trained"] += len(entries)
        self.counters["action_tokens_trained"] = self.counters.get("action_tokens_trained", 0.0) + (
            result.action_tokens_trained)
        self.counters["stale_dropped"] = self.source.drops.total
        self.counters["infra_dropped"] = self.source.drops.infra
        self.counters["skipped_nonfinite"] += result.skipped_nonfinite

    def observe_progress(self, entries: Sequence[QueueEntry], result: TrainStepResult) -> None:
        """Count the iteration just recorded towards the progress bound (``learner.progress``).

        Critic-only warm-up iterations (``critic_warmup_iterations``) are not counted; the rollouts dropped
        while the batch was assembled count in its stale-drop share.
        """
        dropped = self.source.drops.seen - self.drops_seen
        self.drops_seen = self.source.drops.seen
        if self.state.iteration > self.settings.critic_warmup_iterations:
            self.progress.observe(outcome_of(result, len(entries), int(dropped)))

    def observe_drops(self) -> None:
        """With no batch ready: count each batch's worth of rollouts dropped since the last count as one iteration.

        Such an iteration makes no progress (every rollout stale), so a learner whose every rollout is dropped
        stops too.
        """
        while self.settings.batch_rollouts and self.source.drops.seen - self.drops_seen >= self.settings.batch_rollouts:
            self.drops_seen += self.settings.batch_rollouts
            self.progress.observe(IterationOutcome(published=False, rollouts=0, dropped=self.settings.batch_rollouts))

    def stop_on_nonfinite(self, result: TrainStepResult) -> None:
        """End the iteration's streak of skipped steps, or extend it (the same on every rank).

        Raises:
            posttrain.learner.optim.NonFiniteGradientError: ``max_nonfinite_iterations`` in a row
                skipped a step (one line, naming the setting).
        """
        self.nonfinite.observe(result.skipped_nonfinite)

    def publish_next_version(self) -> None:
        """Bump the policy version and publish it (weights gathered from every rank, version key, announcement)."""
        self.state.policy_version += 1
        self.publish(self.state.policy_version)

    def publish(self, version: int, *, write_weights: bool = True) -> None:
        """Publish ``version``: every rank gives its shards, rank 0 writes the store, sets the key, announces.

        Nothing without generators to load it (``publishes`` False, the same on every rank).
        """
        if not self.publishes:
            return
        weights = full_state_dict(self.policy.model, self.world) if write_weights else {}
        if self.publisher is not None:
            self.publisher.publish(weights, version, write_weights=write_weights)

    def metrics(self, entries: Sequence[QueueEntry], result: TrainStepResult) -> dict[str, float]:
        """The iteration's metrics (``posttrain.learner.metrics``); rank 0's only (``{}`` elsewhere).

        Without a transport (GKD at ``gkd.lmbda: 0``) the stream's, generators' and admission's are left out.
        """
        if not self.world.is_main:
            return {}
        t = self.transport
        return {**learner_metrics(
            result, entries, iteration=self.state.iteration, counters=self.counters, staleness=self.staleness,
            queue=t.queue if t is not None else None, generator_stats=t.generator_stats() if t is not None else {},
            step_s=self.last_step_s, elapsed_s=time.monotonic() - self.started,
            admission=t.admission.state() if t is not None else None,
        ), **self.progress.metrics()}

    def finish(self) -> LearnerSummary:
        """Save the final model once the last version is published; return the run's summary.

        Its counters gain the run's infrastructure failures (``infra_metrics``: ``infra/errors``,
        ``infra/<cause>``, ``infra/reissued``...) from the admission counters.
        """
        self.counters["stale_dropped"] = self.source.drops.total
        self.counters["infra_dropped"] = self.source.drops.infra
        if self.transport is not None:
            self.counters["dead_letters"] = float(self.transport.queue.dead_letter_count())
            self.counters.update(infra_metrics(self.transport.admission.state()))
        if self.state.policy_version >= self.settings.steps:
            save_final_model(self.ctx, self.policy.model, self.tokenizer, self.world)
        return self.summary()

    def summary(self) -> LearnerSummary:
        """The learner's summary now: version, iterations, counters (the learner's own dict), and those it started from."""
        return LearnerSummary(self.state.policy_version, self.state.iteration, self.ctx.final_model_dir,
                              self.counters, counters_at_start=self.counters_at_start,
                              iterations_at_start=self.iterations_at_start)


def guard_transport(config: RunConfig, transport: LearnerTransport, model: nn.Module, policy_version: int,
                    generator_positions: dict[str, int] | None = None) -> None:
    """Make the transport safe for this learner before it reads anything (issue 23, items 7, 15, 17, 18).

    * Every delivered rollout is checked against the model's vocabulary (its input embedding's
      rows) and the longest sequence the run's engines produce (``generator.max_episode_tokens +
      generator.max_new_tokens``); one that does not fit is dead-lettered with the reason instead
      of crashing the forward pass (and, pending, every restart after it).
    * Dead-lettered entries give their admission places back (``admission.refund``).
    * The admission counters are re-based on the resumed policy version (``admission.rebase``):
      on a fresh Redis they restart at 0 while the learner is at version C, which granted C x B
      surplus places that all went stale.
    * The generators' positions saved in the checkpoint (``generator_positions``) are written back
      where Redis holds less (``posttrain.rollout.positions``): on a fresh Redis the generators
      numbered their episodes from 0 again and replayed (task, seed) pairs the checkpoint had
      trained on. This runs before the learner first sets the policy-version key, which generators
      wait for before they reserve (``posttrain.generator.worker``), so none reserves from the
      emptied hash.
    """
    hf_model: Any = model  # a transformers model: input embeddings and config
    vocab = int(getattr(hf_model.get_input_embeddings(), "num_embeddings", 0) or hf_model.config.vocab_size)
    gen = config.generator
    transport.queue.set_limits(RolloutLimits(vocab, gen.max_episode_tokens + gen.max_new_tokens),
                               transport.admission.refund)
    # The embedded server of ``posttrain run`` starts empty on every run: finding it so on a resume is the
    # expected case (an info line in the run log); an external Redis found so has lost its data (a warning).
    level, why = ((logging.INFO, "the run's embedded Redis starts empty on a resume") if transport.starts_empty
                  else (logging.WARNING, "a fresh Redis? an external server that lost its data"))
    added = transport.admission.rebase(policy_version)
    if added:
        log.log(level, "admission counters were behind the checkpoint's policy version %d (%s): counted %d "
                "rollouts of the versions they never saw as consumed", policy_version, why, added)
    if generator_positions and transport.restore_positions is not None:
        raised = transport.restore_positions(dict(generator_positions))
        if raised:
            log.log(level, "generator positions were behind the checkpoint's (%s): restored them for generator "
                    "index %s, so no (task, seed) pair trained before is sampled again", why, ", ".join(raised))


def critic_optimizer_steps(sao: SAOConfig) -> int:
    """Optimizer steps the critic takes over a run: K per iteration, warm-up iterations included.

    ``(sao.steps + sao.critic.warmup_steps) * sao.critic.updates_per_step``; the critic's LR
    schedule spans them (sized in iterations, a cosine schedule reached 0 half-way with K = 2).
    """
    return (sao.steps + sao.critic.warmup_steps) * sao.critic.updates_per_step


def _critic(config: RunConfig, start_model_dir: Path, world: World) -> Trainable | None:
    """SAO's critic, initialised from the start policy and placed like it (``sao.advantage == "gae"``), else None.

    Its optimizer is ``sao.optim`` with ``sao.critic.lr``; the schedule counts the critic's own
    optimizer steps (``critic_optimizer_steps``), its warm-up (``sao.optim.warmup_steps``) too.
    """
    sao = config.sao
    if config.technique != "sao" or sao.advantage != "gae":
        return None
    model = prepare_model(CriticModel.from_policy_path(start_model_dir, sao.critic.head_weight_std), world, config.learner)
    optimizer, scheduler = build_optimizer(
        model, sao.optim.model_copy(update={"lr": sao.critic.lr}), critic_optimizer_steps(sao))
    return Trainable(model, optimizer, scheduler)


def gkd_teacher(config: RunConfig, policy: nn.Module, world: World) -> nn.Module:
    """GKD's teacher (``RunContext.teacher_model_dir``), frozen and placed like the student.

    Raises:
        FileNotFoundError: no model there (one line naming ``gkd.teacher.path``).
        posttrain.config.ConfigError: the teacher's vocabulary differs from the student's (one line).
    """
    teacher_dir = RunContext(config).teacher_model_dir
    check_model_dir(teacher_dir, "gkd.teacher.path")
    teacher: Any = load_policy(teacher_dir)
    student: Any = policy
    vocab = int(teacher.get_input_embeddings().num_embeddings)
    student_vocab = int(student.get_input_embeddings().num_embeddings)
    if vocab != student_vocab:
        raise ConfigError(f"gkd.teacher.path: the teacher in {teacher_dir} has a vocabulary of {vocab} tokens, the "
                          f"student {student_vocab}; GKD compares their next-token distributions token by token, "
                          "so both need one tokenizer")
    return prepare_model(teacher, world, config.learner, trainable=False)


def _train_step(config: RunConfig, policy: Trainable, critic: Trainable | None, baseline: RunningMeanBaseline | None,
                start_model_dir: Path, tokenizer: Any, world: World) -> TrainStep:
    """The run's train step: SAO's; asynchronous GRPO's; or GKD's with its teacher and fixed sequences.

    GRPO's frozen reference (placed like the policy) is loaded only when its KL term is on.
    """
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if config.technique == "gkd":
        gkd = config.gkd
        examples = load_fixed_sequences(
            gkd.data_path if gkd.fixed_rows else None, tokenizer, max_seq_len=gkd.max_seq_len, limit=gkd.max_examples,
            on_bad_row=config.data.on_bad_row, quarantine_path=RunContext(config).run_dir / "quarantine-gkd.jsonl")
        return GKDStep(policy, gkd_teacher(config, policy.model, world), gkd,
                       FixedSequences(examples, gkd.fixed_rows, config.seed), pad_id)
    if config.technique == "grpo":
        grpo = config.grpo
        reference: nn.Module | None = None
        if grpo.loss.kl_coef > 0:
            reference = prepare_model(load_policy(start_model_dir), world, config.learner, trainable=False)
        return GRPOStep(policy, grpo, reference, config.generator.temperature, pad_id)
    return SAOStep(policy, critic, config.sao, baseline, pad_id)


def build_learner(config: RunConfig, transport: LearnerTransport | None, *, start_model_dir: Path,
                  world: World | None = None) -> Learner:
    """Load or resume the learner of ``config`` and publish the version it starts from (module docstring).

    Args:
        config: The run config (``technique: sao`` or ``gkd``, or ``grpo`` with ``grpo.async``).
        transport: Queue, admission, version key, weight store, announcements, telemetry; rank 0's
            only (None on the other ranks, which never touch the stream or the store). None on every
            rank for GKD at ``gkd.lmbda: 0``: it trains on fixed sequences only, reads no stream,
            awaits no rollout and publishes no weights for generators (``FixedOnlySource``); its
            metrics, ledger, checkpoints and final model are those of any run.
        start_model_dir: Policy to start from when there is no checkpoint (the SFT warm start).
        world: The learner's ranks (one process when None).

    Raises:
        posttrain.config.ConfigError: the technique does not use the asynchronous runtime, or a
            batch has fewer rollouts than there are ranks.
        ValueError: rank 0 without a transport, or a transport for GKD at ``gkd.lmbda: 0``.
        FileNotFoundError: no tokenizer in the run directory, no model at ``start_model_dir``, or (GKD) no
            teacher at ``gkd.teacher.path`` / ``<run>/teacher_model``.
        posttrain.data.tasks.DatasetError: (GKD) a bad row of ``gkd.data_path`` under ``data.on_bad_row: stop``.
        posttrain.learner.checkpoint.CheckpointError: the checkpoint does not fit this model.
    """
    world = world or World()
    settings = async_rl_settings(config)  # first: a technique off the runtime is a one-line config error
    on_policy = samples_on_policy(config)
    if world.is_main and transport is None and on_policy:
        raise ValueError("build_learner: rank 0 needs the transport")
    if transport is not None and not on_policy:
        raise ValueError("build_learner: gkd.lmbda 0 trains on fixed sequences only; it takes no transport")
    ctx = RunContext(config)
    rows = config.gkd.batch_size if settings.technique == "gkd" else settings.batch_rollouts
    if rows < world.size:
        field_name = {"grpo": "grpo.prompts_per_step x grpo.group_size", "gkd": "gkd.batch_size"}.get(
            settings.technique, "sao.batch_size")
        what = "sequences" if settings.technique == "gkd" else "rollouts"
        raise ConfigError(f"{field_name}: a batch of {rows} {what} cannot feed {world.size} "
                          f"learner ranks; use at least {world.size} (or fewer ranks)")
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    critic = _critic(config, start_model_dir, world)
    resumed_policy = resume_policy(ctx.checkpoints_dir, start_model_dir, settings.optim,
                                   settings.policy_optimizer_steps, critic=critic, mirror_uri=config.checkpoints_uri,
                                   world=world, learner=config.learner)
    policy, state = resumed_policy.policy, resumed_policy.state
    sao = config.sao
    baseline = None
    if config.technique == "sao" and sao.advantage == "running_mean":
        baseline = RunningMeanBaseline(sao.running_mean_window)
        if state.baseline_rewards:
            baseline.load_state_dict({"window": sao.running_mean_window, "rewards": state.baseline_rewards})
    staleness = StalenessStats(settings.max_staleness)
    counters = {"rollouts_trained": 0.0, "stale_dropped": 0.0, "skipped_nonfinite": 0.0, **state.counters}
    publisher, inner, flags = None, None, b""
    if transport is not None and world.is_main:
        guard_transport(config, transport, policy.model, state.policy_version, state.generator_positions)
        latest = transport.store.latest_version()
        resumed = resumed_policy.checkpoint is not None or (latest is not None and latest > 0)
        if state.consumed_entry_ids:  # the checkpoint covers them: acknowledge, never train on them again
            covered = sorted(set(state.consumed_entry_ids))
            transport.queue.ack(covered)
            transport.admission.settle(acked=covered)
        publisher = WeightPublisher(transport.store, transport.versions, transport.announce, start_model_dir,
                                    overwrite=resumed)
        drops = DropRecorder(transport.admission, staleness, counters["stale_dropped"],
                             counters.get("infra_dropped", 0.0))
        inner = make_batch_source(settings, transport.queue, drops, claim_idle_ms=config.queue.claim_idle_ms,
                                  block_s=config.queue.block_ms / 1000)
        flags = b"1" if resumed or latest is None else b"0"
    write_weights = world.broadcast_bytes(flags if world.is_main else None) == b"1"
    state.consumed_entry_ids = []
    checkpointer = Checkpointer(
        ctx, state=state, counters=counters, parts=resumed_policy.parts, baseline=baseline,
        queue=transport.queue if transport is not None and world.is_main else None,
        every=settings.checkpoint_every, last_version=settings.steps, mirror_uri=config.checkpoints_uri, world=world,
        positions=transport.read_positions if transport is not None and world.is_main else None,
        acked=transport.admission.settle if transport is not None and world.is_main else None,
    )
    learner = Learner(ctx, settings, transport if world.is_main else None, state, counters, policy, tokenizer,
                      RankBatchSource(world, inner) if on_policy else FixedOnlySource(),
                      _train_step(config, policy, critic, baseline, start_model_dir, tokenizer, world), publisher,
                      checkpointer, staleness,
                      NonFiniteStreak(settings.max_nonfinite_iterations,
                                      f"{settings.technique}.max_nonfinite_iterations"), world,
                      progress=ProgressWatch(config.learner.max_iterations_without_progress,
                                             print_line if world.is_main else None))
    learner.drops_seen = learner.source.drops.seen
    learner.counters_at_start, learner.iterations_at_start = dict(counters), state.iteration  # as resumed
    learner.publishes = on_policy  # GKD at lambda 0: no generator loads the student's weights
    if transport is not None and world.is_main and transport.live_generators is not None:
        learner.watch = GeneratorWatch(transport.live_generators, transport.return_dead_leases or (lambda: 0),
                                       timeout_s=config.learner.no_generator_timeout_s)
    if transport is not None and world.is_main:
        learner.infra_bound = InfraShareBound(transport.admission.state, config.generator.max_infra_error_share,
                                              config.generator.infra_min_episodes)
    learner.publish(state.policy_version, write_weights=write_weights)
    return learner
