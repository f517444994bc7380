"""The simulator's model: a discrete-event RL post-training cluster with N generators and a learner (seconds, tokens).

Episodes come from a measured trace (``Workload``) and wait their task instance's tool latency after every turn but
the last, on engines that batch statically (``hf``) or continuously (vLLM). The learner trains a batch, publishes
(``publish_s``) and every engine reloads (``reload_s``). Methods: ``sao`` (admission ``(v + tau + 1) * B``, stale
rollouts dropped or cancelled in flight, critic warm-up iterations refunded), ``grpo_async`` (the same on groups;
uniform groups train nothing) and ``grpo_sync`` (generate B/G groups, wait for the last, train, publish, reload).
``simulate`` measures what ``bench.async_vs_sync`` does: busy fraction, trained action tokens and rollouts per second.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Method = Literal["sao", "grpo_async", "grpo_sync"]
"""The kinds of method the simulator runs."""


def method_kind(method: str) -> Method:
    """``sao`` (also ``sao tau=.. slots=..``), ``grpo_sync`` for ``grpo_sync_g<G>``, else ``grpo_async``."""
    if method == "sao" or method.startswith("sao "):
        return "sao"
    return "grpo_sync" if method.rpartition("_g")[0] == "grpo_sync" else "grpo_async"


@dataclass(frozen=True)
class RolloutShape:
    """Lengths of one episode: prompt, tokens decoded in each turn, observation tokens after each turn, its reward,
    and the tool waits after each turn but the last when recorded (a replayed episode; else the cluster draws them)."""

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
    """Traced tasks (a tuple of rollouts each), one Beta ``(a, b)`` per task for GRPO group rewards (empty unless
    every reward is 0 or 1), and ``replay``: a measured run's units in start order, started before any draw."""

    tasks: tuple[tuple[RolloutShape, ...], ...]
    reward_beta: tuple[tuple[float, float], ...] = ()
    replay: tuple[tuple[RolloutShape, ...], ...] = ()

    @classmethod
    def from_trace(cls, trace: Sequence[dict[str, Any]], token_scale: float = 1.0) -> Workload:
        """From ``[{"rollouts": [{prompt_tokens, action_tokens, observation_tokens, reward}]}]``, every length times
        ``token_scale`` (rounded; at least 1 action token per turn); ValueError for an empty task or turnless rollout."""
        def shape(where: str, r: dict[str, Any]) -> RolloutShape:
            if not r["action_tokens"]:
                raise ValueError(f"{where}.action_tokens: empty (a rollout has at least one turn)")
            return RolloutShape(max(1, round(r["prompt_tokens"] * token_scale)),
                                tuple(max(1, round(a * token_scale)) for a in r["action_tokens"]),
                                tuple(round(o * token_scale) for o in r["observation_tokens"]), float(r["reward"]))

        tasks = [tuple(shape(f"trace[{i}].rollouts[{j}]", r) for j, r in enumerate(e.get("rollouts", [])))
                 for i, e in enumerate(trace)]
        if not tasks or not all(tasks):
            raise ValueError("trace: empty, or a task without rollouts")
        return cls(tuple(tasks), reward_posteriors(tasks))


def reward_posteriors(tasks: Sequence[Sequence[RolloutShape]]) -> tuple[tuple[float, float], ...]:
    """Beta posterior ``(a, b)`` of each task's success rate (() for non-binary rewards or fewer than 2 tasks): prior
    Beta(kappa m, kappa (1 - m)) by the method of moments (m the mean reward, kappa = m (1 - m) / var_p - 1 with
    var_p = (var(k / n) - m (1 - m) / n) / (1 - 1 / n), the spread of the tasks' rates beyond binomial noise; 1e6 when
    var_p <= 0); a task with k of n successes: a = k + kappa m, b = n - k + kappa (1 - m)."""
    rewards = [[s.reward for s in t] for t in tasks]
    if len(tasks) < 2 or any(r not in (0.0, 1.0) for rs in rewards for r in rs):
        return ()
    n = statistics.fmean(len(rs) for rs in rewards)
    m = statistics.fmean(r for rs in rewards for r in rs)
    if n < 2 or m in (0.0, 1.0):
        return ()
    var_p = (statistics.pvariance([sum(rs) / len(rs) for rs in rewards]) - m * (1 - m) / n) / (1 - 1 / n)
    kappa = max(m * (1 - m) / var_p - 1 if var_p > 0 else 1e6, 1e-3)
    return tuple((sum(rs) + kappa * m, len(rs) - sum(rs) + kappa * (1 - m)) for rs in rewards)


@dataclass(frozen=True)
class EngineModel:
    """One generator's engine, ``static`` (hf) or ``continuous`` (vLLM), up to ``max_batch`` sequences (seconds): a
    decode step takes ``step_time(rows, width)``; a static batch also pays ``prefill_s_per_token`` per padded prompt
    token and ``sample_s_per_token`` per sampled token (a continuous engine pays prefill per request)."""

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
    """The learner: ``gpus`` data-parallel devices, ``step_s_fixed + s_per_token * tokens / gpus`` seconds per
    iteration; the first ``warmup_iterations`` publish no version (SAO's critic warm-up)."""

    gpus: int = 1
    step_s_fixed: float = 0.0
    s_per_token: float = 1e-4
    warmup_iterations: int = 0

    def train_time(self, batch: Sequence[RolloutShape]) -> float:
        """Seconds for one iteration on ``batch`` (its real tokens)."""
        return self.step_s_fixed + self.s_per_token * sum(s.total_tokens for s in batch) / self.gpus


@dataclass(frozen=True)
class ClusterConfig:
    """One simulated run: ``generators`` engines with ``episodes_in_flight`` slots each (a group takes G), B =
    ``batch_rollouts`` per learner iteration, tau = ``max_staleness``, until ``steps`` versions are published. Engine
    times are multiplied by ``engine_scale_idle`` or, while the learner trains, ``engine_scale_learner_busy`` (CPU
    sharing). A tool call waits ``min(tool_latency_max_s, tool_latency_median_s * exp(tool_latency_sigma * z))``, z ~
    N(0, 1) per (task instance, call). ``abort_stale``: at each publication, cancel the asynchronous units whose first
    turn returned and whose start version is more than tau behind (else they finish and the learner drops them)."""

    method: Method = "sao"
    generators: int = 1
    episodes_in_flight: int = 32
    batch_rollouts: int = 32
    group_size: int = 1
    max_staleness: int = 2
    steps: int = 10
    publish_s: float = 0.0
    reload_s: float = 0.0
    engine: EngineModel = field(default_factory=EngineModel)
    learner: LearnerModel = field(default_factory=LearnerModel)
    seed: int = 0
    engine_scale_idle: float = 1.0
    engine_scale_learner_busy: float = 1.0
    tool_latency_median_s: float = 0.0
    tool_latency_sigma: float = 0.0
    tool_latency_max_s: float = 60.0
    abort_stale: bool = True

    def __post_init__(self) -> None:
        """Raises ValueError for a batch that is not whole groups, or SAO with groups."""
        if self.batch_rollouts % self.group_size:
            raise ValueError(f"batch_rollouts ({self.batch_rollouts}) must be a multiple of group_size ({self.group_size})")
        if self.method == "sao" and self.group_size != 1:
            raise ValueError(f"group_size: must be 1 for method sao, got {self.group_size}")

    def scaled(self, factor: float) -> ClusterConfig:
        """This config with both engine time scales multiplied by ``factor``."""
        return replace(self, engine_scale_idle=self.engine_scale_idle * factor,
                       engine_scale_learner_busy=self.engine_scale_learner_busy * factor)


@dataclass
class SimResult:
    """What a run measured; ``generation_phase_s``: synchronous GRPO's mean seconds from a step's start to its last episode."""

    busy_fraction: float
    generation_phase_s: float | None
    slot_occupancy: float
    learner_busy_fraction: float
    trained_action_tokens_per_s: float
    rollouts_per_s: float
    window_s: float
    wall_s: float
    updates: int
    stale_dropped: int
    stale_aborted: int
    events: int
    generating_s_per_rollout: float
    mean_batch_rows: float


class EventLoop:
    """A time-ordered queue of callbacks (ties run in scheduling order)."""

    def __init__(self) -> None:
        self.now, self.events, self._seq = 0.0, 0, itertools.count()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at time ``t`` (not before now)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn))

    def run(self, until: Callable[[], bool], max_events: int) -> None:
        """Run events until ``until()`` holds or none are left; RuntimeError after ``max_events``."""
        while self._heap and not until():
            self.now, _, fn = heapq.heappop(self._heap)
            fn()
            self.events += 1
            if self.events > max_events:
                raise RuntimeError(f"simulation exceeded {max_events} events at t={self.now:.1f}s")


@dataclass
class Request:
    """One turn's generation request; ``live()`` False: its episode was cancelled (skipped while queued)."""

    prompt: int
    new: int
    done: Callable[[], None]
    live: Callable[[], bool] = lambda: True


class Engine:
    """A simulated engine (``EngineModel``) with its generating clock, occupancy and batch counts."""

    def __init__(self, loop: EventLoop, model: EngineModel, scale: Callable[[], float] = lambda: 1.0) -> None:
        self.loop, self.model, self._scale = loop, model, scale
        self.gen_s, self.row_seconds, self.batches, self.batch_rows = 0.0, 0.0, 0, 0
        self._queue: deque[Request] = deque()  # static batching: the queue, the running batch's start, a reload due
        self._gen_since: float | None = None
        self._running = self._start_pending = False
        self._reload_pending = self._stall_end = self._stall_start = 0.0
        self._phi = self._last = 0.0  # continuous batching: decode steps done so far, when last advanced
        self._active: list[tuple[float, int, Request]] = []  # (phi at which it ends, id, request)
        self._ids, self._token = itertools.count(), 0

    def generating_until_now(self) -> float:
        """Generating seconds so far, including an open period."""
        if self.model.batching == "continuous":
            self._advance()
            return self.gen_s
        return self.gen_s + (self.loop.now - self._gen_since if self._gen_since is not None else 0.0)

    def submit(self, request: Request) -> None:
        """Accept a request; ``request.done`` runs when its tokens are decoded."""
        if self.model.batching == "static":
            self._queue.append(request)
            if not self._start_pending:  # requests submitted at the same instant share a batch
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
        if self.model.batching == "continuous":
            self._advance()
            self._stall(seconds)
            self._reschedule()
        elif self._running:
            self._reload_pending += seconds
        else:
            self._stall_end = max(self._stall_end, self.loop.now) + seconds
            self.loop.at(self._stall_end, self._maybe_start)

    def _maybe_start(self) -> None:
        self._start_pending, now = False, self.loop.now
        if self._running or not self._queue:
            return
        if self._reload_pending > 0:
            self._stall_end = max(self._stall_end, now) + self._reload_pending
            self._reload_pending = 0.0
        if now < self._stall_end:
            self.loop.at(self._stall_end, self._maybe_start)
            return
        batch: list[Request] = []
        while self._queue and len(batch) < self.model.max_batch:
            r = self._queue.popleft()
            if r.live():
                batch.append(r)
        if not batch:
            return
        rows, width, steps, m = len(batch), max(r.prompt for r in batch), max(r.new for r in batch), self.model
        duration = (m.prefill_s_per_token * rows * width + steps * m.step_time(rows, width + steps // 2)
                    + m.sample_s_per_token * sum(r.new for r in batch)) * self._scale()
        self._running, self._gen_since, self.batches, self.batch_rows = True, now, self.batches + 1, self.batch_rows + rows
        self.row_seconds += rows * duration

        def finish() -> None:
            self._running = False
            self.gen_s += self.loop.now - now
            self._gen_since = None
            for r in batch:
                r.done()
            self._maybe_start()

        self.loop.at(now + duration, finish)

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
        self.loop.at(max(self.loop.now, self._stall_end) + max(need, 0.0), lambda: self._complete(token))

    def _complete(self, token: int) -> None:
        if token != self._token:
            return
        self._advance()
        finished = []
        while self._active and self._active[0][0] <= self._phi + 1e-9:
            finished.append(heapq.heappop(self._active)[2])
        self._reschedule()
        for r in finished:
            r.done()


@dataclass(eq=False)
class Unit:
    """A unit in flight (an SAO episode or a GRPO group) on generator ``gen``, started at ``version``; ``versioned``
    once its first turn returned, ``aborted`` once cancelled as stale (asynchronous methods only)."""

    gen: int
    version: int
    versioned: bool = False
    aborted: bool = False


class Cluster:
    """Generators, learner and the controller of one method; ``run()`` simulates it."""

    def __init__(self, config: ClusterConfig, workload: Workload) -> None:
        self.cfg, self.workload, self.rng, self.loop = config, workload, random.Random(config.seed), EventLoop()
        self.engines = [Engine(self.loop, config.engine, lambda: config.engine_scale_learner_busy if self.learner_busy
                               else config.engine_scale_idle) for _ in range(config.generators)]
        self._gen_phases: list[float] = []
        self.version = self.iteration = self.started = 0  # started: rollouts started and not refunded (admission)
        self.ready: deque[tuple[list[RolloutShape], int]] = deque()  # complete units and their start version
        self.learner_busy, self.learner_busy_s = False, 0.0
        self.waiting: deque[int] = deque()  # generator of each slot waiting for admission, FIFO
        self.updates: list[tuple[float, float, float]] = []  # (time, rollouts, trained action tokens)
        self.stale_dropped = self.stale_aborted = self.finished_rollouts = self._replayed = 0
        self._units: dict[Unit, None] = {}  # asynchronous units in flight, in start order
        self._instances = itertools.count()  # task instances drawn (tool-latency seeds)

    def _tool_latency(self, instance: int, call: int) -> float:
        c = self.cfg
        if c.tool_latency_median_s <= 0:
            return 0.0
        z = random.Random((c.seed * 1_000_003 + instance) * 101 + call).gauss(0.0, 1.0)
        return min(c.tool_latency_max_s, c.tool_latency_median_s * math.exp(c.tool_latency_sigma * z))

    def _episode(self, shape: RolloutShape, on_done: Callable[[], None], instance: int, unit: Unit) -> None:
        engine, turn, context = self.engines[unit.gen], 0, shape.prompt_tokens

        def live() -> bool:
            return not unit.aborted

        def submit() -> None:
            if live():
                engine.submit(Request(context, shape.action_tokens[turn], after_turn, live))

        def after_turn() -> None:
            nonlocal turn, context
            if not live():
                return
            unit.versioned = True
            context += shape.action_tokens[turn] + (shape.observation_tokens[turn] if turn < len(shape.observation_tokens) else 0)
            turn += 1
            if turn >= len(shape.action_tokens):
                on_done()
            elif (wait := shape.tool_waits_s[turn - 1] if shape.tool_waits_s else self._tool_latency(instance, turn - 1)) > 0:
                self.loop.at(self.loop.now + wait, submit)
            else:
                submit()

        submit()

    def _group(self, gen: int, on_done: Callable[[list[RolloutShape], int], None],
               shapes: list[RolloutShape] | None = None, unit: Unit | None = None) -> None:
        """Start one unit's episodes on ``gen`` (``shapes``, else ``_draw_group``); ``on_done(shapes, version)``."""
        shapes = self._draw_group() if shapes is None else shapes
        version, instance, left = self.version, next(self._instances), [len(shapes)]
        unit = unit or Unit(gen, version)

        def one_done() -> None:
            self.finished_rollouts += 1
            left[0] -= 1
            if left[0] == 0:
                on_done(shapes, version)

        for s in shapes:
            self._episode(s, one_done, instance, unit)

    def _draw_group(self) -> list[RolloutShape]:
        """The next replayed unit, else G distinct rollouts of a drawn task (if it has G), rewards from its posterior."""
        if self._replayed < len(self.workload.replay):
            self._replayed += 1
            return list(self.workload.replay[self._replayed - 1])
        index = self.rng.randrange(len(self.workload.tasks))
        task, g = self.workload.tasks[index], self.cfg.group_size
        shapes = self.rng.sample(task, g) if g <= len(task) else [task[self.rng.randrange(len(task))] for _ in range(g)]
        if self.workload.reward_beta and g > 1:
            p = self.rng.betavariate(*self.workload.reward_beta[index])
            shapes = [replace(sh, reward=1.0 if self.rng.random() < p else 0.0) for sh in shapes]
        return shapes

    def _capacity(self) -> int:
        return (self.version + self.cfg.max_staleness + 1) * self.cfg.batch_rollouts

    def _slot(self, gen: int) -> None:
        if self.started + self.cfg.group_size > self._capacity():
            self.waiting.append(gen)
            return
        self.started += self.cfg.group_size
        unit = Unit(gen, self.version)
        self._units[unit] = None

        def done(shapes: list[RolloutShape], version: int) -> None:
            del self._units[unit]
            self.ready.append((shapes, version))
            self._slot(gen)
            self._maybe_train()

        self._group(gen, done, unit=unit)

    def _abort_stale(self) -> None:
        doomed = [u for u in self._units if u.versioned and self.version - u.version > self.cfg.max_staleness]
        for u in doomed:
            u.aborted = True
            del self._units[u]
            self.started -= self.cfg.group_size
            self.stale_aborted += self.cfg.group_size
        for u in doomed:
            self._slot(u.gen)

    def _kept(self, units: list[tuple[list[RolloutShape], int]]) -> float:
        """Trained action tokens of a batch: all (SAO), or those of groups with unequal rewards (GRPO)."""
        kept = [shapes for shapes, _ in units if self.cfg.method == "sao" or len({s.reward for s in shapes}) > 1]
        return float(sum(sum(s.action_tokens) for shapes in kept for s in shapes))

    def _maybe_train(self) -> None:
        if self.learner_busy or len(self.updates) >= self.cfg.steps:
            return
        need, refunded = self.cfg.batch_rollouts // self.cfg.group_size, False
        fresh: list[tuple[list[RolloutShape], int]] = []
        while self.ready and len(fresh) < need:
            unit = self.ready.popleft()
            if self.version - unit[1] <= self.cfg.max_staleness:
                fresh.append(unit)
                continue
            self.stale_dropped += len(unit[0])
            self.started -= len(unit[0])
            refunded = True
        if refunded:
            self._wake()
        if len(fresh) < need:
            self.ready.extendleft(reversed(fresh))
            return
        batch = [s for shapes, _ in fresh for s in shapes]
        self._train(batch, self._kept(fresh))

    def _wake(self) -> None:
        while self.waiting and self.started + self.cfg.group_size <= self._capacity():
            self._slot(self.waiting.popleft())

    def _train(self, batch: list[RolloutShape], tokens: float) -> None:
        """Train ``batch``; a batch that publishes keeps its admission places (the version pays for B), a
        critic warm-up batch gives them all back, as the learner's ``refund_untrained`` does."""
        self.learner_busy = True
        publishes = self.iteration >= self.cfg.learner.warmup_iterations
        total = self.cfg.learner.train_time(batch) + (self.cfg.publish_s if publishes else 0.0)
        self.learner_busy_s += total

        def done() -> None:
            self.iteration += 1
            if not publishes:  # a warm-up iteration gives its tickets back
                self.started -= len(batch)
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

    def _sync_iteration(self) -> None:
        if len(self.updates) >= self.cfg.steps:
            return
        groups, started = self.cfg.batch_rollouts // self.cfg.group_size, self.loop.now
        units: list[tuple[list[RolloutShape], int]] = []

        def group_done(shapes: list[RolloutShape], version: int) -> None:
            units.append((shapes, version))
            if len(units) == groups:
                self._gen_phases.append(self.loop.now - started)
                self._train([s for sh, _ in units for s in sh], self._kept(units))

        for i in range(groups):
            self._group(i % self.cfg.generators, group_done)

    def run(self, max_events: int = 50_000_000) -> SimResult:
        """Simulate until ``steps`` versions are published (RuntimeError after ``max_events`` events)."""
        if self.cfg.method == "grpo_sync":
            self._sync_iteration()
        else:
            for gen in range(self.cfg.generators):
                for _ in range(max(1, self.cfg.episodes_in_flight // self.cfg.group_size)):
                    self._slot(gen)
        self.loop.run(lambda: len(self.updates) >= self.cfg.steps, max_events)
        wall, generating = self.loop.now, [e.generating_until_now() for e in self.engines]
        window, tokens, rollouts = steady_window(self.updates)

        def per(x: float, y: float) -> float:
            return x / y if y > 0 else 0.0

        return SimResult(
            busy_fraction=min(1.0, per(statistics.fmean(generating), wall)),
            generation_phase_s=statistics.fmean(self._gen_phases) if self._gen_phases else None,
            slot_occupancy=min(1.0, per(statistics.fmean(e.row_seconds for e in self.engines), wall * self.cfg.engine.max_batch)),
            learner_busy_fraction=min(1.0, per(self.learner_busy_s, wall)), trained_action_tokens_per_s=per(tokens, window),
            rollouts_per_s=per(rollouts, window), window_s=window, wall_s=wall, updates=len(self.updates),
            stale_dropped=self.stale_dropped, stale_aborted=self.stale_aborted, events=self.loop.events,
            generating_s_per_rollout=sum(generating) / max(self.finished_rollouts, 1),
            mean_batch_rows=per(sum(e.batch_rows for e in self.engines), sum(e.batches for e in self.engines)))


def steady_window(updates: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """``(seconds, trained tokens, rollouts)`` from the first update to the last, the first's own left out (start-up)."""
    if len(updates) < 2:
        return 0.0, 0.0, 0.0
    return updates[-1][0] - updates[0][0], sum(u[2] for u in updates[1:]), sum(u[1] for u in updates[1:])


def simulate(config: ClusterConfig, workload: Workload) -> SimResult:
    """One simulation of ``config`` on ``workload``."""
    return Cluster(config, workload).run()


def simulate_feeding(engine: EngineModel, scale: float, episodes: Sequence[RolloutShape], mode: str, slots: int,
                     feed_s: float, group_size: int = 8) -> float:
    """Rollouts per second of one engine fed as ``bench.sim.collect.measure_engine_modes`` feeds it: slots start units of
    ``episodes`` (in order, cycling) until ``feed_s``, each when its last is done; the rate counts the drain."""
    unit_slots, size = {"lockstep": (1, slots), "continuous": (slots, 1)}.get(mode, (max(1, slots // group_size), group_size))
    cluster = Cluster(ClusterConfig(method="grpo_async"), Workload(((episodes[0],),)))
    cluster.engines = [Engine(cluster.loop, engine, lambda: scale)]
    done = running = started = 0

    def unit_slot() -> None:
        nonlocal running, started
        if cluster.loop.now >= feed_s:
            return
        running += 1
        shapes = [episodes[(started + k) % len(episodes)] for k in range(size)]
        started += size

        def finished(shapes: list[RolloutShape], version: int) -> None:
            nonlocal done, running
            running -= 1
            done += len(shapes)
            unit_slot()

        cluster._group(0, finished, shapes)

    for _ in range(unit_slots):
        unit_slot()
    cluster.loop.run(lambda: running == 0, 5_000_000)
    return done / cluster.loop.now if cluster.loop.now > 0 else 0.0
