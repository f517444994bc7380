"""``bench.gkd_miniature``: the gap closed and its sampling error, and the section rendered from a results file."""

from __future__ import annotations

import math

import pytest
from bench.gkd_miniature import gap_closed, gap_closed_se, render


def test_gap_closed_and_its_error_from_three_binomial_accuracies():
    """Teacher 0.5, student 0.1, GKD 0.4 on 400 samples each: closed (0.4 - 0.1) / 0.4 = 0.75; variances
    p(1-p)/400: 0.0006, 0.000225, 0.000625; sigma = sqrt(0.0006 + 0.25^2 x 0.000225 + 0.75^2 x 0.000625) / 0.4
    = sqrt(0.0006 + 0.0000141 + 0.0003516) / 0.4 = sqrt(0.000965625) / 0.4 = 0.077686."""
    acc = {"teacher": 0.5, "student": 0.1, "gkd": 0.4}
    assert gap_closed(acc, "gkd") == pytest.approx(0.75)
    assert gap_closed_se(acc, "gkd", 400) == pytest.approx(0.077686, abs=1e-6)
    assert math.isnan(gap_closed({"teacher": 0.1, "student": 0.1, "gkd": 0.3}, "gkd"))


def test_the_section_counts_the_seeds_that_closed_half_the_gap():
    seed = {"accuracy": {"teacher": 0.5, "student": 0.1, "gkd": 0.4, "sft_on_teacher_samples": 0.2},
            "gkd_trained_tokens": 1000.0, "sft_trained_tokens": 990.0,
            "seconds": {"gkd_run": 100.0, "teacher_samples": 10.0, "sft_run": 20.0}, "load_avg_end": [3.0, 2.0, 1.0]}
    result = {"command": "python -m bench.gkd_miniature", "eval_samples": 400,
              "machine": {"when": "2026-12-06T00:00:00Z", "load_avg": [1.0, 1.0, 1.0]},
              "config": {"teacher_build_steps": 400, "warm_start_steps": 50, "steps": 200, "batch_size": 32,
                         "lmbda": 1.0, "divergence": "generalized_jsd", "beta": 0.5, "max_staleness": 1,
                         "eval_tasks": 100, "eval_samples": 4, "heldout_problems": 20},
              "seeds": [{**seed, "seed": 0}, {**seed, "seed": 1, "accuracy": {**seed["accuracy"], "gkd": 0.2}}]}
    text = render(result)
    assert "| 0 | 0.500 ± 0.025 | 0.100 ± 0.015 | 0.400 ± 0.024 | 0.75 ± 0.08 | 0.200 ± 0.020 | 0.25 ± 0.06 |" in text
    assert "GKD closed at least half of the gap in 1 of 2 seeds (mean 0.50)" in text
    assert "SFT on the teacher's samples at equal tokens closed 0.25 on average" in text
