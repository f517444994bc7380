"""Generator throughput accounting: busy fraction, rollouts/s, tokens/s, episodes in flight.

What ``busy_fraction`` measures: seconds during which the inference engine was *generating*
(running a forward/sampling pass for at least one request) divided by wall seconds since the
generator started serving (``started_at``), capped at 1.

* Engines that report their own generating time (``generating_seconds()``; the ``hf`` engine
  counts the time its dedicated thread spends inside a batch) are measured by that clock.
  Time a request spends queued for the engine's thread, waiting for a weight reload, or
  waiting in the batching window is *not* busy.
* Other engines (``vllm``, whose scheduler owns the queue) fall back to "at least one request
  inside the engine wrapper" (``in_engine_s``). ``busy_measured_by_engine`` says which.

Waiting for admission tickets, for tool calls (environment ``step``) and for the rollout stream
happens outside the engine and never counts. ``in_engine_s`` is reported for every engine, so
the gap ``in_engine_s - busy_s`` shows time requests sat queued in front of the engine.

Generators publish their stats as JSON to a Redis hash (``<prefix>:<run>:generator_stats``)
that the learner logs.

**The time account** (issue 35; ``posttrain.account``). From ``mark_started`` on, two state
machines split the generator's wall time; their shares add up to it by construction:

* the **engine** (``account/engine/<state>_s``) is in exactly one state at a time, the first that
  holds of:

  1. ``reloading_weights``: an in-place weight update is running (``MeteredEngine.update_weights``;
     requests that arrive meanwhile wait for it);
  2. ``generating``: at least one request is inside the engine wrapper (queued for the engine's
     thread or in a batch: the ``in_engine_s`` clock, not the engine's own ``busy_s``);
  3. ``waiting_on_tools``: no request in the engine, at least one episode running between two
     engine calls (an environment step or tool call, tokenizing, grading);
  4. ``waiting_for_admission``: nothing running, at least one slot waits for admission tickets
     (the staleness bound ``max_staleness``);
  5. ``waiting_for_learner``: synchronous GRPO only, between batches (the learner trains, publishes
     and checkpoints; ``learner_phase``);
  6. ``idle``: none of these (no work: sending rollouts, picking tasks, stopping).

* the **episode slots** (``account/slots/<state>_s``, in slot-seconds: ``units`` x wall, ``units``
  = the generator's episode capacity, ``generator.episodes_in_flight`` rounded down to whole groups,
  or synchronous GRPO's batch): each unit of capacity is ``running`` an episode,
  ``waiting_for_group`` (its episode ended but its group, or synchronous GRPO's whole batch, still
  runs: the seed's "waiting for the group"), ``waiting_for_admission`` (its slot waits for tickets),
  ``waiting_for_learner`` (synchronous GRPO between batches) or ``other`` (the rest: sending,
  picking a task, start-up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from posttrain.account import Occupancy, RoleAccount, StateClock
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine

ENGINE_STATES = ("generating", "waiting_on_tools", "waiting_for_admission", "reloading_weights",
                 "waiting_for_learner", "idle")
"""The generator engine's states, in report order (module docstring: the first that holds wins)."""

SLOT_STATES = ("running", "waiting_for_group", "waiting_for_admission", "waiting_for_learner")
"""The episode slots' states (module docstring); the rest of the capacity is ``other``."""

ENGINE_ACCOUNT = "account/engine/"
"""Prefix of the engine's account in ``GeneratorStats.snapshot`` (``<prefix><state>_s``, ``<prefix>wall_s``)."""

ACCOUNT_LIVES = "account/lives"
"""Key of ``GeneratorStats.snapshot``: the generator's process lives its account sums (``carry_account``)."""

SLOTS_ACCOUNT = "account/slots/"
"""Prefix of the episode slots' account in ``GeneratorStats.snapshot`` (slot-seconds)."""


@dataclass
class GeneratorStats:
    """Counters of one generator process (seconds, tokens, rollouts).

    Attributes:
        started_at: Unix time (s) the generator began serving.
        cpu_started_at: The process's CPU time (s, all threads) when it began serving.
        in_engine_s: Seconds with at least one request inside the engine wrapper (queued or
            generating); the busy time of engines without their own clock.
        rollouts: Rollouts put on the stream.
        rejected: Rollouts rejected before sending (invalid record, e.g. a NaN logprob).
        failed: Episodes that raised (environment or engine error), counted, not sent.
        action_tokens: Sampled tokens in sent rollouts.
        total_tokens: All tokens in sent rollouts.
        in_flight: Episodes running now.
        max_in_flight: Most episodes ever running at once.
        weight_reloads: In-place weight updates applied.
        weight_announcements: New-weights announcements received (``posttrain.weight_sync.announce``).
        weight_wait_timeouts: Waits for an announcement that timed out (the store was read anyway).
        admission_wait_s: Seconds spent waiting for admission tickets (summed over episode slots).
        stale_aborted: Episodes cancelled in flight because the learner had moved more than
            ``max_staleness`` versions past their oldest policy version (``generator.inflight``).
        infra_errors: Episodes (GRPO: groups) that failed for the infrastructure (sandbox died,
            grader could not run, tool killed from outside): not sent, their tasks re-issued.
        infra_abandoned: Of those, tasks given up after ``generator.infra_retries`` re-issues.
        reissued: Episodes started on a task taken from the re-issue queue (an infrastructure
            failure or an episode lost in flight, of any generator).
        lost_in_flight: Episodes this generator's previous life (same id) left running when it
            died, released when this life started and re-issued.
        engine_batches: Batches the engine ran (engines that report them: the ``hf`` engine's
            ``batch_observer``; 0 otherwise).
        engine_batch_rows: Requests over those batches (their mean is ``mean_batch_rows``).
        engine_batch_padded_tokens: Prompt tokens the batches ran with padding (rows x width), so
            ``engine_batch_padded_tokens / engine_batch_rows`` is the mean padded context per row.
        engine_batch_cpu_s: CPU seconds of the engine's thread inside those batches
            (``BatchTiming.cpu_seconds``); ``busy_s`` minus this is time the batches waited for a
            core or the GIL.
    """

    started_at: float = field(default_factory=time.time)
    cpu_started_at: float = field(default_factory=time.process_time)
    in_engine_s: float = 0.0
    rollouts: int = 0
    rejected: int = 0
    failed: int = 0
    action_tokens: int = 0
    total_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    weight_reloads: int = 0
    weight_announcements: int = 0
    weight_wait_timeouts: int = 0
    admission_wait_s: float = 0.0
    stale_aborted: int = 0
    infra_errors: int = 0
    infra_abandoned: int = 0
    reissued: int = 0
    lost_in_flight: int = 0
    engine_batches: int = 0
    engine_batch_rows: int = 0
    engine_batch_padded_tokens: int = 0
    engine_batch_cpu_s: float = 0.0
    _aborted_calls: dict[str, int] = field(default_factory=dict)
    _aborted_calls_sum: int = 0
    _active: int = 0
    _busy_since: float = 0.0
    _engine_clock: Callable[[], float] | None = None
    _engine_clock_start: float = 0.0
    _members_done: int = 0
    _admission_waiting: int = 0
    _reloading: int = 0
    _learner_phase: bool = False
    _engine_states: StateClock | None = None
    _slots: Occupancy | None = None
    _carried_busy_s: float = 0.0

    def mark_started(self, units: int = 1) -> None:
        """Start the wall and CPU clocks and the time account now (the generator begins serving).

        Args:
            units: The episode capacity the slots' account divides (module docstring), >= 1.
        """
        self.started_at = time.time()
        self.cpu_started_at = time.process_time()
        self._engine_states = StateClock(ENGINE_STATES, initial="idle")
        self._slots = Occupancy(SLOT_STATES, max(units, 1))
        self._tick()

    def _tick(self) -> None:
        """Move the account's state machines to what the counters say now (module docstring)."""
        if self._engine_states is None or self._slots is None:
            return
        running = max(self.in_flight - self._members_done, 0)
        if self._reloading:
            state = "reloading_weights"
        elif self._active:
            state = "generating"
        elif running:
            state = "waiting_on_tools"
        elif self._admission_waiting:
            state = "waiting_for_admission"
        elif self._learner_phase:
            state = "waiting_for_learner"
        else:
            state = "idle"
        self._engine_states.switch(state)
        counts = {"running": running, "waiting_for_group": self._members_done,
                  "waiting_for_admission": self._admission_waiting}
        if self._learner_phase:
            counts["waiting_for_learner"] = self._slots.units
        self._slots.set(counts)

    def admission_wait(self, units: int, started: bool) -> None:
        """Mark a slot beginning (``started``) or ending a wait for ``units`` admission tickets."""
        self._admission_waiting += units if started else -units
        self._tick()

    def reload(self, started: bool) -> None:
        """Mark an in-place weight update beginning (``started``) or ending."""
        self._reloading += 1 if started else -1
        self._tick()

    def learner_phase(self, waiting: bool) -> None:
        """Synchronous GRPO: mark the engine waiting for the learner (between batches) or not."""
        self._learner_phase = waiting
        self._tick()

    def member_finished(self) -> None:
        """Mark one episode ended while its group (or synchronous GRPO's batch) still runs.

        It keeps its place in ``in_flight`` until ``episode_finished`` (the group's end) and is
        counted ``waiting_for_group`` meanwhile.
        """
        self._members_done += 1
        self._tick()

    def accounts(self, cores: float = 0.0, gpus: float = 0.0) -> tuple[RoleAccount, RoleAccount] | None:
        """The engine's and the slots' accounts now (None before ``mark_started``).

        Args:
            cores: The generator's requested CPU cores (``generator.resources.cpu``).
            gpus: Its requested accelerators (``generator.resources.gpus``).
        """
        if self._engine_states is None or self._slots is None:
            return None
        engine = RoleAccount.from_clock("generator", self._engine_states, cores=cores,
                                        used_cpu_s=self.busy_seconds() + self._carried_busy_s, used_by="engine_busy")
        engine.requested_gpu_s = engine.wall_s * gpus
        return engine, RoleAccount.from_clock("generator_slots", self._slots)

    def carry_account(self, previous: Mapping[str, float]) -> bool:
        """Add an earlier life's time account (its last ``snapshot()``) to this one's; call after ``mark_started``.

        A restarted generator (a second life after a crash or an eviction, under the same id) sums its
        lives instead of overwriting the first one's account in the run's telemetry hash: the engine's
        and the slots' seconds by state are added (``StateClock.carry``, ``Occupancy.carry``), and the
        earlier busy seconds go to the engine's used seconds. The seconds after the earlier life's last
        snapshot are not counted (nothing recorded them). Returns False (nothing added) when
        ``previous`` holds no account or before ``mark_started``.

        Raises:
            ValueError: a negative or non-numeric share in ``previous`` (named).
        """
        if self._engine_states is None or self._slots is None:
            return False
        engine = RoleAccount.from_flat("generator", previous, ENGINE_ACCOUNT, "engine_busy")
        if engine is None:
            return False
        self._engine_states.carry({"shares": engine.shares, "used_cpu_s": 0.0, "lives": 1})
        self._carried_busy_s += engine.used_cpu_s
        slots = RoleAccount.from_flat("generator_slots", previous, SLOTS_ACCOUNT, "none")
        if slots is not None:
            self._slots.carry(slots.shares)
        return True

    def use_engine_clock(self, generating_seconds: Callable[[], float]) -> None:
        """Measure busy time with the engine's own clock from now on (module docstring).

        Args:
            generating_seconds: Returns the engine's cumulative generating seconds (monotonic);
                the value at this call is the zero point.
        """
        self._engine_clock = generating_seconds
        self._engine_clock_start = generating_seconds()

    def busy_seconds(self) -> float:
        """Seconds the engine has been generating (engine clock), else with a request inside (module docstring)."""
        if self._engine_clock is not None:
            return self._engine_clock() - self._engine_clock_start
        return self._in_engine_now()

    def _in_engine_now(self) -> float:
        return self.in_engine_s + (time.monotonic() - self._busy_since if self._active else 0.0)

    def request_started(self) -> None:
        """Mark a request entering the engine."""
        if self._active == 0:
            self._busy_since = time.monotonic()
        self._active += 1
        self._tick()

    def request_finished(self) -> None:
        """Mark a request leaving the engine."""
        self._active -= 1
        if self._active == 0:
            self.in_engine_s += time.monotonic() - self._busy_since
        self._tick()

    def episode_started(self) -> None:
        """Mark an episode starting."""
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self._tick()

    def episode_aborted(self, tool_calls: int, bucket: str) -> None:
        """Count one episode cancelled as stale by the tool calls it had begun (``stale_aborted_calls_<bucket>``).

        ``stale_aborted`` itself is counted by the caller, as before.
        """
        self._aborted_calls[bucket] = self._aborted_calls.get(bucket, 0) + 1
        self._aborted_calls_sum += tool_calls

    def episode_finished(self) -> None:
        """Mark an episode ending (sent, rejected or failed); with its group's end, its ``member_finished`` ends too."""
        self.in_flight -= 1
        if self._members_done > 0:
            self._members_done -= 1
        self._tick()

    def snapshot(self) -> dict[str, float]:
        """Flat metrics: the public counters, busy time and rates.

        Keys beyond the counters: ``busy_s`` and ``wall_s`` (seconds), ``busy_fraction``,
        ``busy_measured_by_engine`` (1.0 when the engine's own clock was used),
        ``rollouts_per_s`` and ``tokens_per_s`` (action tokens per second), and
        ``mean_batch_rows`` (requests per engine batch; 0 without batch reports), and
        ``cpu_s`` / ``cpu_fraction``: CPU seconds the whole process used since ``cpu_started_at``
        (engine thread, event loop, environments, Redis client) and their share of wall time (can
        exceed 1 with several busy threads); ``host_cpu_s = cpu_s - engine_batch_cpu_s`` is the
        CPU spent outside the engine's batches (event loop, environments, Redis, weight reloads).
        ``stale_aborted_calls_<bucket>`` counts the episodes cancelled as stale by the tool calls
        they had begun (``episode_aborted``; ``posttrain.rollout.lengths`` buckets) and
        ``stale_aborted_calls_sum`` adds up those calls. After ``mark_started``, the time account
        (module docstring): ``account/engine/<state>_s`` and ``account/slots/<state>_s`` with their
        ``wall_s`` (``posttrain.account.RoleAccount.flat``).
        """
        wall = max(time.time() - self.started_at, 1e-9)
        busy = self.busy_seconds()
        out = {f.name: float(getattr(self, f.name)) for f in fields(self) if not f.name.startswith("_")}
        out.update(
            in_engine_s=self._in_engine_now(),
            busy_s=busy,
            busy_fraction=min(1.0, busy / wall),
            busy_measured_by_engine=float(self._engine_clock is not None),
            rollouts_per_s=self.rollouts / wall,
            tokens_per_s=self.action_tokens / wall,
            wall_s=wall,
            mean_batch_rows=self.engine_batch_rows / self.engine_batches if self.engine_batches else 0.0,
            cpu_s=(cpu := time.process_time() - self.cpu_started_at),
            cpu_fraction=cpu / wall,
            host_cpu_s=cpu - self.engine_batch_cpu_s,
            stale_aborted_calls_sum=float(self._aborted_calls_sum),
        )
        out.update({f"stale_aborted_calls_{b}": float(n) for b, n in self._aborted_calls.items()})
        accounts = self.accounts()
        if accounts is not None:
            out.update(accounts[0].flat(ENGINE_ACCOUNT))
            out.update(accounts[1].flat(SLOTS_ACCOUNT))
            out[ACCOUNT_LIVES] = float(self._engine_states.lives if self._engine_states is not None else 1)
        return out


class MeteredEngine:
    """Wraps an ``InferenceEngine`` and records busy time in ``GeneratorStats``.

    When the engine has a ``generating_seconds()`` method (the ``hf`` engine), ``stats`` uses it
    as its busy clock (``GeneratorStats.use_engine_clock``); requests entering and leaving are
    counted either way (``in_engine_s``). When it has a ``batch_observer`` slot (the ``hf``
    engine), every batch it runs is counted in ``engine_batches`` / ``engine_batch_rows`` /
    ``engine_batch_padded_tokens`` (an observer already set is still called).
    """

    def __init__(self, engine: InferenceEngine, stats: GeneratorStats) -> None:
        self._engine = engine
        self._stats = stats
        clock = getattr(engine, "generating_seconds", None)
        if callable(clock):
            stats.use_engine_clock(clock)
        if hasattr(engine, "batch_observer"):
            chained = engine.batch_observer

            def observe(batch: Any) -> None:  # on the engine's thread; only it writes these counters
                stats.engine_batches += 1
                stats.engine_batch_rows += int(batch.rows)
                stats.engine_batch_padded_tokens += int(batch.rows) * int(batch.width)
                stats.engine_batch_cpu_s += float(getattr(batch, "cpu_seconds", 0.0))
                if chained is not None:
                    chained(batch)

            engine.batch_observer = observe

    @property
    def policy_version(self) -> int:
        """Version of the weights the wrapped engine serves."""
        return self._engine.policy_version

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Forward to the engine, counting the time it is busy."""
        self._stats.request_started()
        try:
            return await self._engine.generate(request)
        finally:
            self._stats.request_finished()

    async def update_weights(self, weights_dir, policy_version: int) -> None:  # noqa: ANN001
        """Forward a weight update and count it."""
        self._stats.reload(started=True)
        try:
            await self._engine.update_weights(weights_dir, policy_version)
        finally:
            self._stats.reload(started=False)
        self._stats.weight_reloads += 1

    def close(self) -> None:
        """Close the wrapped engine."""
        self._engine.close()
