"""bench.common: generated docs sections keep hand-written text; the targets table reads the results files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.common import REPO, display_path, markdown_table, targets_rows, update_docs_section, write_result


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
    """Busy 0.95 >= 0.9 met; the throughput ratio read at equal episodes in flight (``equal/``, 60 / 50 = 1.2 < 1.5,
    not met; the equal-batch files' 600 / 50 is not the target); stream worst of 0.6 and 0.4 is 0.4 < 0.5; the
    weight sync 1.85 <= 2 met; the simulator missing; the gateway's 1.15 <= 1.2 met."""
    setting = tmp_path / "async_vs_sync" / "tool_latency"
    (setting / "equal").mkdir(parents=True)
    for where, method, busy, tokens in (("", "sao", 0.95, 600.0), ("", "grpo_sync_g8", 0.1, 50.0),
                                        ("equal", "sao", 0.9, 60.0), ("equal", "grpo_sync_g8", 0.4, 50.0)):
        (setting / where / f"{method}.json").write_text(json.dumps(
            {"method": method, "runs": [{"busy_fraction": busy, "trained_action_tokens_per_s": tokens}]}))
    (tmp_path / "weight_sync.json").write_text(json.dumps({"worst_ratio_over_raw": 1.85}))
    (tmp_path / "stream.json").write_text(json.dumps(
        {"rows": [{"ratio_ours_over_raw": 0.6}, {"ratio_ours_over_raw": 0.4}]}))
    (tmp_path / "gateway.json").write_text(json.dumps({"worst_ratio": 1.15}))
    rows = targets_rows(tmp_path)
    assert [(r["measured"], r["met"]) for r in rows] == [(0.95, True), (pytest.approx(1.2), False), (0.4, False),
                                                         (1.85, True), (None, None), (1.15, True)]


def test_publish_result_writes_the_file_then_the_section_and_targets_only_when_asked(tmp_path: Path, capsys,
                                                                                     monkeypatch) -> None:
    """With docs off only the file is written and ``render`` is never called; with docs on, ``render`` runs after
    the write (so a section rendered from the results directory includes the new file) and the targets follow."""
    import bench.common as common

    docs = tmp_path / "benchmarks.md"
    docs.write_text("# B\n")
    monkeypatch.setattr(common, "DOCS", docs)
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    path = tmp_path / "stream.json"

    def render() -> str:
        return f"the table of {json.loads(path.read_text())}"

    common.publish_result(path, {"rows": []}, "stream", lambda: pytest.fail("rendered with docs off"), docs=False)
    assert json.loads(path.read_text()) == {"rows": []} and docs.read_text() == "# B\n"
    common.publish_result(path, {"rows": [{"ratio_ours_over_raw": 0.6}]}, "stream", render, docs=True)
    text = docs.read_text()
    assert "the table of {'rows': [{'ratio_ours_over_raw': 0.6}]}" in text and "| 0.60 | yes |" in text
    assert "the table of" in capsys.readouterr().out


def test_repository_paths_are_written_relative_so_results_carry_no_machine_path() -> None:
    assert display_path(REPO / "bench" / "results" / "x.json") == "bench/results/x.json"
    assert display_path(Path("/elsewhere/r.json")) == "/elsewhere/r.json"


def test_every_section_of_the_docs_renders_from_the_committed_results() -> None:
    """Re-rendering every generated section of docs/benchmarks.md from bench/results/ gives the committed text."""
    from bench import async_vs_sync, gateway, stream, vs_trl, weight_sync
    from bench.common import DOCS, read_result, targets_section
    from bench.sim import project

    docs = DOCS.read_text(encoding="utf-8")

    def section(name: str) -> str:
        return docs.split(f"<!-- bench:{name}:begin -->\n")[1].split(f"\n<!-- bench:{name}:end -->")[0]

    assert section("async_vs_sync") == async_vs_sync.render()
    assert section("targets") == targets_section()
    for name, module in (("vs_trl", vs_trl), ("stream", stream), ("weight_sync", weight_sync), ("simulate", project),
                         ("gateway", gateway)):
        assert section(name) == module.render(read_result(name)), name


def test_the_results_page_re_renders_from_the_committed_results_unchanged(tmp_path: Path, monkeypatch) -> None:
    """``render_results_page`` rewrites docs/results.md's generated sections (learning_race, GKD) and docs/log.md's
    longtail evidence from bench/results/ without running anything: on copies of the committed pages it changes
    nothing."""
    import bench.common as common
    from bench import gkd_miniature, learning_race, longtail_evidence

    page, log = tmp_path / "results.md", tmp_path / "log.md"
    page.write_text(learning_race.DOCS.read_text(encoding="utf-8"), encoding="utf-8")
    log.write_text(longtail_evidence.DOCS.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(learning_race, "DOCS", page)
    monkeypatch.setattr(gkd_miniature, "DOCS", page)
    monkeypatch.setattr(longtail_evidence, "DOCS", log)
    written = common.render_results_page()
    assert {"learning_race_race", "learning_race_stability", "gkd_miniature", "longtail_evidence"} <= set(written)
    assert page.read_text(encoding="utf-8") == (common.REPO / "docs" / "results.md").read_text(encoding="utf-8")
    assert log.read_text(encoding="utf-8") == (common.REPO / "docs" / "log.md").read_text(encoding="utf-8")


def test_results_read_back_unchanged_with_one_line_per_batch_or_episode(tmp_path: Path) -> None:
    """Objects indented, a list of numbers on one line, a list of lists one item per line; json reads it back."""
    data = {"setting": "x", "load": [1.0, 0.5], "batches": [[64, 384, 20, 0.5, 900], [8, 128, 20, 0.1, 160]],
            "episodes": [[78, [15, 4], [23, 0]]], "runs": [{"seed": 0, "ok": True, "none": None}], "empty": [],
            "nested": {}, "numbered": {1: "a"}}
    text = write_result(tmp_path / "r.json", data).read_text()
    assert json.loads(text) == {**data, "numbered": {"1": "a"}}
    lines = text.splitlines()
    assert '  "load": [1.0, 0.5],' in lines
    assert "    [64, 384, 20, 0.5, 900]," in lines and "    [78, [15, 4], [23, 0]]" in lines
    assert '      "seed": 0,' in lines
