"""``synthetic_longtail``: log-normal required calls, the episode rules, the registry entry."""

from __future__ import annotations

import asyncio
import random

import pytest

from posttrain.envs.base import Episode, StepResult
from posttrain.envs.registry import default_tasks, make_environment, reference_actions
from posttrain.envs.synthetic.longtail import (
    REFERENCE_CALL,
    SyntheticLongTailEnv,
    codes_of,
    reference_episode,
    required_calls,
    summarise_calls,
)
from posttrain.records import Task

CALL = REFERENCE_CALL


def task(codes: str = "3 1") -> Task:
    return Task(task_id="t1", env_name="synthetic_longtail", prompt="Fetch the codes of box 7.",
                reference=codes.split()[-1], metadata={"box": "7", "codes": codes})


def play(episode: Episode, actions: list[str]) -> list[StepResult]:
    async def go() -> list[StepResult]:
        return [await episode.step(a) for a in actions]

    return asyncio.run(go())


def test_required_calls_with_zero_sigma_is_the_rounded_median_and_clips_to_the_bounds() -> None:
    """sigma 0: k = round(2.6 * e^0) = 3 for every draw; median 40 clips to max 16, median 0.2 to min 1."""
    rng = random.Random(0)
    assert {required_calls(rng, 2.6, 0.0, 1, 16) for _ in range(20)} == {3}
    assert required_calls(rng, 40.0, 0.0, 1, 16) == 16
    assert required_calls(rng, 0.2, 0.0, 1, 16) == 1


def test_default_distribution_is_long_tailed() -> None:
    """2,000 train tasks, median 3, sigma 0.8, clip 16: median 3, p90 9, max 16, mean 4.13 (mean > median)."""
    summary = summarise_calls(SyntheticLongTailEnv().tasks("train", 2000, seed=0))
    assert summary["median"] == 3.0 and summary["p90"] == 9.0 and summary["max"] == 16.0
    assert summary["mean"] == pytest.approx(4.13, abs=0.01)


def test_tasks_are_deterministic_disjoint_and_carry_their_codes() -> None:
    env = SyntheticLongTailEnv()
    train = env.tasks("train", 300, seed=1)
    assert train == env.tasks("train", 300, seed=1)
    assert train != env.tasks("train", 300, seed=2)
    heldout = env.tasks("eval", 100, seed=1)
    key = lambda t: (t.metadata["box"], t.metadata["codes"])  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in heldout}
    for t in train[:20]:
        codes = codes_of(t)
        assert 1 <= len(codes) <= 16 and t.reference == str(codes[-1])
        assert t.task_id.startswith("synthetic_longtail-train-")


def test_reference_episode_reads_each_code_and_earns_reward_one() -> None:
    """Codes 3 1: call -> 'code 3, left 1'; call -> 'code 1, left 0'; '#### 1' -> reward 1."""
    t = task("3 1")
    assert reference_episode(t) == [CALL, CALL, "#### 1"]
    results = play(SyntheticLongTailEnv().start(t), reference_episode(t))
    assert [r.observation for r in results[:2]] == ["code 3, left 1", "code 1, left 0"]
    last = results[-1]
    assert (last.done, last.reward, last.finish_reason) == (True, 1.0, "stop")
    assert last.metrics == {"correct": 1.0, "tool_calls": 2.0, "required_calls": 2.0, "extra_calls": 0.0,
                            "early_answer": 0.0, "malformed_actions": 0.0, "tool_wait_s": 0.0}


def test_left_first_puts_the_code_last_in_each_observation_and_grades_alike() -> None:
    """left_first: codes 3 1 -> 'left 1, code 3', 'left 0, code 1'; '#### 1' -> reward 1 (issue 29's warm start)."""
    t = task("3 1")
    results = play(SyntheticLongTailEnv(left_first=True).start(t), reference_episode(t))
    assert [r.observation for r in results[:2]] == ["left 1, code 3", "left 0, code 1"]
    assert results[-1].reward == 1.0


def test_an_answer_before_left_zero_earns_zero_even_when_it_names_the_last_code() -> None:
    """Codes 3 1 after one call: '#### 1' is the right digit but one call is missing -> 0, early_answer 1."""
    result = play(SyntheticLongTailEnv().start(task("3 1")), [CALL, "#### 1"])[-1]
    assert (result.done, result.reward) == (True, 0.0)
    assert result.metrics["early_answer"] == 1.0 and result.metrics["correct"] == 0.0


def test_calls_past_the_end_repeat_the_last_code_and_are_counted() -> None:
    """Codes 5: three calls -> 'code 5, left 0' three times, extra_calls 2; the answer still counts."""
    results = play(SyntheticLongTailEnv().start(task("5")), [CALL, CALL + CALL, "#### 5"])
    assert results[1].observation == "code 5, left 0\ncode 5, left 0"
    assert results[-1].reward == 1.0 and results[-1].metrics["extra_calls"] == 2.0


def test_two_malformed_actions_in_a_row_end_with_tool_error_and_a_good_call_resets_the_count() -> None:
    """Wrong tool, good call, arguments given, unclosed tag: the last two in a row end the episode."""
    wrong_tool = '<tool_call>{"name": "calculator"}</tool_call>'
    with_args = '<tool_call>{"name": "next", "arguments": {"x": 1}}</tool_call>'
    results = play(SyntheticLongTailEnv().start(task("3 1")), [wrong_tool, CALL, with_args, "<tool_call>{"])
    assert results[0].observation.startswith("error:") and not results[0].done
    assert results[1].observation == "code 3, left 1"
    assert not results[2].done
    assert (results[3].done, results[3].reward, results[3].finish_reason) == (True, 0.0, "tool_error")
    assert results[3].metrics["malformed_actions"] == 3.0


def test_bad_parameters_and_bad_task_metadata_name_the_field() -> None:
    with pytest.raises(ValueError, match="calls_median"):
        SyntheticLongTailEnv(calls_median=0)
    with pytest.raises(ValueError, match="max_calls"):
        SyntheticLongTailEnv(min_calls=4, max_calls=3)
    with pytest.raises(KeyError, match="t1"):
        codes_of(Task(task_id="t1", env_name="synthetic_longtail", prompt="p", reference="1"))
    with pytest.raises(ValueError, match="single digits"):
        codes_of(task("3 12"))


def test_registry_builds_the_environment_and_its_tasks_and_references() -> None:
    env = make_environment("synthetic_longtail", calls_median=2.0, calls_sigma=0.0, max_calls=4)
    assert env.name == "synthetic_longtail"
    tasks = default_tasks("synthetic_longtail", "eval", 5, seed=0, calls_median=2.0, calls_sigma=0.0)
    assert [len(codes_of(t)) for t in tasks] == [2] * 5
    assert reference_actions("synthetic_longtail", tasks[0]) == [CALL, CALL, f"#### {tasks[0].reference}"]
