"""The SAO learner process: consume rollouts as they arrive, train, publish weights, checkpoint, ack.

Run one with ``posttrain learner CONFIG`` (``REDIS_URL`` must point at the run's Redis); it
resumes from the newest checkpoint in ``<run>/checkpoints`` if there is one. The loop fits on a
screen:

1. read entries until ``sao.batch_size`` fresh rollouts are buffered; a rollout whose oldest
   policy version lags the learner by more than ``max_staleness`` is dropped, counted and acked;
2. one learner iteration (``sao_train_step``): critic values, skip-observation GAE, K critic
   updates, DIS policy update (after the critic-only warm-up, whose batches give their admission
   slots back: they make no policy version);
3. after a policy update: bump the policy version, publish weights to the weight store, set the
   version key (which also refills generators' admission capacity);
4. every ``checkpoint_every`` policy versions (and at the end): checkpoint, then XACK every entry
   the checkpoint covers.

Every iteration appends a line to ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``):
the entries and rollouts it trained on and the rollouts dropped while its batch was assembled.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import redis
import torch
from tqdm import tqdm

from posttrain.advantages import RunningMeanBaseline
from posttrain.config import RunConfig
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.checkpoint import (
    LearnerState,
    latest_checkpoint,
    load_checkpoint_state,
    save_checkpoint,
)
from posttrain.learner.critic import CriticModel
from posttrain.learner.groups import GroupAssembler, collect_groups
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.ledger import LEDGER_NAME, append_ledger, ledger_line
from posttrain.learner.optim import build_optimizer
from posttrain.learner.remote_checkpoint import fetch_checkpoint, mirror_checkpoint
from posttrain.learner.sao_step import sao_train_step
from posttrain.learner.types import LearnerSummary, Trainable
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.records import Rollout
from posttrain.rollout.admission import RedisAdmissionController, StalenessStats, is_stale
from posttrain.rollout.queue import QueueEntry
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue
from posttrain.runtime import RunContext
from posttrain.tracking import MetricsSink
from posttrain.weight_sync.announce import announce_weights
from posttrain.weight_sync.factory import open_weight_store, upload_final_model

log = logging.getLogger("posttrain.learner")





def _generator_metrics(client: redis.Redis, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    raw = client.hgetall(key)
    busy = []
    for gid, blob in raw.items():
        stats = json.loads(blob)
        name = gid.decode() if isinstance(gid, bytes) else str(gid)
        for k in ("busy_fraction", "rollouts_per_s", "tokens_per_s", "max_in_flight", "rejected", "failed",
                  "stale_aborted", "mean_batch_rows"):
            out[f"generator/{name}/{k}"] = float(stats.get(k, 0.0))
        busy.append(float(stats.get("busy_fraction", 0.0)))
    if busy:
        out["generator/busy_fraction_mean"] = sum(busy) / len(busy)
    return out


def run_sao_learner(
    config: RunConfig,
    redis_url: str,
    *,
    start_model_dir: Path,
    sink: MetricsSink | None = None,
    progress: bool = True,
    max_iterations: int | None = None,
) -> LearnerSummary:
    """Train until ``config.sao.steps`` policy versions are published.

    Args:
        config: Run config (``sao`` section).
        redis_url: The run's Redis.
        start_model_dir: Policy to start from when there is no checkpoint (the SFT warm start).
        sink: Receives ``(metrics, policy_version)`` after each iteration (MLflow, JSONL).
        progress: Show a progress bar.
        max_iterations: Stop after this many iterations in this process (used to simulate a
            learner that dies mid-run in tests); None runs to completion.

    Returns:
        ``LearnerSummary``.

    Raises:
        posttrain.rollout.queue.QueueConnectionError: Redis unreachable after bounded retries.
    """
    ctx = RunContext(config)
    sao = config.sao
    torch.manual_seed(config.seed)
    client = redis.Redis.from_url(redis_url)
    # arrays=True: rollouts arrive as read-only numpy views of the payload; collation copies them
    # into tensors without a per-token Python loop (see bench/stream.py).
    queue = RedisStreamQueue(client, ctx.keys, consumer="learner-0", maxlen=config.queue.maxlen, arrays=True)
    versions = RedisPolicyVersionStore(client, ctx.keys)
    admission = RedisAdmissionController(client, ctx.keys, batch_size=sao.batch_size, max_staleness=sao.max_staleness)
    store = open_weight_store(ctx)
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    ckpt = latest_checkpoint(ctx.checkpoints_dir)
    if ckpt is None and config.checkpoints_uri:  # a restarted learner pod has a new, empty disk
        ckpt = fetch_checkpoint(config.checkpoints_uri, ctx.checkpoints_dir)
    policy_model = load_policy(ckpt / "policy" if ckpt else start_model_dir)
    p_opt, p_sched = build_optimizer(policy_model, sao.optim, sao.steps)
    policy = Trainable(policy_model, p_opt, p_sched)
    critic: Trainable | None = None
    if sao.advantage == "gae":
        critic_model = CriticModel.from_policy_path(start_model_dir)
        c_opt, c_sched = build_optimizer(
            critic_model, sao.optim.model_copy(update={"lr": sao.critic.lr}), sao.steps + sao.critic.warmup_steps
        )
        critic = Trainable(critic_model, c_opt, c_sched)
    optimizers = {"policy_opt": p_opt, "policy_sched": p_sched}
    # Asynchronous GRPO ("GRPO + DIS"): whole groups, group-relative advantages, no critic.
    grpo = config.grpo if config.technique == "grpo" else None
    assembler = GroupAssembler(grpo.group_size) if grpo is not None else None
    reference = load_policy(start_model_dir).eval() if grpo is not None and grpo.loss.kl_coef > 0 else None
    if critic is not None:
        optimizers.update(critic_opt=critic.optimizer, critic_sched=critic.scheduler)

    state = LearnerState()
    # After a restart, versions the dead learner published past its checkpoint are replaced (past
    # v0 when it died before its first checkpoint).
    latest = store.latest_version()
    resumed = ckpt is not None or (latest is not None and latest > 0)
    if ckpt is not None:
        state = load_checkpoint_state(ckpt, critic=critic.model if critic else None, optimizers=optimizers)
        # Entries the checkpoint already covers: acknowledge them now, never train on them again.
        already = set(state.consumed_entry_ids)
        if already:
            queue.ack(sorted(already))
        state.consumed_entry_ids = []
        log.info("learner resumed from %s at policy version %d", ckpt.name, state.policy_version)
    if resumed or latest is None:
        # (Re)publish the weights the learner starts from. After a restart, generators may serve
        # weights the dead learner published after its last checkpoint; they reload these.
        store.publish(policy_model.state_dict(), state.policy_version, start_model_dir, overwrite=resumed)
    versions.set(state.policy_version)
    announce_weights(client, ctx.keys, state.policy_version)  # generators wake now instead of at their timeout
    baseline = RunningMeanBaseline(sao.running_mean_window) if sao.advantage == "running_mean" else None
    if baseline is not None and state.baseline_rewards:
        baseline.load_state_dict({"window": sao.running_mean_window, "rewards": state.baseline_rewards})
    staleness = StalenessStats(sao.max_staleness)
    counters = {"rollouts_trained": 0.0, "stale_dropped": 0.0, **state.counters}

    def checkpoint() -> None:
        if baseline is not None:
            state.baseline_rewards = [float(r) for r in baseline.state_dict()["rewards"]]  # type: ignore[union-attr]
        state.counters = dict(counters)
        saved = save_checkpoint(
            ctx.checkpoints_dir, state=state, policy=policy.model, tokenizer=tokenizer,
            critic=critic.model if critic else None, optimizers=optimizers,
            resolved_config_yaml=ctx.resolved_config_yaml(),
        )
        if config.checkpoints_uri:  # durable where a restarted pod looks, before acknowledging
            mirror_checkpoint(saved, config.checkpoints_uri)
        queue.ack(state.consumed_entry_ids)
        state.consumed_entry_ids = []

    # The ledger records what each iteration trained on and dropped (posttrain.learner.ledger).
    ledger = ctx.run_dir / LEDGER_NAME
    buffer: list[QueueEntry] = []
    dropped_here: list[tuple[Rollout, str]] = []  # dropped since the last ledger line
    done_here = 0
    bar = tqdm(total=sao.steps, initial=state.policy_version, desc="sao", disable=not progress, leave=False)
    t_start = time.monotonic()
    while state.policy_version < sao.steps:
        if max_iterations is not None and done_here >= max_iterations:
            break
        if assembler is not None and grpo is not None:
            arrived = queue.claim_stale(config.queue.claim_idle_ms)
            arrived += queue.get_batch(sao.batch_size, timeout_s=config.queue.block_ms / 1000)
            ready, dropped = collect_groups(assembler, arrived, learner_version=state.policy_version,
                                            max_staleness=sao.max_staleness, num_groups=grpo.prompts_per_step)
            if dropped:  # whole groups: stale, or members without a group id
                staleness.record_dropped(len(dropped))
                counters["stale_dropped"] += len(dropped)
                dropped_here.extend((e.rollout, assembler.drop_reason(e)) for e in dropped)
                queue.ack([e.entry_id for e in dropped])
                admission.refund(len(dropped))
            if ready is None:
                continue
            entries = ready
        else:
            need = sao.batch_size - len(buffer)
            if need > 0:
                arrived = queue.claim_stale(config.queue.claim_idle_ms)
                if len(arrived) < need:
                    arrived += queue.get_batch(need - len(arrived), timeout_s=config.queue.block_ms / 1000)
                for entry in arrived:
                    if is_stale(entry.rollout.policy_version, state.policy_version, sao.max_staleness):
                        # A deliberate drop: counted, acknowledged, and its admission slot given back.
                        staleness.record_dropped()
                        counters["stale_dropped"] += 1
                        dropped_here.append((entry.rollout, "stale"))
                        queue.ack([entry.entry_id])
                        admission.refund(1)
                        continue
                    buffer.append(entry)
            if len(buffer) < sao.batch_size:
                continue
            entries, buffer = buffer[: sao.batch_size], buffer[sao.batch_size :]
        for e in entries:
            staleness.observe(e.rollout.policy_version, state.policy_version)
        batch = collate_rollouts([e.rollout for e in entries], pad_id)
        t0 = time.monotonic()
        if grpo is not None:
            result = grpo_train_step(
                policy=policy, batch=batch, group_ids=[str(e.rollout.group_id) for e in entries], config=grpo,
                reference=reference, temperature=config.generator.temperature,
            )
            trained = int(result.metrics["grpo/rollouts_kept"])  # uniform groups train nothing
        else:
            result = sao_train_step(
                policy=policy, critic=critic, batch=batch, config=sao, iteration=state.iteration, baseline=baseline
            )
            trained = len(entries) if result.policy_updated else 0  # a critic-only warm-up makes no version
        if trained < len(entries):
            # Rollouts that made no policy version give their admission places back. Admission counts
            # capacity in versions ((v + tau + 1) * B): without the refund each such batch shrank the
            # generators' lookahead for the whole run, and an SAO warm-up longer than tau + 1 iterations
            # (the defaults: 10 and 5) left no capacity at all, a hang at version 0. Rollouts admitted
            # afterwards are still trained within tau versions (iterations and versions move together).
            admission.refund(len(entries) - trained)
        step_s = time.monotonic() - t0
        state.iteration += 1
        done_here += 1
        state.consumed_entry_ids.extend(e.entry_id for e in entries)
        append_ledger(ledger, ledger_line(state.iteration, state.policy_version + int(result.policy_updated),
                                          [e.rollout for e in entries], [e.entry_id for e in entries], dropped_here))
        dropped_here = []
        counters["rollouts_trained"] += len(entries)
        counters["action_tokens_trained"] = counters.get("action_tokens_trained", 0.0) + float(
            result.metrics.get("grpo/action_tokens_kept", batch.num_action_tokens)
        )
        if result.policy_updated:
            state.policy_version += 1
            store.publish(policy.model.state_dict(), state.policy_version, start_model_dir, overwrite=resumed)
            versions.set(state.policy_version)
            announce_weights(client, ctx.keys, state.policy_version)
            bar.update(1)
        metrics = dict(result.metrics)
        metrics.update(staleness.as_metrics())
        metrics.update(_generator_metrics(client, ctx.keys.generator_stats))
        elapsed = max(time.monotonic() - t_start, 1e-9)
        metrics.update({
            "learner/step_s": step_s,
            "learner/iteration": float(state.iteration),
            "throughput/rollouts_per_s": counters["rollouts_trained"] / elapsed,
            "throughput/action_tokens_per_s": batch.num_action_tokens / max(step_s, 1e-9),
            "throughput/trained_action_tokens_per_s": counters["action_tokens_trained"] / elapsed,
            "queue/dead_letters": float(queue.dead_letter_count()),
            "queue/length": float(queue.length()),
            "rollouts/correct_mean": sum(e.rollout.metrics.get("correct", 0.0) for e in entries) / len(entries),
        })
        if sink is not None:
            sink(metrics, state.policy_version)
        if result.policy_updated and (
            state.policy_version % sao.checkpoint_every == 0 or state.policy_version >= sao.steps
        ):
            checkpoint()
    bar.close()
    if state.consumed_entry_ids:
        checkpoint()
    counters["dead_letters"] = float(queue.dead_letter_count())
    final_dir = ctx.final_model_dir
    if state.policy_version >= sao.steps:
        policy.model.save_pretrained(str(final_dir), safe_serialization=True)
        tokenizer.save_pretrained(str(final_dir))
        (final_dir / "resolved_config.yaml").write_text(ctx.resolved_config_yaml(), encoding="utf-8")
        uploaded = upload_final_model(config, final_dir)  # cluster mode: the pod's disk goes away
        if uploaded:
            log.info("final model uploaded to %s", uploaded)
    return LearnerSummary(state.policy_version, state.iteration, final_dir, counters)
