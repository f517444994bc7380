"""SAO against synchronous GRPO (G = 4, 8) and asynchronous GRPO + DIS on a long-tailed multi-turn workload.

Same tiny model (SFT warm start shared by every method), same environment
(``synthetic_longtail``: log-normal number of required tool calls per task, real token
generation by the engine, real turns), same number of engines, same rollouts per learner step,
same learning rate.

Two settings:

* **tool latency** (``--tool-latency-median-s > 0``, the setting the issue's targets are judged
  on): every tool call costs a log-normal wall-time delay spent in the environment's async
  ``step`` (``asyncio.sleep``: sandbox start-up, test runs; wall time, no accelerator time),
  seeded per task so every method waits the same seconds for the same task. Episodes are then
  long-tailed in *wall time*, as real agentic rollouts are, and a synchronous batch waits for
  its slowest group while the engine idles;
* **compute-bound** (``--tool-latency-median-s 0``): tool calls are instantaneous, so wall time
  is token generation and training, which on a 2-core CPU share the same cores: overlapping
  them buys nothing there, and this setting measures mostly that.

The results file keeps one result per setting: the tool-latency run at the top level (what the
targets table reads), the compute-bound run under ``compute_bound``; a run replaces only its own. Each method runs ``--steps`` policy versions through the product code path:

* ``sao``: ``posttrain.runners.sao.train_sao`` (embedded Redis, ``--generators`` generator processes,
  the SAO learner with critic and DIS);
* ``grpo_sync_g4`` / ``grpo_sync_g8``: ``posttrain.runners.grpo_sync.run_grpo_sync`` (one engine in the
  learner's process: generate a whole batch, wait for the slowest episode, train, reload);
* ``grpo_async_g8``: ``train_sao`` on the ``grpo`` section (groups of G share a ``group_id``,
  DIS mask, staleness bound).

Measured per method (from the learner's metrics sink and the generators' stats):

* ``busy_fraction``: share of the generators' wall time during which the engine was generating
  for at least one request (the ``hf`` engine's own clock: time its thread spends in batches;
  ``posttrain.inference.metering``), mean over generators; waiting for tools, tickets or a queued
  batch is not busy;
* ``trained_action_tokens_per_s``: action tokens that received a policy gradient (GRPO: kept
  groups only) per second, in the steady window from the first to the last policy update;
* ``rollouts_per_s``: rollouts the learner consumed per second in the same window;
* ``time_to_target_s``: seconds from the method's start (services and engines included) to the
  first weight snapshot whose held-out reward reaches the target. Snapshots are taken every
  ``--eval-every`` versions and evaluated after all methods finished (``evaluate_policy``,
  the same held-out tasks and sampling seeds for every snapshot).

The run also records what ``bench/simulate.py`` needs: a trace of episode lengths of the
warm-started policy (turns, action and observation tokens per turn), the ``hf`` engine's batch
timings at 1 thread, the weight publish + reload cost, each method's learner step times, and an
``engine_probe`` (a fixed set of engine batches, timed) before and after every method run and
around the engine-mode measurement, because the shared machine's speed moves between hours.

Writes ``bench/results/async_vs_sync.json`` (with ``busy_fraction`` per method and
``throughput_ratio_sao_over_grpo_sync``: SAO over the *faster* synchronous GRPO variant) and the
``async_vs_sync`` section of docs/benchmarks.md.

Threads: this process (learner, in-process engine) uses ``--torch-threads`` (default 1) and every
generator process uses 1 (``posttrain.generator.worker``): on 2 shared cores one thread per role
was about twice as fast as two for the synchronous baseline too.

Run: ``.venv/bin/python -m bench.async_vs_sync --steps 12 --eval-every 4`` (the tool-latency
setting at tau 8 and 512 episode slots, 31 minutes measured on 2 shared cores: synchronous GRPO
spends most of it waiting for each batch's slowest group; plus 8 minutes of SFT warm start the
first time, cached under ``--work-dir``), the compute-bound setting with
``.venv/bin/python -m bench.async_vs_sync --tool-latency-median-s 0 --episodes-in-flight 64 --max-staleness 4 --steps 12 --eval-every 4``
(10 minutes),
or a smoke run:
``.venv/bin/python -m bench.async_vs_sync --steps 2 --eval-every 2 --methods sao grpo_sync_g4``.
``--engine-modes-only`` re-measures only the engine's lockstep-versus-continuous feeding; ``--trace-only``
re-collects only the trace (for ``bench.simulate``).

Capacity sweep: ``--capacity-sweep TAU:SLOTS ...`` runs only SAO (``--repeats`` runs per point) at
each staleness bound and number of episode slots, on the stored setting's other arguments, and
stores it with that setting (``capacity_sweep``): how SAO's busy fraction depends on its admission
capacity ``(tau + 1) x B`` when episodes wait seconds on tools. Include the setting's own point
(``8:512``) to compare within the same hour; ``TAU:SLOTS:keep`` lets stale episodes finish (``--keep-stale-episodes``).

Episodes: every run reads the episodes it produced from its learner's ledger (``run_episodes``:
lengths per turn, reward, tool waits, in the order it started them) and counts them
(``episodes_recorded``); a synchronous GRPO run stores them (``episodes``), and ``bench.simulate``
replays them so that its check against the run differs from it in timing only (an asynchronous
run's record lacks the episodes still in flight when it stopped, so it is not replayed).

Repeats: on a shared CPU one run's busy fraction moved between 0.86 and 0.96. ``--repeats K`` runs
each method (or each of ``--repeat-methods``) K times, with run seeds ``--seed`` ... ``--seed + K -
1``; the headline numbers and the ratio are then means over the runs and the table shows each mean
with the range of the runs (held-out evaluation stays the first run's). ``--repeats-only`` adds
runs to a stored setting until each method has K. A run of some methods with the same arguments
as the stored setting keeps the setting's other methods (``with_carried_methods``), so one method
can be measured again after a change to its path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    ENGINE_MODES,
    GROUP_FEED_SIZE,
    REPO,
    command_line,
    machine_info,
    machine_line,
    markdown_table,
    method_kind,
    point_label,
    publish_result,
    settings_of,
    stored_settings,
    update_docs_section,
    write_result,
)

ENV = "synthetic_longtail"
"""The long-tailed environment every method runs."""

METHODS = ("sao", "grpo_sync_g4", "grpo_sync_g8", "grpo_async_g8")
"""Method names: ``sao``, ``grpo_sync_g<G>``, ``grpo_async_g<G>``."""

log = logging.getLogger("bench.async_vs_sync")


# ---------------------------------------------------------------------------------- configuration
def base_config(args: argparse.Namespace, work: Path, run_name: str) -> dict[str, Any]:
    """The run-config dict every method shares (model, data, generator limits, eval).

    ``generator.max_turns`` is ``max_calls + 2`` so every task is solvable; the episode token
    budget is ``--max-episode-tokens``.
    """
    return {
        "run_name": run_name,
        "output_dir": str(work / "runs"),
        "seed": args.seed,
        "model": {"tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                           "intermediate_size": 384, "vocab_size": 2048, "max_position_embeddings": 1024}},
        "data": {"env": ENV, "train_path": str(work / "tasks" / "train.jsonl"),
                 "eval_path": str(work / "tasks" / "eval.jsonl"),
                 "num_train_tasks": args.train_tasks, "num_eval_tasks": args.eval_tasks},
        "warm_start": {"steps": args.sft_steps, "batch_size": 16, "max_seq_len": args.max_episode_tokens,
                       "optim": {"lr": 3.0e-3, "warmup_steps": 10, "schedule": "cosine"}},
        "generator": {"engine": args.engine, "num_processes": args.generators,
                      "episodes_in_flight": args.episodes_in_flight, "max_new_tokens": args.max_new_tokens,
                      "max_turns": args.max_calls + 2, "max_episode_tokens": args.max_episode_tokens,
                      "episode_timeout_s": 600.0, "admission_lease_s": 1200.0,
                      "abort_stale_episodes": not getattr(args, "keep_stale_episodes", False)},
        "eval": {"num_tasks": args.eval_tasks, "samples_per_task": args.eval_samples},
        "tracking": {"experiment": "bench-async-vs-sync"},
    }


def tool_latency_args(args: argparse.Namespace) -> dict[str, Any]:
    """``data.env_args`` of the methods' environment: the tool-latency settings, or {} when latency is off.

    Only the training runs get them: the shared warm start, the held-out evaluation and the
    trace use the instantaneous environment (same tasks, same rewards), so they stay cached and fast.
    """
    if args.tool_latency_median_s <= 0:
        return {}
    return {"tool_latency_median_s": args.tool_latency_median_s, "tool_latency_sigma": args.tool_latency_sigma,
            "tool_latency_max_s": args.tool_latency_max_s, "tool_latency_seed": args.seed}


def setting_label(args: argparse.Namespace) -> str:
    """``tool_latency`` when tool calls cost wall time, else ``compute_bound`` (module docstring)."""
    return "tool_latency" if args.tool_latency_median_s > 0 else "compute_bound"


def method_config(args: argparse.Namespace, work: Path, method: str) -> dict[str, Any]:
    """The run-config dict of one method (see the module docstring for the methods).

    Raises:
        ValueError: an unknown method name, or a group size that does not divide ``--batch-rollouts``.
    """
    cfg = base_config(args, work, method)
    cfg["data"]["env_args"] = tool_latency_args(args)
    optim = {"lr": args.lr, "grad_clip": 1.0}
    batch = args.batch_rollouts
    if method == "sao":
        cfg["technique"] = "sao"
        cfg["sao"] = {"steps": args.steps, "batch_size": batch, "micro_batch_size": args.micro_batch_size,
                      "max_staleness": args.max_staleness, "checkpoint_every": args.steps, "optim": optim,
                      "critic": {"lr": 1.0e-3, "warmup_steps": args.critic_warmup, "updates_per_step": 2}}
        return cfg
    kind, _, g = method.rpartition("_g")
    if kind not in ("grpo_sync", "grpo_async") or not g.isdigit():
        raise ValueError(f"--methods: unknown method {method!r}; expected sao, grpo_sync_g<G> or grpo_async_g<G>")
    group = int(g)
    if batch % group:
        raise ValueError(f"--batch-rollouts ({batch}) must be a multiple of the group size of {method} ({group})")
    cfg["technique"] = "grpo"
    cfg["grpo"] = {"steps": args.steps, "prompts_per_step": batch // group, "group_size": group,
                   "micro_batch_size": args.micro_batch_size, "mini_batches": 1, "drop_uniform_groups": True,
                   "checkpoint_every": args.steps, "optim": optim}
    if kind == "grpo_async":
        cfg["grpo"].update({"async": True, "max_staleness": args.max_staleness,
                            "loss": {"dis_mask": True, "mask_eps_low": 0.3, "mask_eps_high": 5.0}})
    return cfg


def validated(cfg: dict[str, Any]) -> Any:
    """``RunConfig`` of a config dict."""
    from posttrain.config import RunConfig

    return RunConfig.model_validate(cfg)


# -------------------------------------------------------------------------------------- setting up
def write_tasks(args: argparse.Namespace, work: Path, expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate the train and held-out task files; return the distribution of required calls.

    Raises:
        ValueError: ``expect`` (a stored result's ``task_calls``) is given and the generated tasks'
            distribution differs; nothing is written.
    """
    from posttrain.envs.synthetic.longtail import SyntheticLongTailEnv, summarise_calls

    env = SyntheticLongTailEnv(calls_median=args.calls_median, calls_sigma=args.calls_sigma,
                               max_calls=args.max_calls)
    splits = {split: env.tasks(split, n, seed=args.seed) for split, n in (("train", args.train_tasks),
                                                                         ("eval", args.eval_tasks))}
    out = {split: summarise_calls(tasks) for split, tasks in splits.items()}
    if expect is not None and expect != out:
        raise ValueError(f"tasks generated from these arguments have required calls {out}, the stored result's are "
                         f"{expect}: pass the run's --calls-median, --calls-sigma, --max-calls, --train-tasks, "
                         "--eval-tasks and --seed (its settings in the results file)")
    for split, tasks in splits.items():
        path = work / "tasks" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as f:
            for t in tasks:
                f.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "reference": t.reference,
                                    "metadata": t.metadata}) + "\n")
    return out


def prepare_shared(args: argparse.Namespace, work: Path) -> tuple[Any, Path, float]:
    """Tokenizer, base model and SFT warm start, shared by every method (cached in ``work``).

    Returns:
        ``(base RunContext, SFT model directory, seconds spent)``.
    """
    from posttrain.runners.common import prepare, warm_start
    from posttrain.runtime import RunContext

    ctx = RunContext(validated(base_config(args, work, "base")))
    t0 = time.monotonic()
    prepare(ctx)
    sft = warm_start(ctx)
    for f in ctx.tokenizer_dir.iterdir():  # snapshots and evaluation load the tokenizer beside the weights
        if not (sft / f.name).exists():
            shutil.copy2(f, sft / f.name)
    return ctx, sft, time.monotonic() - t0


def fresh_run_dir(ctx: Any, base: Any) -> None:
    """Empty ``ctx.run_dir`` and give it the shared tokenizer."""
    if ctx.run_dir.exists():
        shutil.rmtree(ctx.run_dir)
    ctx.run_dir.mkdir(parents=True)
    shutil.copytree(base.tokenizer_dir, ctx.tokenizer_dir)


# ------------------------------------------------------------------------------ measuring a method
@dataclass
class StepRecord:
    """One learner iteration as seen by the metrics sink.

    Attributes:
        t: Seconds since the method started.
        policy_version: Version after the iteration.
        updated: Whether the policy was updated (a new version).
        rollouts: Rollouts the iteration consumed.
        trained_action_tokens: Action tokens that received a policy gradient.
        action_tokens: Action tokens the iteration's rollouts hold (generated, trained or not).
        step_s: Learner compute time of the iteration (seconds).
        reward_mean: Mean training reward of the batch.
    """

    t: float
    policy_version: int
    updated: bool
    rollouts: float
    trained_action_tokens: float
    action_tokens: float
    step_s: float
    reward_mean: float


@dataclass
class MethodRun:
    """What one method's run produced (before held-out evaluation)."""

    method: str
    wall_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    snapshots: dict[int, tuple[float, Path]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    batch_gen_s: list[float] = field(default_factory=list)
    load_avg: list[float] = field(default_factory=list)
    """1-minute load average at the start and at the end of the method's run (shared machine)."""
    when: str = ""
    """UTC time (ISO 8601) the run ended."""
    engine_probe: list[dict[str, Any]] = field(default_factory=list)
    """``engine_probe`` just before and just after the run: the engine's speed in that hour."""
    episodes: list[list[Any]] = field(default_factory=list)
    """Every episode the run produced, in replay order (``run_episodes``)."""
    episode_wait_mismatches: int = 0
    """Episodes whose per-turn tool waits do not add up to what the environment reported (``run_episodes``)."""


def make_sink(run: MethodRun, ctx: Any, t0: float, batch_rollouts: int, eval_every: int, total: int,
              snap_dir: Path) -> Callable[[dict[str, float], int], None]:
    """A metrics sink recording ``StepRecord`` s and copying every ``eval_every``-th version's weights."""
    from posttrain.weight_sync.store import FilesystemWeightStore

    store = FilesystemWeightStore(ctx.weights_dir)
    last = {"version": 0}

    def sink(metrics: dict[str, float], version: int) -> None:
        now = time.monotonic() - t0
        updated = version > last["version"]
        last["version"] = version
        generated = metrics.get("response/action_tokens_mean", 0.0) * batch_rollouts
        # GRPO: only kept (non-uniform) groups get a gradient; SAO trains the whole batch.
        tokens = metrics.get("grpo/action_tokens_kept", generated)
        run.steps.append(StepRecord(now, version, updated, float(batch_rollouts), tokens if updated else 0.0,
                                    generated, metrics.get("learner/step_s", 0.0), metrics.get("reward/mean", 0.0)))
        if "generator/batch_s" in metrics:
            run.batch_gen_s.append(metrics["generator/batch_s"])
        if updated and (version % eval_every == 0 or version == total):
            dst = snap_dir / f"v{version:06d}"
            shutil.copytree(store.path_for(version), dst, dirs_exist_ok=True)
            run.snapshots[version] = (now, dst)

    return sink


def run_method(config_dict: dict[str, Any], method: str, base: Any, sft: Path, snap_dir: Path,
               eval_every: int) -> MethodRun:
    """Train one method from the shared warm start through the product code path (module docstring).

    Args:
        config_dict: The method's run config (``method_config``); ``technique`` picks the runner,
            ``grpo.async`` the asynchronous GRPO runtime.
        method: Name recorded in the results.
        base: The shared ``RunContext`` (its tokenizer is copied into the method's run directory).
        sft: The warm-started model every method starts from.
        snap_dir: Where weight snapshots go (emptied first).
        eval_every: Snapshot every this many policy versions (and the last).

    Returns:
        The ``MethodRun`` (step records, snapshots, counters, wall time, the episodes of its ledger).
    """
    from posttrain.runners.grpo_sync import run_grpo_sync
    from posttrain.runners.sao import train_sao
    from posttrain.runtime import RunContext

    config = validated(config_dict)
    ctx = RunContext(config)
    fresh_run_dir(ctx, base)
    ctx.save_resolved_config()
    run = MethodRun(method)
    if snap_dir.exists():
        shutil.rmtree(snap_dir)
    snap_dir.mkdir(parents=True)
    grpo = config.technique == "grpo"
    steps = config.grpo.steps if grpo else config.sao.steps
    batch = config.grpo.batch_rollouts if grpo else config.sao.batch_size
    run.engine_probe.append(engine_probe(sft, config.generator.max_new_tokens))
    run.load_avg.append(os.getloadavg()[0])
    t0 = time.monotonic()
    sink = make_sink(run, ctx, t0, batch, eval_every, steps, snap_dir)
    print(f"[{method}] {steps} policy versions of {batch} rollouts", flush=True)
    if grpo and not config.grpo.async_:
        summary = run_grpo_sync(config, start_model_dir=sft, sink=sink, progress=False)
    else:
        summary = train_sao(ctx, sft, sink)
    run.wall_s = time.monotonic() - t0
    run.load_avg.append(os.getloadavg()[0])
    run.when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run.counters = dict(summary.counters)
    run.engine_probe.append(engine_probe(sft, config.generator.max_new_tokens))
    run.episodes, run.episode_wait_mismatches = run_episodes(ctx, method)
    last = [s for s in run.steps if s.updated]
    if last and last[-1].policy_version not in run.snapshots:
        # Fewer versions than iterations (GRPO skips a batch of uniform groups): keep the last one too.
        from posttrain.weight_sync.store import FilesystemWeightStore

        version = last[-1].policy_version
        dst = snap_dir / f"v{version:06d}"
        shutil.copytree(FilesystemWeightStore(ctx.weights_dir).path_for(version), dst, dirs_exist_ok=True)
        run.snapshots[version] = (last[-1].t, dst)
    return run


def steady_window(steps: Sequence[StepRecord]) -> dict[str, float]:
    """Throughput between the first and the last policy update (start-up and warm-up excluded).

    Tokens and rollouts of the iterations after the first update, over the time between the two
    updates. Returns zeros when fewer than two updates happened.
    """
    updates = [i for i, s in enumerate(steps) if s.updated]
    if len(updates) < 2:
        return {"window_s": 0.0, "trained_action_tokens_per_s": 0.0, "action_tokens_per_s": 0.0, "rollouts_per_s": 0.0,
                "updates": float(len(updates))}
    first, last = updates[0], updates[-1]
    window = steps[last].t - steps[first].t
    inside = steps[first + 1 : last + 1]
    tokens = sum(s.trained_action_tokens for s in inside)
    rollouts = sum(s.rollouts for s in inside)
    return {
        "window_s": window,
        "trained_action_tokens_per_s": tokens / window,
        "action_tokens_per_s": sum(s.action_tokens for s in inside) / window,
        "rollouts_per_s": rollouts / window,
        "updates": float(len(updates)),
    }


# ---------------------------------------------------------------------------------- evaluation
def evaluate_snapshots(base: Any, sft: Path, runs: list[MethodRun]) -> tuple[float, dict[str, dict[int, float]]]:
    """Held-out reward of the warm start and of every snapshot (same tasks and seeds for all).

    Returns:
        ``(warm-start reward, {method: {policy_version: reward}})``.
    """
    from posttrain.eval.heldout import evaluate_policy

    start = evaluate_policy(base, sft, engine_kind="hf")["reward_mean"]
    out: dict[str, dict[int, float]] = {}
    for run in runs:
        out[run.method] = {}
        for version, (_, path) in sorted(run.snapshots.items()):
            for f in base.tokenizer_dir.iterdir():
                if not (path / f.name).exists():
                    shutil.copy2(f, path / f.name)
            out[run.method][version] = evaluate_policy(base, path, engine_kind="hf")["reward_mean"]
            print(f"  eval reward {run.method} v{version}: {out[run.method][version]:.3f}", flush=True)
    return start, out


def time_to_target(run: MethodRun, rewards: dict[int, float], target: float) -> float | None:
    """Seconds to the first snapshot whose held-out reward reaches ``target``; None if none did."""
    for version in sorted(rewards):
        if rewards[version] >= target:
            return run.snapshots[version][0]
    return None


# ------------------------------------------------------------------------ traces and calibration
def rollout_shape(rollout: Any) -> dict[str, Any]:
    """Lengths of one rollout: prompt tokens, action tokens per turn, observation tokens after each turn.

    ``posttrain.learner.ledger.turn_lengths`` of its ``action_mask``, with its reward and finish reason.
    """
    from posttrain.learner.ledger import turn_lengths

    prompt, actions, observations = turn_lengths(rollout.action_mask)
    return {"prompt_tokens": prompt, "action_tokens": actions, "observation_tokens": observations,
            "reward": rollout.reward, "finish_reason": rollout.finish_reason}


def run_episodes(ctx: Any, method: str) -> tuple[list[list[Any]], int]:
    """Every episode a method's run produced, in the order the simulator replays them, from its ledger.

    Read from ``<run>/learner_ledger.jsonl`` (``posttrain.learner.ledger``): the rollouts each
    iteration trained on and those dropped on the way. Order: SAO, every rollout by its start
    time; asynchronous GRPO, whole groups by their first member's start; synchronous GRPO, the
    batches in iteration order, each group's members together. Episodes still running or
    queued when the run ended are not in the ledger.

    Each episode is ``[unit, prompt_tokens, action_tokens, observation_tokens, reward,
    tool_waits_s]``: ``unit`` numbers the group (SAO: the episode) in replay order; the lengths are
    tokens per turn; ``tool_waits_s`` is the environment's tool latency after each turn but the
    last (``call_latency_s`` of the task, one call per turn for the first ``tool_calls`` turns;
    seconds, to 10 ms).

    Returns:
        ``(episodes, mismatched)``: ``mismatched`` counts episodes whose waits do not add up to
        the ``tool_wait_s`` the environment reported (a turn that made more or less than one call).

    Raises:
        FileNotFoundError: the run wrote no ledger.
        ValueError: a malformed ledger line (file and line), or a rollout of a task the run's
            task file does not have.
    """
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger

    lines = read_ledger(ctx.run_dir / LEDGER_NAME)
    rollouts = [r for line in lines for r in line["rollouts"] + line.get("dropped", [])]
    kind = method_kind(method)
    if kind == "sao":
        units = [[r] for r in sorted(rollouts, key=lambda r: r["started_at"])]
    else:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rollouts:
            groups.setdefault(str(r["group_id"]), []).append(r)
        units = list(groups.values())  # ledger order: batch after batch, a group's members together
        if kind == "grpo_async":
            units.sort(key=lambda g: min(r["started_at"] for r in g))
    env = ctx.environment()
    tasks = {t.task_id: t for t in ctx.tasks("train")}
    episodes, mismatched = [], 0
    for unit, members in enumerate(units):
        for r in sorted(members, key=lambda r: r["started_at"]):
            task = tasks.get(r["task_id"])
            if task is None:
                raise ValueError(f"{ctx.run_dir / LEDGER_NAME}: rollout {r['rollout_id']} ran task {r['task_id']!r}, "
                                 "which the run's train task file does not have")
            calls = int(r["metrics"].get("tool_calls", 0))
            turns = len(r["action_tokens"])
            waits = [env.call_latency_s(task, k) if k < calls else 0.0 for k in range(max(0, turns - 1))]
            if abs(sum(waits) - float(r["metrics"].get("tool_wait_s", 0.0))) > 1e-6:
                mismatched += 1
            episodes.append([unit, r["prompt_tokens"], r["action_tokens"], r["observation_tokens"], r["reward"],
                             [round(w, 2) for w in waits]])
    return episodes, mismatched


def collect_trace(base: Any, sft: Path, tasks: int, samples: int, seed: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Episode shapes of the warm-started policy on ``tasks`` training tasks, ``samples`` episodes each.

    Returns:
        ``(trace, rollouts)``: one dict per task (``task_id``, ``required_calls`` and ``rollouts``,
        a ``rollout_shape`` each), and the ``Rollout`` records themselves.
    """
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.episodes.runner import EpisodeLimits, run_episode
    from posttrain.inference.factory import make_engine
    from posttrain.models.hf import load_tokenizer

    gen = base.config.generator
    chosen = base.tasks("train")[:tasks]
    tokenizer = load_tokenizer(sft)
    env = base.environment()
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    engine = make_engine("hf", sft, seed=seed, max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                         max_batch=gen.episodes_in_flight)

    async def go() -> list[Any]:
        sem = asyncio.Semaphore(gen.episodes_in_flight)

        async def one(i: int, task: Any) -> Any:
            async with sem:
                return await run_episode(engine, tokenizer, env, task, limits, generator_id="trace", seed=seed + i)

        return await asyncio.gather(*(one(i * 100 + k, t) for i, t in enumerate(chosen) for k in range(samples)))

    try:
        rollouts = asyncio.run(go())
    finally:
        engine.close()
    out = []
    for i, task in enumerate(chosen):
        out.append({"task_id": task.task_id, "required_calls": len(codes_of(task)),
                    "rollouts": [rollout_shape(r) for r in rollouts[i * samples : (i + 1) * samples]]})
    return out, list(rollouts)


def measure_engine_modes(base: Any, sft: Path, seconds: float, slots: int, seed: int,
                         group_size: int = GROUP_FEED_SIZE) -> dict[str, Any]:
    """Rollouts per second of one ``hf`` engine (1 thread, alone) fed three ways, ``seconds`` each.

    ``lockstep``: ``slots`` episodes start together and the next ``slots`` start when all are done
    (how synchronous GRPO feeds its engine); ``continuous``: ``slots`` episode slots, each starting
    a new episode as soon as its last one ends (how a SAO generator process feeds it); ``groups``:
    ``slots // group_size`` group slots, each running ``group_size`` episodes of one task at once
    and starting the next group when all of them are done (how an asynchronous GRPO generator
    feeds it). All use the training tasks of the run. The engine's static, left-padded batches make mixed contexts cost
    more, which this isolates from CPU sharing.

    Episodes start while the clock is below ``seconds``; the ones in flight then finish and count
    (``seconds`` in the result is the whole time, drain included; ``feed_s`` is the window).

    Returns:
        ``feed_s``, ``group_size``, and per mode: ``rollouts``, ``rollouts_per_s``, ``mean_batch`` (requests per
        engine batch), ``batches``, one ``[rows, width, prompt_tokens, new_tokens, seconds,
        generated_tokens]`` per engine batch (``HFEngine.batch_observer``; the simulator fits its
        engine cost model on them), and ``episodes``, one ``[prompt_tokens, action_tokens,
        observation_tokens]`` per episode in the order they started (``rollout_shape``; a group's
        ``group_size`` episodes are consecutive), so the simulator can replay the very episodes
        this measurement drew; ``engine_probe``: ``engine_probe`` before and after, so
        ``bench.simulate`` can relate a method run's engine speed to this measurement's.
    """
    import torch

    from posttrain.episodes.runner import EpisodeLimits, run_episode
    from posttrain.inference.hf import BatchTiming, HFEngine
    from posttrain.models.hf import load_tokenizer

    gen = base.config.generator
    tasks = base.tasks("train")
    tokenizer = load_tokenizer(sft)
    env = base.environment()
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = HFEngine(sft, max_batch=slots, max_model_len=gen.max_episode_tokens + gen.max_new_tokens)
    rng = random.Random(seed)
    shapes: list[list[Any]] = []  # one per episode started, in start order; filled when it ends

    def shaped(task: Any, episode_seed: int) -> Any:
        index = len(shapes)  # taken now, when the episode is created, so a group's members are consecutive
        shapes.append([])

        async def run() -> None:
            shape = rollout_shape(await run_episode(engine, tokenizer, env, task, limits, seed=episode_seed))
            shapes[index] = [shape["prompt_tokens"], shape["action_tokens"], shape["observation_tokens"]]

        return run()

    def episode() -> Any:
        return shaped(tasks[rng.randrange(len(tasks))], rng.randrange(2**31))

    async def lockstep(stop: float) -> int:
        n = 0
        while time.monotonic() < stop:
            await asyncio.gather(*(episode() for _ in range(slots)))
            n += slots
        return n

    async def continuous(stop: float) -> int:
        done = [0]

        async def slot() -> None:
            while time.monotonic() < stop:
                await episode()
                done[0] += 1

        await asyncio.gather(*(slot() for _ in range(slots)))
        return done[0]

    async def groups(stop: float) -> int:
        done = [0]

        async def group_slot() -> None:
            while time.monotonic() < stop:
                task, first = tasks[rng.randrange(len(tasks))], rng.randrange(2**31)
                await asyncio.gather(*(shaped(task, first + 1000 * k) for k in range(group_size)))
                done[0] += group_size

        await asyncio.gather(*(group_slot() for _ in range(max(1, slots // group_size))))
        return done[0]

    out: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "feed_s": seconds, "group_size": group_size,
                           "engine_probe": [engine_probe(sft, gen.max_new_tokens)]}
    timings: list[BatchTiming] = []
    engine.batch_observer = timings.append
    try:
        for name, mode in zip(ENGINE_MODES, (lockstep, continuous, groups), strict=True):
            timings.clear()
            shapes.clear()
            t = time.monotonic()
            n = asyncio.run(mode(t + seconds))
            elapsed = time.monotonic() - t
            out[name] = {"rollouts": n, "seconds": elapsed, "rollouts_per_s": n / elapsed,
                         "mean_batch": statistics.fmean(b.rows for b in timings) if timings else 0.0,
                         "batches": [[b.rows, b.width, b.prompt_tokens, b.new_tokens, round(b.seconds, 6),
                                      b.generated_tokens] for b in timings],
                         "episodes": list(shapes)}
    finally:
        engine.close()
        torch.set_num_threads(threads)
    out["load_avg_end"] = os.getloadavg()[0]
    out["engine_probe"].append(engine_probe(sft, gen.max_new_tokens))
    return out


def measure_learner_cost(args: argparse.Namespace, work: Path, sft: Path, rollouts: Sequence[Any],
                         repeats: int = 3) -> dict[str, float]:
    """Seconds of one SAO learner iteration and one GRPO iteration on the same batch, alone on the machine.

    The batch is ``--batch-rollouts`` rollouts drawn from ``rollouts``; SAO runs its full iteration
    (critic values, GAE, the critic updates, the DIS policy update, after the critic warm-up),
    GRPO (G = 8) trains every group (``drop_uniform_groups`` off), so both see the same padded
    tokens. Medians over ``repeats``.

    Returns:
        ``sao_step_s``, ``grpo_step_s``, ``ratio_sao_over_grpo``, ``padded_tokens`` (what one
        forward pass over the length-ordered micro-batches computes), ``real_tokens``,
        ``micro_batch_size``, ``rows``.
    """
    from posttrain.learner.batching import collate_rollouts
    from posttrain.learner.critic import CriticModel
    from posttrain.learner.grpo_step import grpo_train_step
    from posttrain.learner.optim import build_optimizer
    from posttrain.learner.sao_step import sao_train_step
    from posttrain.learner.types import Trainable
    from posttrain.models.hf import load_policy, load_tokenizer

    sao = validated(method_config(args, work, "sao")).sao
    grpo = validated(method_config(args, work, "grpo_sync_g8")).grpo.model_copy(update={"drop_uniform_groups": False})
    rng = random.Random(args.seed)
    picks = [rollouts[rng.randrange(len(rollouts))] for _ in range(args.batch_rollouts)]
    tokenizer = load_tokenizer(sft)
    batch = collate_rollouts(picks, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    model = load_policy(sft)
    policy = Trainable(model, *build_optimizer(model, sao.optim, 100))
    critic_model = CriticModel.from_policy_path(sft)
    critic = Trainable(critic_model, *build_optimizer(critic_model, sao.optim.model_copy(update={"lr": sao.critic.lr}), 100))
    sao_s = []
    for r in range(repeats):
        t = time.perf_counter()
        out = sao_train_step(policy=policy, critic=critic, batch=batch, config=sao,
                             iteration=sao.critic.warmup_steps + r)
        sao_s.append(time.perf_counter() - t)
    model = load_policy(sft)
    policy = Trainable(model, *build_optimizer(model, grpo.optim, 100))
    groups = [f"g{i // grpo.group_size}" for i in range(len(picks))]
    grpo_s = []
    for _ in range(repeats):
        t = time.perf_counter()
        grpo_train_step(policy=policy, batch=batch, group_ids=groups, config=grpo)
        grpo_s.append(time.perf_counter() - t)
    return {
        "sao_step_s": statistics.median(sao_s),
        "grpo_step_s": statistics.median(grpo_s),
        "ratio_sao_over_grpo": statistics.median(sao_s) / statistics.median(grpo_s),
        "padded_tokens": out.metrics["batch/padded_tokens"],
        "real_tokens": out.metrics["batch/real_tokens"],
        "micro_batch_size": float(sao.micro_batch_size),
        "rows": float(batch.token_ids.shape[0]),
    }


def timed_batch(engine: Any, rng: random.Random, rows: int, width: int, new_tokens: int) -> tuple[float, int]:
    """Seconds one static batch of ``rows`` prompts of ``width`` random token ids takes, and its decode steps.

    No stop tokens, so every row samples ``new_tokens`` tokens (unless the engine's
    ``max_model_len`` cuts it): the work is fixed by the shape. Ids are drawn from ``rng`` in
    ``[3, 300)`` (inside every tokenizer the benchmark trains).

    Returns:
        ``(seconds, steps)``: wall seconds from submission to the last result, and the longest continuation (tokens).
    """
    from posttrain.inference.base import GenerationRequest

    reqs = [GenerationRequest(prompt_token_ids=[rng.randrange(3, 300) for _ in range(width)], max_new_tokens=new_tokens,
                              temperature=1.0, stop_token_ids=[], seed=rng.randrange(2**31)) for _ in range(rows)]

    async def run() -> tuple[float, int]:
        t = time.perf_counter()
        results = await asyncio.gather(*(engine.generate(r) for r in reqs))
        return time.perf_counter() - t, max(len(r.token_ids) for r in results)

    return asyncio.run(run())


PROBE_BATCHES = ((64, 384), (8, 128))
"""``(rows, width)`` of the batches ``engine_probe`` times: one wide batch of a loaded engine, one narrow."""
PROBE_REPEATS = 5
"""Times ``engine_probe`` runs each batch; it keeps the median."""


def engine_probe(sft: Path, new_tokens: int) -> dict[str, Any]:
    """The ``hf`` engine's speed now: seconds of a fixed set of static batches at one torch thread.

    Each ``PROBE_BATCHES`` shape runs ``PROBE_REPEATS`` times (``timed_batch``, fixed ids, no stop
    tokens, ``new_tokens`` decode steps); ``seconds`` is the sum of the shapes' medians. On a shared
    machine the same work took about 21% longer in one hour than in another at the same load
    average; ``async_vs_sync`` probes before and after every method run and every engine-mode
    measurement, and ``bench.simulate`` scales a run's engine by its probe over the engine-mode
    measurement's. ``background_cores`` is what other processes used meanwhile (``OtherCpu``), so
    the simulator can tell a busy machine from a slow one.

    Returns:
        ``seconds`` (float, s), ``background_cores`` (float or None), ``batches``
        (``[rows, width, median seconds]`` per shape) and ``when`` (UTC, ISO 8601).
    """
    import torch

    from bench.common import OtherCpu
    from posttrain.inference.hf import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = HFEngine(sft, max_batch=max(rows for rows, _ in PROBE_BATCHES),
                      max_model_len=max(width for _, width in PROBE_BATCHES) + new_tokens + 1)
    rng = random.Random(0)
    batches = []
    try:
        timed_batch(engine, rng, 1, 8, 1)  # first call: thread pool and allocator warm-up, not timed
        with OtherCpu() as other:
            for rows, width in PROBE_BATCHES:
                seconds = [timed_batch(engine, rng, rows, width, new_tokens)[0] for _ in range(PROBE_REPEATS)]
                batches.append([rows, width, round(statistics.median(seconds), 6)])
    finally:
        engine.close()
        torch.set_num_threads(threads)
    return {"seconds": sum(b[2] for b in batches), "background_cores": other.cores, "batches": batches,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def calibrate_engine(sft: Path, batch_sizes: Sequence[int], widths: Sequence[int], new_tokens: int,
                     repeats: int) -> dict[str, Any]:
    """Time the ``hf`` engine's static batches at one torch thread (as in a generator process).

    Fits ``batch_s = prefill_s_per_token * rows * width + steps * (step_s + rows * (step_s_per_row +
    step_s_per_row_token * width))`` by least squares over the grid, where ``steps`` is the longest
    continuation in the batch and ``width`` the left-padded prompt length (every row attends over it).

    Returns:
        The fitted coefficients (seconds), the measured points and the fit's worst relative error.
    """
    import numpy as np
    import torch

    from posttrain.inference.hf import HFEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = HFEngine(sft, max_batch=max(batch_sizes), max_model_len=max(widths) + new_tokens + 1)
    rng = random.Random(0)
    points = []
    try:
        for rows in batch_sizes:
            for width in widths:
                for _ in range(repeats):
                    seconds, steps = timed_batch(engine, rng, rows, width, new_tokens)
                    points.append({"rows": rows, "width": width, "steps": steps, "seconds": seconds})
    finally:
        engine.close()
        torch.set_num_threads(threads)
    a = np.array([[p["rows"] * p["width"], p["steps"], p["steps"] * p["rows"], p["steps"] * p["rows"] * p["width"]]
                  for p in points], dtype=float)
    y = np.array([p["seconds"] for p in points])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    coef = np.maximum(coef, 0.0)
    pred = a @ coef
    return {
        "load_avg": os.getloadavg()[0],
        "prefill_s_per_token": float(coef[0]),
        "step_s": float(coef[1]),
        "step_s_per_row": float(coef[2]),
        "step_s_per_row_token": float(coef[3]),
        "fit_max_rel_error": float(np.max(np.abs(pred - y) / y)),
        "torch_threads": 1,
        "points": points,
    }


def measure_weight_sync(sft: Path, repeats: int) -> dict[str, float]:
    """Seconds to publish the tiny model to a filesystem store and reload it into an ``hf`` engine (medians)."""
    import tempfile

    from posttrain.inference.hf import HFEngine
    from posttrain.models.hf import load_policy
    from posttrain.weight_sync.store import FilesystemWeightStore

    model = load_policy(sft)
    engine = HFEngine(sft)
    publish, reload = [], []
    with tempfile.TemporaryDirectory() as tmp:
        store = FilesystemWeightStore(tmp)
        for v in range(repeats):
            t = time.perf_counter()
            path = store.publish(model.state_dict(), v, sft)
            publish.append(time.perf_counter() - t)
            t = time.perf_counter()
            asyncio.run(engine.update_weights(path, v))
            reload.append(time.perf_counter() - t)
    engine.close()
    return {"publish_s": statistics.median(publish), "reload_s": statistics.median(reload)}


# --------------------------------------------------------------------------------------- report
def summarise(run: MethodRun, rewards: dict[int, float], target: float) -> dict[str, Any]:
    """The per-method numbers of the results JSON."""
    window = steady_window(run.steps)
    updated = [s for s in run.steps if s.updated]
    return {
        "busy_fraction": run.counters.get("generator_busy_fraction"),
        "trained_action_tokens_per_s": window["trained_action_tokens_per_s"],
        "action_tokens_per_s": window["action_tokens_per_s"],
        "rollouts_per_s": window["rollouts_per_s"],
        "steady_window_s": window["window_s"],
        "wall_s": run.wall_s,
        "startup_s": run.steps[0].t - run.steps[0].step_s if run.steps else None,
        "policy_versions": max((s.policy_version for s in run.steps), default=0),
        "iterations": len(run.steps),
        "learner_step_s_mean": statistics.fmean(s.step_s for s in updated) if updated else None,
        "learner_step_s": [s.step_s for s in run.steps],
        "trained_action_tokens_per_update": [s.trained_action_tokens for s in updated],
        "step_times_s": [s.t for s in run.steps],
        "generator_batch_s": run.batch_gen_s,
        "train_reward_first_last": [run.steps[0].reward_mean, run.steps[-1].reward_mean] if run.steps else None,
        "heldout_reward": {str(v): r for v, r in sorted(rewards.items())},
        "time_to_target_s": time_to_target(run, rewards, target),
        "stale_dropped": run.counters.get("stale_dropped", 0.0),
        "stale_aborted": run.counters.get("generator_stale_aborted", 0.0),
        "load_avg_start_end": run.load_avg,
        "engine_probe": run.engine_probe,
        "when": run.when,
        "counters": run.counters,
        "episode_wait_mismatches": run.episode_wait_mismatches,
        "episodes_recorded": len(run.episodes),
        # bench.simulate replays only synchronous runs (an asynchronous run's record lacks the episodes in flight
        # when it stopped, see simulate.method_rows); the others' episodes stay in their run's ledger
        **({"episodes": run.episodes} if method_kind(run.method) == "grpo_sync" else {}),
    }


REPEATED = ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s", "learner_step_s_mean")
"""Per-method quantities summarised over repeated runs (``over_runs``)."""


def repeat_config(args: argparse.Namespace, work: Path, method: str, index: int) -> dict[str, Any]:
    """The run config of repeat ``index`` (>= 1) of ``method``: the same setting with run seed ``--seed + index``.

    Only the run's seed changes (its sampling, task order and generator seeds); the tool
    latencies keep ``--seed``, so each task waits the same seconds in every repeat. The run
    directory is ``<method>_r<index>``.

    Raises:
        ValueError: ``index < 1``, or what ``method_config`` raises.
    """
    if index < 1:
        raise ValueError(f"repeat index: must be >= 1, got {index}")
    cfg = method_config(args, work, method)
    cfg["seed"] = args.seed + index
    cfg["run_name"] = f"{method}_r{index}"
    return cfg


def run_repeats(args: argparse.Namespace, work: Path, base: Any, sft: Path, method: str,
                indices: Sequence[int]) -> list[dict[str, Any]]:
    """Run ``method`` again once per index in ``indices`` (``repeat_config``) and summarise each run.

    Repeats measure how much a quantity moves between runs on a shared machine; their weights
    are not evaluated on held-out tasks (time to target stays the first run's). Each summary
    carries its ``seed`` (and, as every run's, ``when``: UTC).

    Returns:
        One ``summarise`` dict per repeat, in the order of ``indices``.
    """
    out = []
    for index in indices:
        snap = work / "snapshots" / f"{method}_r{index}"
        run = run_method(repeat_config(args, work, method, index), method, base, sft, snap, eval_every=args.steps)
        shutil.rmtree(snap, ignore_errors=True)
        out.append({**summarise(run, {}, math.inf), "seed": args.seed + index})
    return out


def over_runs(method_result: dict[str, Any], first_seed: int) -> dict[str, Any]:
    """Mean, minimum, maximum and values of each ``REPEATED`` quantity over a method's first run and its repeats.

    Args:
        method_result: One entry of ``methods`` (the first run's summary), with its repeats under
            ``repeat_runs`` (possibly none).
        first_seed: The first run's seed (``--seed``).

    Returns:
        ``runs`` (count), ``seeds``, and per quantity ``{"mean", "min", "max", "values"}``
        (quantities with no value in any run are left out).
    """
    runs = [method_result] + list(method_result.get("repeat_runs") or [])
    out: dict[str, Any] = {"runs": len(runs), "seeds": [first_seed] + [r["seed"] for r in runs[1:]]}
    for q in REPEATED:
        values = [float(r[q]) for r in runs if r.get(q) is not None]
        if values:
            out[q] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "values": values}
    return out


def headline(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The per-method headline numbers of a setting's result, and SAO's throughput ratio.

    Each number is the mean over the method's runs (``over_runs``) when it was repeated, else its
    one run's. ``throughput_ratio_sao_over_grpo_sync`` is SAO's trained action tokens per second
    over the *faster* synchronous GRPO variant (None without SAO or a synchronous method).

    Returns:
        ``busy_fraction``, ``trained_action_tokens_per_s`` and ``rollouts_per_s`` (method ->
        value), ``time_to_target_s`` (the first runs'), ``throughput_ratio_sao_over_grpo_sync``
        and ``throughput_ratio_by_baseline``.
    """
    def value(m: dict[str, Any], q: str) -> Any:
        agg = (m.get("over_runs") or {}).get(q)
        return agg["mean"] if agg else m[q]

    out: dict[str, Any] = {q: {k: value(v, q) for k, v in methods.items()}
                           for q in ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s")}
    out["time_to_target_s"] = {k: v["time_to_target_s"] for k, v in methods.items()}
    rates = out["trained_action_tokens_per_s"]
    sync_rates = {k: v for k, v in rates.items() if k.startswith("grpo_sync")}
    sao_rate = rates.get("sao")
    by_baseline = {k: sao_rate / v for k, v in sync_rates.items() if sao_rate and v > 0}
    out["throughput_ratio_sao_over_grpo_sync"] = min(by_baseline.values()) if by_baseline else None
    out["throughput_ratio_by_baseline"] = by_baseline
    return out


def add_repeats(result: dict[str, Any], repeats: dict[str, list[dict[str, Any]]], first_seed: int) -> None:
    """Append repeat summaries to a setting's result, then refresh ``over_runs`` and the headline numbers (in place).

    Raises:
        KeyError: a method in ``repeats`` that ``result`` has no first run of.
    """
    for method, runs in repeats.items():
        m = result["methods"][method]
        m["repeat_runs"] = list(m.get("repeat_runs") or []) + runs
    for m in result["methods"].values():
        if m.get("repeat_runs"):
            m["over_runs"] = over_runs(m, first_seed)
    result.update(headline(result["methods"]))


def render(result: dict[str, Any]) -> str:
    """The docs section: the top-level result, then the compute-bound one when the file keeps it."""
    parts = [render_one(result)]
    if result.get("compute_bound"):
        parts.append(render_one(result["compute_bound"]))
    return "\n\n".join(parts)


def setting_text(result: dict[str, Any]) -> str:
    """Heading line naming the setting of one result (older files without ``setting`` are compute-bound)."""
    s = result["settings"]
    if result.get("setting") == "tool_latency":
        return (f"**Tool-latency setting** (targets judged here): each tool call waits a log-normal wall time, "
                f"median {s['tool_latency_median_s']} s, sigma {s['tool_latency_sigma']}, capped at "
                f"{s['tool_latency_max_s']} s, seeded per task (sandbox / test execution: wall time, no accelerator time).")
    note = result.get("runtime_note")
    return ("**Compute-bound setting**: tool calls are instantaneous; generation and training share the same "
            "2 CPU cores." + (f" {note}" if note else ""))


def render_one(result: dict[str, Any]) -> str:
    """One setting's part of the docs section: heading, machine, command, settings and the table."""
    m = result["methods"]
    rows = []
    for name, r in m.items():
        ttt = r["time_to_target_s"]
        rows.append([
            name, cell(r, "busy_fraction", 2), cell(r, "trained_action_tokens_per_s", 1), cell(r, "rollouts_per_s", 2),
            cell(r, "learner_step_s_mean", 2), f"{r['wall_s']:.0f}", "not reached" if ttt is None else f"{ttt:.0f}",
            " / ".join(f"{v:.2f}" for v in r["heldout_reward"].values()) or "-",
        ])
    repeated = {k: v["over_runs"]["runs"] for k, v in m.items() if v.get("over_runs")}
    carried = result.get("carried_methods") or {}
    s = stored_settings(result)
    calls = result["task_calls"]["train"]
    ratio = result["throughput_ratio_sao_over_grpo_sync"]
    by = ", ".join(f"{k}: {v:.2f}x" for k, v in result["throughput_ratio_by_baseline"].items())
    ratio_text = "not measured (needs sao and a grpo_sync_g<G> method)" if ratio is None else f"**{ratio:.2f}x**"
    return "\n".join([
        setting_text(result),
        "",
        machine_line(result["machine"]),
        "",
        f"Command: `{result['command']}`",
        "",
        f"Setting: `synthetic_longtail`, required calls per task log-normal (median {s['calls_median']}, "
        f"sigma {s['calls_sigma']}, clipped to 1..{s['max_calls']}; train tasks: mean {calls['mean']:.1f}, "
        f"p90 {calls['p90']:.0f}, max {calls['max']:.0f}); {s['batch_rollouts']} rollouts per policy version, "
        f"{s['steps']} versions per method, lr {s['lr']}, engine `{s['engine']}`, {s['generators']} generator "
        f"process(es) with up to {s['episodes_in_flight']} episodes in flight, staleness bound tau = "
        f"{s['max_staleness']} (SAO and asynchronous GRPO; synchronous GRPO: one engine in the learner's process "
        f"running each batch's {s['batch_rollouts']} episodes at once)"
        + (f", learner micro-batches of {s['micro_batch_size']} rollouts in length order (every method)"
           if "micro_batch_size" in s else "")
        + f", tiny Qwen2-shaped model after {s['sft_steps']} SFT steps; "
        + ("generators let an episode that became too stale to train run to its end for the learner to drop."
           if s["keep_stale_episodes"] else
           "generators cancel an episode in flight once the learner is more than tau versions past its oldest "
           "version (the learner would drop it)."),
        "",
        markdown_table(
            ["method", "busy fraction", "trained action tokens/s", "rollouts/s", "learner s/step", "wall s",
             f"s to held-out reward {result['target']:.2f}", "held-out reward at snapshots"],
            rows,
        ),
        "",
        *([f"Carried from the previous run of this setting (same arguments, or for synchronous GRPO differing only in "
           f"tau, slots or stale-episode handling, which it does not use; that run ended at): "
           f"{', '.join(f'{k} ({w})' for k, w in carried.items())}; the other methods ran in this command.", ""]
          if carried else []),
        *([f"Repeated runs ({', '.join(f'{k}: {n}' for k, n in repeated.items())}; seeds --seed, --seed + 1, ...): "
           "their busy fraction, throughputs and learner step are the mean with the range of the runs in brackets "
           "(the ratio below uses the means); wall time and held-out rewards are the first run's.", ""]
          if repeated else []),
        f"Held-out reward of the warm start: {result['start_reward']:.3f} ({s['eval_tasks']} tasks x "
        f"{s['eval_samples']} samples); snapshots every {s['eval_every']} versions.",
        f"Throughput ratio SAO / synchronous GRPO (trained action tokens per second): {ratio_text} "
        f"against the faster synchronous variant ({by}).",
        *extra_lines(result),
        *render_sweep(result),
    ])


def cell(method_result: dict[str, Any], quantity: str, digits: int) -> str:
    """A table cell: the run's value, or with repeats the mean and the range, e.g. ``0.91 (0.86-0.96)``; ``-`` if none."""
    agg = (method_result.get("over_runs") or {}).get(quantity)
    if agg:
        return f"{agg['mean']:.{digits}f} ({agg['min']:.{digits}f}-{agg['max']:.{digits}f})"
    value = method_result.get(quantity)
    return "-" if value is None else f"{value:.{digits}f}"


def extra_lines(result: dict[str, Any]) -> list[str]:
    """Lines about the learner-cost and engine-feeding measurements, when the results hold them."""
    out = []
    lc = result.get("learner_cost")
    if lc:
        out.append(
            f"Learner alone, same batch ({lc['rows']:.0f} rollouts, "
            + (f"{lc['real_tokens']:.0f} tokens, {lc['padded_tokens']:.0f} with padding in length-ordered micro-batches "
               f"of {lc['micro_batch_size']:.0f}" if "real_tokens" in lc else f"{lc['padded_tokens']:.0f} padded tokens")
            + "): SAO "
            f"iteration {lc['sao_step_s']:.2f} s, GRPO iteration {lc['grpo_step_s']:.2f} s "
            f"(**{lc['ratio_sao_over_grpo']:.1f}x**: the critic's value pass and its updates)."
        )
    em = result.get("engine_modes")
    if em:
        names = {"lockstep": "lockstep", "continuous": "continuous",
                 "groups": f"in groups of {em.get('group_size', GROUP_FEED_SIZE)} of one task"}
        fed = [(names[m], em[m]) for m in ENGINE_MODES if m in em]
        timed = sum(len(mode.get("batches", [])) for _, mode in fed)
        probes = [p["seconds"] for p in em.get("engine_probe") or []]
        out.append(
            f"`hf` engine alone (1 thread, {result['settings']['episodes_in_flight']} episodes"
            + (f", episodes started for {em['feed_s']:.0f} s, the last ones drained" if "feed_s" in em else "")
            + "): " + ", ".join(f"fed {name} {mode['rollouts_per_s']:.1f} rollouts/s (mean batch {mode['mean_batch']:.1f})"
                                for name, mode in fed)
            + (f"; {timed} batches timed for the simulator's engine costs" if timed else "")
            + (f"; engine probe {' / '.join(f'{x:.2f}' for x in probes)} s before / after" if probes else "")
            + f"; load average {em['load_avg_start']:.1f} -> {em['load_avg_end']:.1f}."
        )
    return out


def stored_result_and_warm_start(args: argparse.Namespace, work: Path,
                                 setting: str | None = None) -> tuple[dict[str, Any], Any, Path]:
    """The existing results, the base ``RunContext`` and the cached SFT warm start (for the ``--*-only`` modes).

    Checks, before any work: the results file exists and holds a result of ``setting`` (when
    given, see ``setting_result``). Task files missing from ``work`` (a fresh clone: ``runs/`` is
    not committed) are generated again from the arguments (``write_tasks`` is seeded), and must
    reproduce the stored result's distribution of required calls. A missing warm-start model is
    then rebuilt from them (minutes, seeded like the full run's).

    Raises:
        FileNotFoundError: no results file, or no result of ``setting`` (run the benchmark
            first); the message is one line.
        ValueError: regenerated tasks whose required calls differ from the stored result's
            (other ``--calls-*``, ``--train-tasks``, ``--eval-tasks`` or ``--seed`` than the run's;
            nothing is written).
    """
    from bench.common import read_result

    result = read_result("async_vs_sync")
    if result is None:
        raise FileNotFoundError("bench/results/async_vs_sync.json: no results; run the benchmark first")
    stored = setting_result(result, setting) if setting is not None else result
    if not (work / "tasks" / "train.jsonl").is_file():
        write_tasks(args, work, expect=stored.get("task_calls"))
    base, sft, _ = prepare_shared(args, work)
    return result, base, sft


def setting_result(result: dict[str, Any], label: str) -> dict[str, Any]:
    """The result of setting ``label`` in a results file (the top level or its ``compute_bound``; see ``merge_results``).

    Raises:
        FileNotFoundError: the file holds no result of that setting.
    """
    if result.get("setting", "compute_bound") == label:
        return result
    nested = result.get("compute_bound")
    if label == "compute_bound" and nested:
        return nested
    raise FileNotFoundError(f"bench/results/async_vs_sync.json: no {label} result; run that setting first")


def engine_modes_only(args: argparse.Namespace, work: Path) -> int:
    """``--engine-modes-only``: run ``measure_engine_modes`` on the cached warm start, store it in the results.

    The measurement goes to the result of the setting the arguments name (``setting_label``): the
    top level, or ``compute_bound`` with ``--tool-latency-median-s 0``; it uses that setting's
    ``--episodes-in-flight``.

    Raises:
        FileNotFoundError: no results file, no result of that setting, or no cached warm start
            (run the benchmark first).
    """
    result, base, sft = stored_result_and_warm_start(args, work, setting_label(args))
    target = setting_result(result, setting_label(args))
    modes = measure_engine_modes(base, sft, seconds=args.engine_modes_s, slots=args.episodes_in_flight, seed=args.seed)
    target["engine_modes"] = {**modes, "command": command_line("bench.async_vs_sync", None), "machine": machine_info()}
    write_result("async_vs_sync", result)
    if not args.no_docs:
        update_docs_section("async_vs_sync", render(result))
    print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk not in ("batches", "episodes")}
                          if isinstance(v, dict) else v) for k, v in modes.items()}, indent=2))
    return 0


def trace_only(args: argparse.Namespace, work: Path) -> int:
    """``--trace-only``: re-collect the warm start's trace (``--trace-tasks`` x ``--trace-samples``) for every setting.

    The trace describes the warm-started policy on the instantaneous environment, the same for
    both settings, so one collection replaces the ``trace`` of the top-level result and of
    ``compute_bound``; each gets ``trace_settings`` (tasks, samples, seed, when). The method runs
    are left as they are. ``bench.simulate`` reads the new trace.

    Raises:
        FileNotFoundError: no results file or no cached warm start (run the benchmark first).
    """
    result, base, sft = stored_result_and_warm_start(args, work)
    trace, _ = collect_trace(base, sft, args.trace_tasks, args.trace_samples, args.seed)
    meta = {"tasks": args.trace_tasks, "samples": args.trace_samples, "seed": args.seed,
            "command": command_line("bench.async_vs_sync", None), "when": machine_info()["when"]}
    for r in [result] + ([result["compute_bound"]] if result.get("compute_bound") else []):
        r["trace"] = trace
        r["trace_settings"] = meta
    write_result("async_vs_sync", result)
    if not args.no_docs:
        update_docs_section("async_vs_sync", render(result))
    flat = [x for t in trace for x in t["rollouts"]]
    print(f"trace: {len(trace)} tasks x {args.trace_samples} samples, mean reward "
          f"{statistics.fmean(x['reward'] for x in flat):.3f}")
    return 0


def repeat_methods(args: argparse.Namespace) -> list[str]:
    """The methods ``--repeats`` applies to: ``--repeat-methods``, else every method of ``--methods`` (none with 1 run)."""
    if args.repeats <= 1:
        return []
    return list(args.repeat_methods) if args.repeat_methods else list(args.methods)


REPEAT_KEYS = ("steps", "batch_rollouts", "generators", "episodes_in_flight", "engine", "calls_median", "calls_sigma",
               "max_calls", "tool_latency_median_s", "tool_latency_sigma", "tool_latency_max_s", "max_new_tokens",
               "max_episode_tokens", "train_tasks", "lr", "max_staleness", "micro_batch_size", "critic_warmup",
               "sft_steps", "seed", "keep_stale_episodes")
"""Arguments that define a setting's measurement: a ``--repeats-only`` run must share them with the stored
setting it adds runs to, and a run of some methods keeps the stored other methods only when it shares them."""


def repeats_only(args: argparse.Namespace, work: Path) -> int:
    """``--repeats-only``: run each of ``repeat_methods`` until it has ``--repeats`` runs in the stored setting.

    The runs go to the result of the setting the arguments name (``setting_label``), whose stored
    first runs they join (``add_repeats``); the setting's arguments (``REPEAT_KEYS``) must be the
    stored ones, so every run of a method measures the same thing. Already stored repeats count,
    so running it twice adds nothing.

    Raises:
        FileNotFoundError: no results file, no result of that setting, or no cached warm start.
        ValueError: an argument differs from the stored setting's, or a method has no first run
            there (the message names it).
    """
    from bench.common import read_result

    stored_file = read_result("async_vs_sync")
    if stored_file is not None:  # checked before the warm start; without a file the next call says what to run
        check_repeat_args(setting_result(stored_file, setting_label(args)), args)
    result, base, sft = stored_result_and_warm_start(args, work, setting_label(args))
    target = setting_result(result, setting_label(args))
    stored = target["settings"]
    methods = repeat_methods(args)
    repeats = {}
    for method in methods:
        have = 1 + len(target["methods"][method].get("repeat_runs") or [])
        repeats[method] = run_repeats(args, work, base, sft, method, range(have, args.repeats))
    add_repeats(target, repeats, int(stored.get("seed", args.seed)))
    write_result("async_vs_sync", result)
    if not args.no_docs:
        update_docs_section("async_vs_sync", render(result))
    for method in methods:
        print(method, json.dumps({q: v for q, v in target["methods"][method].get("over_runs", {}).items()}))
    return 0


def check_repeat_args(target: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse ``--repeats-only`` arguments that differ from the stored setting's, or name a method it has not run.

    Raises:
        ValueError: the first differing ``REPEAT_KEYS`` argument, or methods without a first run.
    """
    stored = stored_settings(target)
    given = settings_of(args)
    for key in REPEAT_KEYS:
        if key in stored and stored[key] != given[key]:
            raise ValueError(f"--{key.replace('_', '-')}: the stored {target['setting']} result used "
                             f"{stored[key]!r}, got {given[key]!r}; repeats must share the setting")
    methods = repeat_methods(args)
    missing = [m for m in methods if m not in target["methods"]]
    if missing:
        raise ValueError(f"--repeat-methods: {', '.join(missing)} has no first run in the stored "
                         f"{target['setting']} result (it has {', '.join(target['methods'])})")


# ------------------------------------------------------------------------------ capacity sweep
ASYNC_ONLY_KEYS = frozenset({"max_staleness", "episodes_in_flight", "keep_stale_episodes"})
"""``REPEAT_KEYS`` synchronous GRPO does not use: its engine gets all of a batch's episodes at once
(``max_batch = max(episodes_in_flight, batch)``), and it has no admission and no stale rollouts."""

SWEPT_KEYS = ("max_staleness", "episodes_in_flight", "keep_stale_episodes")
"""The arguments a ``--capacity-sweep`` point sets; every other ``REPEAT_KEYS`` argument is the stored setting's."""


def capacity_point(text: str) -> tuple[int, int, bool]:
    """One ``--capacity-sweep`` point, ``TAU:SLOTS`` or ``TAU:SLOTS:keep``.

    TAU is the staleness bound (policy versions), SLOTS the episodes in flight per engine; ``keep``
    lets stale episodes run to the end for the learner to drop (``--keep-stale-episodes``, the
    behaviour before generators cancelled them), so the two compare side by side.

    Returns:
        ``(tau, slots, keep)``.

    Raises:
        ValueError: not two integers separated by ``:`` (optionally followed by ``:keep``), tau < 0
            or slots < 1 (the message quotes it).
    """
    tau, sep, rest = text.partition(":")
    slots, _, mode = rest.partition(":")
    if not sep or not tau.strip().isdigit() or not slots.strip().isdigit() or mode not in ("", "keep"):
        raise ValueError(f"--capacity-sweep: expected TAU:SLOTS or TAU:SLOTS:keep (e.g. 6:384), got {text!r}")
    if int(slots) < 1:
        raise ValueError(f"--capacity-sweep: SLOTS must be >= 1 episodes, got {text!r}")
    return int(tau), int(slots), mode == "keep"


def sweep_args(args: argparse.Namespace, tau: int, slots: int, keep: bool = False) -> argparse.Namespace:
    """``args`` of one capacity-sweep point: ``--max-staleness tau --episodes-in-flight slots`` (and ``--keep-stale-episodes``)."""
    return argparse.Namespace(**{**vars(args), "max_staleness": tau, "episodes_in_flight": slots,
                                 "keep_stale_episodes": keep})


def capacity_sweep_only(args: argparse.Namespace, work: Path) -> int:
    """``--capacity-sweep TAU:SLOTS ...``: SAO's busy fraction against its admission capacity, stored with the setting.

    Why: SAO's generators may start a rollout only while ``started < (v + tau + 1) * B``
    (``posttrain.rollout.admission``), and a rollout waiting on the stream for the learner still
    holds its ticket. With tool calls of seconds, keeping an engine generating needs enough
    episodes in flight to cover them (Little's law: in flight = rollouts/s x episode seconds); when
    the admission capacity ``(tau + 1) * B`` minus the learner's backlog is below that, slots wait
    for tickets and the engine idles. Each point runs SAO ``--repeats`` times (run seeds ``--seed``
    ...) with that ``tau`` (``--max-staleness``) and slots per engine (``--episodes-in-flight``), all
    other arguments the stored setting's; the first run of each point is evaluated on the held-out
    tasks. Every point runs in this one command, so they share the machine's hour (include the
    setting's own point to compare with it side by side).

    Stored under ``capacity_sweep`` of the setting's result: ``points`` (each ``max_staleness``,
    ``episodes_in_flight``, ``admission_capacity`` = ``(tau + 1) * B`` rollouts, ``runs``: one
    ``summarise`` dict per run with its ``seed``, and ``over_runs``), ``command``, ``machine``.

    Raises:
        FileNotFoundError: no results file, no result of the setting, or no warm start to rebuild from.
        ValueError: a malformed point, or an argument other than ``tau`` and slots that differs from
            the stored setting's (the message names it).
    """
    from bench.common import read_result

    points = [capacity_point(p) for p in args.capacity_sweep]
    stored_file = read_result("async_vs_sync")
    if stored_file is not None:  # checked before the warm start; without a file the next call says what to run
        check_sweep_args(setting_result(stored_file, setting_label(args)), args)
    result, base, sft = stored_result_and_warm_start(args, work, setting_label(args))
    target = setting_result(result, setting_label(args))
    runs: dict[tuple[int, int, bool], list[MethodRun]] = {}
    for tau, slots, keep in points:
        pargs = sweep_args(args, tau, slots, keep)
        for index in range(args.repeats):
            cfg = method_config(pargs, work, "sao")
            cfg["seed"] = args.seed + index
            cfg["run_name"] = f"sao_tau{tau}_slots{slots}{'_keep' if keep else ''}_r{index}"
            snap = work / "snapshots" / cfg["run_name"]
            run = run_method(cfg, point_label(tau, slots, keep), base, sft, snap, eval_every=args.steps)
            if index > 0:  # repeats measure speed; only the first run of a point is evaluated
                shutil.rmtree(snap, ignore_errors=True)
            runs.setdefault((tau, slots, keep), []).append(run)
    print("evaluating the first run of each point", flush=True)
    _, rewards = evaluate_snapshots(base, sft, [r[0] for r in runs.values()])
    out_points = []
    for (tau, slots, keep), point_runs in runs.items():
        summaries = [{**summarise(run, rewards[run.method] if i == 0 else {}, float(target["target"])),
                      "seed": args.seed + i} for i, run in enumerate(point_runs)]
        out_points.append({"max_staleness": tau, "episodes_in_flight": slots, "keep_stale_episodes": keep,
                           "admission_capacity": (tau + 1) * int(args.batch_rollouts), "runs": summaries,
                           "over_runs": over_runs({**summaries[0], "repeat_runs": summaries[1:]}, args.seed)})
    target["capacity_sweep"] = {"command": command_line("bench.async_vs_sync", None), "machine": machine_info(),
                                "repeats": args.repeats, "points": out_points}
    write_result("async_vs_sync", result)
    if not args.no_docs:
        update_docs_section("async_vs_sync", render(result))
    for p in out_points:
        print(f"{point_label(p['max_staleness'], p['episodes_in_flight'], p['keep_stale_episodes'])}:",
              json.dumps({q: round(v["mean"], 3) for q, v in p["over_runs"].items() if isinstance(v, dict)}))
    return 0


def check_sweep_args(target: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse capacity-sweep arguments that differ from the stored setting's other than tau and the slots.

    Raises:
        ValueError: the first differing ``REPEAT_KEYS`` argument outside ``SWEPT_KEYS`` (named).
    """
    stored, given = stored_settings(target), settings_of(args)
    for key in REPEAT_KEYS:
        if key not in SWEPT_KEYS and key in stored and stored[key] != given[key]:
            raise ValueError(f"--{key.replace('_', '-')}: the stored {target['setting']} result used "
                             f"{stored[key]!r}, got {given[key]!r}; a capacity sweep changes only tau and the slots")


def render_sweep(result: dict[str, Any]) -> list[str]:
    """Docs lines of a setting's ``capacity_sweep``: one table row per point (empty without a sweep)."""
    sweep = result.get("capacity_sweep")
    if not sweep:
        return []
    rows = []
    for p in sweep["points"]:
        first = p["runs"][0]
        shown = {"over_runs": p["over_runs"]} if len(p["runs"]) > 1 else first  # one run: its value, no range
        stale = [float(r["stale_dropped"] or 0.0) for r in p["runs"]]
        aborted = [float(r.get("stale_aborted") or 0.0) for r in p["runs"]]
        trained = [float((r.get("counters") or {}).get("rollouts_trained") or 0.0) for r in p["runs"]]
        keep = p.get("keep_stale_episodes", True)  # points measured before generators cancelled stale episodes
        rows.append([str(p["max_staleness"]), str(p["episodes_in_flight"]), str(p["admission_capacity"]),
                     "finish (learner drops)" if keep else "cancelled in flight",
                     cell(shown, "busy_fraction", 2), cell(shown, "rollouts_per_s", 2),
                     cell(shown, "trained_action_tokens_per_s", 1),
                     f"{statistics.fmean(s / max(s + t, 1.0) for s, t in zip(stale, trained, strict=True)):.2f}",
                     f"{statistics.fmean(aborted):.0f}",
                     f"{statistics.fmean(float(r['counters'].get('generator_max_in_flight') or 0.0) for r in p['runs']):.0f}",
                     " / ".join(f"{v:.2f}" for v in first["heldout_reward"].values()) or "-"])
    runs = f"{sweep['repeats']} runs" if sweep["repeats"] > 1 else "1 run"
    return [
        "",
        f"**SAO against its admission capacity** ({runs} per point, all in one command, so the points share the "
        "machine's hour; the setting's own point is among them): a generator may start a rollout only while "
        "started < (v + tau + 1) x B, and rollouts waiting for the learner hold their tickets, so tau and the "
        "episode slots bound how many episodes can wait on tools at once. \"Stale episodes\": whether a "
        "generator cancels an episode in flight once the learner is more than tau versions past its oldest "
        "version (the default), or lets it finish for the learner to drop (`TAU:SLOTS:keep`).",
        "",
        machine_line(sweep["machine"]),
        "",
        f"Command: `{sweep['command']}`",
        "",
        markdown_table(["tau", "slots per engine", "admission capacity (rollouts)", "stale episodes",
                        "busy fraction", "rollouts/s", "trained action tokens/s", "stale-dropped share",
                        "cancelled in flight per run", "max in flight",
                        "held-out reward (first run)"], rows),
    ]


def with_carried_methods(new: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    """``new`` plus the methods the stored result of its setting has and ``new`` did not run, when the settings match.

    A stored ``capacity_sweep`` is kept too when every argument but tau and the slots matches
    (``SWEPT_KEYS``): the sweep is measured in its own command and says when and where.

    Re-running some methods (``--methods sao`` after a fix to SAO's path) keeps the other methods'
    runs of the same setting (every ``REPEAT_KEYS`` argument equal), so the table still compares
    all of them; the headline numbers are recomputed and ``carried_methods`` names each carried
    method with the time its run ended. Synchronous GRPO is also kept when only ``ASYNC_ONLY_KEYS``
    differ (it runs each batch's episodes at once in the learner's process: no admission, no
    staleness, no episode slots). A run with other arguments replaces the setting's result.
    """
    if previous is None:
        return new
    try:
        old = setting_result(previous, new["setting"])
    except FileNotFoundError:
        return new
    stored, given = stored_settings(old), stored_settings(new)
    if old.get("capacity_sweep") and "capacity_sweep" not in new and not any(
            stored.get(k) != given.get(k) for k in REPEAT_KEYS if k not in SWEPT_KEYS and (k in stored or k in given)):
        new = {**new, "capacity_sweep": old["capacity_sweep"]}  # it names its own machine, hour and command
    differ = {k for k in REPEAT_KEYS if (k in stored or k in given) and stored.get(k) != given.get(k)}
    carried = {k: v for k, v in old.get("methods", {}).items() if k not in new.get("methods", {})
               and (not differ or (method_kind(k) == "grpo_sync" and differ <= ASYNC_ONLY_KEYS))}
    if not carried:
        return new
    methods = {**carried, **new["methods"]}
    order = [m for m in METHODS if m in methods] + [m for m in methods if m not in METHODS]
    methods = {m: methods[m] for m in order}
    return {**new, **headline(methods), "methods": methods,
            "carried_methods": {k: v.get("when") or (old.get("machine") or {}).get("when") for k, v in carried.items()}}


def merge_results(previous: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The results file after a run: one result per setting (module docstring).

    A tool-latency run becomes the top level and keeps the previous compute-bound result (the old
    top level when that was compute-bound, else the previous ``compute_bound``) under
    ``compute_bound``. A compute-bound run goes under ``compute_bound`` when the file's top level is
    a tool-latency result, else it becomes the top level. Files written before settings existed
    are compute-bound, measured before the runtime fixes; they are marked so (``runtime_note``).
    """
    new = with_carried_methods(new, previous)

    def carried(r: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in r.items() if k not in ("compute_bound",)}
        if "setting" not in r:
            out["setting"] = "compute_bound"
            out["runtime_note"] = ("Measured before the runtime fixes of this commit: admission waits parked "
                                   "threads of the default pool and the busy fraction counted queued requests.")
        return out

    if new["setting"] == "tool_latency":
        out = dict(new)
        if previous is not None:
            if previous.get("setting", "compute_bound") == "compute_bound":
                out["compute_bound"] = carried(previous)
            elif previous.get("compute_bound"):
                out["compute_bound"] = previous["compute_bound"]
        return out
    if previous is not None and previous.get("setting") == "tool_latency":
        out = dict(previous)
        out["compute_bound"] = carried(new)
        return out
    return dict(new)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), help=f"any of {METHODS} (other G allowed)")
    p.add_argument("--steps", type=int, default=20, help="policy versions per method")
    p.add_argument("--batch-rollouts", type=int, default=64, help="rollouts per policy version (every method)")
    p.add_argument("--generators", type=int, default=1, help="generator processes (SAO, async GRPO)")
    p.add_argument("--episodes-in-flight", type=int, default=512,
                   help="concurrent episodes per engine (asynchronous methods; admission caps them at "
                        "(tau + 1) x --batch-rollouts ahead of the learner)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "auto"])
    p.add_argument("--calls-median", type=float, default=3.0)
    p.add_argument("--calls-sigma", type=float, default=0.8)
    p.add_argument("--max-calls", type=int, default=16)
    p.add_argument("--tool-latency-median-s", type=float, default=3.0,
                   help="median wall-time latency of one tool call (s); 0 = compute-bound setting")
    p.add_argument("--tool-latency-sigma", type=float, default=1.0, help="log-sd of the tool latency")
    p.add_argument("--tool-latency-max-s", type=float, default=30.0, help="cap on one call's latency (s)")
    p.add_argument("--max-new-tokens", type=int, default=20, help="tokens per turn")
    p.add_argument("--max-episode-tokens", type=int, default=768)
    p.add_argument("--train-tasks", type=int, default=2000)
    p.add_argument("--eval-tasks", type=int, default=64)
    p.add_argument("--eval-samples", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=5, help="snapshot every this many versions")
    p.add_argument("--sft-steps", type=int, default=500)
    p.add_argument("--lr", type=float, default=3.0e-4)
    p.add_argument("--max-staleness", type=int, default=8,
                   help="tau of SAO and asynchronous GRPO (policy versions; 8: prime-rl's and verl V1's default, "
                        "which keeps SAO's generator busy with 3 s tool calls; the run config's default is 4)")
    p.add_argument("--micro-batch-size", type=int, default=4,
                   help="rollouts per micro-batch, every method (rows are trained in length order)")
    p.add_argument("--critic-warmup", type=int, default=1, help="SAO critic-only iterations")
    p.add_argument("--target", type=float, default=None, help="held-out reward target (default: warm start + gain)")
    p.add_argument("--target-gain", type=float, default=0.05)
    p.add_argument("--trace-tasks", type=int, default=128,
                   help="training tasks in the trace bench.simulate replays (32 under-represented the tail)")
    p.add_argument("--trace-samples", type=int, default=8, help="episodes per trace task")
    p.add_argument("--trace-only", action="store_true",
                   help="only re-collect the trace and store it in every setting of the existing JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=REPO / "runs" / "bench" / "async_vs_sync")
    p.add_argument("--no-docs", action="store_true", help="write the JSON only")
    p.add_argument("--engine-modes-only", action="store_true",
                   help="only measure the engine's lockstep vs continuous feeding and add it to the existing JSON")
    p.add_argument("--engine-modes-s", type=float, default=60.0,
                   help="feeding window of each engine-mode measurement (s); continuous feeding takes about a "
                        "minute to reach its steady mix of contexts, which the simulator's engine costs must cover")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs per method (seeds --seed, --seed + 1, ...); the table shows the mean and the range, "
                        "held-out evaluation stays the first run's")
    p.add_argument("--repeat-methods", nargs="+", default=None,
                   help="methods --repeats applies to (default: every method of --methods)")
    p.add_argument("--repeats-only", action="store_true",
                   help="only add runs (up to --repeats per method) to the stored result of this setting")
    p.add_argument("--capacity-sweep", nargs="+", default=None, metavar="TAU:SLOTS[:keep]",
                   help="only run SAO at each staleness bound TAU and episodes in flight SLOTS (--repeats runs "
                        "each; ':keep' lets stale episodes finish) on the stored setting's other arguments, and "
                        "store it with that setting")
    p.add_argument("--keep-stale-episodes", action="store_true",
                   help="generators let an episode that became too stale to train run to its end for the learner "
                        "to drop (generator.abort_stale_episodes=false), as before they cancelled it in flight")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch threads of this process (learner and in-process engines); generator processes use 1")
    args = p.parse_args(argv)
    if args.engine_modes_s <= 0:
        p.error(f"--engine-modes-s: must be > 0 seconds, got {args.engine_modes_s}")
    if args.repeats < 1:
        p.error(f"--repeats: must be >= 1 runs per method, got {args.repeats}")
    unknown = [m for m in args.repeat_methods or [] if m not in args.methods]
    if unknown and not args.repeats_only:
        p.error(f"--repeat-methods: {', '.join(unknown)} is not in --methods ({', '.join(args.methods)})")
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.torch_threads)
    work = args.work_dir.resolve()
    if args.capacity_sweep:
        try:
            [capacity_point(x) for x in args.capacity_sweep]
        except ValueError as exc:
            p.error(str(exc))
    if args.engine_modes_only or args.trace_only or args.repeats_only or args.capacity_sweep:
        only = (engine_modes_only if args.engine_modes_only else trace_only if args.trace_only
                else repeats_only if args.repeats_only else capacity_sweep_only)
        try:
            return only(args, work)
        except (FileNotFoundError, ValueError) as exc:
            print(f"bench.async_vs_sync: {exc}", file=sys.stderr)
            return 2
    work.mkdir(parents=True, exist_ok=True)

    for method in args.methods:  # a bad name or group size fails now, not after the warm start
        try:
            validated(method_config(args, work, method))
        except ValueError as exc:
            p.error(str(exc).splitlines()[0])
    t_all = time.monotonic()
    task_calls = write_tasks(args, work)
    base, sft, prep_s = prepare_shared(args, work)
    print(f"warm start ready in {prep_s:.0f} s: {sft}", flush=True)
    runs = [run_method(method_config(args, work, m), m, base, sft, work / "snapshots" / m, args.eval_every)
            for m in args.methods]
    repeats = {m: run_repeats(args, work, base, sft, m, range(1, args.repeats)) for m in repeat_methods(args)}
    print("evaluating snapshots", flush=True)
    start, rewards = evaluate_snapshots(base, sft, runs)
    target = args.target if args.target is not None else round(start + args.target_gain, 3)
    print("trace and calibration", flush=True)
    trace, trace_rollouts = collect_trace(base, sft, args.trace_tasks, args.trace_samples, args.seed)
    learner_cost = measure_learner_cost(args, work, sft, trace_rollouts)
    engine_modes = measure_engine_modes(base, sft, seconds=args.engine_modes_s, slots=args.episodes_in_flight, seed=args.seed)
    engine = calibrate_engine(sft, batch_sizes=[1, 8, 32], widths=[64, 256, 512], new_tokens=args.max_new_tokens,
                              repeats=2)
    sync = measure_weight_sync(sft, repeats=3)

    methods = {r.method: summarise(r, rewards[r.method], target) for r in runs}
    result = {
        "setting": setting_label(args),
        "command": command_line("bench.async_vs_sync", argv),
        "machine": machine_info(),
        "settings": settings_of(args),
        "task_calls": task_calls,
        "start_reward": start,
        "target": target,
        **headline(methods),
        "methods": methods,
        "trace": trace,
        "engine_calibration": engine,
        "learner_cost": learner_cost,
        "engine_modes": engine_modes,
        "weight_sync": sync,
        "prepare_s": prep_s,
        "total_s": time.monotonic() - t_all,
    }
    add_repeats(result, repeats, args.seed)
    result["total_s"] = time.monotonic() - t_all
    from bench.common import read_result

    merged = merge_results(read_result("async_vs_sync"), result)
    publish_result("async_vs_sync", merged, render(merged), docs=not args.no_docs, shown=render_one(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
