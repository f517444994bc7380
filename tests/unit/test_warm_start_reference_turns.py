"""``warm_start.max_reference_turns``: the warm start's SFT data keeps the short reference episodes only (issue 29)."""

import pytest

from posttrain.config import load_config
from posttrain.envs.synthetic.longtail import codes_of
from posttrain.runners.common import reference_tasks
from posttrain.runtime import RunContext


def _ctx(tmp_path, *overrides):
    return RunContext(load_config(None, [f"output_dir={tmp_path}", "run_name=r", "data.env=synthetic_longtail",
                                         "data.num_train_tasks=200", *overrides]))


def test_only_tasks_whose_reference_episode_fits_are_kept(tmp_path):
    ctx = _ctx(tmp_path)
    everything = ctx.tasks("train")
    kept = reference_tasks(ctx, 5)  # at most 4 calls and the answer
    assert kept == [t for t in everything if len(codes_of(t)) <= 4]
    assert 0 < len(kept) < len(everything)
    assert reference_tasks(ctx, None) == everything


def test_a_bound_that_keeps_nothing_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"warm_start.max_reference_turns: 1 keeps no train task \(the shortest "
                                         r"reference episode has 2 turns\)"):
        reference_tasks(_ctx(tmp_path), 1)
