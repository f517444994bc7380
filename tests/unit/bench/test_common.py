"""bench.common: generated docs sections keep hand-written text; the targets table reads the results files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.common import (
    OtherCpu,
    busy_cpu_seconds,
    markdown_table,
    targets_rows,
    update_docs_section,
    write_result,
)


def test_update_docs_section_replaces_only_its_own_block_and_appends_new_ones(tmp_path: Path) -> None:
    docs = tmp_path / "b.md"
    docs.write_text("# B\n\nhand text\n<!-- bench:x:begin -->\nold\n<!-- bench:x:end -->\nafter\n")
    update_docs_section("x", "new table", docs)
    update_docs_section("y", "other", docs)
    assert docs.read_text() == (
        "# B\n\nhand text\n<!-- bench:x:begin -->\nnew table\n<!-- bench:x:end -->\nafter\n\n"
        "<!-- bench:y:begin -->\nother\n<!-- bench:y:end -->\n"
    )


def test_update_docs_section_refuses_a_half_marked_section(tmp_path: Path) -> None:
    docs = tmp_path / "b.md"
    docs.write_text("<!-- bench:x:begin -->\nno end\n")
    with pytest.raises(ValueError, match="x"):
        update_docs_section("x", "t", docs)


def test_markdown_table_aligns_numbers_right_and_checks_row_width() -> None:
    assert markdown_table(["a", "b"], [[1, 2]]) == "| a | b |\n|---|---:|\n| 1 | 2 |"
    with pytest.raises(ValueError, match="rows\\[0\\]"):
        markdown_table(["a", "b"], [[1]])


def test_targets_read_each_result_and_judge_it(tmp_path: Path) -> None:
    """Busy 0.95 >= 0.9 met; ratio 1.2 < 1.5 not met; stream worst of 0.6 and 0.4 is 0.4 < 0.5; rest missing."""
    (tmp_path / "async_vs_sync.json").write_text(json.dumps(
        {"busy_fraction": {"sao": 0.95}, "throughput_ratio_sao_over_grpo_sync": 1.2}))
    (tmp_path / "stream.json").write_text(json.dumps(
        {"rows": [{"ratio_ours_over_raw": 0.6}, {"ratio_ours_over_raw": 0.4}]}))
    rows = targets_rows(tmp_path)
    assert [(r["measured"], r["met"]) for r in rows] == [(0.95, True), (1.2, False), (0.4, False), (None, None),
                                                         (None, None)]


def test_publish_result_writes_json_then_docs_and_targets_only_when_asked(tmp_path: Path, capsys) -> None:
    from bench.common import publish_result

    docs = tmp_path / "benchmarks.md"
    docs.write_text("# B\n")
    path = publish_result("stream", {"rows": []}, "the table", docs=False, shown="this run",
                          results_dir=tmp_path, docs_path=docs)
    assert json.loads(path.read_text()) == {"rows": []}
    assert docs.read_text() == "# B\n"
    assert capsys.readouterr().out.startswith("this run\n")
    publish_result("stream", {"rows": []}, "the table", docs=True, results_dir=tmp_path, docs_path=docs)
    text = docs.read_text()
    assert "the table" in text and "<!-- bench:targets:begin -->" in text


def test_settings_write_repository_paths_relative_so_results_carry_no_machine_path():
    import argparse

    from bench.common import REPO, settings_of

    got = settings_of(argparse.Namespace(work_dir=REPO / "runs" / "bench" / "x", out=Path("/elsewhere/r.json"), n=3))
    assert got == {"work_dir": "runs/bench/x", "out": "r.json", "n": 3}


def test_busy_cpu_seconds_reads_user_nice_system_irq_softirq(tmp_path: Path) -> None:
    """cpu user nice system idle iowait irq softirq steal: busy = 100 + 1 + 50 + 2 + 3 ticks (idle, iowait, steal out)."""
    import os

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 1 50 9000 70 2 3 40 0 0\ncpu0 50 0 25 4500 35 1 1 20 0 0\n")
    assert busy_cpu_seconds(stat) == pytest.approx(156 / os.sysconf("SC_CLK_TCK"))
    assert busy_cpu_seconds(tmp_path / "absent") is None
    stat.write_text("intr 1 2 3\n")
    with pytest.raises(ValueError, match="not the aggregate 'cpu' line"):
        busy_cpu_seconds(stat)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat (Linux)")
def test_other_cpu_counts_a_busy_child_process() -> None:
    """A child spins for 1 s of CPU while this process waits for it: at least a quarter of a core is counted
    (two cores, whatever else runs beside the test)."""
    import subprocess
    import sys

    with OtherCpu() as other:
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"],
                       check=True)
    assert other.cores is not None and other.cores >= 0.25


def test_results_read_back_unchanged_with_one_line_per_batch_or_episode(tmp_path: Path) -> None:
    """Objects indented, a list of numbers on one line, a list of lists one item per line; json reads it back."""
    data = {"setting": "x", "load": [1.0, 0.5], "batches": [[64, 384, 20, 0.5, 900], [8, 128, 20, 0.1, 160]],
            "episodes": [[78, [15, 4], [23, 0]]], "runs": [{"seed": 0, "ok": True, "none": None}], "empty": [],
            "nested": {}, "numbered": {1: "a"}}
    text = write_result("r", data, tmp_path).read_text()
    assert json.loads(text) == {**data, "numbered": {"1": "a"}}
    lines = text.splitlines()
    assert '  "load": [1.0, 0.5],' in lines
    assert "    [64, 384, 20, 0.5, 900]," in lines and "    [78, [15, 4], [23, 0]]" in lines
    assert '      "seed": 0,' in lines
