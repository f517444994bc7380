"""Quarantine files hold each bad row once, however many processes load the task file, and how often.

Every process of a SAO run (learner, each generator, the evaluator) calls ``RunContext.tasks``; with
``data.on_bad_row=quarantine`` they used to append the same rows again and again.

Run: ``python -m pytest -q tests/unit/data/test_quarantine_once.py``.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from posttrain.config import load_config
from posttrain.data.tasks import read_tasks_jsonl
from posttrain.runtime import RunContext

ROWS = [
    '{"prompt": "1 + 1", "reference": "2"}',
    '{"prompt": "", "reference": "3"}',  # line 2: empty prompt
    "not json",  # line 3
    '{"prompt": "2 + 2", "reference": "4"}',
    '{"prompt": "3 + 3"}',  # line 5: no reference
    '{"prompt": "4 + 4", "reference": "8"}',
]
"""6 rows: 3 good (lines 1, 4, 6), 3 bad (lines 2, 3, 5)."""


def write_tasks(path: Path) -> Path:
    path.write_text("\n".join(ROWS) + "\n", encoding="utf-8")
    return path


def run_context(tmp_path: Path) -> RunContext:
    train = write_tasks(tmp_path / "train.jsonl")
    evals = write_tasks(tmp_path / "heldout.jsonl")
    cfg = load_config(None, [
        f"output_dir={tmp_path / 'runs'}", "run_name=q", "data.on_bad_row=quarantine",
        f"data.train_path={train}", f"data.eval_path={evals}",
    ])
    return RunContext(cfg)


def _load_like_a_role(ctx: RunContext, barrier: multiprocessing.synchronize.Barrier, loads: int) -> None:
    """One role process: wait for the others, then load both splits ``loads`` times."""
    barrier.wait(timeout=60)
    for _ in range(loads):
        assert len(ctx.tasks("train")) == 3 and len(ctx.tasks("eval")) == 3


def quarantined_lines(path: Path) -> list[tuple[str, int]]:
    return [(Path(r["file"]).name, r["line"]) for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())]


def test_five_processes_loading_the_task_files_at_once_quarantine_each_bad_row_once(tmp_path: Path) -> None:
    """5 processes (learner, 3 generators, evaluator) start together and load train and eval 3 times
    each: 5 x 3 = 15 loads per file, 3 bad rows per file. Before the fix: 45 lines per quarantine
    file; now 3 (lines 2, 3, 5), and the run counts 3 + 3 = 6 quarantined rows."""
    ctx = run_context(tmp_path)
    ctx.run_dir.mkdir(parents=True)
    mp = multiprocessing.get_context("fork")
    barrier = mp.Barrier(5)
    procs = [mp.Process(target=_load_like_a_role, args=(ctx, barrier, 3)) for _ in range(5)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * 5
    assert quarantined_lines(ctx.quarantine_path("train")) == [("train.jsonl", 2), ("train.jsonl", 3), ("train.jsonl", 5)]
    assert quarantined_lines(ctx.quarantine_path("eval")) == [("heldout.jsonl", 2), ("heldout.jsonl", 3), ("heldout.jsonl", 5)]
    assert ctx.quarantined_rows() == 6


def test_reloading_in_one_process_counts_every_bad_row_but_writes_none_twice(tmp_path: Path) -> None:
    """Two loads of the same file into one quarantine file: each load reports 3 bad rows (the count is
    what the load met), the first writes 3 lines and the second 0."""
    f = write_tasks(tmp_path / "t.jsonl")
    q = tmp_path / "q.jsonl"
    first = read_tasks_jsonl(f, "synthetic_arith", on_bad_row="quarantine", quarantine_path=q)
    second = read_tasks_jsonl(f, "synthetic_arith", on_bad_row="quarantine", quarantine_path=q)
    assert (first.num_quarantined, second.num_quarantined) == (3, 3)
    assert [line for _, line in quarantined_lines(q)] == [2, 3, 5]
    assert {r["field"] for r in map(json.loads, q.read_text(encoding="utf-8").splitlines())} == {
        "prompt", "<json>", "reference"
    }


def test_a_changed_row_on_the_same_line_is_quarantined_again_with_its_new_reason(tmp_path: Path) -> None:
    """Idempotence is per (file, line, field, reason): an edited file whose line 2 now lacks the
    reference (not an empty prompt) adds that record; the unchanged lines 3 and 5 are not repeated."""
    f = write_tasks(tmp_path / "t.jsonl")
    q = tmp_path / "q.jsonl"
    read_tasks_jsonl(f, "synthetic_arith", on_bad_row="quarantine", quarantine_path=q)
    rows = list(ROWS)
    rows[1] = '{"prompt": "5 + 5"}'
    f.write_text("\n".join(rows) + "\n", encoding="utf-8")
    read_tasks_jsonl(f, "synthetic_arith", on_bad_row="quarantine", quarantine_path=q)
    records = [(r["line"], r["field"]) for r in map(json.loads, q.read_text(encoding="utf-8").splitlines())]
    assert records == [(2, "prompt"), (3, "<json>"), (5, "reference"), (2, "reference")]


def test_no_quarantine_file_means_zero_quarantined_rows(tmp_path: Path) -> None:
    assert run_context(tmp_path).quarantined_rows() == 0
