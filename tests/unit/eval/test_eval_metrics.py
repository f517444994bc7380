"""avg@k, unbiased pass@k (Chen et al. 2021), Wilson and bootstrap intervals, length statistics."""

from __future__ import annotations

import math

import pytest

from posttrain.eval.metrics import (
    avg_at_k,
    bootstrap_interval,
    length_stats,
    mean_pass_at_k,
    pass_at_k,
    pass_k_values,
    summarize_scores,
    wilson_interval,
)


def test_pass_at_k_matches_hand_computed_binomials() -> None:
    """n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7.
    n=10, c=3, k=3: 1 - C(7,3)/C(10,3) = 1 - 35/120 = 0.7083333.
    n=4, c=1, k=1: 1/4. n=4, c=0: 0. n=4, c=3, k=2: n-c=1 < k so 1.0.
    """
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 3, 3) == pytest.approx(85 / 120)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0


def test_pass_at_1_equals_fraction_correct() -> None:
    """pass@1 = c/n for every n, c (the estimator is unbiased for k=1)."""
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_pass_at_k_rejects_bad_arguments_by_name() -> None:
    with pytest.raises(ValueError, match="^k:"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="^c:"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="^n:"):
        pass_at_k(0, 0, 1)


def test_avg_and_mean_pass_at_k_over_tasks() -> None:
    """Task A: 1 of 4 correct, task B: 2 of 4.
    avg@4 = (0.25 + 0.5) / 2 = 0.375.
    pass@2: A = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; B = 1 - C(2,2)/C(4,2) = 1 - 1/6 = 5/6; mean = 2/3.
    """
    table = [[True, False, False, False], [True, True, False, False]]
    assert avg_at_k(table) == pytest.approx(0.375)
    assert mean_pass_at_k(table, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    assert mean_pass_at_k(table, 4) == 1.0
    with pytest.raises(ValueError, match=r"correct\[1\]"):
        mean_pass_at_k([[True, True], [True]], 2)


def test_wilson_interval_matches_hand_computed_value() -> None:
    """8 of 10 at 95%: z = 1.959964, z^2 = 3.841459, denom = 1 + z^2/10 = 1.3841459,
    centre = (0.8 + z^2/20) / denom = 0.99207294 / 1.3841459 = 0.7167402,
    half = z/denom * sqrt(0.8*0.2/10 + z^2/400) = 1.4160097 * 0.1600114 = 0.2265777,
    interval = (0.4901625, 0.9433178).
    """
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=1e-6)
    assert hi == pytest.approx(0.9433178, abs=1e-6)
    lo0, hi0 = wilson_interval(0, 10)
    assert lo0 == 0.0 and 0.0 < hi0 < 0.35
    lo1, hi1 = wilson_interval(10, 10)
    assert hi1 == 1.0 and lo1 > 0.65


def test_bootstrap_interval_is_deterministic_and_brackets_the_mean() -> None:
    values = [0.0, 0.25, 0.5, 1.0, 1.0, 0.75, 0.0, 0.5]
    a = bootstrap_interval(values, seed=3)
    assert a == bootstrap_interval(values, seed=3)
    mean = sum(values) / len(values)
    assert a[0] <= mean <= a[1]
    assert bootstrap_interval([0.5] * 5) == (0.5, 0.5)


def test_summarize_scores_uses_wilson_for_one_sample_and_bootstrap_for_several() -> None:
    """One sample per task, 3 of 4 correct: avg@1 = pass@1 = 0.75, Wilson interval.
    Two samples per task [[T,F],[T,T]]: avg@2 = 0.75, pass@1 = 0.75, pass@2 = (1 + 1)/2 = 1.0.
    """
    one = summarize_scores([[True], [True], [False], [True]])
    assert one.avg_at_k == 0.75 and one.pass_at_k == {1: 0.75} and one.ci_method == "wilson"
    assert (one.ci_low, one.ci_high) == pytest.approx(wilson_interval(3, 4))
    two = summarize_scores([[True, False], [True, True]])
    assert two.avg_at_k == 0.75 and two.pass_at_k == {1: 0.75, 2: 1.0} and two.ci_method == "bootstrap"
    with pytest.raises(ValueError, match=r"correct\[1\]"):
        summarize_scores([[True, False], [True]])


def test_pass_k_values_are_powers_of_two_then_k() -> None:
    assert pass_k_values(1) == [1]
    assert pass_k_values(8) == [1, 2, 4, 8]
    assert pass_k_values(6) == [1, 2, 4, 6]


def test_length_stats_on_hand_example() -> None:
    """[10, 20, 30, 40]: mean 25, pstdev sqrt(125) = 11.18, median 25, p90 = 4th of 4 (ceil(3.6)=4) = 40."""
    s = length_stats([40, 10, 30, 20])
    assert (s.count, s.mean, s.min, s.p50, s.p90, s.max) == (4, 25.0, 10, 25.0, 40, 40)
    assert s.std == pytest.approx(math.sqrt(125))
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        length_stats([1, -2])
