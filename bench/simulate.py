"""Discrete-event simulator of an RL post-training cluster: SAO and GRPO with N generators and M learner GPUs.

What it models (every time in seconds, every length in tokens):

* **Workload**: episodes drawn from a measured trace (``bench/results/async_vs_sync.json`` ->
  ``trace``): per task, a few rollouts of the warm-started policy, each with its prompt length,
  action tokens per turn, observation tokens after each turn and reward. ``token_scale``
  stretches every length (to emulate longer turns than the tiny model's). A GRPO group's
  members are distinct traced rollouts of its task while the task has G of them (a subset of
  independent samples is independent; repeats would finish in lockstep), and its rewards are
  drawn from the task's success-rate posterior (``Workload``), not from its few traced rewards.
  When checking itself against a measured synchronous GRPO run that recorded its episodes, the
  simulator replays those (``Workload.replay``, ``run_replay``: the run's own groups, lengths,
  rewards and tool waits, batch after batch), and draws from the trace only after them
  (asynchronous runs: see ``method_rows``).
* **Tools**: after every turn but the last, ``env_step_s`` plus the ``synthetic_longtail``
  environment's tool latency (log-normal, capped; drawn per task instance: the same draws for
  the G episodes of a group, independent ones for every other group or SAO episode).
* **Generators**: N engines, each running up to ``episodes_in_flight`` episodes. An episode is a
  chain of requests (one per turn: the whole context as prompt, that turn's action tokens to
  decode). Two engine models, both with a decode step time of ``step_s + step_s_per_row * rows``
  and a prefill cost of ``prefill_s_per_token`` per prompt token: ``static`` batching (the
  ``hf`` engine: a batch of queued requests runs until its longest member is done, new
  requests wait, and each row's decode step also pays ``step_s_per_row_token`` per token of the
  batch's left-padded context plus ``step_s_per_kv_sq`` per squared batch context, and every
  token a row samples costs ``sample_s_per_token``; the costs are
  fitted on the batches the engine ran when fed by real episodes, ``engine_costs``) and
  ``continuous`` batching (vLLM: requests join and leave at every step; a prefill pauses
  decoding for its duration). ``pool_workers`` > 0 models the
  generator worker before its fix, whose admission waits and engine batches shared one thread
  pool (``ThreadPool``).
* **Learner**: M GPUs; one iteration on a batch of rollouts takes ``step_s_fixed +
  s_per_token * tokens / M`` (the batch's real tokens: our learner trains rows in length order, so
  padding is small; perfect data parallelism), then a
  weight publication (``publish_s``) during which the learner waits, then every engine reloads
  (``reload_s``; a static engine after its running batch).
* **Methods**: ``sao`` (one rollout per prompt; AReaL-style admission: at most ``(v + tau + 1) * B``
  rollouts started by policy version v; rollouts older than tau versions at consumption are
  dropped and refunded; ``warmup_iterations`` critic-only iterations publish nothing and refund
  their batch, as the SAO learner does),
  ``grpo_async`` (the same runtime with groups of G episodes of one task started together and
  batches of B/G complete groups; groups whose rewards are all equal train nothing and are
  refunded) and ``grpo_sync`` (B/G prompts x G episodes spread over the engines group by group;
  wait for the last episode; train; publish; reload; repeat).

Outputs per run: generator **busy fraction** (the engine's generating time over wall time, as
``posttrain.inference.metering`` measures it with the engine's clock) and **in-engine fraction**
(a request inside the engine, queued or generating: what it measured before), slot occupancy
(mean decoding rows / ``max_batch``), learner busy fraction, and **trained action tokens per
second** and **rollouts per second** between the first and the last policy update (GRPO counts
only tokens of groups with unequal rewards, like ``grpo_train_step``).

The command (a) re-simulates the small runs of ``bench/async_vs_sync.py`` with what that run
measured, read from the JSON at run time (trace, the ``hf`` engine's batch costs fitted on the
batches its ``engine_modes`` timed and the speed factor those feedings imply, each run's own
generation time where recorded, learner step times, publish and reload costs, tool latency,
which generator worker and busy clock it had) and
reports the relative error of each predicted quantity per method, then (b) projects busy
fraction and the SAO / synchronous-GRPO throughput ratio for N = 8 ... 1024 with a GPU-like
parameter set (every assumed number is printed beside the result), and plots both against N.

Run: ``.venv/bin/python -m bench.simulate`` (about 5 minutes on one core, 3 of them for N =
1024), ``.venv/bin/python -m bench.simulate --ns 8 64`` for a quick look, or
``.venv/bin/python -m bench.simulate --validate-only`` for the check against the small runs alone
(printed, nothing written).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from bench.common import ENGINE_MODES, GROUP_FEED_SIZE, Method, method_kind, point_label, stored_settings

"""Simulated methods (see the module docstring)."""


# ------------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class RolloutShape:
    """Lengths of one episode.

    Attributes:
        prompt_tokens: Tokens before the first action (system and user messages, template).
        action_tokens: Tokens decoded in each turn, in order (>= 1 turn).
        observation_tokens: Tokens appended after each turn (tool output and delimiters; 0 after the last).
        reward: The episode's reward (decides whether a GRPO group is uniform).
        tool_waits_s: Seconds of tool latency after each turn but the last, when the episode was
            recorded with them (a run's replayed episode); empty: the cluster draws them.
    """

    prompt_tokens: int
    action_tokens: tuple[int, ...]
    observation_tokens: tuple[int, ...]
    reward: float
    tool_waits_s: tuple[float, ...] = ()

    @property
    def total_tokens(self) -> int:
        """Prompt, actions and observations (the learner's row length)."""
        return self.prompt_tokens + sum(self.action_tokens) + sum(self.observation_tokens)


@dataclass(frozen=True)
class Workload:
    """Tasks, each with the measured rollouts of one task (GRPO groups: see ``Cluster._group``).

    ``reward_beta`` (one ``(a, b)`` per task, or empty): when every traced reward is 0 or 1, a
    GRPO group's rewards are drawn as Bernoulli(p) with p ~ Beta(a, b), the posterior of the
    task's success rate given its k of n traced successes under a Beta prior fitted to all tasks
    (method of moments): a = k + kappa * m, b = n - k + kappa * (1 - m). Drawing G rewards
    from the n traced ones instead makes groups uniform far too often when n < G (four traced
    zeros say little about eight new samples). The lengths still come from the traced rollouts.
    """

    tasks: tuple[tuple[RolloutShape, ...], ...]
    reward_beta: tuple[tuple[float, float], ...] = ()
    replay: tuple[tuple[RolloutShape, ...], ...] = ()
    """A measured run's episodes, one tuple per group (SAO: per episode), in the order the run
    started them (``run_replay``): the cluster's first units are these, in order, and it draws from
    ``tasks`` only when they run out (episodes still running when the run ended)."""

    @classmethod
    def from_trace(cls, trace: Sequence[dict[str, Any]], token_scale: float = 1.0) -> Workload:
        """Build from ``async_vs_sync.json``'s ``trace`` (one dict per task with ``rollouts``).

        Args:
            trace: ``[{"rollouts": [{"prompt_tokens", "action_tokens", "observation_tokens", "reward"}]}]``.
            token_scale: Multiplies every length (rounded, at least 1 action token per turn).

        Raises:
            ValueError: an empty trace, a task without rollouts, or a rollout without turns.
        """
        if not trace:
            raise ValueError("trace: empty")
        tasks = []
        for i, entry in enumerate(trace):
            shapes = []
            for j, r in enumerate(entry.get("rollouts", [])):
                if not r["action_tokens"]:
                    raise ValueError(f"trace[{i}].rollouts[{j}].action_tokens: empty (a rollout has at least one turn)")
                shapes.append(RolloutShape(
                    prompt_tokens=max(1, round(r["prompt_tokens"] * token_scale)),
                    action_tokens=tuple(max(1, round(a * token_scale)) for a in r["action_tokens"]),
                    observation_tokens=tuple(round(o * token_scale) for o in r["observation_tokens"]),
                    reward=float(r["reward"]),
                ))
            if not shapes:
                raise ValueError(f"trace[{i}].rollouts: empty")
            tasks.append(tuple(shapes))
        return cls(tuple(tasks), reward_posteriors(tasks))

    def task(self, rng: random.Random) -> tuple[RolloutShape, ...]:
        """A uniformly drawn task's rollouts."""
        return self.tasks[rng.randrange(len(self.tasks))]

    def rollout(self, rng: random.Random) -> RolloutShape:
        """A rollout of a uniformly drawn task."""
        shapes = self.task(rng)
        return shapes[rng.randrange(len(shapes))]

    def summary(self) -> dict[str, float]:
        """Mean and max turns, mean action tokens per rollout, over all rollouts."""
        flat = [s for t in self.tasks for s in t]
        return {
            "rollouts": float(len(flat)),
            "turns_mean": statistics.fmean(len(s.action_tokens) for s in flat),
            "turns_max": float(max(len(s.action_tokens) for s in flat)),
            "action_tokens_mean": statistics.fmean(sum(s.action_tokens) for s in flat),
            "total_tokens_mean": statistics.fmean(s.total_tokens for s in flat),
        }


def reward_posteriors(tasks: Sequence[Sequence[RolloutShape]]) -> tuple[tuple[float, float], ...]:
    """Beta posterior ``(a, b)`` of each task's success rate (see ``Workload``); () for non-binary rewards.

    Prior Beta(kappa * m, kappa * (1 - m)): m is the mean reward over all traced rollouts, and
    kappa = m (1 - m) / var_p - 1 with var_p = (var(k / n) - m (1 - m) / n) / (1 - 1 / n), the
    spread of the tasks' rates beyond binomial noise (mean n per task). With var_p <= 0 every
    task gets the pooled rate m (kappa very large).
    """
    rewards = [[s.reward for s in t] for t in tasks]
    if len(tasks) < 2 or any(r not in (0.0, 1.0) for rs in rewards for r in rs):
        return ()
    n = statistics.fmean(len(rs) for rs in rewards)
    m = statistics.fmean(r for rs in rewards for r in rs)
    if n < 2 or m in (0.0, 1.0):
        return ()
    var_p = (statistics.pvariance([sum(rs) / len(rs) for rs in rewards]) - m * (1 - m) / n) / (1 - 1 / n)
    kappa = m * (1 - m) / var_p - 1 if var_p > 0 else 1e6
    kappa = max(kappa, 1e-3)
    return tuple((sum(rs) + kappa * m, len(rs) - sum(rs) + kappa * (1 - m)) for rs in rewards)


# ---------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class EngineModel:
    """One generator's inference engine (seconds).

    Attributes:
        batching: ``static`` (hf: a batch runs until its longest request ends) or ``continuous`` (vLLM).
        max_batch: Most sequences decoded together.
        step_s: Decode step time at zero rows (fixed cost per step).
        step_s_per_row: Extra decode step time per row in the batch.
        prefill_s_per_token: Prefill time per prompt token.
        step_s_per_row_token: Extra decode step time per row per context token (a static batch's
            rows all attend over the padded width; 0 for the continuous model).
        step_s_per_kv_sq: Extra decode step time per squared batch context, ``(rows * width)**2``
            (seconds per token squared): on the CPU a step's cost per context token grows with the
            batch's KV cache (64 rows x 578 tokens took 1.7x what a fit on batches of at most
            32 x 512 predicted); 0 for the continuous model.
        sample_s_per_token: Time per token sampled in a static batch (only rows still generating
            sample: the ``hf`` engine draws row by row on the host, about a third of a 64-row
            decode step per sampled token on the CPU); 0 for the continuous model.
    """

    batching: Literal["static", "continuous"] = "static"
    max_batch: int = 32
    step_s: float = 0.01
    step_s_per_row: float = 0.0005
    prefill_s_per_token: float = 1e-5
    step_s_per_row_token: float = 0.0
    step_s_per_kv_sq: float = 0.0
    sample_s_per_token: float = 0.0

    def step_time(self, rows: int, width: int = 0) -> float:
        """Seconds per decode step with ``rows`` sequences over a context of ``width`` tokens."""
        return (self.step_s + rows * (self.step_s_per_row + self.step_s_per_row_token * width)
                + self.step_s_per_kv_sq * (rows * width) ** 2)


@dataclass(frozen=True)
class LearnerModel:
    """The learner (seconds).

    Attributes:
        gpus: M, learner devices (data parallel, perfect scaling).
        step_s_fixed: Per-iteration cost independent of the batch.
        s_per_token: Seconds per trained token (the batch's real tokens; the learner orders rows by
            length, so micro-batches carry little padding) on one device.
        warmup_iterations: Leading iterations that train without publishing a version (SAO critic warm-up).
    """

    gpus: int = 1
    step_s_fixed: float = 0.0
    s_per_token: float = 1e-4
    warmup_iterations: int = 0

    def train_time(self, batch: Sequence[RolloutShape]) -> float:
        """Seconds for one iteration on ``batch``."""
        return self.step_s_fixed + self.s_per_token * sum(s.total_tokens for s in batch) / self.gpus


@dataclass(frozen=True)
class ClusterConfig:
    """One simulated run.

    Attributes:
        method: ``sao``, ``grpo_async`` or ``grpo_sync``.
        generators: N engines.
        episodes_in_flight: Episode slots per generator (async methods; GRPO groups use G slots).
        batch_rollouts: B, rollouts per learner iteration.
        group_size: G for GRPO (1 for SAO).
        max_staleness: tau, policy versions (async methods).
        steps: Policy versions to publish before the run ends.
        publish_s: Seconds the learner spends publishing a version.
        reload_s: Seconds an engine spends loading a new version.
        env_step_s: Seconds between a turn's end and the next request (environment step).
        engine: Engine model.
        learner: Learner model.
        seed: Sampling seed.
        engine_scale_idle: Multiplies engine batch times while the learner is idle (CPU share, see
            ``cpu_share``; 1 on dedicated devices).
        engine_scale_learner_busy: The same while the learner trains (on a shared CPU the learner
            takes cores from the generators).
        tool_latency_median_s: Median wall time of one tool call (seconds; 0: instantaneous tools),
            the ``synthetic_longtail`` environment's latency: after every turn but the last, a delay
            of ``min(tool_latency_max_s, median * exp(tool_latency_sigma * z))``, z ~ N(0, 1) drawn
            per (task instance, call index): the G episodes of a GRPO group wait alike, and every
            group or SAO episode is a new task instance (``Cluster._tool_latency``).
        tool_latency_sigma: Standard deviation of the latency's logarithm.
        tool_latency_max_s: Cap on one call's latency (seconds).
        pool_workers: 0 for the current generator worker (tickets awaited on the event loop, the
            engine on its own thread). ``W > 0`` models the worker before that fix: the engine's
            batches and every slot's blocking ``admission.acquire(acquire_timeout_s)`` shared
            asyncio's default pool of W threads (``ThreadPool``).
        acquire_timeout_s: Longest blocking ``acquire`` call (seconds) in the ``pool_workers`` model.
        abort_stale: Asynchronous methods: when a version is published, cancel every unit in flight
            whose first turn has returned and whose start version is more than ``max_staleness``
            behind it, and give its slot and tickets back (``generator.abort_stale_episodes``, the
            generator's default). A request of it still queued in the engine is skipped; one in a
            running batch finishes. False: the unit runs to its end and the learner drops it.
    """

    method: Method = "sao"
    generators: int = 1
    episodes_in_flight: int = 32
    batch_rollouts: int = 32
    group_size: int = 1
    max_staleness: int = 2
    steps: int = 10
    publish_s: float = 0.0
    reload_s: float = 0.0
    env_step_s: float = 0.0
    engine: EngineModel = field(default_factory=EngineModel)
    learner: LearnerModel = field(default_factory=LearnerModel)
    seed: int = 0
    engine_scale_idle: float = 1.0
    engine_scale_learner_busy: float = 1.0
    tool_latency_median_s: float = 0.0
    tool_latency_sigma: float = 0.0
    tool_latency_max_s: float = 60.0
    pool_workers: int = 0
    acquire_timeout_s: float = 1.0
    abort_stale: bool = True

    def __post_init__(self) -> None:
        """Validate cross-field constraints.

        Raises:
            ValueError: a count below 1, or ``batch_rollouts`` not a multiple of ``group_size``.
        """
        for name in ("generators", "episodes_in_flight", "batch_rollouts", "group_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.batch_rollouts % self.group_size:
            raise ValueError(f"batch_rollouts ({self.batch_rollouts}) must be a multiple of group_size ({self.group_size})")
        if self.method == "sao" and self.group_size != 1:
            raise ValueError(f"group_size: must be 1 for method sao, got {self.group_size}")


@dataclass
class SimResult:
    """What a simulated run measured (see the module docstring).

    ``busy_fraction`` is the engine's generating time over wall time (``posttrain.inference.metering``
    with the engine's clock); ``in_engine_fraction`` counts time with a request inside the engine,
    queued or generating (that module's fallback, and its only clock before the fix).
    ``generation_phase_s`` (synchronous GRPO) is the mean seconds from the start of a step's
    generation to its last episode's end (``generator/batch_s`` of the real runner).
    """

    busy_fraction: float
    in_engine_fraction: float
    generation_phase_s: float | None
    slot_occupancy: float
    learner_busy_fraction: float
    trained_action_tokens_per_s: float
    rollouts_per_s: float
    window_s: float
    wall_s: float
    updates: int
    stale_dropped: int
    events: int
    generating_s_per_rollout: float = 0.0
    """Mean engine generating seconds per finished rollout, over the whole run and all engines."""
    stale_aborted: int = 0
    """Rollouts cancelled in flight as stale (``ClusterConfig.abort_stale``)."""
    mean_batch_rows: float = 0.0
    """Requests per engine batch (static batching; 0 for continuous), over all engines."""


# -------------------------------------------------------------------------------- event loop
class EventLoop:
    """A time-ordered queue of callbacks (ties run in scheduling order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.events = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``t`` (not before now)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    def run(self, until: Callable[[], bool], max_events: int) -> None:
        """Run events until ``until()`` holds or the queue is empty.

        Raises:
            RuntimeError: more than ``max_events`` events (a run that cannot finish).
        """
        while self._heap and not until():
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()
            self.events += 1
            if self.events > max_events:
                raise RuntimeError(f"simulation exceeded {max_events} events at t={self.now:.1f}s")


@dataclass
class Request:
    """One turn's generation request; ``live()`` False means its episode was cancelled (skipped while queued)."""

    prompt: int
    new: int
    done: Callable[[], None]
    live: Callable[[], bool] = lambda: True


class ThreadPool:
    """A FIFO pool of ``workers`` threads shared by blocking jobs (asyncio's default executor).

    Models the generator worker before its fix: ``asyncio.to_thread`` ran both the ``hf``
    engine's batches and every episode slot's blocking ``admission.acquire(1.0)``, so a batch
    could wait in the pool's queue behind slots waiting for tickets.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers: must be >= 1, got {workers}")
        self.free = workers
        self._queue: deque[Callable[[Callable[[], None]], None]] = deque()

    def submit(self, job: Callable[[Callable[[], None]], None]) -> None:
        """Run ``job(release)`` on a free worker now or when one frees up; ``release()`` frees it."""
        self._queue.append(job)
        self._dispatch()

    def _dispatch(self) -> None:
        while self.free > 0 and self._queue:
            self.free -= 1
            job = self._queue.popleft()
            released = {"done": False}

            def release(released: dict[str, bool] = released) -> None:
                if not released["done"]:
                    released["done"] = True
                    self.free += 1
                    self._dispatch()

            job(release)


class Engine:
    """A simulated engine with busy and occupancy accounting (see ``EngineModel``).

    Two busy clocks: ``generating`` (a batch or decode step is running: what
    ``posttrain.inference.metering`` measures with the engine's own clock) and ``in_engine`` (at least
    one request inside, queued or generating: what it measured before, and still does for engines
    without a clock). With a ``pool`` (static batching only), each batch first waits for a worker.
    """

    def __init__(self, loop: EventLoop, model: EngineModel, scale: Callable[[], float] = lambda: 1.0,
                 pool: ThreadPool | None = None) -> None:
        self.loop, self.model = loop, model
        self._scale = scale
        self.pool = pool
        self.outstanding = 0
        self.busy_s = 0.0
        self._busy_since = 0.0
        self.gen_s = 0.0
        self._gen_since: float | None = None
        self.row_seconds = 0.0
        self.batches = 0
        self.batch_rows = 0
        # static batching
        self._queue: deque[Request] = deque()
        self._running = False
        self._start_pending = False
        self._reload_pending = 0.0
        self._stall_end = 0.0
        # continuous batching
        self._phi = 0.0
        self._last = 0.0
        self._stall_start = 0.0
        self._active: list[tuple[float, int, Request]] = []
        self._ids = itertools.count()
        self._token = 0

    # accounting -------------------------------------------------------------------------
    def _enter(self) -> None:
        if self.outstanding == 0:
            self._busy_since = self.loop.now
        self.outstanding += 1

    def _leave(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self.busy_s += self.loop.now - self._busy_since

    def busy_until_now(self) -> float:
        """In-engine seconds so far (a request inside, queued or generating), including an open period."""
        return self.busy_s + (self.loop.now - self._busy_since if self.outstanding else 0.0)

    def generating_until_now(self) -> float:
        """Generating seconds so far (a batch or decode step running), including an open period."""
        if self.model.batching == "continuous":
            self._advance()
            return self.gen_s
        return self.gen_s + (self.loop.now - self._gen_since if self._gen_since is not None else 0.0)

    # public -----------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Accept a request; ``request.done`` runs when its tokens are decoded."""
        self._enter()
        if self.model.batching == "static":
            self._queue.append(request)
            if not self._start_pending:
                # Like the hf engine's batching loop: requests submitted at the same instant share a batch.
                self._start_pending = True
                self.loop.at(self.loop.now, self._maybe_start)
        else:
            self._advance()
            self._stall(self.model.prefill_s_per_token * request.prompt)
            heapq.heappush(self._active, (self._phi + request.new, next(self._ids), request))
            self._reschedule()

    def reload(self, seconds: float) -> None:
        """Load new weights: after the running batch (static) or now, pausing decoding (continuous)."""
        if seconds <= 0:
            return
        if self.model.batching == "static":
            if self._running:
                self._reload_pending += seconds
            else:
                self._stall_end = max(self._stall_end, self.loop.now) + seconds
                self.loop.at(self._stall_end, self._maybe_start)
        else:
            self._advance()
            self._stall(seconds)
            self._reschedule()

    # static batching ----------------------------------------------------------------------
    def _maybe_start(self) -> None:
        self._start_pending = False
        if self._running or not self._queue:
            return
        now = self.loop.now
        if self._reload_pending > 0:
            self._stall_end = max(self._stall_end, now) + self._reload_pending
            self._reload_pending = 0.0
        if now < self._stall_end:
            self.loop.at(self._stall_end, self._maybe_start)
            return
        batch: list[Request] = []  # a request cancelled while queued is skipped, as the hf engine does
        while self._queue and len(batch) < self.model.max_batch:
            r = self._queue.popleft()
            if r.live():
                batch.append(r)
            else:
                self._leave()
        if not batch:
            return
        self._running = True
        if self.pool is None:
            self._run_batch(batch, lambda: None)
        else:  # the batch is formed, then waits for a worker thread (requests arriving meanwhile wait too)
            self.pool.submit(lambda release: self._run_batch(batch, release))

    def _run_batch(self, batch: list[Request], release: Callable[[], None]) -> None:
        now = self.loop.now
        rows = len(batch)
        self.batches += 1
        self.batch_rows += rows
        width = max(r.prompt for r in batch)
        steps = max(r.new for r in batch)
        decode = steps * self.model.step_time(rows, width + steps // 2)
        sampling = self.model.sample_s_per_token * sum(r.new for r in batch)
        duration = (self.model.prefill_s_per_token * rows * width + decode + sampling) * self._scale()
        self.row_seconds += rows * duration
        self._gen_since = now

        def finish() -> None:
            self._running = False
            self.gen_s += self.loop.now - now
            self._gen_since = None
            release()
            for r in batch:
                self._leave()
                r.done()
            self._maybe_start()

        self.loop.at(now + duration, finish)

    # continuous batching ------------------------------------------------------------------
    def _stall(self, seconds: float) -> None:
        now = self.loop.now
        if self._stall_end <= now:
            self._stall_start, self._stall_end = now, now + seconds
        else:
            self._stall_end += seconds

    def _advance(self) -> None:
        now = self.loop.now
        dt = now - self._last
        overlap = max(0.0, min(now, self._stall_end) - max(self._last, self._stall_start))
        if self._active and dt > 0:
            rows = len(self._active)
            self._phi += (dt - overlap) / self.model.step_time(rows)
            self.row_seconds += rows * dt
            self.gen_s += dt - overlap
        self._last = now

    def _reschedule(self) -> None:
        self._token += 1
        if not self._active:
            return
        token = self._token
        need = (self._active[0][0] - self._phi) * self.model.step_time(len(self._active))
        start = max(self.loop.now, self._stall_end)
        self.loop.at(start + max(need, 0.0), lambda: self._complete(token))

    def _complete(self, token: int) -> None:
        if token != self._token:
            return
        self._advance()
        finished = []
        while self._active and self._active[0][0] <= self._phi + 1e-9:
            finished.append(heapq.heappop(self._active)[2])
        for _ in finished:
            self._leave()
        self._reschedule()
        for r in finished:
            r.done()


# -------------------------------------------------------------------------------- the cluster
@dataclass(eq=False)
class Unit:
    """An asynchronous unit in flight (one SAO episode or one GRPO group) on generator ``gen``.

    ``version`` is the learner's version when it started (rollouts, policy versions); ``versioned``
    turns True when its first turn returns (the generator knows its oldest version from then on);
    ``aborted`` when ``Cluster._abort_stale`` cancelled it.
    """

    uid: int
    gen: int
    version: int
    size: int
    versioned: bool = False
    aborted: bool = False


class Cluster:
    """Generators, learner and the controller of one method; call ``run()``."""

    def __init__(self, config: ClusterConfig, workload: Workload) -> None:
        self.cfg, self.workload = config, workload
        self.rng = random.Random(config.seed)
        self.loop = EventLoop()
        self.pools = [ThreadPool(config.pool_workers) if config.pool_workers > 0 else None
                      for _ in range(config.generators)]
        self.engines = [Engine(self.loop, config.engine, self._engine_scale, pool) for pool in self.pools]
        self._gen_phases: list[float] = []
        self._acquiring: list[bool] = [False] * config.generators  # a group slot holds the group lock
        self._held: deque[tuple[int, Callable[[], None], Callable[[], None]]] = deque()  # pool-model waiters
        self.version = 0
        self.iteration = 0
        self.started = 0  # rollouts started and not refunded (admission)
        self.ready: deque[tuple[list[RolloutShape], int]] = deque()  # complete units (1 rollout or a group)
        self.learner_busy = False
        self.learner_busy_s = 0.0
        self.waiting: deque[int] = deque()  # generator index of each slot waiting for admission, FIFO
        self.updates: list[tuple[float, float, float]] = []  # (time, rollouts, trained action tokens)
        self.stale_dropped = 0
        self.stale_aborted = 0
        self._units: dict[int, Unit] = {}  # asynchronous units in flight, by id
        self._unit_ids = itertools.count()
        self.finished_rollouts = 0
        self._sync_left = 0
        self._instances = itertools.count()  # task instances drawn so far (tool-latency seeds)
        self._replayed = 0  # units of workload.replay started so far

    def _engine_scale(self) -> float:
        return self.cfg.engine_scale_learner_busy if self.learner_busy else self.cfg.engine_scale_idle

    # episodes -------------------------------------------------------------------------------
    def _tool_latency(self, instance: int, call: int) -> float:
        """Seconds of the ``call``-th tool call of an episode of task instance ``instance`` (0 without latency).

        ``instance`` numbers the tasks the run draws (one per SAO episode, one per GRPO group), not
        the trace's task: the real run draws from thousands of tasks, each with its own latencies
        (``synthetic_longtail`` seeds them by task id), and the trace's few tasks only lend their
        lengths and rewards. Seeding by trace task made concurrent episodes of one trace task wait
        alike and share batches they would not share.
        """
        c = self.cfg
        if c.tool_latency_median_s <= 0:
            return 0.0
        z = random.Random((c.seed * 1_000_003 + instance) * 101 + call).gauss(0.0, 1.0)
        return min(c.tool_latency_max_s, c.tool_latency_median_s * math.exp(c.tool_latency_sigma * z))

    def _episode(self, gen: int, shape: RolloutShape, on_done: Callable[[], None], instance: int = 0,
                 unit: Unit | None = None) -> None:
        engine = self.engines[gen]
        state = {"turn": 0, "context": shape.prompt_tokens}
        live = (lambda: not unit.aborted) if unit is not None else (lambda: True)

        def submit() -> None:
            if live():
                engine.submit(Request(state["context"], shape.action_tokens[state["turn"]], after_turn, live))

        def after_turn() -> None:
            if not live():
                return
            if unit is not None:
                unit.versioned = True
            turn = state["turn"]
            state["context"] += shape.action_tokens[turn] + (shape.observation_tokens[turn] if turn < len(shape.observation_tokens) else 0)
            state["turn"] = turn + 1
            if state["turn"] >= len(shape.action_tokens):
                on_done()
                return
            wait = self.cfg.env_step_s + (shape.tool_waits_s[turn] if shape.tool_waits_s
                                          else self._tool_latency(instance, turn))
            if wait > 0:
                self.loop.at(self.loop.now + wait, submit)
            else:
                submit()

        submit()

    def _group(self, gen: int, on_done: Callable[[list[RolloutShape], int], None],
               shapes: list[RolloutShape] | None = None, unit: Unit | None = None) -> None:
        """Start G episodes of one task on ``gen``; ``on_done(shapes, start_version)`` after the last.

        The members are ``shapes`` when given (a replay of measured episodes), else G distinct
        traced rollouts of a drawn task when it has at least G (G fresh samples of the policy;
        drawing with replacement repeated shapes, whose episodes then end together and made groups
        finish early: asynchronous GRPO's rollouts/s +22%), else G draws with replacement.
        """
        if shapes is None:
            shapes = self._draw_group()
        version = self.version
        instance = next(self._instances)  # the G episodes share one task, hence its tool latencies
        left = {"n": len(shapes)}

        def one_done() -> None:
            self.finished_rollouts += 1
            left["n"] -= 1
            if left["n"] == 0:
                on_done(shapes, version)

        for s in shapes:
            self._episode(gen, s, one_done, instance, unit)

    def _draw_group(self) -> list[RolloutShape]:
        """The workload's next replayed unit, else G rollouts of a uniformly drawn task, rewards from its posterior.

        See ``_group`` and ``Workload.replay``.
        """
        if self._replayed < len(self.workload.replay):
            self._replayed += 1
            return list(self.workload.replay[self._replayed - 1])
        index = self.rng.randrange(len(self.workload.tasks))
        task = self.workload.tasks[index]
        g = self.cfg.group_size
        shapes = (self.rng.sample(task, g) if g <= len(task)
                  else [task[self.rng.randrange(len(task))] for _ in range(g)])
        if self.workload.reward_beta and g > 1:
            # Rewards from the task's success-rate posterior; lengths from the task's traced rollouts.
            p = self.rng.betavariate(*self.workload.reward_beta[index])
            shapes = [replace(sh, reward=1.0 if self.rng.random() < p else 0.0) for sh in shapes]
        return shapes

    # asynchronous methods -------------------------------------------------------------------
    def _capacity(self) -> int:
        return (self.version + self.cfg.max_staleness + 1) * self.cfg.batch_rollouts

    def _slot(self, gen: int) -> None:
        if self.pools[gen] is not None:
            self._slot_blocking(gen)
            return
        g = self.cfg.group_size
        if self.started + g > self._capacity():
            self.waiting.append(gen)
            return
        self.started += g
        self._start_unit(gen)

    def _start_unit(self, gen: int) -> None:
        unit = Unit(next(self._unit_ids), gen, self.version, self.cfg.group_size)
        self._units[unit.uid] = unit

        def done(shapes: list[RolloutShape], version: int) -> None:
            del self._units[unit.uid]
            self.ready.append((shapes, version))
            self._slot(gen)
            self._maybe_train()

        self._group(gen, done, unit=unit)

    def _abort_stale(self) -> None:
        """Cancel the units in flight the new version made too stale (``ClusterConfig.abort_stale``); restart their slots."""
        doomed = [u for u in self._units.values()
                  if u.versioned and self.version - u.version > self.cfg.max_staleness]
        for u in doomed:
            u.aborted = True
            del self._units[u.uid]
            self.started -= u.size
            self.stale_aborted += u.size
        for u in doomed:
            self._slot(u.gen)

    def _slot_blocking(self, gen: int) -> None:
        """The worker before the fix: a slot's ``acquire`` holds a pool thread until a ticket or its timeout.

        GRPO group slots take their G tickets one group at a time (the worker's group lock): only
        one of them is in ``acquire`` per generator; the others wait on the lock, not in the pool.
        """
        g = self.cfg.group_size
        if g > 1:
            if self._acquiring[gen]:
                self.waiting.append(gen)
                return
            self._acquiring[gen] = True
        pool = self.pools[gen]
        assert pool is not None

        def job(release: Callable[[], None]) -> None:
            state = {"open": True}

            def take() -> None:  # capacity allows: the ticket(s) are taken, the thread returns
                state["open"] = False
                self.started += g
                release()
                if g > 1:
                    self._acquiring[gen] = False
                    if gen in self.waiting:
                        self.waiting.remove(gen)
                        self._slot(gen)
                self._start_unit(gen)

            def timeout() -> None:  # acquire returned None: the slot loops and queues a new acquire
                if state["open"]:
                    state["open"] = False
                    self._held = deque(h for h in self._held if h[1] is not take)
                    release()
                    if g > 1:
                        self._acquiring[gen] = False
                    self._slot_blocking(gen)

            if self.started + g <= self._capacity():
                take()
                return
            self._held.append((gen, take, timeout))
            self.loop.at(self.loop.now + self.cfg.acquire_timeout_s, timeout)

        pool.submit(job)

    def _kept(self, units: list[tuple[list[RolloutShape], int]]) -> tuple[float, int]:
        """Trained action tokens and rollouts of a batch: all (SAO), or groups with unequal rewards (GRPO)."""
        tokens, rollouts = 0.0, 0
        for shapes, _ in units:
            if self.cfg.method != "sao" and len({s.reward for s in shapes}) == 1:
                continue
            tokens += sum(sum(s.action_tokens) for s in shapes)
            rollouts += len(shapes)
        return tokens, rollouts

    def _maybe_train(self) -> None:
        if self.learner_busy or len(self.updates) >= self.cfg.steps:
            return
        need = self.cfg.batch_rollouts // self.cfg.group_size
        fresh: list[tuple[list[RolloutShape], int]] = []
        refunded = False
        while self.ready and len(fresh) < need:
            unit = self.ready.popleft()
            if self.version - unit[1] > self.cfg.max_staleness:
                self.stale_dropped += len(unit[0])
                self.started -= len(unit[0])
                refunded = True
                continue
            fresh.append(unit)
        if refunded:
            self._wake()
        if len(fresh) < need:
            self.ready.extendleft(reversed(fresh))
            return
        batch = [s for shapes, _ in fresh for s in shapes]
        tokens, kept = self._kept(fresh)
        self._train(batch, tokens, refund=len(batch) - kept if self.cfg.method == "grpo_async" else 0)

    def _wake(self) -> None:
        """Start waiting slots, oldest first, while admission capacity allows."""
        g = self.cfg.group_size
        while self._held and self.started + g <= self._capacity():
            self._held.popleft()[1]()
        if self.cfg.pool_workers > 0:
            return  # pool model: waiting slots hold a thread (``_held``) or wait on the group lock
        while self.waiting and self.started + g <= self._capacity():
            self._slot(self.waiting.popleft())

    # the learner ------------------------------------------------------------------------------
    def _train(self, batch: list[RolloutShape], tokens: float, refund: int = 0) -> None:
        self.learner_busy = True
        seconds = self.cfg.learner.train_time(batch)
        publishes = self.iteration >= self.cfg.learner.warmup_iterations
        total = seconds + (self.cfg.publish_s if publishes else 0.0)
        self.learner_busy_s += total

        def done() -> None:
            self.iteration += 1
            # A warm-up iteration makes no version: its batch gives its admission slots back (the learner's rule).
            self.started -= refund if publishes else len(batch)
            if publishes:
                self.version += 1
                self.updates.append((self.loop.now, float(len(batch)), tokens))
                if self.cfg.abort_stale and self.cfg.method != "grpo_sync":
                    self._abort_stale()
                for e in self.engines:
                    e.reload(self.cfg.reload_s)
            self.learner_busy = False
            if self.cfg.method == "grpo_sync":
                self._sync_iteration()
            else:
                self._wake()
                self._maybe_train()

        self.loop.at(self.loop.now + total, done)

    # synchronous GRPO ---------------------------------------------------------------------------
    def _sync_iteration(self) -> None:
        if len(self.updates) >= self.cfg.steps:
            return
        groups = self.cfg.batch_rollouts // self.cfg.group_size
        units: list[tuple[list[RolloutShape], int]] = []
        self._sync_left = groups
        started = self.loop.now

        def group_done(shapes: list[RolloutShape], version: int) -> None:
            units.append((shapes, version))
            self._sync_left -= 1
            if self._sync_left == 0:
                self._gen_phases.append(self.loop.now - started)
                tokens, _ = self._kept(units)
                self._train([s for sh, _ in units for s in sh], tokens)

        for i in range(groups):
            self._group(i % self.cfg.generators, group_done)

    # running ------------------------------------------------------------------------------------
    def run(self, max_events: int = 50_000_000) -> SimResult:
        """Simulate until ``steps`` versions are published.

        Raises:
            RuntimeError: the run cannot finish within ``max_events`` events.
        """
        if self.cfg.method == "grpo_sync":
            self._sync_iteration()
        else:
            slots = max(1, self.cfg.episodes_in_flight // self.cfg.group_size)
            for gen in range(self.cfg.generators):
                for _ in range(slots):
                    self._slot(gen)
        self.loop.run(lambda: len(self.updates) >= self.cfg.steps, max_events)
        wall = self.loop.now
        in_engine = statistics.fmean(e.busy_until_now() for e in self.engines) / wall if wall > 0 else 0.0
        busy = statistics.fmean(e.generating_until_now() for e in self.engines) / wall if wall > 0 else 0.0
        occupancy = statistics.fmean(e.row_seconds for e in self.engines) / (wall * self.cfg.engine.max_batch) if wall > 0 else 0.0
        window, tokens, rollouts = steady_window(self.updates)
        return SimResult(
            busy_fraction=min(1.0, busy),
            in_engine_fraction=min(1.0, in_engine),
            generation_phase_s=statistics.fmean(self._gen_phases) if self._gen_phases else None,
            slot_occupancy=min(1.0, occupancy),
            learner_busy_fraction=min(1.0, self.learner_busy_s / wall) if wall > 0 else 0.0,
            trained_action_tokens_per_s=tokens / window if window > 0 else 0.0,
            rollouts_per_s=rollouts / window if window > 0 else 0.0,
            window_s=window,
            wall_s=wall,
            updates=len(self.updates),
            stale_dropped=self.stale_dropped,
            stale_aborted=self.stale_aborted,
            mean_batch_rows=(sum(e.batch_rows for e in self.engines) / batches
                             if (batches := sum(e.batches for e in self.engines)) else 0.0),
            generating_s_per_rollout=sum(e.generating_until_now() for e in self.engines) / max(self.finished_rollouts, 1),
            events=self.loop.events,
        )


def steady_window(updates: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """``(seconds, rollouts, trained tokens)`` from the first to the last update, the first's own excluded.

    The same window ``bench/async_vs_sync.py`` measures: the first update's batch was produced
    during start-up, so it is left out. Zeros with fewer than two updates.
    """
    if len(updates) < 2:
        return 0.0, 0.0, 0.0
    window = updates[-1][0] - updates[0][0]
    return window, sum(u[2] for u in updates[1:]), sum(u[1] for u in updates[1:])


def simulate(config: ClusterConfig, workload: Workload) -> SimResult:
    """Run one simulation of ``config`` on ``workload`` (see ``Cluster``)."""
    return Cluster(config, workload).run()


# ----------------------------------------------------------------------------------- validation
def cpu_share(cores: int, background_load: float, busy: int) -> float:
    """Cores one busy single-threaded process gets when ``busy`` of ours and ``background_load`` others run.

    ``min(1, cores / (background_load + busy))``: the fair share of a CPU-bound process on a Linux
    machine with ``cores`` cores (other users' work counted by its run-queue load).
    """
    return min(1.0, cores / max(background_load + busy, 1e-9))


GENERATOR_BUSY_THREADS = 1
"""CPU-busy threads of a generating generator: the ``hf`` engine's batch thread.

The generator's event loop (agent loop, tokenizer, environment, Redis) also runs, but between
batches and briefly: the gap between two batches of real episodes was 12 ms on average against
0.1-1.7 s batches (``engine_modes``, 64 slots). Counting it as a second busy thread made a
learner beside the generator cost the engine x1.5 on 2 idle cores; with engine costs fitted on
the engine's own batches that under-predicted compute-bound SAO and asynchronous GRPO by 14-16%
on the runs measured before this change, and one thread brought both within 10%. (Two threads
had compensated for the calibration grid's too cheap wide batches.)
"""


def measured_config(measured: dict[str, Any], method: str, engine_factor: float = 1.0,
                    run: dict[str, Any] | None = None) -> ClusterConfig:
    """The simulated twin of one method of ``async_vs_sync.json``, built from what that run measured.

    Engine: the ``hf`` engine's static batching with the costs of ``engine_costs`` (1 torch
    thread, as in a generator process). Learner: the method's mean measured step time
    (``step_s_fixed``), so only the scheduling is predicted. Publish and reload: the measured medians.

    CPU sharing (the runs share 2 cores with other people's work): the costs were measured with
    CPU share ``S_ref`` (``engine_costs``); during a method the 1-minute load was ``L`` (mean of
    its start and end), of which ``k`` busy threads were ours (the generator's
    ``GENERATOR_BUSY_THREADS`` for synchronous GRPO, plus the learner's 1 for the asynchronous
    methods). Engine times are scaled by ``S_ref / cpu_share(cores, L - k, busy)`` with ``busy`` =
    ``GENERATOR_BUSY_THREADS + 1`` while the asynchronous learner trains, else
    ``GENERATOR_BUSY_THREADS``.

    Tool latency: ``settings.tool_latency_median_s`` / ``_sigma`` / ``_max_s`` when the run had it
    (absent or 0: instantaneous tools). Generator worker: ``pool_workers = cores + 4`` (asyncio's
    default pool) when ``measured_worker`` says the run predates the worker fix, else 0.

    ``run``: one of the method's repeated runs (``repeat_runs``; its own learner step time and
    load); default the method's first run.

    Raises:
        KeyError: the method or a needed field is missing from ``measured``.
    """
    s = stored_settings(measured)
    costs, calibrated, _ = engine_costs(measured)
    blocking = measured_worker(measured) == "blocking_pool"
    m = run if run is not None else measured["methods"][method]
    g = method.rpartition("_g")[2]
    sim_method = method_kind(method)
    cores = int(measured["machine"].get("cpu_count") or 1)
    loads = m.get("load_avg_start_end") or [float(measured["machine"]["load_avg"][0])]
    generator = GENERATOR_BUSY_THREADS
    ours = generator if sim_method == "grpo_sync" else generator + 1
    background = max(0.0, statistics.fmean(loads) - ours)
    return ClusterConfig(
        engine_scale_idle=engine_factor * calibrated / cpu_share(cores, background, generator),
        engine_scale_learner_busy=engine_factor * calibrated / cpu_share(cores, background, ours),
        method=sim_method,
        generators=s["generators"] if sim_method != "grpo_sync" else 1,
        episodes_in_flight=s["episodes_in_flight"],
        batch_rollouts=s["batch_rollouts"],
        group_size=1 if method == "sao" else int(g),
        max_staleness=s["max_staleness"],
        abort_stale=not s["keep_stale_episodes"],
        steps=max(2, int(m["policy_versions"])),
        publish_s=measured["weight_sync"]["publish_s"],
        reload_s=measured["weight_sync"]["reload_s"],
        engine=EngineModel(
            batching="static",
            max_batch=max(s["episodes_in_flight"], s["batch_rollouts"]) if sim_method == "grpo_sync" else s["episodes_in_flight"],
            **costs,
        ),
        learner=LearnerModel(gpus=1, step_s_fixed=float(m["learner_step_s_mean"]), s_per_token=0.0,
                             warmup_iterations=s["critic_warmup"] if method == "sao" else 0),
        seed=s["seed"],
        tool_latency_median_s=float(s.get("tool_latency_median_s") or 0.0),
        tool_latency_sigma=float(s.get("tool_latency_sigma") or 0.0),
        tool_latency_max_s=float(s.get("tool_latency_max_s") or 60.0),
        pool_workers=min(32, cores + 4) if blocking and sim_method != "grpo_sync" else 0,
    )


FEEDING_OF: dict[str, str] = {"grpo_sync": "lockstep", "sao": "continuous", "grpo_async": "groups"}
"""The ``engine_modes`` feeding that drives each simulated method's engine the way its generator does."""


def measured_worker(measured: dict[str, Any]) -> Literal["blocking_pool", "current"]:
    """Which generator worker produced ``measured`` (one setting's result): before (``blocking_pool``) or after the fix.

    Before the fix the generator's admission waits and the ``hf`` engine's batches shared
    asyncio's default thread pool, and its busy clock counted requests queued there. Read from
    ``busy_measured_by_engine`` (per method, or in its ``counters`` as
    ``generator_busy_measured_by_engine``; 1 means the engine's own clock, i.e. the fixed
    worker) when present; otherwise a result with a ``setting`` and without ``runtime_note``
    (``async_vs_sync`` marks results carried over from before the fix with it) is current, and
    an older one (no ``setting``) is ``blocking_pool``.
    """
    for m in measured.get("methods", {}).values():
        flag = m.get("busy_measured_by_engine", m.get("counters", {}).get("generator_busy_measured_by_engine"))
        if flag is not None:
            return "current" if float(flag) > 0 else "blocking_pool"
    return "current" if "setting" in measured and not measured.get("runtime_note") else "blocking_pool"


def busy_clock(measured: dict[str, Any]) -> Literal["generating", "in_engine"]:
    """The busy definition ``measured`` used: the engine's generating clock (fixed worker) or in-engine time."""
    return "generating" if measured_worker(measured) == "current" else "in_engine"


ENGINE_FREE_FACTOR = 1e-6
"""Engine speed factor that makes generation practically free: the phase left is tool and environment waits."""


def phase_identifies_engine_speed(phases: Sequence[float], engine_free_s: float, at_current_s: float) -> bool:
    """Whether the measured generation phases say anything about the engine's speed.

    A synchronous step's generation phase (seconds) is the engine's work on the critical path plus
    the slowest episode's tool waits. The engine's share at the current speed is
    ``at_current_s - engine_free_s`` (simulated phase at the speed of ``measured_config`` minus the
    phase with a free engine). When that share is below twice the standard error of the measured
    mean phase (``stdev(phases) / sqrt(n)``), any speed within the noise fits: the phases do not
    identify it.

    Args:
        phases: Measured generation seconds per step (``generator_batch_s``), >= 1 value.
        engine_free_s: Simulated mean phase with a free engine (seconds).
        at_current_s: Simulated mean phase at the current engine speed (seconds).

    Returns:
        True when the engine's share exceeds twice the standard error (always with one phase and
        no tool wait).
    """
    se = statistics.stdev(phases) / math.sqrt(len(phases)) if len(phases) > 1 else 0.0
    return at_current_s - engine_free_s > 2 * se


ENGINE_SPEED_ROUNDS = 4
"""Fixed-point rounds of ``calibrate_engine_speed`` on a run's generating seconds per rollout."""


def calibrate_engine_speed(base: ClusterConfig, measured_method: dict[str, Any], workload: Workload,
                           repeats: int) -> tuple[ClusterConfig, str]:
    """Scale the engine's speed to what the run itself measured, when it measured it.

    Synchronous GRPO records each step's generation wall time (``generator_batch_s``): the engine
    times are scaled by the factor (bisection, 1/20 to 20) at which the simulated mean
    generation phase equals the measured one, the same factor while the learner trains (it
    never overlaps generation there); the phase includes tool latency, which the factor leaves
    alone. Only when the engine's share of the phase is above the phases' noise
    (``phase_identifies_engine_speed``): with long tool waits the phase is the slowest group's
    waits, and the fit used to push their sampling noise into the speed (x1/20 for G = 4, x5 for
    G = 8 in the tool-latency setting, so -96% and +380% busy fraction). A run that records its
    generators' engine-clock seconds and rollouts (``generator_busy_s``, ``generator_rollouts``,
    per method or in its ``counters``: asynchronous runs since generators report them) is scaled
    so the simulated generating seconds per rollout match: ``ENGINE_SPEED_ROUNDS`` rounds of
    ``factor *= measured / simulated``, because a slower engine also batches more rows, which
    lowers its cost per rollout. What such a row then checks is the scheduling: the busy
    fraction and the throughput that the slots, admission, tool waits and learner make of that
    engine speed. Other runs keep the load-based scale of ``measured_config``.

    Returns:
        The config and where its engine speed came from (``"generator_batch_s"``,
        ``"generator_busy_s"``, ``"load average (generator_batch_s is tool waits)"`` or
        ``"load average"``).
    """
    phases = measured_method.get("generator_batch_s") or []
    counters = measured_method.get("counters", {})
    busy_s = measured_method.get("generator_busy_s", counters.get("generator_busy_s"))
    produced = measured_method.get("generator_rollouts", counters.get("generator_rollouts"))
    if base.method == "grpo_sync" and phases:
        target = statistics.fmean(phases)

        def phase(f: float) -> float:
            cfg = replace(base, engine_scale_idle=base.engine_scale_idle * f,
                          engine_scale_learner_busy=base.engine_scale_learner_busy * f)
            sims = [simulate(replace(cfg, seed=cfg.seed + k), workload).generation_phase_s for k in range(repeats)]
            return statistics.fmean(x for x in sims if x is not None)

        if not phase_identifies_engine_speed(phases, phase(ENGINE_FREE_FACTOR), phase(1.0)):
            # The phase is the slowest group's tool waits: fitting it would turn their sampling noise
            # into the engine's speed (x1/20 or x5 in the tool-latency setting).
            return base, "load average (generator_batch_s is tool waits)"

        # The phase grows with the factor but also holds tool waits that do not scale with it:
        # bisect on log(factor) in [1/20, 20] instead of assuming proportionality.
        lo, hi = math.log(1 / 20), math.log(20)
        for _ in range(14):
            mid = (lo + hi) / 2
            if phase(math.exp(mid)) < target:
                lo = mid
            else:
                hi = mid
        factor, source = math.exp((lo + hi) / 2), "generator_batch_s"
    elif busy_s and produced:
        target, factor = float(busy_s) / float(produced), 1.0
        for _ in range(ENGINE_SPEED_ROUNDS):
            cfg = replace(base, engine_scale_idle=base.engine_scale_idle * factor,
                          engine_scale_learner_busy=base.engine_scale_learner_busy * factor)
            simulated = statistics.fmean(simulate(replace(cfg, seed=cfg.seed + k), workload).generating_s_per_rollout
                                         for k in range(repeats))
            if simulated <= 0:
                break
            factor *= target / simulated
        source = "generator_busy_s"
    else:
        return base, "load average"
    return replace(base, engine_scale_idle=base.engine_scale_idle * factor,
                   engine_scale_learner_busy=base.engine_scale_learner_busy * factor), source


def probe_core_seconds(probes: Sequence[dict[str, Any]] | None, cores: int) -> float | None:
    """Mean seconds of ``engine_probe`` measurements, each scaled to a whole core (None without probes).

    A probe that ran beside ``background_cores`` of other work had ``cpu_share(cores,
    background_cores, 1)`` of a core; its seconds times that share are what it would have taken on
    a core of its own, so what is left between two probes is the machine's speed, not its load
    (which ``measured_config`` models from the load average).
    """
    values = [float(p["seconds"]) * cpu_share(cores, float(p.get("background_cores") or 0.0), 1)
              for p in probes or [] if p.get("seconds")]
    return statistics.fmean(values) if values else None


def engine_probe_ratio(measured: dict[str, Any], run: dict[str, Any]) -> float | None:
    """How much slower the engine ran in a method run's hour than during the setting's ``engine_modes``.

    ``probe_core_seconds`` of the run's probes (``engine_probe``, before and after it) over those of
    the ``engine_modes`` measurement; ``fit_engine_speed`` fits the engine's speed on the latter, so
    this factor carries it to the run's hour. On the 2 shared cores the same batches took 21% longer
    at one hour than at another with the same load average, and each setting's runs spanned hours.
    None when either side has no probe (results from before the probe): the run keeps the
    ``engine_modes`` speed.
    """
    cores = int(measured["machine"].get("cpu_count") or 1)
    at_run = probe_core_seconds(run.get("engine_probe"), cores)
    at_modes = probe_core_seconds((measured.get("engine_modes") or {}).get("engine_probe"), cores)
    return at_run / at_modes if at_run and at_modes else None


def run_twin(measured: dict[str, Any], method: str, run: dict[str, Any], factor: float | None, workload: Workload,
             repeats: int, factor_from: str = "engine_modes") -> tuple[ClusterConfig, str]:
    """The simulated twin of one measured run of ``method`` and where its engine speed came from.

    ``measured_config`` with the engine at ``factor`` (``fit_engine_speed``; 1 without
    ``engine_modes``) times the run's ``engine_probe_ratio`` (1 without probes), then
    ``calibrate_engine_speed`` where the run measured its own generation speed. ``factor_from``
    names where ``factor`` came from in ``speed_from``.

    Returns:
        ``(config, speed_from)``; ``speed_from`` names the sources (``"engine_modes x engine probe x
        load average"`` for a probed asynchronous run).
    """
    ratio = engine_probe_ratio(measured, run)
    base = measured_config(measured, method, engine_factor=(factor or 1.0) * (ratio or 1.0), run=run)
    base, speed_from = calibrate_engine_speed(base, run, workload, repeats)
    if speed_from.startswith("load average") and factor:
        speed_from = f"{factor_from} x " + ("engine probe x " if ratio else "") + speed_from
    return base, speed_from


def validate_all(measured: dict[str, Any], repeats: int = 3) -> dict[str, Any]:
    """``validate`` every setting the results file holds: the top level and ``compute_bound`` when present.

    Every setting's engine costs are fitted on the batches all settings timed (``engine_costs``).

    Returns:
        ``rows`` (each with its ``setting``), ``max_abs_relative_error`` and ``worst`` over all of
        them, ``repeats``, and ``by_setting`` (each setting's ``validate`` result without rows).

    Raises:
        ValueError: a malformed part of a setting's result (the message starts with the setting).
    """
    results = [measured] + ([measured["compute_bound"]] if measured.get("compute_bound") else [])
    pooled = [b for result in results for b in engine_mode_batches(result)]
    if pooled:
        results = [{**r, POOLED_BATCHES_KEY: pooled} for r in results]
    rows: list[dict[str, Any]] = []
    by_setting = []
    for result in results:
        setting = result.get("setting", "compute_bound")
        try:
            v = validate(result, repeats)
        except ValueError as exc:
            raise ValueError(f"{setting}: {exc}") from exc
        rows.extend({"setting": setting, **r} for r in v["rows"])
        by_setting.append({"setting": setting, "measured_when": result.get("machine", {}).get("when"),
                           **{k: val for k, val in v.items() if k != "rows"}})
    worst_row = max((r for r in rows if not r.get("calibration")), key=lambda r: abs(r["relative_error"]), default=None)
    return {"rows": rows, "max_abs_relative_error": abs(worst_row["relative_error"]) if worst_row else None,
            "worst": worst_row, "repeats": repeats, "by_setting": by_setting}


def validate(measured: dict[str, Any], repeats: int = 3) -> dict[str, Any]:
    """Re-simulate every measured method; relative error of busy fraction and both throughputs.

    Each prediction is the mean over ``repeats`` seeds. Relative error = (predicted - measured) /
    measured. The busy fraction compared is the one the run measured (``busy_clock``). When the
    JSON has ``engine_modes`` (the engine alone, fed in lockstep, continuously and in groups), each
    method's engine runs at the speed fitted on its own feeding (``feeding_speeds``,
    ``FEEDING_OF``; one speed for all when its feeding was not measured), and how far one speed
    for all feedings is from each is reported in ``calibration`` rows (``validate_engine_modes``),
    left out of the worst error. A run that probed the engine's speed beside it
    (``engine_probe``) is simulated with that speed times its ``engine_probe_ratio``; the rows give
    the mean ratio over the method's runs. The SAO runs of the setting's ``capacity_sweep`` (other
    tau and episodes in flight, ``async_vs_sync --capacity-sweep``) are checked the same way, each
    point with its own tau and slots, in rows named ``sao tau=<tau> slots=<slots>`` (marked
    ``capacity_sweep``) that count towards the worst error.

    Returns:
        ``rows`` (per method and quantity, with ``speed_from`` and ``engine_probe_ratio``), ``max_abs_relative_error``,
        ``worst`` (the row with that error, calibration rows left out), ``busy_clock``, ``worker``,
        ``engine_factor`` (one speed for all feedings) and ``feeding_factors`` (per feeding).
    """
    workload = Workload.from_trace(measured["trace"])
    clock = busy_clock(measured)
    factor = fit_engine_speed(measured, workload, repeats)
    speeds = feeding_speeds(measured, workload, repeats)
    rows = []
    for method, m in measured["methods"].items():
        if m.get("learner_step_s_mean") is None:
            continue
        runs = [m] + [r for r in m.get("repeat_runs") or [] if r.get("learner_step_s_mean") is not None]
        rows.extend(method_rows(measured, method, runs, workload, repeats, factor, speeds, f"methods.{method}"))
    for point in (measured.get("capacity_sweep") or {}).get("points", []):
        runs = [r for r in point["runs"] if r.get("learner_step_s_mean") is not None]
        if not runs:
            continue
        keep = point.get("keep_stale_episodes", True)  # points measured before generators cancelled stale episodes
        swept = {**measured, "settings": {**measured["settings"], "max_staleness": point["max_staleness"],
                                          "episodes_in_flight": point["episodes_in_flight"],
                                          "keep_stale_episodes": keep}}
        label = point_label(point["max_staleness"], point["episodes_in_flight"], keep)
        rows.extend({**r, "method": label, "capacity_sweep": True}
                    for r in method_rows(swept, "sao", runs, workload, repeats, factor, speeds, f"capacity_sweep {label}"))
    rows.extend(validate_engine_modes(measured, workload, repeats, factor))
    worst_row = max((r for r in rows if not r.get("calibration")), key=lambda r: abs(r["relative_error"]), default=None)
    return {"rows": rows, "max_abs_relative_error": abs(worst_row["relative_error"]) if worst_row else None,
            "worst": worst_row, "repeats": repeats, "busy_clock": clock, "worker": measured_worker(measured),
            "engine_factor": factor, "feeding_factors": speeds}


def mean_or_none(values: Iterable[Any]) -> float | None:
    """Mean of the values that are not None (runs from before a counter existed lack it); None if none are."""
    known = [float(v) for v in values if v is not None]
    return statistics.fmean(known) if known else None


def method_rows(measured: dict[str, Any], method: str, runs: Sequence[dict[str, Any]], workload: Workload,
                repeats: int, factor: float | None, speeds: dict[str, float], where: str) -> list[dict[str, Any]]:
    """The three validation rows (busy fraction, trained action tokens/s, rollouts/s) of one method's runs.

    Each run is simulated ``repeats`` times (seeds ``seed`` ...) with its own learner step time, load
    and engine probe (``run_twin``), its engine at the speed fitted on the feeding its generator
    produces (``speeds``, ``FEEDING_OF``; ``factor`` when that feeding was not measured); a row
    compares the mean over all runs' simulations with the mean of the measured runs.
    ``measured["settings"]`` gives tau and the slots (a capacity-sweep point passes its own). A
    synchronous GRPO run that recorded its episodes replays them (``run_replay``: the same groups,
    lengths, rewards and tool waits, batch after batch; ``where`` names the runs in errors), so the
    simulation differs from the run in timing only; ``replayed_episodes`` counts them. An
    asynchronous run's record lacks the episodes still running when it stopped, the longest ones:
    replayed alone they made the simulated SAO run 31% more rollouts/s than it measured (tool
    latency, 3 runs), so asynchronous runs draw from the trace.

    Returns:
        Three row dicts (``validate`` documents the keys).

    Raises:
        ValueError: a malformed recorded episode (``run_replay``).
    """
    clock = busy_clock(measured)
    feeding = FEEDING_OF[method_kind(method)]
    method_factor, factor_from = ((speeds[feeding], f"engine_modes {feeding}") if feeding in speeds
                                  else (factor, "engine_modes"))
    per_run = []  # (simulations, speed_from) of each measured run, each with its own learner time and load
    probe_ratios = []
    replayed = 0
    for i, run in enumerate(runs):
        replay = run_replay(run, f"{where}[{i}]") if method_kind(method) == "grpo_sync" else ()
        replayed += sum(len(u) for u in replay)
        run_workload = replace(workload, replay=replay)
        base, speed_from = run_twin(measured, method, run, method_factor, run_workload, repeats, factor_from)
        probe_ratios.append(engine_probe_ratio(measured, run))
        per_run.append(([simulate(replace(base, seed=base.seed + k), run_workload) for k in range(repeats)],
                        speed_from))
    sims = [r for run_sims, _ in per_run for r in run_sims]
    speed_from = per_run[0][1] + (f" (mean of {len(runs)} runs)" if len(runs) > 1 else "")
    known = [r for r in probe_ratios if r is not None]
    rows = []
    for quantity in ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s"):
        attr = "in_engine_fraction" if quantity == "busy_fraction" and clock == "in_engine" else quantity
        pred = statistics.fmean(getattr(r, attr) for r in sims)
        meas = statistics.fmean(float(r[quantity]) for r in runs)
        rows.append({"method": method, "quantity": quantity, "measured": meas, "predicted": pred,
                     "relative_error": (pred - meas) / meas if meas else math.inf, "speed_from": speed_from,
                     "runs": len(runs), "measured_relative_se": measured_relative_se_over(runs, quantity),
                     "engine_probe_ratio": statistics.fmean(known) if known else None,
                     "replayed_episodes": replayed,
                     "predicted_generating_fraction": statistics.fmean(r.busy_fraction for r in sims),
                     "predicted_mean_batch_rows": statistics.fmean(r.mean_batch_rows for r in sims),
                     "measured_mean_batch_rows": mean_or_none(
                         (r.get("counters") or {}).get("generator_mean_batch_rows") for r in runs),
                     "predicted_in_engine_fraction": statistics.fmean(r.in_engine_fraction for r in sims)})
    return rows


POOLED_BATCHES_KEY = "engine_batches_all_settings"
"""Key ``validate_all`` adds to each setting's result: every setting's timed batches (``engine_mode_batches``)."""


def engine_mode_batches(measured: dict[str, Any]) -> list[list[float]]:
    """The batches ``engine_modes`` timed (both feedings), their seconds scaled to a whole core.

    Each batch is ``[rows, width, prompt_tokens, new_tokens, seconds]``, followed by
    ``generated_tokens`` where the measurement recorded it; seconds are multiplied by
    the CPU share of that measurement (``cpu_share(cores, L - k, k)`` at its load ``L``, ``k =
    GENERATOR_BUSY_THREADS``), so batches measured at different loads can be pooled. Empty
    when the result has no timed batches.
    """
    em = measured.get("engine_modes") or {}
    batches = [b for mode in ENGINE_MODES for b in (em.get(mode) or {}).get("batches", [])]
    if not batches:
        return []
    share = engine_modes_share(measured)
    return [[*b[:4], float(b[4]) * share, *b[5:6]] for b in batches]


def engine_modes_share(measured: dict[str, Any]) -> float:
    """CPU share the engine had during ``engine_modes``: ``cpu_share(cores, L - k, k)``, ``k = GENERATOR_BUSY_THREADS``.

    ``L`` is the mean of the measurement's start and end load (the run's first load average when
    it recorded none).
    """
    em = measured.get("engine_modes") or {}
    cores = int(measured["machine"].get("cpu_count") or 1)
    default = float(measured["machine"]["load_avg"][0])
    load = statistics.fmean([float(em.get("load_avg_start", default)), float(em.get("load_avg_end", default))])
    busy = GENERATOR_BUSY_THREADS
    return cpu_share(cores, max(0.0, load - busy), busy)


def engine_costs(measured: dict[str, Any]) -> tuple[dict[str, float], float, str]:
    """The ``hf`` engine's batch costs (``EngineModel`` coefficients), the CPU share they hold for, and their source.

    With batches timed in ``engine_modes`` (``bench.async_vs_sync.measure_engine_modes``
    records every batch the engine ran while fed by real episodes, both feedings), the costs are
    fitted on those (``fit_batch_costs``), at a whole core's speed (share 1): they span the rows,
    padded widths and early stops the runs produce. Every setting's batches are pooled when
    ``validate_all`` put them under ``POOLED_BATCHES_KEY`` (one engine, one machine; 256 slots
    time mostly wide batches, 64 slots the narrower ones; one setting alone left the other's
    regime to extrapolation: +52% busy fraction for asynchronous GRPO with tool latency). The
    calibration grid (``engine_calibration``: at most 32 rows x 512 tokens, no padding, every row
    decoding 20 tokens) under-predicted the continuous feeding's batches of 64 rows x 500-700
    tokens by 40-70%, which one speed factor cannot undo for both feedings; older results without
    timed batches fall back to it, at ``cpu_share(cores, L_cal - 1, 1)``.

    Returns:
        ``(costs, share, source)``: ``costs`` holds ``step_s``, ``step_s_per_row``,
        ``prefill_s_per_token``, ``step_s_per_row_token``, ``step_s_per_kv_sq`` and
        ``sample_s_per_token`` (0 unless every batch recorded its generated tokens); ``source`` is
        ``"engine_modes batches"``, ``"engine_modes batches of every setting"`` or
        ``"calibration grid"``.

    Raises:
        KeyError: neither timed batches nor ``engine_calibration`` in ``measured``.
    """
    pooled = measured.get(POOLED_BATCHES_KEY)
    if pooled:
        return fit_batch_costs(pooled), 1.0, "engine_modes batches of every setting"
    batches = engine_mode_batches(measured)
    if batches:
        return fit_batch_costs(batches), 1.0, "engine_modes batches"
    cores = int(measured["machine"].get("cpu_count") or 1)
    cal = measured["engine_calibration"]
    l_cal = float(cal.get("load_avg", measured["machine"]["load_avg"][0]))
    costs = {"step_s": cal["step_s"], "step_s_per_row": cal["step_s_per_row"],
             "prefill_s_per_token": cal["prefill_s_per_token"],
             "step_s_per_row_token": cal.get("step_s_per_row_token", 0.0), "step_s_per_kv_sq": 0.0,
             "sample_s_per_token": 0.0}
    return costs, cpu_share(cores, max(0.0, l_cal - 1), 1), "calibration grid"


BATCH_COST_TERMS = ("prefill_s_per_token", "step_s", "step_s_per_row", "step_s_per_row_token", "step_s_per_kv_sq",
                    "sample_s_per_token")
"""``EngineModel`` coefficients ``fit_batch_costs`` fits, in the order of ``batch_cost_features``."""


def batch_cost_features(rows: int, width: int, steps: int, sampled: int) -> list[float]:
    """What each ``BATCH_COST_TERMS`` coefficient multiplies in one static batch's time (``Engine._run_batch``).

    ``rows`` requests, left-padded to ``width`` prompt tokens, ``steps`` decode steps over a
    context of ``width + steps // 2`` tokens on average, ``sampled`` tokens sampled over all
    rows (at most ``rows * steps``: a row stops sampling at its stop token).
    """
    ctx = width + steps // 2
    return [rows * width, steps, steps * rows, steps * rows * ctx, steps * (rows * ctx) ** 2, sampled]


def fit_batch_costs(batches: Sequence[Sequence[float]]) -> dict[str, float]:
    """Non-negative least squares of batch seconds on ``batch_cost_features``, in relative error.

    Args:
        batches: ``[rows, width, prompt_tokens, new_tokens, seconds]`` per batch (``engine_modes``),
            with ``generated_tokens`` sixth where recorded. Unless every batch has it,
            ``sample_s_per_token`` is 0 and not fitted: without the count, sampling is
            indistinguishable from a per-row decode cost, and the simulator would charge it on
            fewer tokens than it was fitted on.

    Returns:
        The ``BATCH_COST_TERMS`` coefficients (seconds per unit of each feature).

    Raises:
        ValueError: fewer batches than terms, or a batch with non-positive seconds.
    """
    import numpy as np
    from scipy.optimize import nnls

    if len(batches) < len(BATCH_COST_TERMS):
        raise ValueError(f"batches: need at least {len(BATCH_COST_TERMS)} to fit the engine's costs, got {len(batches)}")
    y = np.array([float(b[4]) for b in batches])
    if np.any(y <= 0):
        raise ValueError("batches: every batch needs positive seconds")
    sampled = all(len(b) > 5 for b in batches)
    a = np.array([batch_cost_features(int(b[0]), int(b[1]), int(b[3]), int(b[5]) if sampled else 0)
                  for b in batches], dtype=float)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale / y[:, None], np.ones(len(y)))
    return {k: float(c) for k, c in zip(BATCH_COST_TERMS, coef / scale, strict=True)}


def engine_alone(measured: dict[str, Any]) -> tuple[EngineModel, float]:
    """The ``hf`` engine (``engine_costs``, without host cost) and its time scale at the ``engine_modes`` load.

    The ``engine_modes`` run had the generator's ``GENERATOR_BUSY_THREADS`` busy.
    """
    costs, reference, _ = engine_costs(measured)
    slots = int(measured["settings"]["episodes_in_flight"])
    return EngineModel(batching="static", max_batch=slots, **costs), reference / engine_modes_share(measured)


FEED_S_DEFAULT = 20.0
"""Feeding window (seconds) of ``engine_modes`` results that do not record their ``feed_s`` (every run before it did)."""


def feed_group_size(em: dict[str, Any]) -> int:
    """Episodes per group of an ``engine_modes`` result's ``groups`` feeding (``GROUP_FEED_SIZE`` when unrecorded)."""
    return int(em.get("group_size", GROUP_FEED_SIZE))


def feeding_episodes(em: dict[str, Any], mode: str) -> list[RolloutShape] | None:
    """The episodes an ``engine_modes`` feeding ran, in the order they started (None if it did not record them).

    ``bench.async_vs_sync.measure_engine_modes`` stores one ``[prompt_tokens, action_tokens,
    observation_tokens]`` per episode; rewards are not recorded (0: the feeding has no learner).

    Raises:
        ValueError: an entry that is not ``[prompt, actions, observations]``, an episode without
            turns, or observation counts that do not match its turns (naming the entry).
    """
    recorded = (em.get(mode) or {}).get("episodes")
    if not recorded:
        return None
    out = []
    for i, entry in enumerate(recorded):
        if not isinstance(entry, list) or len(entry) != 3:
            raise ValueError(f"engine_modes.{mode}.episodes[{i}]: expected [prompt_tokens, action_tokens, "
                             f"observation_tokens], got {entry!r}")
        prompt, actions, observations = entry
        if not actions or len(observations) != len(actions):
            raise ValueError(f"engine_modes.{mode}.episodes[{i}]: needs >= 1 turn and one observation count per turn, "
                             f"got {len(actions)} turns and {len(observations)} observations")
        out.append(RolloutShape(int(prompt), tuple(int(a) for a in actions), tuple(int(o) for o in observations), 0.0))
    return out


def run_replay(run: dict[str, Any], where: str) -> tuple[tuple[RolloutShape, ...], ...]:
    """The units a measured run started, in order, from its ``episodes`` (``async_vs_sync.run_episodes``); () without.

    Each episode is ``[unit, prompt_tokens, action_tokens, observation_tokens, reward,
    tool_waits_s]``; consecutive episodes with the same ``unit`` form one group.

    Raises:
        ValueError: a malformed entry (``where``, the entry's index and what is wrong).
    """
    units: list[list[RolloutShape]] = []
    last = None
    for i, entry in enumerate(run.get("episodes") or []):
        if not isinstance(entry, list) or len(entry) != 6:
            raise ValueError(f"{where}.episodes[{i}]: expected [unit, prompt_tokens, action_tokens, "
                             f"observation_tokens, reward, tool_waits_s], got {entry!r}")
        unit, prompt, actions, observations, reward, waits = entry
        if not actions or len(observations) != len(actions) or len(waits) != len(actions) - 1:
            raise ValueError(f"{where}.episodes[{i}]: needs >= 1 turn, one observation count per turn and one tool "
                             f"wait per turn but the last, got {len(actions)} turns, {len(observations)} "
                             f"observations and {len(waits)} waits")
        shape = RolloutShape(int(prompt), tuple(int(a) for a in actions), tuple(int(o) for o in observations),
                             float(reward), tuple(float(w) for w in waits))
        if unit != last:
            units.append([])
            last = unit
        units[-1].append(shape)
    return tuple(tuple(u) for u in units)


def simulate_feeding(engine: EngineModel, scale: float, workload: Workload, mode: str, slots: int, feed_s: float,
                     seed: int, group_size: int = GROUP_FEED_SIZE,
                     episodes: Sequence[RolloutShape] | None = None) -> float:
    """Rollouts per second of one engine fed by ``slots`` episode slots (no learner, no admission).

    Replays ``bench.async_vs_sync.measure_engine_modes``: episodes start only while the clock is
    below ``feed_s`` (seconds), the episodes in flight then finish, and the rate is every finished
    rollout over the time the last one ended. ``lockstep``: the next ``slots`` episodes start when
    all are done (synchronous GRPO's feeding); ``continuous``: each slot starts a new episode as
    its last one ends; ``groups``: ``slots // group_size`` group slots, each running ``group_size``
    distinct traced rollouts of one task at once and starting the next group when all are done
    (asynchronous GRPO's feeding, ``Cluster._group``). The drain matters: a continuous feed's last episodes are the long ones, run
    in ever smaller batches (13 s of feeding took 20.5 s with 64 slots), and a model that stopped
    the clock at ``feed_s`` over-predicted the continuous rate by 12-14%.

    With ``episodes`` (``feeding_episodes``: what the measurement ran, in start order), each
    started episode is the next of them (groups: the next ``group_size``), from the first again
    after the last, instead of draws from ``workload``. The task draw alone moved the simulated
    group feeding from 7.9 to 9.8 rollouts/s between seeds (the measurement ran 4.7 requests
    per rollout where the trace averages 5.1), which no engine speed should absorb.

    Raises:
        RuntimeError: the replay does not end within 5,000,000 events.
    """
    loop = EventLoop()
    eng = Engine(loop, engine, lambda: scale)
    rng = random.Random(seed)
    cluster = Cluster(ClusterConfig(method="grpo_async", seed=seed, group_size=group_size), workload)  # episode logic only
    cluster.loop, cluster.engines = loop, [eng]
    state = {"done": 0, "running": 0, "next": 0}

    def shape() -> RolloutShape:
        if not episodes:
            return workload.rollout(rng)
        state["next"] += 1
        return episodes[(state["next"] - 1) % len(episodes)]

    def start(on_done: Callable[[], None]) -> None:
        state["running"] += 1

        def finished() -> None:
            state["running"] -= 1
            state["done"] += 1
            on_done()
        cluster._episode(0, shape(), finished)

    def slot() -> None:
        if loop.now < feed_s:
            start(slot)

    def wave() -> None:
        if loop.now >= feed_s:
            return
        left = {"n": slots}

        def finished() -> None:
            left["n"] -= 1
            if left["n"] == 0:
                wave()
        for _ in range(slots):
            start(finished)

    def group_slot() -> None:
        if loop.now >= feed_s:
            return
        state["running"] += 1

        def finished(shapes: list[RolloutShape], version: int) -> None:
            state["running"] -= 1
            state["done"] += len(shapes)
            group_slot()
        cluster._group(0, finished, [shape() for _ in range(group_size)] if episodes else None)

    if mode == "continuous":
        for _ in range(slots):
            slot()
    elif mode == "groups":
        for _ in range(max(1, slots // group_size)):
            group_slot()
    else:
        wave()
    loop.run(lambda: state["running"] == 0, 5_000_000)
    return state["done"] / loop.now if loop.now > 0 else 0.0


def fit_engine_speed(measured: dict[str, Any], workload: Workload, repeats: int, rounds: int = 4,
                     modes: Sequence[str] | None = None) -> float | None:
    """Factor on the engine's batch costs (``engine_costs``) that makes it match the engine fed by real episodes.

    The costs time bare batches; ``engine_modes`` measures the same engine driven by the agent
    loop (episodes, tokenizer, environment, batching loop), fed in lockstep, continuously and in
    groups (``ENGINE_MODES``). The factor minimises the squared log error over ``modes`` (default:
    every feeding measured): its log is moved by the mean log ratio of simulated to measured
    rates, ``rounds`` times (the rate is nearly inversely proportional to the factor; the fixed
    feeding window makes it not exactly so). Each mode's residual under the factor fitted on all
    of them is reported by ``validate_engine_modes``. None without ``engine_modes`` (or without
    any of ``modes`` in it).
    """
    em = measured.get("engine_modes") or {}
    modes = [m for m in (modes or ENGINE_MODES) if m in em]
    if not modes:
        return None
    engine, scale = engine_alone(measured)
    factor = 1.0
    for _ in range(rounds):
        logs = [math.log(replayed_feeding(measured, workload, mode, engine, scale * factor, repeats)
                         / float(em[mode]["rollouts_per_s"])) for mode in modes]
        factor *= math.exp(statistics.fmean(logs))
    return factor


def replayed_feeding(measured: dict[str, Any], workload: Workload, mode: str, engine: EngineModel, scale: float,
                     repeats: int) -> float:
    """Simulated rollouts/s of ``engine_modes`` feeding ``mode`` (``simulate_feeding`` with the measurement's window).

    The episodes are the ones the measurement ran where it recorded them (``feeding_episodes``:
    the replay is then deterministic and runs once), else the mean over ``repeats`` seeds of
    draws from ``workload``.
    """
    em = measured["engine_modes"]
    feed_s = float(em.get("feed_s", FEED_S_DEFAULT))
    seed = int(measured["settings"]["seed"])
    episodes = feeding_episodes(em, mode)
    runs = 1 if episodes else repeats
    return statistics.fmean(simulate_feeding(engine, scale, workload, mode, engine.max_batch, feed_s, seed + k,
                                             feed_group_size(em), episodes) for k in range(runs))


def feeding_speeds(measured: dict[str, Any], workload: Workload, repeats: int) -> dict[str, float]:
    """One engine speed factor per measured feeding (``fit_engine_speed`` on that mode alone).

    Each method's engine runs at the factor of the feeding its generator produces (``FEEDING_OF``):
    one factor for every feeding left asynchronous GRPO's rollouts/s 17-22% low, because the
    engine alone fed in groups of 8 (same task, same start) ran 1.8x the rollouts/s of the
    continuous feed while the batch model, fitted on lockstep and continuous batches, predicted
    1.4x. The per-feeding factors make the engine-alone rates calibration, not a check;
    ``validate_engine_modes`` still reports how far one factor for all is from each.
    """
    em = measured.get("engine_modes") or {}
    return {mode: f for mode in ENGINE_MODES if mode in em
            for f in [fit_engine_speed(measured, workload, repeats, modes=(mode,))] if f is not None}


def measured_relative_se(m: dict[str, Any], quantity: str) -> float | None:
    """Relative standard error of a measured throughput from its own per-update spread (None if unknown).

    ``trained_action_tokens_per_s``: of the mean of ``trained_action_tokens_per_update`` (the first
    update left out, as in the window); ``rollouts_per_s``: of the mean interval between iterations
    (``step_times_s``). A single run of 20 policy versions is itself this uncertain.
    """
    if quantity == "trained_action_tokens_per_s":
        xs = [float(x) for x in (m.get("trained_action_tokens_per_update") or [])[1:]]
    elif quantity == "rollouts_per_s":
        t = [float(x) for x in (m.get("step_times_s") or [])]
        xs = [b - a for a, b in itertools.pairwise(t)][1:]
    else:
        return None
    if len(xs) < 3 or statistics.fmean(xs) <= 0:
        return None
    return statistics.stdev(xs) / math.sqrt(len(xs)) / statistics.fmean(xs)


def measured_relative_se_over(runs: Sequence[dict[str, Any]], quantity: str) -> float | None:
    """Relative standard error of a quantity's mean over a method's measured runs (None if unknown).

    Three or more runs: the runs' own spread, ``stdev / sqrt(n) / mean``. Fewer: one run's
    per-update spread (``measured_relative_se``) divided by ``sqrt(n)``, as independent runs of
    the same length average it down.
    """
    values = [float(r[quantity]) for r in runs if r.get(quantity) is not None]
    if len(values) >= 3 and statistics.fmean(values) > 0:
        return statistics.stdev(values) / math.sqrt(len(values)) / statistics.fmean(values)
    one = measured_relative_se(runs[0], quantity) if runs else None
    return None if one is None else one / math.sqrt(max(len(values), 1))


def validate_engine_modes(measured: dict[str, Any], workload: Workload, repeats: int,
                          factor: float | None) -> list[dict[str, Any]]:
    """The engine alone (``engine_modes``), each feeding: rollouts/s, simulated vs measured, at one speed.

    With the one ``factor`` fitted on every feeding (``fit_engine_speed``), the rows show how well
    one speed explains them all (the batching model). They are marked ``calibration``: methods run
    at their own feeding's speed (``feeding_speeds``), so these rates are inputs of the check,
    not predictions, and ``validate`` leaves them out of its worst error.
    """
    em = measured.get("engine_modes")
    if not em:
        return []
    engine, scale = engine_alone(measured)
    scale *= factor or 1.0
    rows = []
    for mode in ENGINE_MODES:
        if mode not in em:
            continue
        pred = replayed_feeding(measured, workload, mode, engine, scale, repeats)
        meas = float(em[mode]["rollouts_per_s"])
        rows.append({"method": f"engine_{mode}", "quantity": "rollouts_per_s", "measured": meas, "predicted": pred,
                     "relative_error": (pred - meas) / meas if meas else math.inf, "calibration": True,
                     "speed_from": "engine_modes (one speed for every feeding)" if factor else "load average",
                     "episodes": "replayed" if feeding_episodes(em, mode) else "drawn from the trace"})
    return rows


# ----------------------------------------------------------------------------------- projection
def gpu_assumptions(args: argparse.Namespace, measured: dict[str, Any]) -> dict[str, Any]:
    """The assumed GPU-cluster parameters of the projection (printed in the docs beside the result).

    The SAO learner's cost per token relative to GRPO's (SAO also trains a critic) is the ratio
    ``async_vs_sync`` measured on one batch (``learner_cost``), or ``--sao-learner-cost`` when
    absent; the tool latency is the measured setting's (``settings.tool_latency_*``, 0 when
    absent); everything else comes from the flags.
    """
    ratio = measured.get("learner_cost", {}).get("ratio_sao_over_grpo", args.sao_learner_cost)
    return {
        "engine": asdict(EngineModel(batching="continuous", max_batch=args.gpu_max_batch, step_s=args.gpu_step_s,
                                     step_s_per_row=args.gpu_step_s_per_row,
                                     prefill_s_per_token=args.gpu_prefill_s_per_token)),
        "episodes_in_flight": args.gpu_max_batch,
        "grpo_learner_s_per_token": args.gpu_train_s_per_token,
        "sao_learner_cost_ratio": ratio,
        "learner_gpus_per_generator": args.learner_ratio,
        "rollouts_per_generator_per_step": args.rollouts_per_generator,
        "publish_s": args.gpu_publish_s,
        "reload_s": args.gpu_reload_s,
        "token_scale": args.token_scale,
        "group_size": args.group_size,
        "max_staleness": args.max_staleness,
        "steps": args.steps,
        # The measured setting's tool latency (wall time per call, not scaled with the lengths).
        "tool_latency_median_s": float(measured.get("settings", {}).get("tool_latency_median_s") or 0.0),
        "tool_latency_sigma": float(measured.get("settings", {}).get("tool_latency_sigma") or 0.0),
        "tool_latency_max_s": float(measured.get("settings", {}).get("tool_latency_max_s") or 60.0),
    }


def project(ns: Sequence[int], assumptions: dict[str, Any], workload: Workload, seed: int = 0,
            learner_ratio: float | None = None) -> list[dict[str, Any]]:
    """SAO and synchronous GRPO for each N with the GPU assumptions; one row per N.

    ``learner_ratio`` (learner GPUs per generator) overrides the assumptions' ratio.
    """
    a = assumptions
    ratio = a["learner_gpus_per_generator"] if learner_ratio is None else learner_ratio
    engine = EngineModel(**a["engine"])
    rows = []
    for n in ns:
        gpus = max(1, round(n * ratio))
        batch = n * a["rollouts_per_generator_per_step"]
        batch -= batch % a["group_size"]
        common = dict(generators=n, episodes_in_flight=a["episodes_in_flight"], batch_rollouts=batch,
                      max_staleness=a["max_staleness"], steps=a["steps"], publish_s=a["publish_s"],
                      reload_s=a["reload_s"], engine=engine, seed=seed,
                      tool_latency_median_s=a.get("tool_latency_median_s", 0.0),
                      tool_latency_sigma=a.get("tool_latency_sigma", 0.0),
                      tool_latency_max_s=a.get("tool_latency_max_s", 60.0))
        t0 = time.monotonic()
        sao = simulate(ClusterConfig(method="sao", group_size=1, learner=LearnerModel(
            gpus=gpus, s_per_token=a["grpo_learner_s_per_token"] * a["sao_learner_cost_ratio"]), **common), workload)
        grpo = simulate(ClusterConfig(method="grpo_sync", group_size=a["group_size"], learner=LearnerModel(
            gpus=gpus, s_per_token=a["grpo_learner_s_per_token"]), **common), workload)
        rows.append({
            "generators": n, "learner_gpus": gpus, "batch_rollouts": batch,
            "sao": asdict(sao), "grpo_sync": asdict(grpo),
            "speedup_sao_over_grpo_sync": sao.trained_action_tokens_per_s / grpo.trained_action_tokens_per_s
            if grpo.trained_action_tokens_per_s > 0 else None,
            "sim_seconds": time.monotonic() - t0,
        })
        print(f"  N={n}: busy SAO {sao.busy_fraction:.2f} / GRPO {grpo.busy_fraction:.2f}, "
              f"speedup {rows[-1]['speedup_sao_over_grpo_sync']:.2f}x ({rows[-1]['sim_seconds']:.0f} s)", flush=True)
    return rows


def plot(rows: list[dict[str, Any]], out_png: Any) -> Any:
    """Busy fraction and slot occupancy (left) and SAO/GRPO speedup (right) against N; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["generators"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for method, marker in (("sao", "o"), ("grpo_sync", "s")):
        left.plot(ns, [r[method]["busy_fraction"] for r in rows], marker=marker, ls="-", label=f"{method} busy fraction")
        left.plot(ns, [r[method]["slot_occupancy"] for r in rows], marker=marker, ls="--", alpha=0.6,
                  label=f"{method} slot occupancy")
    left.set_xscale("log", base=2)
    left.set_ylim(0, 1.05)
    left.set_xlabel("generators N")
    left.set_ylabel("fraction of wall time")
    left.set_title("Generator utilisation")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.plot(ns, [r["speedup_sao_over_grpo_sync"] for r in rows], "-o", color="tab:green")
    right.axhline(1.5, color="grey", ls=":", label="target 1.5x")
    right.set_xscale("log", base=2)
    right.set_xlabel("generators N")
    right.set_ylabel("SAO / sync GRPO trained tokens per s")
    right.set_title("Projected speedup")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


# ------------------------------------------------------------------------------------------ CLI
def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, validation table, assumptions, projection table, plot."""
    from bench.common import machine_line, markdown_table

    v = result["validation"]

    def se(r: dict[str, Any]) -> str:
        x = r.get("measured_relative_se")
        return "" if x is None else f"{100 * x:.0f}%"

    def probe(r: dict[str, Any]) -> str:
        x = r.get("engine_probe_ratio")
        return "" if x is None else f"x{x:.2f}"

    vrows = [[r["setting"], r["method"], r["quantity"], f"{r['measured']:.3g}", se(r), f"{r['predicted']:.3g}",
              f"{100 * r['relative_error']:+.0f}%", probe(r), str(r.get("replayed_episodes") or ""),
              r.get("speed_from", "")] for r in v["rows"]]
    a = result["assumptions"]
    prow = [[r["generators"], r["learner_gpus"], r["batch_rollouts"], f"{r['sao']['busy_fraction']:.2f}",
             f"{r['grpo_sync']['busy_fraction']:.2f}", f"{r['sao']['slot_occupancy']:.2f}",
             f"{r['grpo_sync']['slot_occupancy']:.2f}", f"{r['speedup_sao_over_grpo_sync']:.2f}"]
            for r in result["projection"]]
    e = a["engine"]
    worst = v["max_abs_relative_error"]
    w = v.get("worst") or {}
    clocks = {"generating": "the engine's generating clock",
              "in_engine": "time with a request inside the engine (queued or generating)"}
    workers = {"blocking_pool": "the generator worker before the fix (admission waits and `hf` batches in one "
               "thread pool: `ThreadPool`)", "current": "the current generator worker"}
    settings = []
    for b in v.get("by_setting", []):
        f = b.get("engine_factor")
        settings.append(
            f"* `{b['setting']}` (measured at {b.get('measured_when')}): {workers[b['worker']]}; busy fraction "
            f"compared as that run measured it, {clocks[b['busy_clock']]}; engine speed from `engine_modes`: "
            + (", ".join(f"x{x:.2f} {mode}" for mode, x in b["feeding_factors"].items()) + f" (one for all: x{f:.2f})"
               if b.get("feeding_factors") else f"x{f:.2f}")
            if f else f"* `{b['setting']}`: {workers[b['worker']]}; busy fraction as {clocks[b['busy_clock']]}")
        settings[-1] += f"; worst error {100 * b['max_abs_relative_error']:.0f}%."
    tool = (f"tool latency median {a['tool_latency_median_s']} s (sigma {a['tool_latency_sigma']}, max "
            f"{a['tool_latency_max_s']} s) per call" if a.get("tool_latency_median_s") else "instantaneous tools")
    return "\n".join([
        machine_line(result["machine"]),
        "",
        f"Command: `{result['command']}` (inputs: `{result['measured_from']}`, measured at {result['measured_when']})",
        "",
        f"**Check against the small runs** (mean of {v['repeats']} seeds per run), for each setting the results "
        "file holds. Inputs read from it: the trace's lengths and rewards, the `hf` engine's batch costs fitted on "
        "the batches it ran in `engine_modes` (the engine alone, fed by real episodes in lockstep, "
        "continuously and in groups of 8 of one task) times a speed factor fitted on the rate of the feeding "
        "the method's generator produces (synchronous GRPO lockstep, SAO continuous, asynchronous GRPO groups; "
        "the `engine_*` rows show each feeding at one speed for all, as calibration, not counted in the worst "
        "error), each method's "
        "learner step time, publish and reload medians, the setting's tool latency, and where the run recorded "
        "it its own generation speed (column *speed from*: `generator_batch_s`, the synchronous runs' generation "
        "time per step, unless that time is mostly tool waits: *generator_batch_s is tool waits*; "
        "`generator_busy_s`, an asynchronous run's engine seconds per rollout from its generators' own counters, "
        "so that row checks the scheduling around that speed; otherwise the "
        f"CPU share its load average implied, counting the generator as {GENERATOR_BUSY_THREADS} busy thread). "
        "A method run several times (`async_vs_sync --repeats`) is compared as the mean of its runs against the "
        "mean of their simulations, each run simulated with its own learner step time and load (*speed from* "
        "says *mean of n runs*). *Measured SE*: the relative standard error of the measured value, from the "
        "runs' spread with three or more runs, else from one run's step-to-step spread (divided by the square "
        "root of the runs). *Engine probe*: a fixed set of engine batches timed before and after each run "
        "and around `engine_modes` (`async_vs_sync.engine_probe`, scaled to a whole core by what other "
        "processes used meanwhile); the run's engine is simulated at the `engine_modes` speed times the ratio "
        "of the two (mean over the runs shown; blank: a run from before the probe, kept at the `engine_modes` "
        "speed). Rows `sao tau=<tau> slots=<slots>` are SAO runs at another staleness bound and number of "
        "episodes in flight (`async_vs_sync --capacity-sweep`), simulated with those. *Replayed episodes*: a "
        "synchronous GRPO run that recorded the episodes it produced (its learner's ledger: each rollout's lengths "
        "per turn, reward and tool waits) is simulated on those, batch after batch, so the simulation differs from "
        "the run in timing only. Asynchronous runs are not replayed: their ledgers lack the episodes still running "
        "when they stopped, the longest, and replaying the rest made simulated SAO 31% faster than measured; they "
        "draw episodes from the trace, as do runs from before the recording (blank). "
        f"Worst relative error: **{100 * worst:.0f}%** ({w.get('setting')}, {w.get('method')}, {w.get('quantity')}; "
        f"target: within 15%, {'met' if worst <= 0.15 else 'not met'}).",
        "",
        *settings,
        "",
        markdown_table(["setting", "method", "quantity", "measured", "measured SE", "simulated", "error",
                        "engine probe", "replayed episodes", "speed from"], vrows, align="lllrrrrrrl"),
        "",
        f"**Projection** to a GPU cluster (assumed, not measured: continuous batching, decode step "
        f"{e['step_s'] * 1e3:.0f} ms + {e['step_s_per_row'] * 1e3:.2f} ms per row, up to {e['max_batch']} rows, "
        f"prefill {e['prefill_s_per_token'] * 1e6:.0f} us/token; GRPO learner {a['grpo_learner_s_per_token'] * 1e6:.0f} "
        f"us per trained token per GPU, SAO learner x{a['sao_learner_cost_ratio']:.2f} (critic; the ratio `async_vs_sync` "
        f"measured on one batch); {a['learner_gpus_per_generator']} learner GPU per generator; "
        f"{a['rollouts_per_generator_per_step']} rollouts per generator per step; publish {a['publish_s']} s, "
        f"reload {a['reload_s']} s; turn lengths of the trace x{a['token_scale']}; {tool}; G = {a['group_size']}, "
        f"tau = {a['max_staleness']}, {a['steps']} versions per run).",
        "",
        markdown_table(["N", "learner GPUs", "B", "busy SAO", "busy GRPO", "occupancy SAO", "occupancy GRPO",
                        "speedup SAO/GRPO"], prow),
        "",
        f"![utilisation and speedup against N]({result['plot']})",
        "",
        f"Learner GPUs per generator at N = {result['learner_sensitivity'][0]['generators']} (same assumptions "
        "otherwise):",
        "",
        markdown_table(["learner GPUs per generator", "learner GPUs", "busy SAO", "busy GRPO", "speedup SAO/GRPO"],
                       [[f"{r['learner_ratio']:g}", r["learner_gpus"], f"{r['sao']['busy_fraction']:.2f}",
                         f"{r['grpo_sync']['busy_fraction']:.2f}", f"{r['speedup_sao_over_grpo_sync']:.2f}"]
                        for r in result["learner_sensitivity"]]),
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    from bench.common import (
        PLOTS_DIR,
        REPO,
        command_line,
        machine_info,
        publish_result,
        read_result,
    )

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ns", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512, 1024], help="generator counts")
    p.add_argument("--steps", type=int, default=6, help="policy versions per projected run")
    p.add_argument("--repeats", type=int, default=5, help="seeds per validation run")
    p.add_argument("--token-scale", type=float, default=10.0, help="stretch the trace's lengths for the projection")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-staleness", type=int, default=4, help="tau of the projection (4, as async_vs_sync)")
    p.add_argument("--rollouts-per-generator", type=int, default=32,
                   help="B / N; with --gpu-max-batch 32 one step fills every engine once (GRPO's best case)")
    p.add_argument("--learner-ratio", type=float, default=1.0, help="learner GPUs per generator")
    p.add_argument("--gpu-max-batch", type=int, default=32)
    p.add_argument("--gpu-step-s", type=float, default=0.02)
    p.add_argument("--gpu-step-s-per-row", type=float, default=0.0002)
    p.add_argument("--gpu-prefill-s-per-token", type=float, default=2e-5)
    p.add_argument("--gpu-train-s-per-token", type=float, default=1.5e-4)
    p.add_argument("--sao-learner-cost", type=float, default=2.0, help="used when the runs lack a measured ratio")
    p.add_argument("--gpu-publish-s", type=float, default=2.0)
    p.add_argument("--gpu-reload-s", type=float, default=1.0)
    p.add_argument("--sensitivity-n", type=int, default=64, help="N of the learner-GPU sensitivity table")
    p.add_argument("--sensitivity-ratios", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0],
                   help="learner GPUs per generator in the sensitivity table")
    p.add_argument("--measured", type=Path, default=None,
                   help="results of async_vs_sync to check against (default bench/results/async_vs_sync.json)")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--validate-only", action="store_true",
                   help="only the check against the small runs: print it, skip the projection, write no file")
    args = p.parse_args(argv)

    try:  # the default results file gets the same one-line error as --measured
        measured = (json.loads(args.measured.read_text(encoding="utf-8")) if args.measured is not None
                    else read_result("async_vs_sync"))
    except (OSError, ValueError) as exc:
        print(f"bench.simulate: {args.measured or 'bench/results/async_vs_sync.json'}: {exc}", file=sys.stderr)
        return 2
    if measured is None:
        print("bench/results/async_vs_sync.json is missing: run .venv/bin/python -m bench.async_vs_sync first",
              file=sys.stderr)
        return 2
    t0 = time.monotonic()
    print("validating against the measured small runs", flush=True)
    try:
        validation = validate_all(measured, args.repeats)
    except ValueError as exc:  # a malformed entry of the results: one line naming it, nothing written
        print(f"bench.simulate: {args.measured or 'bench/results/async_vs_sync.json'}: {exc}", file=sys.stderr)
        return 2
    for r in validation["rows"]:
        print(f"  {r['setting']:>13} {r['method']:>17} {r['quantity']:<28} measured {r['measured']:.3g} "
              f"simulated {r['predicted']:.3g} ({100 * r['relative_error']:+.0f}%)")
    if args.validate_only:
        w = validation["worst"] or {}
        print(f"worst relative error {100 * (validation['max_abs_relative_error'] or 0.0):.0f}% ({w.get('setting')}, "
              f"{w.get('method')}, {w.get('quantity')}); {time.monotonic() - t0:.0f} s; nothing written (--validate-only)")
        return 0
    assumptions = gpu_assumptions(args, measured)
    workload = Workload.from_trace(measured["trace"], token_scale=args.token_scale)
    print(f"projecting N = {args.ns}", flush=True)
    rows = project(args.ns, assumptions, workload)
    print(f"learner-GPU sensitivity at N = {args.sensitivity_n}", flush=True)
    sensitivity = [{"learner_ratio": r, **project([args.sensitivity_n], assumptions, workload, learner_ratio=r)[0]}
                   for r in args.sensitivity_ratios]
    png = plot(rows, PLOTS_DIR / "simulate.png")
    result = {
        "command": command_line("bench.simulate", argv),
        "machine": machine_info(),
        "measured_from": str(args.measured) if args.measured else "bench/results/async_vs_sync.json",
        "measured_when": measured["machine"]["when"],
        "validation": validation,
        "assumptions": assumptions,
        "workload": workload.summary(),
        "projection": rows,
        "learner_sensitivity": sensitivity,
        "plot": str(png.relative_to(REPO / "docs")),
        "seconds": time.monotonic() - t0,
    }
    publish_result("simulate", result, render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
