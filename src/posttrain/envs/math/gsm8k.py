r"""``gsm8k``: single-turn grade-school math word problems with a verified final answer.

The system prompt asks for step-by-step work and the final answer after ``####``. The reward is
1.0 when ``verify_answer`` (style ``auto``: the last ``####`` line or ``\boxed{}``, whichever
comes last) finds the answer equal to the reference number, else 0.0. Metrics: ``correct`` and
``has_answer``.

``reference_solution`` turns a GSM8K worked solution into an SFT target: the calculator
annotations ``<<48/2=24>>`` are removed, the ``#### 72`` line is kept.

Run ``python -m posttrain.envs.math.gsm8k`` to print one task and its reference solution.
"""

from __future__ import annotations

import re

from posttrain.envs.base import StepResult
from posttrain.envs.math.verify import averify_answer
from posttrain.records import Task

ENV_NAME = "gsm8k"
"""Registry name of this environment."""

SYSTEM_PROMPT = (
    "Solve the math word problem step by step. "
    "On the last line, write the final answer as a number after '####', for example: #### 42"
)
"""Instruction placed in the system message of every episode."""

_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")


class GSM8KEnv:
    """Single-turn GSM8K.

    Args:
        system_prompt: The system message (``None`` for none).
        verify_timeout_s: Deadline for one answer check (seconds).
    """

    name = ENV_NAME

    def __init__(self, system_prompt: str | None = SYSTEM_PROMPT, verify_timeout_s: float = 5.0) -> None:
        if verify_timeout_s <= 0:
            raise ValueError(f"verify_timeout_s: must be > 0, got {verify_timeout_s}")
        self.system_prompt = system_prompt
        self.verify_timeout_s = verify_timeout_s

    def start(self, task: Task) -> GSM8KEpisode:
        """Begin an episode for ``task``."""
        return GSM8KEpisode(self, task)


class GSM8KEpisode:
    """One GSM8K episode: the problem, one answer, a verified reward."""

    def __init__(self, env: GSM8KEnv, task: Task) -> None:
        self.env, self.task = env, task

    def messages(self) -> list[dict[str, str]]:
        """System instruction (if any) and the question."""
        head = [{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []
        return head + [{"role": "user", "content": self.task.prompt}]

    async def step(self, action_text: str) -> StepResult:
        """Verify the final answer; reward 1.0 if correct else 0.0."""
        result = await averify_answer(
            action_text, self.task.reference, style="auto", timeout_s=self.env.verify_timeout_s
        )
        return StepResult(
            done=True,
            reward=1.0 if result.correct else 0.0,
            finish_reason="stop",
            metrics={"correct": float(result.correct), "has_answer": float(result.extracted is not None)},
        )

    def close(self) -> None:
        """Nothing to release."""


def reference_solution(task: Task) -> str:
    """SFT target: the worked solution without ``<<...>>`` annotations, ending in ``#### answer``.

    Falls back to ``#### <reference>`` when the task carries no ``solution`` metadata.
    """
    solution = task.metadata.get("solution")
    if not solution:
        return f"#### {task.reference}"
    return _ANNOTATION_RE.sub("", solution)


if __name__ == "__main__":
    from posttrain.data.tasks import load_gsm8k

    first = load_gsm8k("test").tasks[0]
    print(first.prompt, "\n---\n", reference_solution(first))
