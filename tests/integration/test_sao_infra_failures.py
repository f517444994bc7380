"""An SAO run in which a sandboxed tool call is SIGKILLed from outside: nothing of it is trained, it is counted, its task comes back.

Issue 32. The real learner loop (in-memory queue, admission and version key, tiny model) and a
real generator's episode slots: the ``math_tool`` environment whose ``python`` tool runs in the real
sandbox, the agent loop, the sender and the admission tickets. Only the engine is scripted (a tiny
random model never writes a tool call): each episode calls ``python`` once, then answers
``\\boxed{42}``. The first episode of the task marked "(victim)" runs code that sleeps with a marker
in its command line, and a thread SIGKILLs that process from outside, as the OOM killer or an
eviction would. Each new policy version announced makes the generator run episodes for every
ticket left (as ``tests/unit/learner/test_loop.py``'s scripted generator does).

Before the fix the policy read ``[exit code 137]`` as its own tool's result, answered, and the
rollout was trained. Now the episode ends as an infrastructure failure: never sent, its ticket
released, counted by cause in the run's metrics, and its task runs again and trains.

Run: ``python -m pytest -q tests/integration/test_sao_infra_failures.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from outside_kill import OutsideKiller, victim_code
from posttrain.config import RunConfig
from posttrain.envs.math.math_tool import MathToolEnv
from posttrain.envs.sandbox import SandboxLimits
from posttrain.envs.tool_calls import ToolCall, format_tool_call
from posttrain.episodes.runner import EpisodeLimits
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.generator.seeds import EpisodeSeeds
from posttrain.generator.sender import RolloutSender
from posttrain.generator.slots import EpisodeSlot, EpisodeWork, TicketTaker
from posttrain.inference.base import GenerationRequest, GenerationResult
from posttrain.inference.metering import GeneratorStats
from posttrain.learner.loop import run_learner
from posttrain.learner.setup import LearnerTransport
from posttrain.models.hf import load_tokenizer
from posttrain.records import Task
from posttrain.rollout.admission import AsyncTicketGate, MemoryAdmissionController
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue, MemoryStream
from posttrain.rollout.queue import decode_entry
from posttrain.runtime import RunContext
from posttrain.weight_sync.store import FilesystemWeightStore

pytestmark = [pytest.mark.integration]

VICTIM = Task(task_id="m-victim", env_name="math_tool", prompt="What is 6 times 7? (victim)", reference="42")
PLAIN = Task(task_id="m-plain", env_name="math_tool", prompt="What is 6 times 7?", reference="42")
LIMITS = EpisodeLimits(max_turns=3, max_new_tokens=160, max_episode_tokens=800, timeout_s=120.0)


@dataclass
class ScriptedMathEngine:
    """Engine test double: a ``python`` call, then ``\\boxed{42}``; the victim task's first call is the victim code."""

    tok: Any
    versions: MemoryPolicyVersionStore
    marker: str
    victim_calls: int = 0
    requests: list[GenerationRequest] = field(default_factory=list)

    @property
    def policy_version(self) -> int:
        return self.versions.get()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        prompt = self.tok.decode(request.prompt_token_ids)
        if '<tool_result name="python">' in prompt:
            reply = r"\boxed{42}"
        elif "(victim)" in prompt and self.victim_calls == 0:
            self.victim_calls += 1
            reply = format_tool_call(ToolCall("python", {"code": victim_code(self.marker)}))
        else:
            reply = format_tool_call(ToolCall("python", {"code": "print(6 * 7)"}))
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.convert_tokens_to_ids("<|im_end|>")]
        return GenerationResult(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop",
                                policy_version=self.versions.get())

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


def _first_draw_is_the_victim() -> random.Random:
    seed = next(s for s in range(100) if random.Random(s).randrange(2) == 0)
    return random.Random(seed)


def test_a_tool_killed_from_outside_during_an_sao_run_trains_nothing_is_counted_and_its_task_comes_back(
        tmp_path: Path, tiny_model: Any) -> None:
    config = RunConfig.model_validate({
        "output_dir": str(tmp_path / "runs"), "run_name": "infra", "technique": "sao",
        "queue": {"block_ms": 1, "claim_idle_ms": 60_000},
        "generator": {"max_new_tokens": LIMITS.max_new_tokens, "max_episode_tokens": LIMITS.max_episode_tokens},
        "sao": {"steps": 3, "batch_size": 4, "micro_batch_size": 2, "max_staleness": 2, "checkpoint_every": 2,
                "optim": {"lr": 1e-3}, "critic": {"warmup_steps": 1, "lr": 1e-3}}})
    shutil.copytree(tiny_model.path, RunContext(config).tokenizer_dir)
    tok = load_tokenizer(tiny_model.path)
    versions = MemoryPolicyVersionStore()
    admission = MemoryAdmissionController(versions, batch_size=4, max_staleness=2)
    stream = MemoryStream()
    marker = f"victim-{uuid.uuid4().hex}"
    engine = ScriptedMathEngine(tok, versions, marker)
    env = MathToolEnv(sandbox_limits=SandboxLimits(cpu_time_s=10.0, wall_time_s=60.0))
    work = EpisodeWork(engine, tok, env, [VICTIM, PLAIN], LIMITS, "g0", infra_retries=2)
    stats, rng, seeds = GeneratorStats(), _first_draw_is_the_victim(), EpisodeSeeds(run_seed=0, index=0)
    sender_queue = MemoryRolloutQueue(stream, consumer="generator")
    killer = OutsideKiller(marker, timeout_s=300)

    async def fill() -> None:  # every ticket left becomes an episode, as a generator would run them
        stopping = asyncio.Event()
        taker = TicketTaker(AsyncTicketGate(admission), admission, 1, stats, stopping, wait_s=0.01)
        slot = EpisodeSlot(work, taker, admission, InFlightEpisodes(),
                           RolloutSender(sender_queue, admission, stats, "g0"), stats, rng, stopping, seeds)
        while True:
            granted = admission.state().granted_total
            await slot.step()
            if admission.state().granted_total == granted:
                return

    logged: list[dict[str, float]] = []
    transport = LearnerTransport(queue=MemoryRolloutQueue(stream, consumer="learner-0"), admission=admission,
                                 versions=versions, store=FilesystemWeightStore(RunContext(config).weights_dir),
                                 announce=lambda version: asyncio.run(fill()), generator_stats=lambda: {
                                     "g0": stats.snapshot()})
    summary = run_learner(config, transport, start_model_dir=tiny_model.path, progress=False,
                          sink=lambda metrics, version: logged.append(metrics))

    assert summary.policy_version == 3
    assert killer.join(), "the victim's python was never seen"
    # Nothing of the killed episode reached the stream, so nothing of it trained: every rollout sent
    # shows its python call's output (42); none shows the kill the policy used to read as its own.
    sent = [decode_entry(fields) for fields in stream.entries.values()]
    observations = [tok.decode([t for t, a in zip(r.token_ids, r.action_mask, strict=True) if not a]) for r in sent]
    assert all("exit code 137" not in text for text in observations)
    assert all(r.outcome == "completed" and r.reward == 1.0 for r in sent)
    # Counted by cause, in the run's metrics and summary.
    state = admission.state()
    assert (state.infra_total, state.infra_by_cause, state.reissued_total) == (1, {"tool_killed": 1}, 1)
    assert logged[-1]["infra/errors"] == 1.0 and logged[-1]["infra/tool_killed"] == 1.0
    assert logged[-1]["generator/g0/infra_errors"] == 1.0
    assert summary.counters["infra/errors"] == 1.0 and summary.counters["infra/share"] > 0.0
    # Its task came back: run again from the re-issue queue, sent, and trained.
    assert stats.reissued == 1 and state.abandoned_total == 0 and admission.take_reissued() is None
    lines = [json.loads(x) for x in (RunContext(config).run_dir / "learner_ledger.jsonl").read_text().splitlines()]
    trained_tasks = [r["task_id"] for line in lines for r in line["rollouts"]]
    assert VICTIM.task_id in trained_tasks
    assert all(not line["dropped"] for line in lines)
