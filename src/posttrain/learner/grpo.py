"""GRPO learner (``technique: grpo``): group-relative advantages, PPO clipping, synchronous and asynchronous.

GRPO (DeepSeekMath, arXiv 2402.03300 §4.1) samples G rollouts per prompt and uses each rollout's
reward relative to its group, ``A_i = (r_i - mean_g) / (std_g + eps)``, as the advantage of every
action token; the loss is ``posttrain.losses.grpo_loss`` (PPO clipped surrogate with DAPO's
separate ``clip_eps_low`` / ``clip_eps_high``, optional k3 KL to a frozen reference policy).

* **Synchronous** (``run_grpo_sync``): generate ``prompts_per_step x group_size`` rollouts with
  the current weights in this process, wait for every one of them, then train; the PPO anchor
  pi_old is the learner's own log-probabilities at the start of the step. The engine is idle
  while the learner trains and the learner idles while the slowest rollout finishes; the
  throughput metrics (``throughput/rollouts_per_s``, ``throughput/trained_action_tokens_per_s``,
  ``generator/busy_fraction_mean``) have the same names as SAO's, so the two compare directly.
* **Asynchronous** (``grpo.async: true``): the SAO runtime (generator processes, Redis stream,
  staleness bound) produces groups of rollouts that share a ``group_id``; ``collect_groups``
  assembles complete groups for the learner loop and ``grpo_train_step`` trains on them with the
  DIS mask against the behaviour logprobs (arXiv 2607.07508's "GRPO + DIS" baseline; the
  behaviour logprobs are the PPO anchor, "bypass" mode). ``async_runtime_config`` maps the
  ``grpo`` section onto the runtime settings the SAO processes read.

Groups whose rewards are all equal give zero advantage; with ``drop_uniform_groups`` they are
dropped before the forward pass and counted (``grpo/uniform_groups_frac``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posttrain.advantages import group_relative_advantages
from posttrain.config import RunConfig
from posttrain.config.techniques import GRPOTechniqueConfig
from posttrain.learner.accumulate import EpochSampler, GradientAccumulator
from posttrain.learner.batching import (
    RolloutBatch,
    collate_rollouts,
    length_order,
    micro_batches,
    padded_tokens,
    select_rows,
)
from posttrain.learner.optim import clip_and_step
from posttrain.learner.sao_step import StepResult, Trainable
from posttrain.losses import PolicyLossInputs, grpo_loss
from posttrain.losses.logprobs import token_logprobs
from posttrain.records import Rollout
from posttrain.rollout.admission import is_stale
from posttrain.rollout.queue import QueueEntry

log = logging.getLogger("posttrain.learner.grpo")

MetricsSink = Callable[[dict[str, float], int], None]


# ------------------------------------------------------------------------------------ train step
def rollout_logprobs(model: nn.Module, batch: RolloutBatch, temperature: float = 1.0) -> torch.Tensor:
    """``logprobs [B, T] float32`` of the batch tokens under ``model`` at ``temperature`` (gradient if enabled)."""
    logits = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask.long(), use_cache=False).logits
    return token_logprobs(logits, batch.token_ids, temperature)


def _split(items: list[Any], parts: int) -> list[list[Any]]:
    """``items`` cut into ``parts`` consecutive chunks whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    out, lo = [], 0
    for p in range(parts):
        hi = lo + size + (1 if p < extra else 0)
        out.append(items[lo:hi])
        lo = hi
    return out


def _mean_of(parts: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for p in parts for k in p}
    return {k: sum(p.get(k, 0.0) for p in parts) / len(parts) for k in keys}


def grpo_train_step(
    *,
    policy: Trainable,
    batch: RolloutBatch,
    group_ids: Sequence[str],
    config: GRPOTechniqueConfig,
    reference: nn.Module | None = None,
    temperature: float = 1.0,
) -> StepResult:
    """Train on one batch of groups: group-relative advantages, then ``config.mini_batches`` optimizer steps.

    Each mini-batch (whole groups) is one optimizer step; inside it, micro-batches of
    ``config.micro_batch_size`` rollouts accumulate gradients of ``grpo_loss`` divided by the
    mini-batch's action-token count. The PPO anchor is the learner's log-probabilities before the
    first update (synchronous), or the behaviour logprobs (``config.async_``: bypass mode with the
    DIS mask of ``config.loss``).

    Args:
        policy: The policy, its AdamW and scheduler.
        batch: Padded rollouts: ``token_ids [B, T] int64``, masks ``[B, T] bool``,
            ``behaviour_logprobs [B, T] float32``, ``rewards [B] float32``.
        group_ids: B group ids; rollouts of one prompt share one.
        config: ``grpo`` section.
        reference: Frozen reference policy; required when ``config.loss.kl_coef > 0``.
        temperature: Sampling temperature of the behaviour policy; learner logprobs use it too.

    Returns:
        ``StepResult``: ``policy_updated`` False when every group was dropped as uniform; metrics
        ``reward/mean``, ``reward/std``, ``advantage/mean``, ``advantage/std``,
        ``response/action_tokens_mean``, ``grpo/groups``, ``grpo/uniform_groups_frac``,
        ``grpo/rollouts_kept``, ``grpo/action_tokens_kept`` and, after an update, ``loss/policy``,
        the ``grpo_loss`` metrics (``clip/*``, ``ppo_ratio/*``, ``kl/ref_k3``, mismatch, ``mask/*``
        with DIS), ``policy/grad_norm`` and ``policy/lr`` (means over mini-batches),
        ``batch/padded_tokens`` (tokens the forward passes of the update computed; kept rows are
        split into micro-batches in order of length, ``length_order``) and ``batch/real_tokens``.

    Raises:
        ValueError: ``len(group_ids)`` differs from B, or ``kl_coef > 0`` without ``reference``.
        FloatingPointError: a non-finite gradient norm (see ``clip_and_step``).
    """
    rows = batch.token_ids.shape[0]
    if len(group_ids) != rows:
        raise ValueError(f"group_ids: expected {rows} ids like batch rows, got {len(group_ids)}")
    if config.loss.kl_coef > 0 and reference is None:
        raise ValueError(f"reference: required when grpo.loss.kl_coef > 0 (kl_coef={config.loss.kl_coef})")
    advantages, degenerate = group_relative_advantages(
        batch.rewards, list(group_ids), batch.action_mask, normalize_std=config.normalize_std
    )
    members: OrderedDict[str, list[int]] = OrderedDict()
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    uniform = [g for g, idx in members.items() if bool(degenerate[idx[0]])]
    kept = [g for g in members if not (config.drop_uniform_groups and g in uniform)]
    kept_rows = [i for g in kept for i in members[g]]
    act = batch.action_mask
    metrics: dict[str, float] = {
        "reward/mean": float(batch.rewards.mean()),
        "reward/std": float(batch.rewards.std()) if rows > 1 else 0.0,
        "response/action_tokens_mean": float(act.sum(dim=1).float().mean()),
        "grpo/groups": float(len(members)),
        "grpo/uniform_groups_frac": len(uniform) / len(members),
        "grpo/rollouts_kept": float(len(kept_rows)),
        "grpo/action_tokens_kept": float(act[kept_rows].sum()) if kept_rows else 0.0,
    }
    kept_adv = advantages[kept_rows][act[kept_rows]] if kept_rows else advantages.new_zeros(0)
    metrics["advantage/mean"] = float(kept_adv.mean()) if kept_adv.numel() else 0.0
    metrics["advantage/std"] = float(kept_adv.std()) if kept_adv.numel() > 1 else 0.0
    if not kept_rows:
        return StepResult(policy_updated=False, metrics=metrics)

    # Kept rows shortest first, so consecutive micro-batches pad little (``length_order``).
    kept_rows = length_order(batch, kept_rows)
    sub = select_rows(batch, kept_rows)
    sub_adv = advantages[torch.tensor(kept_rows, dtype=torch.long), : sub.token_ids.shape[1]]
    mbs = config.micro_batch_size
    chunks = _split(kept, min(config.mini_batches, len(kept)))
    old_all: torch.Tensor | None = None
    if not config.async_ and len(chunks) > 1:
        # PPO's pi_old: the learner's log-probabilities before the first update of this batch.
        old_all = torch.zeros_like(sub.behaviour_logprobs)
        policy.model.eval()
        with torch.no_grad():
            for i, mb in enumerate(micro_batches(sub, mbs)):
                old_all[i * mbs : i * mbs + mb.token_ids.shape[0], : mb.token_ids.shape[1]] = rollout_logprobs(
                    policy.model, mb, temperature
                )
    position = {row: k for k, row in enumerate(kept_rows)}
    parts: list[dict[str, float]] = []
    padded = 0
    policy.model.train()
    for chunk in chunks:
        local = sorted(position[i] for g in chunk for i in members[g])
        mini = select_rows(sub, local)
        local_t = torch.tensor(local, dtype=torch.long)
        width = mini.token_ids.shape[1]
        mini_adv = sub_adv[local_t, :width]
        mini_old = old_all[local_t, :width] if old_all is not None else None
        acc = GradientAccumulator(mini.num_action_tokens)
        mini_parts = micro_batches(mini, mbs)
        padded += padded_tokens(mini_parts)
        for j, mb in enumerate(mini_parts):
            lo, hi, w = j * mbs, j * mbs + mb.token_ids.shape[0], mb.token_ids.shape[1]
            logprobs = rollout_logprobs(policy.model, mb, temperature)
            if config.async_:
                old = None
            elif mini_old is not None:
                old = mini_old[lo:hi, :w]
            else:
                old = logprobs.detach()
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref = rollout_logprobs(reference, mb, temperature)
            inputs = PolicyLossInputs(
                logprobs=logprobs,
                behaviour_logprobs=mb.behaviour_logprobs,
                advantages=mini_adv[lo:hi, :w],
                action_mask=mb.action_mask,
                ref_logprobs=ref,
                old_logprobs=old,
            )
            acc.backward(grpo_loss(inputs, config.loss))
        step_metrics = acc.metrics("loss/policy")
        step_metrics["policy/grad_norm"] = clip_and_step(
            policy.model, policy.optimizer, policy.scheduler, config.optim.grad_clip
        )
        step_metrics["policy/lr"] = float(policy.scheduler.get_last_lr()[0])
        parts.append(step_metrics)
    metrics.update(_mean_of(parts))
    metrics["grpo/optimizer_steps"] = float(len(chunks))
    metrics["batch/padded_tokens"] = float(padded)
    metrics["batch/real_tokens"] = float(sub.attention_mask.sum())
    return StepResult(policy_updated=True, metrics=metrics)


# ------------------------------------------------------------------------------- group assembly
class GroupAssembler:
    """Buffers stream entries by ``group_id`` and releases only complete groups (asynchronous GRPO).

    A group is complete when ``group_size`` distinct entries of it have arrived. A group is
    dropped whole, never trained partially: when a member is stale on arrival, when a pending
    member becomes stale (``evict_stale``), or when its members lack a ``group_id``. Ids of
    dropped groups are remembered (the newest ``remember`` of them) so late members are dropped too.

    Args:
        group_size: G, rollouts per group (>= 2).
        remember: How many dropped group ids to remember.

    Raises:
        ValueError: ``group_size < 2`` or ``remember < 1``.
    """

    def __init__(self, group_size: int, remember: int = 100_000) -> None:
        if group_size < 2:
            raise ValueError(f"group_size: must be >= 2, got {group_size}")
        if remember < 1:
            raise ValueError(f"remember: must be >= 1, got {remember}")
        self.group_size = group_size
        self._remember = remember
        self._pending: OrderedDict[str, dict[str, QueueEntry]] = OrderedDict()
        self._complete: OrderedDict[str, list[QueueEntry]] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()

    @property
    def complete_groups(self) -> int:
        """Complete groups waiting to be taken."""
        return len(self._complete)

    @property
    def pending_rollouts(self) -> int:
        """Rollouts of incomplete groups held."""
        return sum(len(g) for g in self._pending.values())

    def _forget(self, group_id: str) -> list[QueueEntry]:
        out = list(self._pending.pop(group_id, {}).values()) + self._complete.pop(group_id, [])
        self._dropped[group_id] = None
        while len(self._dropped) > self._remember:
            self._dropped.popitem(last=False)
        return out

    def offer(self, entry: QueueEntry, learner_version: int, max_staleness: int) -> list[QueueEntry]:
        """Add one entry; return the entries to drop now (acknowledge and count them as dropped).

        Returns:
            ``[]`` normally; ``[entry]`` for an entry without ``group_id``, of an already dropped
            group, or beyond ``group_size`` members; the entry and its held siblings when it is
            stale (``learner_version - policy_version > max_staleness``). A re-delivered entry (same
            ``entry_id``) is held once.
        """
        gid = entry.rollout.group_id
        if gid is None:
            log.warning("rollout %s has no group_id; asynchronous GRPO drops it", entry.rollout.rollout_id)
            return [entry]
        if gid in self._dropped:
            return [entry]
        if is_stale(entry.rollout.policy_version, learner_version, max_staleness):
            return [entry, *self._forget(gid)]
        if gid in self._complete:
            known = any(e.entry_id == entry.entry_id for e in self._complete[gid])
            return [] if known else [entry]
        group = self._pending.setdefault(gid, {})
        group[entry.entry_id] = entry
        if len(group) >= self.group_size:
            self._complete[gid] = list(self._pending.pop(gid).values())
        return []

    def drop_reason(self, entry: QueueEntry) -> str:
        """Why ``offer`` or ``evict_stale`` just dropped ``entry``, for the learner's ledger.

        Returns:
            ``no group id``; ``stale group`` (the entry or a member of its group lagged the learner
            by more than ``max_staleness``, now or before); or ``surplus member`` (its group was
            already complete).
        """
        gid = entry.rollout.group_id
        if gid is None:
            return "no group id"
        return "stale group" if gid in self._dropped else "surplus member"

    def evict_stale(self, learner_version: int, max_staleness: int) -> list[QueueEntry]:
        """Drop every held group (pending or complete) with a member that has become stale; return its entries."""
        doomed = [
            gid
            for gid, entries in [*((g, list(e.values())) for g, e in self._pending.items()), *self._complete.items()]
            if any(is_stale(e.rollout.policy_version, learner_version, max_staleness) for e in entries)
        ]
        out: list[QueueEntry] = []
        for gid in doomed:
            out.extend(self._forget(gid))
        return out

    def take(self, num_groups: int) -> list[list[QueueEntry]] | None:
        """The ``num_groups`` oldest complete groups, or None while fewer are complete.

        Raises:
            ValueError: ``num_groups < 1``.
        """
        if num_groups < 1:
            raise ValueError(f"num_groups: must be >= 1, got {num_groups}")
        if len(self._complete) < num_groups:
            return None
        return [self._complete.popitem(last=False)[1] for _ in range(num_groups)]


def collect_groups(
    assembler: GroupAssembler,
    incoming: Sequence[QueueEntry],
    *,
    learner_version: int,
    max_staleness: int,
    num_groups: int,
) -> tuple[list[QueueEntry] | None, list[QueueEntry]]:
    """One pass of the asynchronous learner's read loop: offer entries, evict stale groups, take a batch.

    Args:
        assembler: The learner's group buffer.
        incoming: Entries just read from the stream (or reclaimed).
        learner_version: The learner's policy version.
        max_staleness: tau (policy versions).
        num_groups: Groups per batch (``grpo.prompts_per_step``).

    Returns:
        ``(batch, dropped)``: the batch's entries, group after group (None while fewer than
        ``num_groups`` groups are complete), and the entries to acknowledge as dropped.
    """
    dropped: list[QueueEntry] = []
    for entry in incoming:
        dropped.extend(assembler.offer(entry, learner_version, max_staleness))
    dropped.extend(assembler.evict_stale(learner_version, max_staleness))
    groups = assembler.take(num_groups)
    return ([e for g in groups for e in g] if groups is not None else None), dropped


def async_runtime_config(config: RunConfig) -> RunConfig:
    """The run config the asynchronous runtime (generator processes, SAO learner loop) reads for ``grpo.async``.

    The runtime takes its batch shape and budgets from the ``sao`` section; this copies them from
    ``grpo``: ``sao.steps``, ``sao.batch_size = prompts_per_step * group_size``,
    ``sao.micro_batch_size``, ``sao.max_staleness``, ``sao.optim``, ``sao.checkpoint_every``, and
    ``sao.advantage = batch_norm`` (no critic is built; GRPO's advantages are group-relative).

    Raises:
        ValueError: ``config.technique`` is not ``grpo`` or ``grpo.async`` is false.
    """
    if config.technique != "grpo" or not config.grpo.async_:
        raise ValueError(f"technique/grpo.async: expected grpo with async true, got {config.technique}")
    grpo = config.grpo
    data = config.model_dump(mode="json", by_alias=True)
    data["sao"].update(
        steps=grpo.steps,
        batch_size=grpo.batch_rollouts,
        micro_batch_size=min(grpo.micro_batch_size, grpo.batch_rollouts),
        max_staleness=grpo.max_staleness,
        optim=grpo.optim.model_dump(mode="json"),
        checkpoint_every=grpo.checkpoint_every,
        advantage="batch_norm",
    )
    return type(config).model_validate(data)


# ------------------------------------------------------------------------------ synchronous runner
async def run_group(
    engine: Any,
    tokenizer: Any,
    env: Any,
    task: Any,
    limits: Any,
    *,
    group_size: int,
    seed: int,
    generator_id: str = "sync",
    temperature: float = 1.0,
    top_p: float = 1.0,
    chat: Any = None,
    arrays: bool = False,
    on_turn: Callable[[int], None] | None = None,
) -> list[Rollout]:
    """Run ``group_size`` episodes of one task concurrently; they share a fresh ``group_id``.

    Args:
        engine: ``InferenceEngine``.
        tokenizer: The policy's tokenizer.
        env: ``Environment`` running ``task``.
        task: The prompt.
        limits: ``EpisodeLimits``.
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
    from posttrain.generator.agent_loop import run_episode

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
        posttrain.generator.agent_loop.EpisodeError: an episode could not produce a rollout.
        FloatingPointError: a non-finite gradient norm.
    """
    from tqdm import tqdm

    from posttrain.generator.agent_loop import ChatFormat, EpisodeLimits
    from posttrain.generator.engines.factory import make_engine
    from posttrain.generator.stats import GeneratorStats, MeteredEngine
    from posttrain.learner.checkpoint import (
        LearnerState,
        latest_checkpoint,
        load_checkpoint_state,
        save_checkpoint,
    )
    from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
    from posttrain.learner.model import load_policy, load_tokenizer
    from posttrain.learner.optim import build_optimizer
    from posttrain.learner.sao_loop import LearnerSummary
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
