"""Synthetic environments (arith, calculator tool), the safe calculator, and the environment registry."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from posttrain.envs.base import Environment, Episode, StepResult
from posttrain.envs.registry import ENVIRONMENTS, default_tasks, make_environment, reference_actions
from posttrain.envs.synthetic.arith import SyntheticArithEnv, reference_solution
from posttrain.envs.synthetic.tool import CalculatorError, SyntheticToolEnv, calculate, reference_episode
from posttrain.records import Task


def step(episode: Episode, text: str) -> StepResult:
    return asyncio.run(episode.step(text))


def test_arith_tasks_are_deterministic_and_splits_are_disjoint() -> None:
    """Default pool: 50 x 50 = 2,500 additions, ~10% held out by hash, whatever the seed."""
    env = SyntheticArithEnv()
    assert env.tasks("train", 20, seed=3) == env.tasks("train", 20, seed=3)
    assert env.tasks("train", 20, seed=3) != env.tasks("train", 20, seed=4)
    train = {t.prompt for seed in (0, 1) for t in env.tasks("train", 2500, seed=seed)}
    heldout = {t.prompt for t in env.tasks("eval", 400, seed=0)}
    assert not train & heldout
    assert len(train) + len(heldout) == 2500
    assert 150 < len(heldout) < 350


def test_arith_prompt_reference_and_custom_operators() -> None:
    env = SyntheticArithEnv(low=5, high=8, operators=("-", "*"))
    for task in env.tasks("train", 30, seed=0):
        a, op, b = task.metadata["a"], task.metadata["op"], task.metadata["b"]
        assert task.prompt == f"Compute {a} {op} {b}."
        assert int(task.reference) == (int(a) - int(b) if op == "-" else int(a) * int(b))
    with pytest.raises(ValueError, match="operators"):
        SyntheticArithEnv(operators=("/",))
    with pytest.raises(ValueError, match="high"):
        SyntheticArithEnv(low=3, high=3)


def test_arith_reference_solution_earns_reward_one_and_wrong_answers_zero() -> None:
    env = SyntheticArithEnv()
    task = Task(task_id="t", env_name="synthetic_arith", prompt="Compute 23 + 48.", reference="71")
    assert reference_solution(task) == "#### 71"
    episode = env.start(task)
    assert isinstance(episode, Episode) and episode.messages() == [{"role": "user", "content": "Compute 23 + 48."}]
    good = step(episode, "#### 71")
    assert (good.done, good.reward, good.finish_reason, good.metrics["correct"]) == (True, 1.0, "stop", 1.0)
    assert step(env.start(task), "#### 70").reward == 0.0
    assert step(env.start(task), "71").metrics == {"correct": 0.0, "has_answer": 0.0}


def tool_task() -> Task:
    return Task(
        task_id="t", env_name="synthetic_tool", prompt="Compute 7 * 8 + 5 using the calculator.",
        reference="61", metadata={"expression": "7 * 8 + 5"},
    )


def test_tool_reference_episode_calls_the_calculator_then_answers() -> None:
    """Turn 1 -> observation "61"; turn 2 "#### 61" -> reward 1.0, one tool call."""
    env, task = SyntheticToolEnv(), tool_task()
    turns = reference_episode(task)
    assert turns == ['<tool_call>{"name": "calculator", "arguments": {"expression": "7*8+5"}}</tool_call>', "#### 61"]
    episode = env.start(task)
    first = step(episode, turns[0])
    assert not first.done and first.observation == '<tool_result name="calculator">\n61\n</tool_result>'
    last = step(episode, turns[1])
    assert (last.done, last.reward, last.finish_reason) == (True, 1.0, "stop")
    assert last.metrics == {"correct": 1.0, "tool_calls": 1.0, "malformed_actions": 0.0, "tool_wait_s": 0.0}


def test_tool_unmarked_reference_still_calls_the_calculator_but_earns_zero() -> None:
    """An ``unmarked`` task: turn 1 is the same call (observation "61", episode goes on), turn 2 is
    "= 61" -> no ``####`` answer, so reward 0.0 and correct 0.0 with one tool call."""
    env = SyntheticToolEnv(unmarked_fraction=0.5)
    base = tool_task()
    task = msgspec.structs.replace(base, metadata={**base.metadata, "sft_style": "unmarked"})
    turns = reference_episode(task)
    assert turns == [reference_episode(base)[0], "= 61"]
    episode = env.start(task)
    first = step(episode, turns[0])
    assert not first.done and first.observation == '<tool_result name="calculator">\n61\n</tool_result>'
    last = step(episode, turns[1])
    assert (last.done, last.reward, last.finish_reason) == (True, 0.0, "stop")
    assert last.metrics == {"correct": 0.0, "tool_calls": 1.0, "malformed_actions": 0.0, "tool_wait_s": 0.0}


def test_tool_unmarked_fraction_marks_only_training_tasks_the_same_for_every_seed() -> None:
    """Pool: 2 x 2 operator pairs x 10^3 operands = 4,000 expressions, ~90% train. With
    unmarked_fraction=0.5 about half the train tasks are unmarked (hash-chosen, so the same
    expressions for seeds 0 and 1); the default 0.0 and the held-out split have none."""
    default = SyntheticToolEnv().tasks("train", 3600, seed=0)
    assert not any("sft_style" in t.metadata for t in default)
    env = SyntheticToolEnv(unmarked_fraction=0.5)
    train = {seed: env.tasks("train", 3600, seed=seed) for seed in (0, 1)}
    unmarked = {seed: {t.prompt for t in tasks if t.metadata.get("sft_style") == "unmarked"}
                for seed, tasks in train.items()}
    assert unmarked[0] == unmarked[1]
    assert 0.4 < len(unmarked[0]) / len({t.prompt for t in train[0]}) < 0.6
    assert not any("sft_style" in t.metadata for t in env.tasks("eval", 400, seed=0))
    with pytest.raises(ValueError, match="unmarked_fraction"):
        SyntheticToolEnv(unmarked_fraction=1.0)


def test_tool_correct_answer_without_calling_the_tool_pays_the_penalty() -> None:
    """Reward 1.0 - no_tool_penalty (0.1) = 0.9; a wrong answer gets 0.0."""
    env = SyntheticToolEnv()
    assert step(env.start(tool_task()), "#### 61").reward == pytest.approx(0.9)
    assert step(env.start(tool_task()), "#### 60").reward == 0.0
    assert step(SyntheticToolEnv(no_tool_penalty=0.0).start(tool_task()), "#### 61").reward == 1.0


def test_tool_malformed_actions_in_a_row_end_with_tool_error() -> None:
    """Bad JSON, then an unknown tool: two malformed actions in a row -> tool_error, reward 0."""
    episode = SyntheticToolEnv().start(tool_task())
    first = step(episode, "<tool_call>{oops</tool_call>")
    assert not first.done and "malformed tool call" in (first.observation or "")
    second = step(episode, '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
    assert (second.done, second.finish_reason, second.reward) == (True, "tool_error", 0.0)
    assert second.metrics["malformed_actions"] == 2.0


def test_tool_well_formed_call_resets_the_malformed_count() -> None:
    episode = SyntheticToolEnv().start(tool_task())
    assert not step(episode, "<tool_call>{oops</tool_call>").done
    ok = step(episode, '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>')
    assert not ok.done and "error: division by zero" in (ok.observation or "")
    assert not step(episode, "<tool_call>{oops</tool_call>").done
    assert step(episode, "#### 61").reward == 1.0


def test_tool_splits_are_disjoint_and_references_match_python_precedence() -> None:
    env = SyntheticToolEnv()
    train = {t.prompt for t in env.tasks("train", 3000, seed=0)}
    heldout = {t.prompt for t in env.tasks("eval", 300, seed=0)}
    assert not train & heldout
    for task in env.tasks("eval", 20, seed=1):
        a, op1, b, op2, c = task.metadata["expression"].split()
        x, y, z = int(a), int(b), int(c)
        expected = {("+", "+"): x + y + z, ("+", "*"): x + y * z, ("*", "+"): x * y + z, ("*", "*"): x * y * z}
        assert int(task.reference) == expected[(op1, op2)]


def test_calculator_evaluates_plain_arithmetic() -> None:
    assert calculate("7*8+5") == "61"
    assert calculate("(2 + 3) * -4") == "-20"
    assert calculate("7/2") == "3.5" and calculate("6/3") == "2" and calculate("2**10 % 7") == "2"


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('touch /tmp/pwned')",  # calls and names
        "(1).__class__",  # attribute access
        "[x for x in range(10)]",  # comprehension
        "(lambda: 1)()",  # lambda
        "'a' * 10",  # strings
        "True + 1",  # booleans
        "x",  # names
    ],
)
def test_calculator_runs_no_code_only_arithmetic(attack: str) -> None:
    """Guarantee: only numeric literals and arithmetic operators are interpreted."""
    with pytest.raises(CalculatorError):
        calculate(attack)


@pytest.mark.parametrize(
    "attack", ["9**9**9**9", "10**64 * 10**64", "1" * 199, "1" + "+1" * 150, "1e999 - 1", "(" * 150 + "1" + ")" * 150]
)
def test_calculator_work_is_bounded(attack: str) -> None:
    """Guarantee: exponent <= 64, |values| <= 1e30, <= 200 characters; all rejected quickly."""
    with pytest.raises(CalculatorError):
        calculate(attack)


def test_registry_builds_every_environment_and_rejects_unknown_names() -> None:
    for name in ENVIRONMENTS:
        env = make_environment(name)
        assert isinstance(env, Environment) and env.name == name
    with pytest.raises(KeyError, match="known"):
        make_environment("chess")
    assert make_environment("synthetic_arith", high=5).high == 5  # type: ignore[attr-defined]


def test_default_tasks_for_every_environment() -> None:
    """Train and held-out tasks never share a task (prompt plus hidden metadata, e.g. the long-tail
    env's codes); file-backed splits are shuffled and cut to n."""

    def identity(t):
        return t.prompt, tuple(sorted(t.metadata.items()))

    for name in ENVIRONMENTS:
        n = 6 if name == "swe" else 30
        train, heldout = default_tasks(name, "train", n, seed=0), default_tasks(name, "eval", n, seed=0)
        assert len(train) == len(heldout) == n
        assert not {identity(t) for t in train} & {identity(t) for t in heldout}
        assert {t.env_name for t in train + heldout} == {name}
    assert default_tasks("gsm8k", "eval", 5, seed=1) == default_tasks("gsm8k", "test", 5, seed=1)
    assert len(default_tasks("math_tool", "eval", 1000, seed=0)) == 100
    with pytest.raises(ValueError, match="split"):
        default_tasks("gsm8k", "validation", 5)


def test_reference_actions_solve_their_tasks() -> None:
    """SFT targets score reward 1.0 in their own environments (GSM8K: the worked solution)."""
    for name in ("synthetic_arith", "synthetic_tool", "gsm8k"):
        env = make_environment(name)
        for task in default_tasks(name, "train", 5, seed=0):
            episode = env.start(task)
            results = [step(episode, action) for action in reference_actions(name, task)]
            assert results[-1].done and results[-1].reward == 1.0, (name, task.task_id)
    with pytest.raises(ValueError, match="no reference"):
        reference_actions("math_tool", default_tasks("math_tool", "eval", 1)[0])
