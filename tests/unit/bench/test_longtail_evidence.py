"""``bench.longtail_evidence``: turn kinds and per-version evidence read from ledger rollouts (issue 29)."""

import statistics

import pytest
from bench.longtail_evidence import (
    analyse,
    explained_variance,
    population,
    turn_kinds,
    value_by_left,
    value_reference,
    version_evidence,
)


def _rollout(task, calls, finish="stop", reward=0.0, turns=None, malformed=0, early=0, extra=0, **extra_keys):
    turns = turns if turns is not None else calls + (finish == "stop")
    return {"task_id": task, "reward": reward, "finish_reason": finish, "action_tokens": [15] * turns,
            "metrics": {"tool_calls": float(calls), "malformed_actions": float(malformed), "early_answer": float(early),
                        "extra_calls": float(extra)}, "trained_tokens": 8.0, **extra_keys}


def test_turn_kinds_tell_required_and_extra_calls_and_early_and_due_answers_apart():
    assert turn_kinds(_rollout("t", 2), required=2) == [("call_left_gt0", 2), ("call_left_gt0", 1), ("answer_left0", 0)]
    assert turn_kinds(_rollout("t", 3), required=2)[-2:] == [("extra_call", 0), ("answer_left0", 0)]
    assert turn_kinds(_rollout("t", 1), required=3) == [("call_left_gt0", 3), ("early_answer", 2)]
    assert turn_kinds(_rollout("t", 4, finish="length"), required=2) == [
        ("call_left_gt0", 2), ("call_left_gt0", 1), ("extra_call", 0), ("extra_call", 0)]
    # A malformed action, or turns that do not add up (two calls in one action), leave the episode out.
    assert turn_kinds(_rollout("t", 2, malformed=1, turns=4), required=2) is None
    assert turn_kinds(_rollout("t", 2, turns=2), required=2) is None


def test_version_evidence_buckets_by_the_tasks_required_calls_and_reads_turn_diagnostics():
    tasks = {"short": 1, "long": 12}
    rollouts = [
        _rollout("short", 1, reward=1.0, turn_advantage=[0.5, 0.75], turn_value=[0.2, 0.4], turn_return=[1.0, 1.0]),
        _rollout("long", 18, finish="length", turns=18, extra=6, turn_advantage=[-0.25] * 18,
                 turn_value=[0.1] * 18, turn_return=[0.0] * 18),
        _rollout("long", 0, finish="length", turns=1),  # cut on its first turn: no tool step, no metrics to read
    ]
    rollouts[2]["metrics"] = {}
    ev = version_evidence(rollouts, [{"task_id": "long", "reason": "stale", "metrics": {}}], tasks)
    assert ev["reward_by_calls"] == {"1-2": 1.0, "3-4": None, "5-8": None, "9-16": 0.0}
    assert ev["trained_by_calls"] == {"1-2": 1, "3-4": 0, "5-8": 0, "9-16": 2}
    assert ev["finish"] == {"length": 2 / 3, "stop": 1 / 3}
    assert ev["extra_call_rate"] == 1 / 3
    adv = ev["advantage_by_turn"]
    assert adv["answer_left0"] == {"n": 1, "mean": 0.75, "positive": 1.0}
    assert adv["extra_call"] == {"n": 6, "mean": -0.25, "positive": 0.0}
    assert adv["call_left_gt0"]["n"] == 13
    left0 = ev["value_vs_return_by_left"]["0"]
    assert (left0["n"], left0["value"], left0["return"]) == (7, (0.4 + 6 * 0.1) / 7, 1 / 7)
    # returns 1 once and 0 six times against values 0.4 and 0.1: 1 - Var(G - V) / Var(G)
    residuals, returns = [0.6] + [-0.1] * 6, [1.0] + [0.0] * 6

    assert left0["explained_variance"] == pytest.approx(1 - statistics.pvariance(residuals) / statistics.pvariance(returns))
    assert ev["dropped"] == {"stale": 1} and ev["dropped_by_calls"] == {"9-16": 1}


def test_analyse_keeps_the_later_line_of_a_repeated_iteration_and_population_compares_with_the_tasks():
    tasks = {"a": 1, "b": 5}
    lines = [{"iteration": 1, "policy_version": 1, "rollouts": [_rollout("a", 1)]},
             {"iteration": 1, "policy_version": 1, "rollouts": [_rollout("b", 5)]}]
    rows = analyse(lines, tasks, {1: {"policy/entropy": 0.5, "other": 1.0}})
    assert len(rows) == 1 and rows[0]["trained_by_calls"]["5-8"] == 1
    assert rows[0]["learner"] == {"policy/entropy": 0.5}
    pop = population(lines[1:], tasks)
    assert pop["5-8"] == {"trained": 1, "dropped": 0, "trained_share": 1.0, "task_share": 0.5}


def test_explained_variance_is_none_without_spread_and_one_for_a_perfect_critic():
    assert explained_variance([(0.5, 1.0)]) is None and explained_variance([(0.2, 1.0), (0.3, 1.0)]) is None
    assert explained_variance([(0.0, 0.0), (1.0, 1.0)]) == 1.0
    assert explained_variance([(0.5, 0.0), (0.5, 1.0)]) == 0.0


def test_value_by_left_pools_every_turn_of_the_run_by_the_left_count_it_saw():
    """Turn 0 saw no observation: it is a ``first`` turn, not ``left 1`` (the prompt never says the required calls).
    A bucket's explained variance needs 20 returns above their mean and 20 below."""
    tasks = {"t": 1}
    lines = [{"iteration": i, "policy_version": i, "rollouts": [
        _rollout("t", 1, reward=g, rollout_id=f"r{i}", turn_advantage=[0.0, 0.0], turn_value=[v, v],
                 turn_return=[g, g])]} for i, (v, g) in enumerate([(0.0, 0.0), (1.0, 1.0)] * 20, start=1)]
    out = value_by_left(lines, tasks)
    assert out["all"] == {"n": 80, "value": 0.5, "return": 0.5, "explained_variance": 1.0}
    assert out["first"]["n"] == 40 and out["0"]["n"] == 40 and "1" not in out
    assert value_by_left(lines[:38], tasks)["0"]["explained_variance"] is None  # 19 returns each side
    critic_only = [{**line, "rollouts": [{**r, "trained_tokens": 0.0} for r in line["rollouts"]]} for line in lines[:2]]
    assert value_by_left(critic_only + lines, tasks)["all"]["n"] == 80  # value pretraining is left out
    assert value_by_left([{"iteration": 1, "policy_version": 1, "rollouts": [_rollout("t", 1)]}], tasks) == {}


def test_the_reference_predicts_each_turn_from_the_other_half_of_the_run_at_the_same_left_count():
    """Short tasks (1 call) always solved, long ones (3) never: the long episodes' turns that saw ``left`` 2 and 1
    are predicted exactly (0), while the first turns and the answers at ``left 0`` of both kinds look alike and are
    predicted by their mean 0.5: a quarter of the variance explained overall, none inside those buckets."""
    tasks = {"short": 1, "long": 3}

    def rollout(i: int, task: str) -> dict:
        k, g = tasks[task], float(task == "short")
        return _rollout(task, k, reward=g, rollout_id=f"r{i}", turn_advantage=[0.0] * (k + 1),
                        turn_value=[0.5] * (k + 1), turn_return=[g] * (k + 1))

    lines = [{"iteration": 1, "policy_version": 1, "rollouts": [rollout(i, t) for i in range(40)
                                                                  for t in ("short", "long")]}]
    ref = value_reference(lines, tasks)
    assert ref["all"]["n"] == 40 * (2 + 4)
    assert ref["all"]["explained_variance"] == pytest.approx(0.25)
    assert ref["first"]["explained_variance"] == pytest.approx(0.0) and ref["0"]["explained_variance"] == pytest.approx(0.0)
    assert ref["1"]["n"] == ref["2"]["n"] == 40 and ref["2"]["explained_variance"] is None  # returns all 0 there
    assert value_reference([{"iteration": 1, "policy_version": 1, "rollouts": [_rollout("short", 1)]}], tasks) == {}


