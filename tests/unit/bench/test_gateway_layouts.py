"""bench.gateway's core layouts: the core lists parse and validate in one line; pinning reaches every thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from bench.gateway import Layout, core_list, main, parse_cores, pin_process, render, resolve_layouts

TWO = frozenset({0, 1})


def test_parse_cores_reads_taskset_style_lists() -> None:
    assert parse_cores("0", "f") == {0}
    assert parse_cores("0,2", "f") == {0, 2}
    assert parse_cores(" 1-3, 6", "f") == {1, 2, 3, 6}
    assert core_list(parse_cores("3,0-1", "f")) == "0,1,3"


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "0,,1", "1.5"])
def test_parse_cores_refuses_what_is_not_a_core_list(text: str) -> None:
    with pytest.raises(ValueError, match="^--engine-cores: .*not a core number") as e:
        parse_cores(text, "--engine-cores")
    assert "\n" not in str(e.value)


def test_parse_cores_refuses_a_backward_range() -> None:
    with pytest.raises(ValueError, match="--agent-cores: range '3-1' runs backwards"):
        parse_cores("3-1", "--agent-cores")


def test_default_layouts_put_the_agent_on_the_highest_core_and_the_engine_on_the_rest() -> None:
    assert resolve_layouts(["shared", "split"], None, None, TWO) == [
        Layout("shared", TWO, TWO), Layout("split", frozenset({0}), frozenset({1}))]
    four = frozenset({0, 1, 2, 3})
    assert resolve_layouts(["split"], None, None, four) == [Layout("split", frozenset({0, 1, 2}), frozenset({3}))]
    assert resolve_layouts(["split", "shared"], "2", "0-1", four) == [
        Layout("split", frozenset({2}), frozenset({0, 1})), Layout("shared", four, four)]


@pytest.mark.parametrize(("names", "engine", "agent", "allowed", "message"), [
    (["split"], "0", "2", TWO, "--agent-cores: core\\(s\\) 2 not available to this process \\(allowed: 0,1\\)"),
    (["split"], "0-2", "1", TWO, "--engine-cores: core\\(s\\) 2 not available"),
    (["split"], "0-1", "1", TWO, "--engine-cores and --agent-cores overlap on core\\(s\\) 1"),
    (["split"], None, "0", TWO, "overlap on core\\(s\\) 0"),  # the default engine side, {0}, is the agent's core
    (["split"], None, None, frozenset({0}), "--layouts split: needs at least 2 cores"),
    (["shared", "shared"], None, None, TWO, "--layouts: give shared and/or split once each"),
    ([], None, None, TWO, "--layouts: give shared"),
    (["both"], None, None, TWO, "--layouts: unknown layout 'both'"),
])
def test_bad_layouts_fail_in_one_line(names: list[str], engine: str | None, agent: str | None,
                                      allowed: frozenset[int], message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        resolve_layouts(names, engine, agent, allowed)
    assert "\n" not in str(e.value)


def test_main_refuses_bad_cores_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(SystemExit) as e:
        main(["--layouts", "split", "--agent-cores", str(bad), "--engine-cores", "0", "--out",
              str(tmp_path / "g.json"), "--no-docs"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--agent-cores" in err or "needs at least 2 cores" in err
    assert not (tmp_path / "g.json").exists()


def test_pin_process_sets_every_thread_and_threads_started_later_inherit() -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    one = frozenset({min(allowed)})
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)
    before.start()
    try:
        pin_process(os.getpid(), one)
        assert os.sched_getaffinity(before.native_id) == one
        assert os.sched_getaffinity(0) == one
        seen: list[set[int]] = []
        later = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        later.start()
        later.join()
        assert seen == [one]
    finally:
        pin_process(os.getpid(), allowed)
        stop.set()
        before.join()
    assert os.sched_getaffinity(0) == allowed


def _row(layout: str | None, concurrency: int, ratio: float) -> dict[str, object]:
    row: dict[str, object] = {"concurrency": concurrency, "direct_ms_per_token": 1.0, "gateway_ms_per_token": ratio,
                              "ratio": ratio, "direct_cpu_ms_per_token": 0.5, "gateway_cpu_ms_per_token": 0.6,
                              "client_cpu_ms_per_token": 0.2, "direct_batch_rows": 8.0, "gateway_batch_rows": 6.0}
    if layout is not None:
        row["layout"] = layout
    return row


def test_render_shows_both_layouts_side_by_side_and_reads_old_results() -> None:
    machine = {"cpu_count": 2, "memory_gib": 1.0, "gpu": None, "torch": "t", "load_avg": [1.0, 1.0, 1.0], "when": "w"}
    base = {"command": "c", "machine": machine, "engine": "hf", "turns": 3, "tokens": 24, "rounds": 3}
    text = render({**base, "rows": [_row("shared", 8, 1.8), _row("split", 8, 1.3)], "worst_ratio": 1.8,
                   "worst_ratio_by_layout": {"shared": 1.8, "split": 1.3},
                   "layouts": [{"name": "shared", "engine_cores": "0,1", "agent_cores": "0,1"},
                               {"name": "split", "engine_cores": "0", "agent_cores": "1"}]})
    assert "| shared | 8 | 1.00/1.80 | **1.80** |" in text
    assert "| split | 8 | 1.00/1.30 | **1.30** |" in text
    assert "on core 0, agent on 1" in text
    assert "**1.80x** shared, **1.30x** split" in text
    old = render({**base, "rows": [_row(None, 1, 1.2)], "worst_ratio": 1.2})
    assert "| shared | 1 | 1.00/1.20 | **1.20** |" in old and "split" not in old
