"""``bench.gang_admission`` (the model's invariants) and ``bench.time_account`` (its docs section re-renders from the
committed results)."""

from __future__ import annotations

import json

import pytest
from bench import gang_admission, time_account
from bench.common import REPO


def test_an_empty_cohort_runs_both_ways_at_full_rate_from_the_start():
    """Other teams at 1% load: nothing to wait for; 21600 rollouts at 0.75/s x 8 generators = 3600 s."""
    setting = gang_admission.Setting()
    for elastic in (False, True):
        out = gang_admission._run(setting, 0.01, seed=0, elastic=elastic)
        assert out["wait_to_start_s"] == 0.0 and out["wait_to_full_s"] == 0.0
        assert out["completion_s"] == pytest.approx(3600.0)
        assert out["held_gpu_s"] == pytest.approx(16 * 3600.0)


def test_an_elastic_run_never_starts_later_than_the_gang_on_the_same_cohort():
    """Same seed, same other teams' jobs: the learner + 1 generator fit whenever learner + 8 generators fit."""
    setting = gang_admission.Setting()
    for seed in range(20):
        gang = gang_admission._run(setting, 0.9, seed, elastic=False)
        elastic = gang_admission._run(setting, 0.9, seed, elastic=True)
        assert elastic["wait_to_start_s"] <= gang["wait_to_start_s"]


def test_the_time_account_section_re_renders_from_the_committed_results():
    data = json.loads((REPO / "bench" / "results" / "time_account.json").read_text(encoding="utf-8"))
    section = time_account.section(data)
    assert section.strip() in (REPO / "docs" / "kubeflow.md").read_text(encoding="utf-8")
    for label in ("sao", "grpo_sync"):
        slots = data["runs"][label]["roles"]["generator_slots"]
        assert abs(sum(slots["shares_s"].values()) - slots["wall_s"]) <= 0.02 * slots["wall_s"]
