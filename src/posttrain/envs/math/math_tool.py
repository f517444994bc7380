r"""``math_tool``: multi-turn competition math with a sandboxed ``python`` tool; answer in ``\boxed{}``.

Tasks come from DAPO-Math-17k (train) and BeyondAIME (held out); see ``posttrain.envs.registry``.

Rules of an episode:

* The system prompt describes the ``python`` tool in the one tool-call format
  (``posttrain.envs.tool_calls``): ``<tool_call>{"name": "python", "arguments": {"code": "..."}}
  </tool_call>``.
* An action with tool calls runs each call's code (at most ``max_calls_per_action`` per action;
  the rest are answered "skipped") in a *fresh* sandbox (``posttrain.envs.sandbox.run_in_sandbox``:
  no network, no host files, CPU/wall/memory/output limits; variables do not persist between
  calls). The observation is each call's stdout, then stderr, then a note when a limit killed it
  or it exited non-zero, wrapped by ``format_tool_result`` and cut to ``max_observation_chars``.
  The episode goes on.
* Malformed-call rule: an action whose tool call does not parse, names a tool other than
  ``python``, or lacks a string ``code`` argument gets an error observation; after
  ``max_malformed_actions`` such actions *in a row* (default 2) the episode ends with
  ``finish_reason="tool_error"`` and reward 0.0. A well-formed action resets the count.
* An action without tool calls is final: the last ``\boxed{}`` is verified against the reference
  with math-verify (``verify_answer``); reward 1.0 if correct, else 0.0.
* Infrastructure failures are not the policy's (issue 32): a sandbox that cannot start
  (``SandboxError``), a ``python`` call killed by something other than its own limits (SIGKILL
  from outside: ``InfraError`` cause ``tool_killed``, never shown to the policy as an exit code),
  and an answer checker that cannot run (``VerifierError``) propagate out of ``step``; the agent
  loop ends the episode as ``outcome="infra_error"`` and the generator re-issues its task instead
  of training on it.

Every step reports ``correct``, ``tool_calls``, ``tool_timeouts`` and ``malformed_actions``.

Run ``python -m posttrain.envs.math.math_tool`` to play the first BeyondAIME task with a scripted
tool call.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from posttrain.envs.base import InfraError, StepResult
from posttrain.envs.math.verify import averify_answer
from posttrain.envs.sandbox import SandboxLimits, SandboxResult, run_in_sandbox
from posttrain.envs.tool_calls import (
    TOOL_CALL_FORMAT_PROMPT,
    ToolCall,
    ToolCallError,
    format_tool_result,
    parse_tool_calls,
)
from posttrain.records import Task

ENV_NAME = "math_tool"
"""Registry name of this environment."""

TOOL_NAME = "python"
"""The one tool of this environment."""

SYSTEM_PROMPT = (
    "Solve the math problem. You may run Python code (sympy and numpy if installed) with the tool "
    '"python", whose only argument is "code"; it returns what the code prints. Each call starts '
    "a fresh interpreter.\n"
    + TOOL_CALL_FORMAT_PROMPT
    + "\nWhen you are done, reply without a tool call and put the final answer in \\boxed{}."
)
"""System message of every episode."""

DEFAULT_SANDBOX_LIMITS = SandboxLimits(
    cpu_time_s=10.0, wall_time_s=20.0, memory_bytes=1 << 30, max_output_bytes=16 << 10, max_processes=16
)
"""Limits of one ``python`` call: 10 CPU s, 20 wall s, 1 GiB address space, 16 KiB of output."""


def render_sandbox_output(result: SandboxResult) -> str:
    """Observation text of one run: stdout, ``[stderr]`` section, and a note on limits/exit code."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.timed_out:
        parts.append(f"[killed: {result.killed_reason} limit reached]")
    elif result.exit_code != 0:
        parts.append(f"[exit code {result.exit_code}]")
    if result.truncated:
        parts.append("[output truncated]")
    text = "\n".join(parts)
    return text if text.strip() else "[no output; use print() to show values]"


class MathToolEnv:
    """Multi-turn math with a sandboxed Python tool (see the module docstring for the rules).

    Args:
        system_prompt: The system message.
        sandbox_limits: Limits of each ``python`` call.
        max_observation_chars: Characters of one call's output kept in the observation (>= 64).
        max_malformed_actions: Malformed actions in a row that end the episode (>= 1).
        max_calls_per_action: Tool calls run per action (>= 1); later ones are skipped.
        verify_timeout_s: Deadline of the final answer check (seconds).

    Raises:
        ValueError: a bound out of range; the message names it.
    """

    name = ENV_NAME

    def __init__(
        self,
        system_prompt: str = SYSTEM_PROMPT,
        sandbox_limits: SandboxLimits = DEFAULT_SANDBOX_LIMITS,
        max_observation_chars: int = 4000,
        max_malformed_actions: int = 2,
        max_calls_per_action: int = 4,
        verify_timeout_s: float = 5.0,
    ) -> None:
        if max_observation_chars < 64:
            raise ValueError(f"max_observation_chars: must be >= 64, got {max_observation_chars}")
        if max_malformed_actions < 1:
            raise ValueError(f"max_malformed_actions: must be >= 1, got {max_malformed_actions}")
        if max_calls_per_action < 1:
            raise ValueError(f"max_calls_per_action: must be >= 1, got {max_calls_per_action}")
        if verify_timeout_s <= 0:
            raise ValueError(f"verify_timeout_s: must be > 0, got {verify_timeout_s}")
        self.system_prompt = system_prompt
        self.sandbox_limits = replace(sandbox_limits)
        self.max_observation_chars = max_observation_chars
        self.max_malformed_actions = max_malformed_actions
        self.max_calls_per_action = max_calls_per_action
        self.verify_timeout_s = verify_timeout_s

    def start(self, task: Task) -> MathToolEpisode:
        """Begin an episode for ``task``."""
        return MathToolEpisode(self, task)


class MathToolEpisode:
    """One ``math_tool`` episode."""

    def __init__(self, env: MathToolEnv, task: Task) -> None:
        self.env, self.task = env, task
        self.tool_calls = 0
        self.tool_timeouts = 0
        self.malformed_actions = 0
        self._malformed_in_a_row = 0

    def messages(self) -> list[dict[str, str]]:
        """System message with the tool description, then the problem."""
        return [
            {"role": "system", "content": self.env.system_prompt},
            {"role": "user", "content": self.task.prompt},
        ]

    def _metrics(self, correct: bool = False) -> dict[str, float]:
        return {
            "correct": float(correct),
            "tool_calls": float(self.tool_calls),
            "tool_timeouts": float(self.tool_timeouts),
            "malformed_actions": float(self.malformed_actions),
        }

    def _result(self, text: str) -> str:
        return format_tool_result(TOOL_NAME, text, self.env.max_observation_chars)

    async def _run(self, call: ToolCall) -> tuple[str, bool]:
        """Observation text of one call and whether the call was well formed.

        Raises:
            posttrain.envs.sandbox.SandboxError: the sandbox could not run at all.
            InfraError: the call was killed from outside (cause ``tool_killed``).
        """
        if call.name != TOOL_NAME:
            text = f"error: unknown tool {call.name!r}; the only tool is {TOOL_NAME!r}"
            return format_tool_result(call.name, text, self.env.max_observation_chars), False
        code = call.arguments.get("code")
        if not isinstance(code, str) or set(call.arguments) != {"code"}:
            return self._result('error: arguments must be {"code": "<python source>"}'), False
        self.tool_calls += 1
        result = await asyncio.to_thread(run_in_sandbox, code=code, limits=self.env.sandbox_limits)
        if result.killed_externally:
            raise InfraError(f"python tool call of task {self.task.task_id} killed from outside (exit code "
                             f"{result.exit_code}, no limit of its own reached)", "tool_killed")
        if result.timed_out:
            self.tool_timeouts += 1
        return self._result(render_sandbox_output(result)), True

    async def step(self, action_text: str) -> StepResult:
        """Run the action's python calls, or verify its boxed final answer.

        Raises:
            InfraError: the infrastructure failed under the episode (module docstring): a
                ``SandboxError``, a call killed from outside, or a ``VerifierError``.
        """
        try:
            calls = parse_tool_calls(action_text)
        except ToolCallError as exc:
            return self._malformed(
                format_tool_result("tool_call", f"error: malformed tool call: {exc}", self.env.max_observation_chars)
            )
        if not calls:
            verdict = await averify_answer(
                action_text, self.task.reference, style="boxed", timeout_s=self.env.verify_timeout_s
            )
            metrics = self._metrics(verdict.correct)
            metrics["needs_judge"] = float(verdict.needs_judge)
            return StepResult(
                done=True, reward=1.0 if verdict.correct else 0.0, finish_reason="stop", metrics=metrics
            )
        texts: list[str] = []
        well_formed = True
        for index, call in enumerate(calls):
            if index >= self.env.max_calls_per_action:
                texts.append(
                    format_tool_result(call.name, f"skipped: at most {self.env.max_calls_per_action} calls per turn")
                )
                continue
            text, ok = await self._run(call)
            texts.append(text)
            well_formed = well_formed and ok
        observation = "\n".join(texts)
        if not well_formed:
            return self._malformed(observation)
        self._malformed_in_a_row = 0
        return StepResult(observation=observation, metrics=self._metrics())

    def _malformed(self, observation: str) -> StepResult:
        """Count a malformed action; end with ``tool_error`` after too many in a row."""
        self.malformed_actions += 1
        self._malformed_in_a_row += 1
        if self._malformed_in_a_row >= self.env.max_malformed_actions:
            return StepResult(done=True, reward=0.0, finish_reason="tool_error", metrics=self._metrics())
        return StepResult(observation=observation, metrics=self._metrics())

    def close(self) -> None:
        """Nothing to release: every sandbox is torn down when its call returns."""


if __name__ == "__main__":
    from posttrain.data.tasks import load_beyond_aime

    demo_task = load_beyond_aime().tasks[0]
    episode = MathToolEnv().start(demo_task)
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>'
    print(asyncio.run(episode.step(call)).observation)
    print(asyncio.run(episode.step(f"\\boxed{{{demo_task.reference}}}")))
