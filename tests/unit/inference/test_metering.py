"""Busy fraction: the engine's own generating clock when it has one, requests-in-engine otherwise.

Also: the ``hf`` engine runs its batches on its own thread, so a saturated default thread pool
(the old failure: episode slots parked in ``asyncio.to_thread(admission.acquire, ...)``) cannot
hold its batches back.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from posttrain.inference.base import GenerationRequest, GenerationResult
from posttrain.inference.hf import HFEngine
from posttrain.inference.metering import GeneratorStats, MeteredEngine


class ClockedEngine:
    """An engine whose generating clock the test sets by hand (seconds)."""

    def __init__(self) -> None:
        self.generating = 5.0
        self.policy_version = 0

    def generating_seconds(self) -> float:
        return self.generating

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return GenerationResult(token_ids=[1], logprobs=[-0.5], finish_reason="stop", policy_version=0)

    async def update_weights(self, weights_dir, policy_version: int) -> None:  # noqa: ANN001
        self.policy_version = policy_version

    def close(self) -> None:
        """Nothing to release."""


class PlainEngine(ClockedEngine):
    """Same engine without a generating clock (as ``vllm``)."""

    generating_seconds = None  # type: ignore[assignment]


def test_busy_fraction_follows_the_engine_clock_from_the_moment_it_is_attached() -> None:
    """Clock at 5 s when wrapped, 35 s later; wall 100 s -> busy 30 s, fraction 0.30, measured by the engine."""
    engine = ClockedEngine()
    stats = GeneratorStats()
    MeteredEngine(engine, stats)
    engine.generating = 35.0
    stats.started_at = time.time() - 100.0
    snap = stats.snapshot()
    assert snap["busy_s"] == 30.0
    assert abs(snap["busy_fraction"] - 0.30) < 1e-3
    assert snap["busy_measured_by_engine"] == 1.0


def test_engines_without_a_clock_count_time_with_a_request_inside() -> None:
    """No clock: busy = in_engine_s; after one finished request both are equal and the flag is 0."""
    stats = GeneratorStats()
    metered = MeteredEngine(PlainEngine(), stats)
    asyncio.run(metered.generate(GenerationRequest(prompt_token_ids=[1], max_new_tokens=1)))
    snap = stats.snapshot()
    assert snap["busy_measured_by_engine"] == 0.0
    assert snap["busy_s"] == snap["in_engine_s"]
    assert 0.0 <= snap["busy_fraction"] <= 1.0


def test_hf_batches_run_while_the_default_thread_pool_is_blocked(tiny_model) -> None:
    """Default pool of 1 thread held by a blocked job; 3 concurrent requests still finish (1 batch of 3).

    Before the engine had its own thread, this deadlocked: the batch waited for the pool forever.
    The engine's clock is 0 before the batch and > 0 after; requests-in-engine time is at least as long.
    """
    engine = HFEngine(tiny_model.path, max_batch=8, batch_wait_s=0.05)
    stats = GeneratorStats()
    metered = MeteredEngine(engine, stats)
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    assert engine.generating_seconds() == 0.0

    async def go() -> list[GenerationResult]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(pool)
        blocker = loop.run_in_executor(None, release.wait)
        try:
            reqs = [GenerationRequest(prompt_token_ids=[40 + i, 41, 42], max_new_tokens=4, seed=i) for i in range(3)]
            return list(await asyncio.wait_for(asyncio.gather(*(metered.generate(r) for r in reqs)), timeout=120))
        finally:
            release.set()
            await blocker

    try:
        results = asyncio.run(go())
    finally:
        engine.close()
        pool.shutdown(wait=True)
    assert [len(r.token_ids) > 0 for r in results] == [True, True, True]
    assert list(engine.batch_sizes) == [3]
    snap = stats.snapshot()
    assert snap["busy_measured_by_engine"] == 1.0
    assert 0.0 < snap["busy_s"] <= snap["in_engine_s"]
    # the batch was counted through the engine's batch observer: 1 batch of 3 rows, prompts of 3 tokens
    assert (snap["engine_batches"], snap["engine_batch_rows"], snap["mean_batch_rows"]) == (1.0, 3.0, 3.0)
    assert snap["engine_batch_padded_tokens"] == 9.0
    assert snap["cpu_s"] > 0.0 and snap["cpu_fraction"] > 0.0  # the batch ran in this process
    assert 0.0 < snap["engine_batch_cpu_s"] <= snap["cpu_s"]  # the engine thread's CPU inside the batch


def test_a_batch_observer_already_set_is_still_called() -> None:
    """The bench sets its own observer on an hf engine; metering it must not silence that observer."""

    class Batch:
        rows, width = 2, 5

    class ObservedEngine(ClockedEngine):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[object] = []
            self.batch_observer = self.seen.append

    engine, stats = ObservedEngine(), GeneratorStats()
    MeteredEngine(engine, stats)
    engine.batch_observer(Batch())
    assert len(engine.seen) == 1
    assert (stats.engine_batches, stats.engine_batch_rows, stats.engine_batch_padded_tokens) == (1, 2, 10)
    assert GeneratorStats().snapshot()["mean_batch_rows"] == 0.0  # no batches reported: 0, not a division error


def test_time_account_engine_state_follows_the_priority_of_the_module_docstring():
    """reloading > generating > waiting_on_tools > waiting_for_admission > waiting_for_learner > idle;
    the slots' account: running, waiting_for_group (a member done, its group still running), admission."""
    from posttrain.inference.metering import ENGINE_ACCOUNT, SLOTS_ACCOUNT

    stats = GeneratorStats()
    stats.mark_started(units=4)
    engine = stats._engine_states
    slots = stats._slots
    assert engine is not None and slots is not None
    assert engine.state == "idle"
    stats.admission_wait(2, started=True)
    assert engine.state == "waiting_for_admission" and slots._counts["waiting_for_admission"] == 2
    stats.admission_wait(2, started=False)
    stats.episode_started()
    stats.episode_started()
    assert engine.state == "waiting_on_tools" and slots._counts["running"] == 2
    stats.request_started()
    assert engine.state == "generating"
    stats.reload(started=True)
    assert engine.state == "reloading_weights"
    stats.reload(started=False)
    stats.request_finished()
    stats.member_finished()  # one member of the group is done, the other still runs
    assert engine.state == "waiting_on_tools"
    assert slots._counts["running"] == 1 and slots._counts["waiting_for_group"] == 1
    stats.member_finished()
    stats.episode_finished()
    stats.episode_finished()
    assert engine.state == "idle" and slots._counts["waiting_for_group"] == 0 and slots._counts["other"] == 4
    stats.learner_phase(waiting=True)
    assert engine.state == "waiting_for_learner" and slots._counts["waiting_for_learner"] == 4
    snap = stats.snapshot()
    engine_sum = sum(v for k, v in snap.items() if k.startswith(ENGINE_ACCOUNT) and k.endswith("_s")
                     and k[len(ENGINE_ACCOUNT):] not in ("wall_s", "requested_cpu_s", "used_cpu_s", "requested_gpu_s"))
    assert abs(engine_sum - snap[f"{ENGINE_ACCOUNT}wall_s"]) <= 1e-9 * max(1.0, engine_sum)
    assert snap[f"{SLOTS_ACCOUNT}wall_s"] > 0.0
