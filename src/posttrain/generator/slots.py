"""Episode slots: the generator's concurrent loops that turn admission tickets into rollouts.

One slot type serves both techniques on the asynchronous runtime. A slot with group size G
(1 for SAO, G for async GRPO) loops:

1. take G admission tickets, all or none (``TicketTaker``): a partial set is released, so slots
   waiting for whole groups never hold each other's tickets at the capacity's edge;
2. pick a task (``rng.randrange``) and the next episode seed (``generator.seeds.EpisodeSeeds``:
   numbered by generator index and episode counter, so two generators of a run never sample with
   the same seed, and a seeded generator runs the same task and seed sequence);
3. run one episode (``run_episode``) or one group of G episodes sharing a ``group_id``
   (``run_group``) under ``InFlightEpisodes``, which cancels it once the learner is too far ahead;
4. hand the rollouts to the ``RolloutSender``: a group is sent whole or not at all.

Every ticket ends consumed (rollout sent) or released, and each outcome is counted in the
generator's stats: a failed episode or group (``failed += 1``; for G = 1 an invalid record is
``rejected += 1`` instead), one cancelled as stale (``stale_aborted += G``, and each of its episodes
in ``stale_aborted_calls_<bucket>`` by the tool calls it had begun), one cancelled by a stop
(released, then the cancellation propagates).

Infrastructure failures (issue 32; ``EpisodeInfraError``: the sandbox died, the grader could not
run, a tool was killed from outside) are never sent: the tickets are released through
``AdmissionController.release_infra``, which counts the failure by cause and queues the task to
run again, at most ``infra_retries`` times (then the task is given up with a log line naming it,
and counted in ``abandoned_total``). Before drawing a new task a slot takes the oldest task queued
to run again (``take_reissued``: these failures, and episodes lost in flight when a generator died
or restarted); each ticket set records the task it runs (``assign``), so a loss can re-issue it.

``run_until_stopped`` runs the slots beside the weight watcher until the generator stops.
Tested in ``tests/unit/generator/test_slots.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posttrain.envs.base import Environment
from posttrain.episodes.group import run_group
from posttrain.episodes.runner import EpisodeInfraError, EpisodeLimits, run_episode
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.generator.seeds import EpisodeSeeds
from posttrain.generator.sender import RolloutSender
from posttrain.inference.base import InferenceEngine
from posttrain.inference.metering import GeneratorStats
from posttrain.records import RecordError, Rollout, Task
from posttrain.rollout.admission import AdmissionController, AsyncTicketGate, ReissuedTask, Ticket
from posttrain.rollout.lengths import CALL_BUCKETS, bucket_label

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("posttrain.generator")

TICKET_WAIT_S = 1.0
"""Longest wait (seconds) of one episode slot for an admission ticket before it re-checks for stop."""


def slot_count(episodes_in_flight: int, group_size: int) -> int:
    """Episode slots of one generator: ``episodes_in_flight // group_size``, at least 1 (a count)."""
    return max(1, episodes_in_flight // group_size)


class TicketTaker:
    """Takes ``group_size`` admission tickets for one slot, or none; shared by all slots of a generator.

    Args:
        gate: The generator's ticket gate (waits on the event loop).
        admission: The controller behind ``gate``; a partial set of tickets is released to it.
        group_size: Tickets per take (G; 1 for SAO).
        stats: Counts the wait in ``admission_wait_s`` (seconds, summed over slots).
        stopping: Set when the generator stops; no new ticket is waited for after that.
        wait_s: Longest wait for one ticket (seconds).
    """

    def __init__(self, gate: AsyncTicketGate, admission: AdmissionController, group_size: int,
                 stats: GeneratorStats, stopping: asyncio.Event, wait_s: float = TICKET_WAIT_S) -> None:
        self.gate = gate
        self.admission = admission
        self.group_size = group_size
        self.stats = stats
        self.stopping = stopping
        self.wait_s = wait_s
        # One group fills at a time; single tickets need no lock beyond the gate's own.
        self._group_lock = asyncio.Lock() if group_size > 1 else None

    async def take(self) -> list[Ticket]:
        """``group_size`` tickets; ``[]`` when one wait timed out or the generator is stopping.

        The whole wait (for the group lock too) counts as ``waiting_for_admission`` of ``group_size``
        units of the time account (``GeneratorStats.admission_wait``).
        """
        self.stats.admission_wait(self.group_size, started=True)
        try:
            if self._group_lock is None:
                return await self._take_all()
            async with self._group_lock:
                return await self._take_all()
        finally:
            self.stats.admission_wait(self.group_size, started=False)

    async def _take_all(self) -> list[Ticket]:
        held: list[Ticket] = []
        while len(held) < self.group_size and not self.stopping.is_set():
            t0 = time.monotonic()
            ticket = await self.gate.acquire(self.wait_s)
            self.stats.admission_wait_s += time.monotonic() - t0
            if ticket is None:
                break
            held.append(ticket)
        if len(held) < self.group_size:
            for ticket in held:
                self.admission.release(ticket)
            return []
        return held


@dataclass(frozen=True)
class EpisodeWork:
    """What every slot of one generator runs: one episode (G = 1) or one group of G per ticket set.

    Attributes:
        engine: Samples the action tokens (the generator's ``MeteredEngine``).
        tokenizer: The policy's tokenizer (with a chat template).
        env: The environment that runs the tasks.
        tasks: The training tasks slots pick from.
        limits: Turn, token and wall-time budgets of each episode.
        generator_id: Stored in each rollout.
        group_size: G: episodes per task run together (1 for SAO).
        temperature: Sampling temperature.
        top_p: Nucleus mass.
        infra_retries: Times a task whose episode failed for the infrastructure runs again before
            it is given up (``generator.infra_retries``).
    """

    engine: InferenceEngine
    tokenizer: PreTrainedTokenizerBase
    env: Environment
    tasks: Sequence[Task]
    limits: EpisodeLimits
    generator_id: str
    group_size: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    infra_retries: int = 2

    @functools.cached_property
    def _tasks_by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.tasks}

    def task_by_id(self, task_id: str) -> Task | None:
        """The training task ``task_id``, or None when it is not one of ``tasks``."""
        return self._tasks_by_id.get(task_id)

    async def run(self, task: Task, seed: int, on_turn: Callable[[int], None],
                  on_member_done: Callable[[], None] | None = None) -> list[Rollout]:
        """Run ``task`` once (G = 1) or as a group of G; return the rollouts (per-token fields as arrays).

        Args:
            task: The task.
            seed: Episode seed (a group's member ``k`` uses ``seed + 1000 * k``).
            on_turn: Called with each turn's policy version (``InFlightEpisodes``).
            on_member_done: A group's member ended (``run_group``); unused for G = 1.

        Raises:
            Whatever the episode raises (``EpisodeError``, ``RecordError``, engine errors).
        """
        if self.group_size == 1:
            # arrays: converted once while validating, so put() packs them without a per-token pass.
            return [await run_episode(
                self.engine, self.tokenizer, self.env, task, self.limits, generator_id=self.generator_id, seed=seed,
                temperature=self.temperature, top_p=self.top_p, arrays=True, on_turn=on_turn,
            )]
        return await run_group(
            self.engine, self.tokenizer, self.env, task, self.limits, group_size=self.group_size, seed=seed,
            generator_id=self.generator_id, temperature=self.temperature, top_p=self.top_p, arrays=True,
            on_turn=on_turn, on_member_done=on_member_done,
        )


class EpisodeSlot:
    """One episode slot (module docstring): tickets, task, episode or group, send; until stopped.

    Args:
        work: What to run (shared by all slots).
        tickets: Takes the slot's G tickets (shared by all slots).
        admission: The controller the tickets came from; tickets not sent are released to it.
        running: Episodes in flight, for cancelling stale ones (shared by all slots).
        sender: Sends the rollouts and settles their tickets (shared by all slots).
        stats: The generator's counters.
        rng: Picks tasks (shared by all slots).
        stopping: Set when the generator stops.
        seeds: The generator's episode seeds (shared by all slots).
    """

    def __init__(self, work: EpisodeWork, tickets: TicketTaker, admission: AdmissionController,
                 running: InFlightEpisodes, sender: RolloutSender, stats: GeneratorStats, rng: random.Random,
                 stopping: asyncio.Event, seeds: EpisodeSeeds) -> None:
        self.work = work
        self.tickets = tickets
        self.admission = admission
        self.running = running
        self.sender = sender
        self.stats = stats
        self.rng = rng
        self.stopping = stopping
        self.seeds = seeds

    async def serve(self) -> None:
        """Run ``step`` until ``stopping`` is set.

        Raises:
            asyncio.CancelledError: the slot was cancelled (the tickets it held are released).
        """
        while not self.stopping.is_set():
            await self.step()

    async def step(self) -> None:
        """Take G tickets and, when granted, run one episode or group and send it (or settle its tickets).

        Raises:
            asyncio.CancelledError: the slot was cancelled; the tickets of its episode are released first.
        """
        tickets = await self.tickets.take()
        if not tickets:
            return
        task, attempts = self._next_task()
        self.admission.assign(tickets[0], ReissuedTask(task.task_id, attempts))  # one record per task, G too
        seed = self.seeds.next()
        for _ in tickets:
            self.stats.episode_started()
        try:
            rollouts = await self.running.run(functools.partial(self.work.run, task, seed,
                                                                on_member_done=self.stats.member_finished),
                                              on_abort=functools.partial(self._aborted, len(tickets)))
        except asyncio.CancelledError:  # stopping: give the tickets back before unwinding
            _release(self.admission, tickets)
            raise
        except EpisodeInfraError as exc:
            self._infra_failed(task, attempts, tickets, exc)
            return
        except (OSError, RuntimeError, ValueError) as exc:
            self._failed(task, tickets, exc)
            return
        finally:
            for _ in tickets:
                self.stats.episode_finished()
        if rollouts is None:  # cancelled as stale: the learner would drop it (a group: whole)
            self.stats.stale_aborted += len(tickets)
            _release(self.admission, tickets)
            return
        await self.sender.send_shielded(list(zip(tickets, rollouts, strict=True)))

    def _next_task(self) -> tuple[Task, int]:
        """The oldest task queued to run again (with its failed attempts), else a new draw (0 attempts)."""
        while (again := self.admission.take_reissued()) is not None:
            task = self.work.task_by_id(again.task_id)
            if task is not None:
                self.stats.reissued += 1
                log.info("generator %s: running %s again (%s; %d infrastructure failures before)",
                         self.work.generator_id, again.task_id, again.cause, again.attempts)
                return task, again.attempts
            log.warning("generator %s: task %s was queued to run again but is not one of this run's training "
                        "tasks; skipped", self.work.generator_id, again.task_id)
        return self.work.tasks[self.rng.randrange(len(self.work.tasks))], 0

    def _infra_failed(self, task: Task, attempts: int, tickets: Sequence[Ticket], exc: EpisodeInfraError) -> None:
        """Count an infrastructure failure, release the tickets, re-issue the task (or give it up, with a line)."""
        gid = self.work.generator_id
        self.stats.infra_errors += 1
        attempts += 1
        again = ReissuedTask(task.task_id, attempts, exc.cause) if attempts <= self.work.infra_retries else None
        self.admission.release_infra(tickets[0], exc.cause, again)
        _release(self.admission, tickets[1:])
        if again is None:
            self.stats.infra_abandoned += 1
            log.error("generator %s: task %s failed for the infrastructure %d times (last: %s: %s); given up "
                      "(generator.infra_retries=%d)", gid, task.task_id, attempts, exc.cause, exc,
                      self.work.infra_retries)
        else:
            log.warning("generator %s: episode of %s failed for the infrastructure (%s: %s); not trained, the task "
                        "runs again (attempt %d of %d)", gid, task.task_id, exc.cause, exc, attempts + 1,
                        self.work.infra_retries + 1)

    def _aborted(self, episodes: int, turns: int) -> None:
        """Count ``episodes`` cancelled as stale by their tool calls begun (``turns`` over all of them).

        Each turn of an unfinished episode made a tool call; a group's turns are shared evenly.
        """
        calls = turns // max(episodes, 1)
        for _ in range(episodes):
            self.stats.episode_aborted(calls, bucket_label(calls, CALL_BUCKETS))

    def _failed(self, task: Task, tickets: Sequence[Ticket], exc: BaseException) -> None:
        """Count the failure, release the tickets, log it."""
        gid = self.work.generator_id
        if self.work.group_size == 1 and isinstance(exc, RecordError):  # an invalid record of one episode
            self.stats.rejected += 1
            _release(self.admission, tickets)
            log.warning("generator %s: rollout of %s rejected: %s", gid, task.task_id, exc)
            return
        self.stats.failed += 1  # one per episode or group; a group with an invalid record fails whole
        _release(self.admission, tickets)
        unit = "episode" if self.work.group_size == 1 else "group"
        log.error("generator %s: %s of %s failed: %s", gid, unit, task.task_id, exc)


def _release(admission: AdmissionController, tickets: Sequence[Ticket]) -> None:
    for ticket in tickets:
        admission.release(ticket)


async def run_until_stopped(slots: Sequence[EpisodeSlot], watcher: Awaitable[None], stopping: asyncio.Event) -> None:
    """Run ``slots`` beside ``watcher`` until ``stopping`` is set, then cancel the slots and wait for them.

    A slot or the watcher ending with an error sets ``stopping`` (the watcher does so itself), so
    the error surfaces instead of a hang.

    Args:
        slots: The generator's episode slots.
        watcher: The weight watcher's loop (``WeightWatcher.run()``).
        stopping: Set on stop (key, SIGTERM, an error).

    Raises:
        The first error of the watcher or a slot (a cancellation is not an error).
    """
    slot_tasks = [asyncio.create_task(slot.serve(), name=f"episode-slot-{i}") for i, slot in enumerate(slots)]
    for t in slot_tasks:
        t.add_done_callback(functools.partial(_stop_on_error, stopping))
    results = await asyncio.gather(watcher, _cancel_on_stop(slot_tasks, stopping), *slot_tasks,
                                   return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    if errors:
        raise errors[0]


def _stop_on_error(stopping: asyncio.Event, done: asyncio.Task[None]) -> None:
    if not done.cancelled() and done.exception():
        stopping.set()


async def _cancel_on_stop(slot_tasks: Sequence[asyncio.Task[None]], stopping: asyncio.Event) -> None:
    await stopping.wait()
    for t in slot_tasks:
        t.cancel()
