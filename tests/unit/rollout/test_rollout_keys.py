"""Key names of a run's rollout stream.

Run: .venv/bin/python -m pytest -q tests/unit/rollout/test_rollout_keys.py
"""

from __future__ import annotations

import pytest

from posttrain.rollout.keys import StreamKeys, main


def test_every_key_of_a_run_shares_prefix_and_run():
    keys = StreamKeys(prefix="team-a", run="exp1")
    assert keys.rollouts == "team-a:exp1:rollouts"
    assert keys.dead_letter == "team-a:exp1:dead_letter"
    assert keys.policy_version == "team-a:exp1:policy_version"
    assert keys.admission == "team-a:exp1:admission"
    assert all(k.startswith("team-a:exp1:") for k in keys.all_keys().values())
    assert keys.acl_pattern == "team-a:*"


def test_bad_prefix_or_run_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="run:"):
        StreamKeys(prefix="p", run="a:b")
    with pytest.raises(ValueError, match="prefix:"):
        StreamKeys(prefix="p q", run="a")


def test_cli_prints_the_keys(capsys):
    assert main(["p", "r"]) == 0
    assert "rollouts\tp:r:rollouts" in capsys.readouterr().out
