"""The ``gsm8k`` environment: system prompt, verified reward, SFT reference solutions."""

from __future__ import annotations

import asyncio

from posttrain.data.tasks import load_gsm8k
from posttrain.envs.math.gsm8k import SYSTEM_PROMPT, GSM8KEnv, reference_solution
from posttrain.records import Task


def task(reference: str = "72") -> Task:
    return Task(task_id="g", env_name="gsm8k", prompt="How many clips?", reference=reference)


def reward(text: str, reference: str = "72") -> tuple[float, dict[str, float]]:
    result = asyncio.run(GSM8KEnv().start(task(reference)).step(text))
    assert result.done and result.finish_reason == "stop"
    return result.reward, result.metrics


def test_episode_messages_are_system_prompt_then_question() -> None:
    assert GSM8KEnv().start(task()).messages() == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "How many clips?"},
    ]
    assert "####" in SYSTEM_PROMPT
    assert GSM8KEnv(system_prompt=None).start(task()).messages()[0]["role"] == "user"


def test_reward_is_one_for_a_verified_answer_and_zero_otherwise() -> None:
    """'#### 72', '#### $72.00' and a boxed 72 are right; '#### 71' and no answer are wrong."""
    assert reward("48 + 24 = 72\n#### 72") == (1.0, {"correct": 1.0, "has_answer": 1.0})
    assert reward("#### $72.00")[0] == 1.0
    assert reward(r"so \boxed{72}")[0] == 1.0
    assert reward("#### 71") == (0.0, {"correct": 0.0, "has_answer": 1.0})
    assert reward("seventy-two") == (0.0, {"correct": 0.0, "has_answer": 0.0})
    assert reward("#### 0.5", "1/2")[0] == 1.0  # non-integer reference goes through math-verify


def test_reference_solutions_drop_annotations_and_verify_on_200_train_rows() -> None:
    tasks = load_gsm8k("train").tasks[:200]
    first = reference_solution(tasks[0])
    assert "<<" not in first and first.endswith("#### 72")
    for t in tasks:
        assert reward(reference_solution(t), t.reference)[0] == 1.0, t.task_id
    assert reference_solution(task("9")) == "#### 9"
