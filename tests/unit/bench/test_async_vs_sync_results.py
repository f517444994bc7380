"""``bench.async_vs_sync.merge_results``: one result per setting, the tool-latency one on top."""

from __future__ import annotations

import pytest
from bench.async_vs_sync import merge_results, setting_result


def result(setting: str | None, ratio: float) -> dict:
    r = {"throughput_ratio_sao_over_grpo_sync": ratio, "busy_fraction": {"sao": 0.5}}
    if setting is not None:
        r["setting"] = setting
    return r


def test_a_tool_latency_run_goes_on_top_and_keeps_an_old_compute_bound_file_marked_as_such() -> None:
    """Old file (no setting, ratio 0.42) + tool-latency run (2.0) -> top 2.0, compute_bound 0.42 with a note."""
    merged = merge_results(result(None, 0.42), result("tool_latency", 2.0))
    assert merged["throughput_ratio_sao_over_grpo_sync"] == 2.0
    assert merged["compute_bound"]["throughput_ratio_sao_over_grpo_sync"] == 0.42
    assert merged["compute_bound"]["setting"] == "compute_bound"
    assert "before the runtime fixes" in merged["compute_bound"]["runtime_note"]


def test_a_compute_bound_run_replaces_only_the_compute_bound_part() -> None:
    """Top tool-latency 2.0 with compute_bound 0.42; a new compute-bound run 0.8 -> top 2.0, compute_bound 0.8."""
    top = {**result("tool_latency", 2.0), "compute_bound": result("compute_bound", 0.42)}
    merged = merge_results(top, result("compute_bound", 0.8))
    assert merged["throughput_ratio_sao_over_grpo_sync"] == 2.0
    assert merged["compute_bound"]["throughput_ratio_sao_over_grpo_sync"] == 0.8
    assert "runtime_note" not in merged["compute_bound"]
    again = merge_results(merged, result("tool_latency", 3.0))
    assert (again["throughput_ratio_sao_over_grpo_sync"], again["compute_bound"]["throughput_ratio_sao_over_grpo_sync"]) == (3.0, 0.8)


def test_without_a_previous_file_the_run_is_the_top_level() -> None:
    assert merge_results(None, result("compute_bound", 0.8)) == result("compute_bound", 0.8)
    assert "compute_bound" not in merge_results(None, result("tool_latency", 2.0))


def test_setting_result_finds_each_setting_or_says_which_is_missing() -> None:
    """--engine-modes-only writes into the setting its arguments name, never over the other one."""
    top = {**result("tool_latency", 2.0), "compute_bound": result("compute_bound", 0.42)}
    assert setting_result(top, "tool_latency") is top
    assert setting_result(top, "compute_bound") is top["compute_bound"]
    alone = result("compute_bound", 0.8)
    assert setting_result(alone, "compute_bound") is alone
    with pytest.raises(FileNotFoundError, match="no tool_latency result"):
        setting_result(alone, "tool_latency")
    with pytest.raises(FileNotFoundError, match="no compute_bound result"):
        setting_result(result("tool_latency", 2.0), "compute_bound")


@pytest.mark.parametrize(("methods", "message"), [
    (["nonsense"], "unknown method 'nonsense'"),
    (["grpo_sync_g5"], "must be a multiple of the group size of grpo_sync_g5"),
])
def test_bad_methods_fail_before_the_warm_start(tmp_path, capsys, methods, message):
    """Checked right after parsing (the SFT warm start takes minutes): exit 2, one error line, nothing written."""
    from bench.async_vs_sync import main

    with pytest.raises(SystemExit) as exc:
        main(["--methods", *methods, "--steps", "1", "--no-docs", "--work-dir", str(tmp_path / "w")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w" / "tasks").exists()


@pytest.mark.parametrize(("stored", "message"), [
    ({"setting": "tool_latency"}, "no compute_bound result; run that setting first"),
    (None, "no results; run the benchmark first"),
    ({"setting": "tool_latency", "compute_bound": {"setting": "compute_bound"}}, "no cached tasks or warm start"),
])
def test_only_modes_say_in_one_line_what_to_run_first(tmp_path, capsys, monkeypatch, stored, message):
    """--engine-modes-only in a fresh checkout: exit 2, one line on stderr, no traceback, no work directory made."""
    import bench.common
    from bench.async_vs_sync import main

    monkeypatch.setattr(bench.common, "read_result", lambda name: stored)
    work = tmp_path / "w"
    code = main(["--engine-modes-only", "--tool-latency-median-s", "0", "--no-docs", "--work-dir", str(work)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not work.exists()
