"""``synthetic_longtail`` tool latency: seeded per task, log-normal, spent with ``asyncio.sleep`` in ``step``.

The sleeps are recorded (``asyncio.sleep`` of the shared latency module is wrapped to log its argument and
yield), so the tests count waits and seconds requested, never wall-clock time.
"""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from posttrain.envs.synthetic import latency
from posttrain.envs.synthetic.longtail import REFERENCE_CALL, SyntheticLongTailEnv
from posttrain.records import Task


def task(task_id: str = "t1", codes: str = "3 1 4") -> Task:
    return Task(task_id=task_id, env_name="synthetic_longtail", prompt="Fetch the codes of box 7.",
                reference=codes.split()[-1], metadata={"box": "7", "codes": codes})


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Seconds passed to ``asyncio.sleep`` by the environment, in order (the sleep itself yields only)."""
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float) -> None:
        asked.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(latency.asyncio, "sleep", recording_sleep)  # the shared ToolLatency.wait sleeps
    return asked


def play(env: SyntheticLongTailEnv, t: Task, actions: list[str]):
    async def go():
        episode = env.start(t)
        return [await episode.step(a) for a in actions]

    return asyncio.run(go())


def test_default_environment_never_waits(sleeps) -> None:
    """Latency median 0 (default): three calls and an answer -> no sleep, tool_wait_s 0."""
    results = play(SyntheticLongTailEnv(), task(), [REFERENCE_CALL] * 3 + ["#### 4"])
    assert sleeps == []
    assert results[-1].metrics["tool_wait_s"] == 0.0
    assert results[-1].reward == 1.0


def test_each_call_waits_its_seeded_latency_and_the_answer_waits_nothing(sleeps) -> None:
    """Three calls (one action holding two of them) -> three sleeps equal to call_latency_s(task, 0..2)."""
    env = SyntheticLongTailEnv(tool_latency_median_s=2.0, tool_latency_sigma=1.0)
    t = task()
    expected = [env.call_latency_s(t, i) for i in range(3)]
    results = play(env, t, [REFERENCE_CALL, REFERENCE_CALL + REFERENCE_CALL, "#### 4"])
    assert sleeps == expected
    assert results[1].observation == "code 1, left 1\ncode 4, left 0"
    assert results[-1].metrics["tool_wait_s"] == pytest.approx(sum(expected))
    assert results[-1].reward == 1.0


def test_malformed_actions_run_no_tool_and_wait_nothing(sleeps) -> None:
    env = SyntheticLongTailEnv(tool_latency_median_s=2.0)
    play(env, task(), ['<tool_call>{"name": "other"}</tool_call>'])
    assert sleeps == []


def test_latencies_are_the_same_for_every_instance_and_differ_between_tasks_and_seeds() -> None:
    """Same (seed, task, index) -> same latency in two env objects; another task or seed -> another draw."""
    a = SyntheticLongTailEnv(tool_latency_median_s=1.0)
    b = SyntheticLongTailEnv(tool_latency_median_s=1.0)
    t1, t2 = task("t1"), task("t2")
    assert [a.call_latency_s(t1, i) for i in range(5)] == [b.call_latency_s(t1, i) for i in range(5)]
    assert a.call_latency_s(t1, 0) != a.call_latency_s(t2, 0)
    assert SyntheticLongTailEnv(tool_latency_median_s=1.0, tool_latency_seed=1).call_latency_s(t1, 0) != a.call_latency_s(t1, 0)


def test_latency_is_log_normal_with_the_given_median_and_capped() -> None:
    """Median 0.5 s, sigma 1: over 2,000 draws the median is within 10% of 0.5, log-sd within 10% of 1.

    Sigma 0 gives every call exactly the median; a cap of 0.3 s bounds every draw.
    """
    env = SyntheticLongTailEnv(tool_latency_median_s=0.5, tool_latency_sigma=1.0)
    draws = [env.call_latency_s(task(f"t{i}"), j) for i in range(400) for j in range(5)]
    assert abs(statistics.median(draws) - 0.5) < 0.05
    assert abs(statistics.pstdev(math.log(d) for d in draws) - 1.0) < 0.1
    assert SyntheticLongTailEnv(tool_latency_median_s=0.5, tool_latency_sigma=0.0).call_latency_s(task(), 3) == 0.5
    capped = SyntheticLongTailEnv(tool_latency_median_s=0.5, tool_latency_max_s=0.3)
    assert max(capped.call_latency_s(task(f"t{i}"), 0) for i in range(200)) == 0.3


def test_bad_latency_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="tool_latency_median_s"):
        SyntheticLongTailEnv(tool_latency_median_s=-1.0)
    with pytest.raises(ValueError, match="tool_latency_sigma"):
        SyntheticLongTailEnv(tool_latency_sigma=-0.1)
    with pytest.raises(ValueError, match="tool_latency_max_s"):
        SyntheticLongTailEnv(tool_latency_max_s=0.0)
    with pytest.raises(ValueError, match="call_index"):
        SyntheticLongTailEnv().call_latency_s(task(), -1)
