"""A run directory resumes only the run it holds: another technique, seed, model or data is refused."""

from __future__ import annotations

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.runtime import RunContext


def test_a_run_directory_is_not_reused_for_other_data_but_is_for_more_steps(tmp_path) -> None:
    base = [f"output_dir={tmp_path}", "run_name=r"]
    RunContext(load_config(None, base)).save_resolved_config()
    RunContext(load_config(None, [*base, "sao.steps=99"])).save_resolved_config()  # train longer: the same run
    (tmp_path / "r" / "tokenizer").mkdir()  # the run did work (a run that did none takes any config over)
    other = RunContext(load_config(None, [*base, "data.train_path=elsewhere.jsonl"]))
    with pytest.raises(ConfigError, match=r"data.train_path: None there, 'elsewhere.jsonl' now"):
        other.save_resolved_config()
    assert "elsewhere" not in (tmp_path / "r" / "resolved_config.yaml").read_text()
