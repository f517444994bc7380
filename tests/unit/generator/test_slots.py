"""Episode slots and the rollout sender: every admission ticket ends consumed or released, and is counted.

A slot runs real episodes (``run_episode`` / ``run_group``) of the ``synthetic_tool`` environment
with a locally trained ChatML tokenizer, against the in-memory admission controller and rollout
stream. Only the engine is a test double: it answers from a script (an answer, a tool call then
a stall, an error, an invalid logprob). Capacity at policy version 0 with tau 0 is B tickets.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import pytest

from posttrain.data.tokenizer import train_tokenizer
from posttrain.envs.base import InfraError
from posttrain.envs.synthetic.tool import SyntheticToolEnv, reference_episode
from posttrain.envs.tool_calls import format_tool_result
from posttrain.episodes.runner import EpisodeLimits
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.generator.seeds import EpisodeSeeds
from posttrain.generator.sender import RolloutSender
from posttrain.generator.slots import EpisodeSlot, EpisodeWork, TicketTaker, run_until_stopped, slot_count
from posttrain.inference.base import GenerationRequest, GenerationResult
from posttrain.inference.metering import GeneratorStats
from posttrain.models.hf import load_tokenizer
from posttrain.records import Rollout, Task
from posttrain.rollout.admission import AsyncTicketGate, MemoryAdmissionController, ReissuedTask
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue

LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=64, max_episode_tokens=400, timeout_s=30.0)
Mode = Literal["answer", "fail", "invalid", "stall"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    env = SyntheticToolEnv()
    texts = []
    for task in env.tasks("train", 200, seed=0):
        texts += [m["content"] for m in env.start(task).messages()] + reference_episode(task)
    texts.append(format_tool_result("calculator", "61"))
    return load_tokenizer(train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=400))


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return list(SyntheticToolEnv().tasks("train", 5, seed=1))


@dataclass
class ScriptedEngine:
    """Engine test double; every request gets the reply of ``mode`` and is recorded.

    answer: ``#### 61`` (one turn). fail: RuntimeError. invalid: ``#### 61`` with logprob +0.5
    (the rollout violates an invariant: RecordError). stall: the task's tool call on an episode's
    first turn (version 0), then a request that never returns.
    """

    tok: Any
    mode: Mode
    requests: list[GenerationRequest] = field(default_factory=list)
    first_prompt_len: int | None = None
    policy_version: int = 0

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        if self.mode == "fail":
            raise RuntimeError("engine down")
        text = "#### 61"
        if self.mode == "stall":
            if self.first_prompt_len is None:
                self.first_prompt_len = len(request.prompt_token_ids)
            if len(request.prompt_token_ids) > self.first_prompt_len:  # a second turn: stuck forever
                await asyncio.Event().wait()
            text = '<tool_call>{"name": "calculator", "arguments": {"expression": "7 * 8 + 5"}}</tool_call>'
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        logprob = 0.5 if self.mode == "invalid" else -0.5
        return GenerationResult(token_ids=ids, logprobs=[logprob] * len(ids), finish_reason="stop", policy_version=0)

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


@dataclass
class Generator:
    """One generator's parts, as ``generator.worker.serve`` wires them, over in-memory services."""

    engine: ScriptedEngine
    admission: MemoryAdmissionController
    queue: MemoryRolloutQueue
    stats: GeneratorStats
    running: InFlightEpisodes
    stopping: asyncio.Event
    slot: EpisodeSlot

    def counts(self) -> tuple[int, int, int, int]:
        """(granted, consumed, released, in flight) tickets."""
        s = self.admission.state()
        return s.granted_total, s.consumed, s.released_total, s.in_flight

    def sent(self) -> list[Rollout]:
        return [entry.rollout for entry in self.queue.get_batch(100, 0.0)]


class InfraFailingEnv:
    """``synthetic_tool`` whose every step fails for the infrastructure (a tool killed from outside); records tasks."""

    name = "synthetic_tool"

    def __init__(self) -> None:
        self.inner, self.started = SyntheticToolEnv(), []

    def start(self, task: Task) -> Any:
        self.started.append(task.task_id)
        inner = self.inner.start(task)

        class Episode:
            def messages(self) -> list[dict[str, str]]:
                return inner.messages()

            async def step(self, action_text: str) -> Any:
                raise InfraError("python tool call killed from outside (exit code 137)", "tool_killed")

            def close(self) -> None:
                inner.close()

        return Episode()


def make_generator(tok: Any, tasks: list[Task], mode: Mode, group_size: int, batch_size: int, seed: int = 7,
                   env: Any = None, infra_retries: int = 2) -> Generator:
    """Call inside the event loop: the gate and the stop event belong to it."""
    admission = MemoryAdmissionController(MemoryPolicyVersionStore(0), batch_size=batch_size, max_staleness=0)
    queue, stats, running, stopping = MemoryRolloutQueue(), GeneratorStats(), InFlightEpisodes(), asyncio.Event()
    engine = ScriptedEngine(tok, mode)
    work = EpisodeWork(engine, tok, env or SyntheticToolEnv(), tasks, LIMITS, "g0", group_size=group_size,
                       infra_retries=infra_retries)
    taker = TicketTaker(AsyncTicketGate(admission), admission, group_size, stats, stopping, wait_s=0.05)
    sender = RolloutSender(queue, admission, stats, "g0")
    slot = EpisodeSlot(work, taker, admission, running, sender, stats, random.Random(seed), stopping,
                       EpisodeSeeds(run_seed=0, index=1))
    return Generator(engine, admission, queue, stats, running, stopping, slot)


def test_slot_count_is_one_slot_per_episode_or_per_group() -> None:
    assert (slot_count(8, 1), slot_count(8, 4), slot_count(8, 3), slot_count(2, 4)) == (8, 2, 2, 1)


def test_sao_slot_sends_its_rollout_consumes_its_ticket_and_seeds_it_by_generator_and_episode(
        tok: Any, tasks: list[Task]) -> None:
    """B = 2: one step takes 1 ticket, sends 1 rollout, consumes the ticket.

    Random(7) draws the task index; the first episode of generator 1 in a run seeded 0 samples with
    (0 * 1024 + 1) * 2**20 = 1048576, recorded in the rollout's metrics.
    """
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=1, batch_size=2)
        await gen.slot.step()
        return gen

    gen = asyncio.run(go())
    task, seed = tasks[random.Random(7).randrange(len(tasks))], 1048576
    assert gen.counts() == (1, 1, 0, 0)
    [rollout] = gen.sent()
    assert rollout.task_id == task.task_id and rollout.group_id is None
    assert [r.seed for r in gen.engine.requests] == [seed]
    assert rollout.metrics["sampling_seed"] == seed
    assert (gen.stats.rollouts, gen.stats.failed, gen.stats.rejected, gen.stats.in_flight) == (1, 0, 0, 0)
    assert gen.stats.action_tokens == rollout.num_action_tokens
    assert gen.stats.total_tokens == len(rollout.token_ids)


def test_group_slot_sends_the_whole_group_and_consumes_g_tickets(tok: Any, tasks: list[Task]) -> None:
    """G = 2, B = 2: one step takes 2 tickets, sends 2 rollouts of one task and group, consumes both.

    Member k samples with seed + 1000 k, seed being generator 1's first episode seed, 2**20.
    """
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=2, batch_size=2)
        await gen.slot.step()
        return gen

    gen = asyncio.run(go())
    task, seed = tasks[random.Random(7).randrange(len(tasks))], 2**20
    assert gen.counts() == (2, 2, 0, 0)
    rollouts = gen.sent()
    assert [r.task_id for r in rollouts] == [task.task_id] * 2
    assert rollouts[0].group_id is not None and rollouts[0].group_id == rollouts[1].group_id
    assert sorted(r.seed for r in gen.engine.requests) == [seed, seed + 1000]
    assert sorted(r.metrics["sampling_seed"] for r in rollouts) == [seed, seed + 1000]
    assert (gen.stats.rollouts, gen.stats.max_in_flight, gen.stats.in_flight) == (2, 2, 0)


@pytest.mark.parametrize(("group_size", "mode", "failed", "rejected"), [
    (1, "fail", 1, 0), (2, "fail", 1, 0),  # one failure per episode or per group
    (1, "invalid", 0, 1), (2, "invalid", 1, 0),  # an invalid record: rejected alone, a failed group
])
def test_a_failed_episode_or_group_releases_its_tickets_and_counts_once(
        tok: Any, tasks: list[Task], group_size: int, mode: Mode, failed: int, rejected: int) -> None:
    async def go() -> Generator:
        gen = make_generator(tok, tasks, mode, group_size=group_size, batch_size=2)
        await gen.slot.step()
        return gen

    gen = asyncio.run(go())
    assert gen.counts() == (group_size, 0, group_size, 0)
    assert gen.sent() == []
    assert (gen.stats.failed, gen.stats.rejected, gen.stats.rollouts, gen.stats.in_flight) == (failed, rejected, 0, 0)


def test_an_infrastructure_failure_is_never_sent_its_slot_returns_and_its_task_runs_again_boundedly(
        tok: Any, tasks: list[Task], caplog: pytest.LogCaptureFixture) -> None:
    """Issue 32, B = 2, ``infra_retries=1``; every step fails for the infrastructure (tool killed).

    Step 1 draws task T: not sent, its ticket released, counted (tool_killed), T queued again.
    Step 2 runs T again (taken from the queue, not drawn): fails; 2 failures > 1 retry: given up, with
    a line naming T. Step 3 draws a new task. Nothing is ever sent; every ticket came back."""
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=1, batch_size=2, env=env, infra_retries=1)
        for _ in range(3):
            await gen.slot.step()
        return gen

    env = InfraFailingEnv()
    draws = random.Random(7)
    first, third = tasks[draws.randrange(len(tasks))], tasks[draws.randrange(len(tasks))]
    with caplog.at_level("WARNING", logger="posttrain.generator"):
        gen = asyncio.run(go())
    assert env.started == [first.task_id, first.task_id, third.task_id]
    assert gen.sent() == [] and gen.counts() == (3, 0, 3, 0)
    s = gen.admission.state()
    assert (s.infra_total, s.infra_by_cause, s.reissued_total, s.abandoned_total) == (3, {"tool_killed": 3}, 2, 1)
    assert (gen.stats.infra_errors, gen.stats.infra_abandoned, gen.stats.reissued, gen.stats.failed) == (3, 1, 1, 0)
    assert gen.admission.take_reissued() == ReissuedTask(third.task_id, 1, "tool_killed")
    given_up = [r.message for r in caplog.records if "given up" in r.message]
    assert len(given_up) == 1 and first.task_id in given_up[0] and "tool_killed" in given_up[0]


@pytest.mark.parametrize("group_size", [1, 2])
def test_an_episode_cancelled_as_stale_releases_its_tickets_and_counts_each(
        tok: Any, tasks: list[Task], group_size: int) -> None:
    """Turn 1 at version 0, then a stuck turn 2; learner at 5 with tau 0 -> cancelled: stale_aborted G, G released."""
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "stall", group_size=group_size, batch_size=2)
        step = asyncio.create_task(gen.slot.step())
        while not gen.running.abort_stale(learner_version=5, max_staleness=0):
            await asyncio.sleep(0.01)  # until turn 1 has returned
        await step
        return gen

    gen = asyncio.run(asyncio.wait_for(go(), timeout=60))
    assert gen.counts() == (group_size, 0, group_size, 0)
    assert (gen.stats.stale_aborted, gen.stats.failed, gen.stats.rollouts, gen.stats.in_flight) == (group_size, 0, 0, 0)
    assert len(gen.running) == 0 and gen.sent() == []


@pytest.mark.parametrize("group_size", [1, 2])
def test_a_stopping_generator_releases_the_tickets_of_its_episodes(tok: Any, tasks: list[Task], group_size: int) -> None:
    """The slot is cancelled while its episode is stuck: CancelledError propagates, the G tickets are released."""
    async def go() -> tuple[Generator, bool]:
        gen = make_generator(tok, tasks, "stall", group_size=group_size, batch_size=2)
        step = asyncio.create_task(gen.slot.step())
        while len(gen.engine.requests) < 2 * group_size:  # every member is stuck on its second turn
            await asyncio.sleep(0.01)
        step.cancel()
        try:
            await step
        except asyncio.CancelledError:
            return gen, True
        return gen, False

    gen, cancelled = asyncio.run(asyncio.wait_for(go(), timeout=60))
    assert cancelled
    assert gen.counts() == (group_size, 0, group_size, 0)
    assert (gen.stats.stale_aborted, gen.stats.failed, gen.stats.in_flight) == (0, 0, 0)


def test_a_group_slot_releases_a_partial_ticket_set_and_runs_nothing(tok: Any, tasks: list[Task]) -> None:
    """G = 2 but B = 1 (capacity 1): the one ticket granted is released, no episode starts."""
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=2, batch_size=1)
        await gen.slot.step()
        return gen

    gen = asyncio.run(go())
    assert gen.counts() == (1, 0, 1, 0)
    assert gen.engine.requests == [] and gen.stats.max_in_flight == 0
    assert gen.stats.admission_wait_s > 0.0


def test_run_until_stopped_serves_until_stop_and_leaves_no_ticket_open(tok: Any, tasks: list[Task]) -> None:
    """B = 3, tau 0: the slot sends 3 rollouts, then waits for capacity; the watcher stand-in then stops it."""
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=1, batch_size=3)

        async def stop_after_three() -> None:
            while gen.stats.rollouts < 3:
                await asyncio.sleep(0.01)
            gen.stopping.set()

        await run_until_stopped([gen.slot], stop_after_three(), gen.stopping)
        return gen

    gen = asyncio.run(asyncio.wait_for(go(), timeout=60))
    assert gen.counts() == (3, 3, 0, 0)
    assert len(gen.sent()) == 3


def test_a_slot_dying_of_an_unexpected_error_stops_the_generator_and_raises(tok: Any, tasks: list[Task]) -> None:
    """An error the slot does not handle (KeyError from the engine) sets stopping and comes out of run_until_stopped."""
    async def go() -> Generator:
        gen = make_generator(tok, tasks, "answer", group_size=1, batch_size=2)

        async def broken(request: GenerationRequest) -> GenerationResult:
            raise KeyError("bug")

        gen.engine.generate = broken  # type: ignore[method-assign]
        with pytest.raises(KeyError, match="bug"):
            await run_until_stopped([gen.slot], gen.stopping.wait(), gen.stopping)
        return gen

    gen = asyncio.run(asyncio.wait_for(go(), timeout=60))
    assert gen.stopping.is_set()
    assert gen.stats.in_flight == 0


class DownQueue(MemoryRolloutQueue):
    """A stream whose XADD fails (the server went away)."""

    def put(self, rollout: Rollout) -> str:
        raise ConnectionResetError("stream unreachable")


def test_the_sender_releases_the_ticket_of_a_refused_or_unsent_rollout(tok: Any, tasks: list[Task]) -> None:
    """A valid rollout: sent, ticket consumed. Reward NaN: refused (rejected). Stream down: failed. Both released."""
    async def go() -> tuple[Generator, RolloutSender]:
        gen = make_generator(tok, tasks, "answer", group_size=1, batch_size=4)
        await gen.slot.step()
        [good] = gen.sent()
        bad = msgspec.structs.replace(good, reward=float("nan"))
        tickets = [gen.admission.acquire(0.0) for _ in range(2)]
        sender = gen.slot.sender
        await sender.send_shielded([(tickets[0], bad)])
        down = RolloutSender(DownQueue(), gen.admission, gen.stats, "g0")
        await down.send_shielded([(tickets[1], good)])
        await down.drain()
        return gen, sender

    gen, sender = asyncio.run(go())
    assert gen.counts() == (3, 1, 2, 0)
    assert (gen.stats.rollouts, gen.stats.rejected, gen.stats.failed) == (1, 1, 1)
    assert sender.pending == 0
