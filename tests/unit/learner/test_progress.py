"""``posttrain.learner.progress``: what counts as progress, the status lines and the stop line, on hand-made outcomes.

The learners that use it are tested in ``test_loop.py`` (SAO and asynchronous GRPO) and
``tests/unit/runners/test_grpo_sync.py``. Run: ``python -m pytest -q tests/unit/learner/test_progress.py``.
"""

import pytest

from posttrain.learner.progress import IterationOutcome, ProgressWatch, outcome_of
from posttrain.learner.types import TrainStepResult

UNIFORM = IterationOutcome(published=False, rollouts=8, groups=4, uniform_groups=4)
STALE = IterationOutcome(published=False, rollouts=0, dropped=8)
MASKED = IterationOutcome(published=True, rollouts=8, dropped=2, update_tokens=40.0, masked_tokens=40.0)
TRAINED = IterationOutcome(published=True, rollouts=8, update_tokens=40.0, masked_tokens=39.0)


def test_only_a_version_that_trained_a_token_is_progress_and_each_other_iteration_has_its_cause():
    assert [o.cause for o in (UNIFORM, STALE, MASKED, TRAINED)] == ["uniform", "stale", "masked", None]
    half_uniform = IterationOutcome(published=False, rollouts=8, groups=4, uniform_groups=3)  # a skipped step
    assert half_uniform.cause == "skipped" and TRAINED.trained_tokens == 1.0


def test_progress_ends_a_streak_and_a_mixed_streak_names_each_cause_with_its_count_and_the_pooled_shares():
    """Bound 8: a status line every 2 iterations without progress. 3 uniform, progress (streak reset, no line),
    then 4 masked, 2 uniform and 2 stale: stop at the 8th. Shares over those 8: groups 8 of 8 uniform (2 x 4),
    drops 2 x 8 + 4 x 2 = 24 of 24 + 6 x 8 read rollouts, masked 160 of 160 update tokens."""
    lines: list[str] = []
    watch = ProgressWatch(8, report=lines.append)
    for o in (UNIFORM, UNIFORM, UNIFORM, TRAINED, MASKED, MASKED, MASKED, MASKED, UNIFORM, UNIFORM, STALE):
        watch.observe(o)
    assert watch.reason is None and watch.in_a_row == 7
    watch.observe(STALE)
    assert watch.reason == (
        "no progress for 8 learner iterations in a row (learner.max_iterations_without_progress=8): every action "
        "token masked (staleness bound or DIS band) in 4, every group uniform (equal rewards, zero advantage) in 2, "
        "every rollout dropped as stale in 2; uniform groups 100% (8 of 8 groups), stale drops 33% (24 of 72 "
        "rollouts), masked tokens 100% (160 of 160 update tokens); stopped after a final checkpoint")
    assert [line.split(";")[0] for line in lines] == [
        "learner: no progress for 2 iterations in a row (every group uniform (equal rewards, zero advantage) in all 2)",
        "learner: no progress for 2 iterations in a row (every action token masked (staleness bound or DIS band) in all 2)",
        "learner: no progress for 4 iterations in a row (every action token masked (staleness bound or DIS band) in all 4)",
        "learner: no progress for 6 iterations in a row (every action token masked (staleness bound or DIS band) in 4, "
        "every group uniform (equal rewards, zero advantage) in 2)"]
    assert all(line.endswith("stops at 8 (learner.max_iterations_without_progress)") for line in lines)
    assert watch.metrics() == {"progress/iterations_without_progress": 8.0, "progress/stale_dropped_frac": 1.0,
                               "progress/masked_tokens_frac": 0.0}


def test_outcomes_read_sao_row_tokens_and_grpo_metrics():
    """SAO: 2 rollouts, 3 + 1 trained, 1 + 0 stale-masked, 0 + 2 DIS-masked tokens. Asynchronous GRPO: 2 groups, one
    uniform; 10 kept tokens of which a quarter DIS-masked. Synchronous GRPO without DIS: nothing masked."""
    rows = [{"trained_tokens": 3.0, "stale_masked_tokens": 1.0, "dis_masked_tokens": 0.0},
            {"trained_tokens": 1.0, "stale_masked_tokens": 0.0, "dis_masked_tokens": 2.0}]
    sao = outcome_of(TrainStepResult(policy_updated=True, row_tokens=rows), rollouts=2, dropped=1)
    assert (sao.update_tokens, sao.masked_tokens, sao.dropped, sao.groups, sao.progress) == (7.0, 3.0, 1, 0, True)
    grpo = {"grpo/groups": 2.0, "grpo/uniform_groups_frac": 0.5, "grpo/action_tokens_kept": 10.0}
    dis = outcome_of(TrainStepResult(policy_updated=True, metrics={**grpo, "mask/frac_total": 0.25}), rollouts=4)
    assert (dis.groups, dis.uniform_groups, dis.update_tokens, dis.masked_tokens) == (2, 1, 10.0, 2.5)
    assert outcome_of(TrainStepResult(policy_updated=True, metrics=grpo), rollouts=4).masked_tokens == 0.0
    with pytest.raises(ValueError, match="limit: must be >= 1, got 0"):
        ProgressWatch(0)
