"""The ``math_tool`` environment: sandboxed python calls, malformed-call rule, boxed answers (real sandbox)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from outside_kill import OutsideKiller, victim_code
from posttrain.envs.base import InfraError
from posttrain.envs.math.math_tool import MathToolEnv
from posttrain.envs.math.verifier_pool import VerifierError
from posttrain.envs.sandbox import SandboxLimits
from posttrain.envs.tool_calls import TOOL_CALL_FORMAT_PROMPT
from posttrain.records import Task


def task() -> Task:
    return Task(task_id="m", env_name="math_tool", prompt="What is 2^10 / 4?", reference="256")


def call(code: str) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def test_messages_describe_the_python_tool_and_boxed_answers() -> None:
    system, user = MathToolEnv().start(task()).messages()
    assert system["role"] == "system" and TOOL_CALL_FORMAT_PROMPT in system["content"]
    assert "\\boxed{}" in system["content"] and user == {"role": "user", "content": "What is 2^10 / 4?"}


def test_python_call_output_is_the_observation_then_a_boxed_answer_is_verified() -> None:
    episode = MathToolEnv().start(task())
    first = asyncio.run(episode.step("Let me compute.\n" + call("print(2**10 // 4)")))
    assert not first.done and first.observation == '<tool_result name="python">\n256\n</tool_result>'
    final = asyncio.run(episode.step(r"The answer is \boxed{256}."))
    assert (final.done, final.reward, final.finish_reason) == (True, 1.0, "stop")
    assert final.metrics["tool_calls"] == 1.0 and final.metrics["correct"] == 1.0


def test_errors_and_limits_are_reported_in_the_observation() -> None:
    """stderr and the exit code come back; an endless loop is killed by the CPU/wall limit."""
    env = MathToolEnv(sandbox_limits=SandboxLimits(cpu_time_s=1.0, wall_time_s=3.0))
    episode = env.start(task())
    err = asyncio.run(episode.step(call("1/0")))
    assert "ZeroDivisionError" in (err.observation or "") and "[exit code 1]" in (err.observation or "")
    loop = asyncio.run(episode.step(call("while True:\n    pass")))
    assert "[killed:" in (loop.observation or "") and loop.metrics["tool_timeouts"] == 1.0
    silent = asyncio.run(episode.step(call("x = 1")))
    assert "[no output" in (silent.observation or "")


def test_wrong_or_missing_boxed_answer_gets_zero() -> None:
    assert asyncio.run(MathToolEnv().start(task()).step(r"\boxed{255}")).reward == 0.0
    result = asyncio.run(MathToolEnv().start(task()).step("256"))
    assert (result.done, result.reward) == (True, 0.0)


def test_two_malformed_actions_in_a_row_end_with_tool_error() -> None:
    """Unknown tool, then a call without "code": tool_error, reward 0; a good call in between resets."""
    episode = MathToolEnv().start(task())
    bad_tool = '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>'
    first = asyncio.run(episode.step(bad_tool))
    assert not first.done and "unknown tool" in (first.observation or "")
    assert not asyncio.run(episode.step(call("print(1)"))).done
    assert not asyncio.run(episode.step(bad_tool)).done
    end = asyncio.run(episode.step('<tool_call>{"name": "python", "arguments": {}}</tool_call>'))
    assert (end.done, end.finish_reason, end.reward, end.metrics["malformed_actions"]) == (True, "tool_error", 0.0, 3.0)


def test_calls_beyond_the_per_action_cap_are_skipped() -> None:
    episode = MathToolEnv(max_calls_per_action=1).start(task())
    result = asyncio.run(episode.step(call("print(1)") + call("print(2)")))
    assert "skipped" in (result.observation or "") and result.metrics["tool_calls"] == 1.0


def test_a_python_call_killed_from_outside_is_an_infra_error_not_an_exit_code_shown_to_the_policy() -> None:
    """Issue 32: the sandbox's python killed from outside (SIGKILL, as the OOM killer would) used to come
    back as ``[exit code 137]`` in the observation, the policy's mistake; it is now ``InfraError`` (cause
    ``tool_killed``), which ends the episode untrained."""
    marker = f"victim-{uuid.uuid4().hex}"
    killer = OutsideKiller(marker, timeout_s=60)
    episode = MathToolEnv(sandbox_limits=SandboxLimits(cpu_time_s=10.0, wall_time_s=60.0)).start(task())
    with pytest.raises(InfraError, match="killed from outside") as failure:
        asyncio.run(episode.step(call(victim_code(marker))))
    assert killer.join() and failure.value.cause == "tool_killed"


def test_an_answer_checker_that_cannot_run_is_an_infra_error() -> None:
    """The math-verify worker failing to start is the grader failing, not a wrong answer."""
    assert issubclass(VerifierError, InfraError) and VerifierError("no worker").cause == "grader_not_started"
