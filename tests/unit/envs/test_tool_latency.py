"""Shared tool latency (``envs/synthetic/latency.py``) and ``synthetic_tool``'s use of it.

The sleeps are recorded (``asyncio.sleep`` is replaced by a recorder that logs its argument and
yields), so the tests count waits and the seconds awaited, never wall-clock time.
"""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from posttrain.envs.synthetic import latency as latency_module
from posttrain.envs.synthetic.latency import ToolLatency
from posttrain.envs.synthetic.tool import SyntheticToolEnv, reference_episode
from posttrain.records import Task

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "7*8+5"}}</tool_call>'
BAD = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'


def task(task_id: str = "synthetic_tool-train-000001") -> Task:
    return Task(task_id=task_id, env_name="synthetic_tool", prompt="Compute 7 * 8 + 5 using the calculator.",
                reference="61", metadata={"expression": "7 * 8 + 5"})


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Seconds passed to ``asyncio.sleep`` by the latency module, in order (the sleep itself yields only)."""
    asked: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(seconds: float) -> None:
        asked.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(latency_module.asyncio, "sleep", recording_sleep)
    return asked


def play(env: SyntheticToolEnv, t: Task, actions: list[str]):
    async def go():
        episode = env.start(t)
        return [await episode.step(a) for a in actions]

    return asyncio.run(go())


# --- ToolLatency -----------------------------------------------------------------------------------

def test_delay_is_deterministic_per_key_and_differs_across_keys_seeds_and_namespaces() -> None:
    a = ToolLatency(1.0, 1.0, 60.0, seed=0, namespace="env")
    b = ToolLatency(1.0, 1.0, 60.0, seed=0, namespace="env")
    keys = [f"t{i}:{j}" for i in range(20) for j in range(3)]
    assert [a.delay_s(k) for k in keys] == [b.delay_s(k) for k in keys]
    assert len({a.delay_s(k) for k in keys}) == len(keys)  # 60 distinct draws
    assert ToolLatency(1.0, 1.0, 60.0, seed=1, namespace="env").delay_s("t0:0") != a.delay_s("t0:0")
    assert ToolLatency(1.0, 1.0, 60.0, seed=0, namespace="other").delay_s("t0:0") != a.delay_s("t0:0")


def test_zero_median_disables_latency_and_awaits_nothing(sleeps) -> None:
    off = ToolLatency(0.0, 1.0, 60.0, seed=0, namespace="env")
    assert not off.enabled and off.delay_s("t:0") == 0.0
    assert asyncio.run(off.wait("t:0")) == 0.0
    assert sleeps == []


def test_wait_awaits_exactly_the_delay_of_its_key(sleeps) -> None:
    on = ToolLatency(0.5, 1.0, 60.0, seed=3, namespace="env")
    waited = [asyncio.run(on.wait(f"t:{i}")) for i in range(3)]
    assert sleeps == waited == [on.delay_s(f"t:{i}") for i in range(3)]


def test_delay_is_log_normal_with_the_given_median_and_capped() -> None:
    """Median 0.5 s, sigma 1: over 2,000 keys the median is within 10% of 0.5 and the log-sd within 10% of 1."""
    lat = ToolLatency(0.5, 1.0, 60.0, seed=0, namespace="env")
    draws = [lat.delay_s(f"k{i}") for i in range(2000)]
    assert abs(statistics.median(draws) - 0.5) < 0.05
    assert abs(statistics.pstdev(math.log(d) for d in draws) - 1.0) < 0.1
    assert ToolLatency(0.5, 0.0, 60.0, seed=0, namespace="env").delay_s("k") == 0.5
    assert max(ToolLatency(0.5, 1.0, 0.3, seed=0, namespace="env").delay_s(f"k{i}") for i in range(200)) == 0.3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1.0, 1.0, 60.0, 0), r"tool_latency_median_s: must be >= 0 seconds, got -1.0"),
        ((1.0, -0.1, 60.0, 0), r"tool_latency_sigma: must be >= 0, got -0.1"),
        ((1.0, 1.0, 0.0, 0), r"tool_latency_max_s: must be > 0 seconds, got 0.0"),
        ((1.0, 1.0, 60.0, "x"), r"tool_latency_seed: must be an integer, got 'x'"),
        ((float("nan"), 1.0, 60.0, 0), r"tool_latency_median_s: must be >= 0 seconds, got nan"),
    ],
)
def test_bad_arguments_name_the_env_arg(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        ToolLatency(*args, namespace="env")


# --- synthetic_tool --------------------------------------------------------------------------------

def test_synthetic_tool_default_never_waits(sleeps) -> None:
    """Latency median 0 (default): a call and an answer -> no sleep, tool_wait_s 0, reward 1."""
    results = play(SyntheticToolEnv(), task(), reference_episode(task()))
    assert sleeps == []
    assert results[-1].metrics["tool_wait_s"] == 0.0 and results[-1].reward == 1.0


def test_synthetic_tool_each_call_waits_its_seeded_latency(sleeps) -> None:
    """Three well-formed calls (one action holding two) -> three sleeps of call_latency_s(task, 0..2);
    a malformed action and the final answer wait nothing; tool_wait_s is their sum."""
    env = SyntheticToolEnv(tool_latency_median_s=2.0, tool_latency_sigma=1.0)
    t = task()
    expected = [env.call_latency_s(t, i) for i in range(3)]
    results = play(env, t, [CALL, BAD, CALL + CALL, "#### 61"])
    assert sleeps == expected
    assert [r.metrics["tool_wait_s"] for r in results] == pytest.approx(
        [expected[0], expected[0], sum(expected), sum(expected)])
    assert results[-1].metrics["tool_calls"] == 3.0 and results[-1].reward == 1.0


def test_synthetic_tool_latency_is_deterministic_per_task_and_seed() -> None:
    a = SyntheticToolEnv(tool_latency_median_s=1.0, tool_latency_seed=5)
    b = SyntheticToolEnv(tool_latency_median_s=1.0, tool_latency_seed=5)
    tasks = a.tasks("train", 10, seed=0)
    assert [a.call_latency_s(t, i) for t in tasks for i in range(3)] == [b.call_latency_s(t, i) for t in tasks for i in range(3)]
    assert a.call_latency_s(tasks[0], 0) != a.call_latency_s(tasks[1], 0)
    assert a.call_latency_s(tasks[0], 0) != a.call_latency_s(tasks[0], 1)
    assert SyntheticToolEnv(tool_latency_median_s=1.0, tool_latency_seed=6).call_latency_s(tasks[0], 0) != a.call_latency_s(tasks[0], 0)
    assert SyntheticToolEnv().call_latency_s(tasks[0], 0) == 0.0


def test_synthetic_tool_bad_latency_arguments_name_the_field() -> None:
    with pytest.raises(ValueError, match="tool_latency_median_s"):
        SyntheticToolEnv(tool_latency_median_s=-1.0)
    with pytest.raises(ValueError, match="tool_latency_sigma"):
        SyntheticToolEnv(tool_latency_sigma=-0.1)
    with pytest.raises(ValueError, match="tool_latency_max_s"):
        SyntheticToolEnv(tool_latency_max_s=0.0)
    with pytest.raises(ValueError, match="call_index: must be >= 0, got -1"):
        SyntheticToolEnv().call_latency_s(task(), -1)


def test_longtail_and_tool_draw_from_one_shared_implementation() -> None:
    """Both environments hold a ToolLatency; with the same arguments they differ only by namespace and key."""
    from posttrain.envs.synthetic.longtail import SyntheticLongTailEnv

    tool = SyntheticToolEnv(tool_latency_median_s=1.5, tool_latency_sigma=0.5, tool_latency_seed=2)
    longtail = SyntheticLongTailEnv(tool_latency_median_s=1.5, tool_latency_sigma=0.5, tool_latency_seed=2)
    assert isinstance(tool.tool_latency, ToolLatency) and isinstance(longtail.tool_latency, ToolLatency)
    t = task()
    assert tool.call_latency_s(t, 1) == ToolLatency(1.5, 0.5, 60.0, 2, "synthetic_tool").delay_s(f"{t.task_id}:1")


def test_synthetic_tool_latency_env_args_pass_the_config_checks() -> None:
    """``data.env_args`` for synthetic_tool accepts the four latency arguments and refuses a wrong kind by name."""
    from posttrain.config import ConfigError, load_config

    cfg = load_config(None, ["data.env=synthetic_tool", "data.env_args.tool_latency_median_s=0.5",
                             "data.env_args.tool_latency_seed=3"])
    assert cfg.data.env_args["tool_latency_median_s"] == 0.5
    with pytest.raises(ConfigError, match="tool_latency_seed"):
        load_config(None, ["data.env=synthetic_tool", "data.env_args.tool_latency_seed=abc"])
