"""Task-file loading: the generic RL JSONL format, GSM8K, BeyondAIME, DAPO-Math; bad rows stop or quarantine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.data.tasks import (
    DatasetError,
    data_dir,
    gsm8k_final_answer,
    load_beyond_aime,
    load_dapo_math,
    load_gsm8k,
    load_tasks_jsonl,
    read_tasks_jsonl,
)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_generic_rows_become_tasks_with_default_ids(tmp_path: Path) -> None:
    f = write(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "Compute 2 + 2.", "reference": "4"}),
            "",
            json.dumps({"prompt": "p", "reference": 7, "task_id": "x7", "metadata": {"level": 3, "src": "a"}}),
        ],
    )
    tasks = load_tasks_jsonl(f, "synthetic_arith")
    assert [t.task_id for t in tasks] == ["mine-1", "x7"]
    assert tasks[1].reference == "7" and tasks[1].metadata == {"level": "3", "src": "a"}
    assert {t.env_name for t in tasks} == {"synthetic_arith"} and tasks[0].data_source == "mine"


@pytest.mark.parametrize(
    ("row", "field", "reason"),
    [
        ('{"prompt": "p"', "<json>", "invalid JSON"),
        ('["p", "r"]', "<json>", "expected an object"),
        ('{"reference": "1"}', "prompt", "missing"),
        ('{"prompt": "  ", "reference": "1"}', "prompt", "empty"),
        ('{"prompt": "p", "reference": ["1"]}', "reference", "expected a string"),
        ('{"prompt": "p", "reference": "1", "metadata": {"k": [1]}}', "metadata.k", "expected a scalar"),
        ('{"prompt": "p", "reference": "1", "task_id": 5}', "task_id", "non-empty string"),
    ],
)
def test_bad_row_stops_with_file_line_and_field(tmp_path: Path, row: str, field: str, reason: str) -> None:
    f = write(tmp_path / "t.jsonl", [json.dumps({"prompt": "ok", "reference": "1"}), row])
    with pytest.raises(DatasetError) as info:
        load_tasks_jsonl(f, "gsm8k")
    err = info.value
    assert (err.line, err.field) == (2, field) and reason in err.reason
    assert f"{f}:2: field {field!r}" in str(err)


def test_duplicate_task_id_is_a_bad_row(tmp_path: Path) -> None:
    row = json.dumps({"prompt": "p", "reference": "1", "task_id": "a"})
    with pytest.raises(DatasetError, match="duplicate id 'a'"):
        load_tasks_jsonl(write(tmp_path / "t.jsonl", [row, row]), "gsm8k")


def test_quarantine_writes_bad_rows_with_reasons_and_counts_them(tmp_path: Path) -> None:
    f = write(
        tmp_path / "t.jsonl",
        ['{"prompt": "a", "reference": "1"}', "{broken", '{"prompt": "b"}', '{"prompt": "c", "reference": "3"}'],
    )
    q = tmp_path / "q" / "quarantine.jsonl"
    result = read_tasks_jsonl(f, "gsm8k", on_bad_row="quarantine", quarantine_path=q)
    assert [t.prompt for t in result.tasks] == ["a", "c"]
    assert result.num_quarantined == 2 and result.quarantine_path == q
    bad = [json.loads(line) for line in q.read_text(encoding="utf-8").splitlines()]
    assert [(b["line"], b["field"]) for b in bad] == [(2, "<json>"), (3, "reference")]
    assert bad[1]["row"] == {"prompt": "b"} and bad[0]["file"] == str(f)


def test_quarantine_mode_needs_a_path_and_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quarantine_path"):
        load_tasks_jsonl(write(tmp_path / "t.jsonl", ["{}"]), "gsm8k", on_bad_row="quarantine")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_tasks_jsonl(tmp_path / "nope.jsonl", "gsm8k")


def test_gsm8k_loads_all_rows_with_numeric_references() -> None:
    """7,473 train / 1,319 test rows; reference = number after ####, commas removed."""
    train, test = load_gsm8k("train"), load_gsm8k("test")
    assert (len(train.tasks), len(test.tasks)) == (7473, 1319)
    assert train.tasks[0].reference == "72" and train.tasks[0].task_id == "gsm8k-train-00001"
    for task in train.tasks + test.tasks:
        float(task.reference)
    assert gsm8k_final_answer("so\n#### 1,072") == "1072" and gsm8k_final_answer("no marker") is None


def test_gsm8k_row_without_final_answer_is_reported(tmp_path: Path) -> None:
    f = write(tmp_path / "g.jsonl", [json.dumps({"question": "q", "answer": "no marker"})])
    with pytest.raises(DatasetError, match=r"g.jsonl:1: field 'answer': no final answer"):
        load_gsm8k("train", path=f)
    q = tmp_path / "q.jsonl"
    assert load_gsm8k("train", path=f, on_bad_row="quarantine", quarantine_path=q).num_quarantined == 1


def test_beyond_aime_and_dapo_math_load() -> None:
    aime = load_beyond_aime().tasks
    assert len(aime) == 100 and all(t.reference.isdigit() for t in aime)
    dapo = load_dapo_math().tasks
    assert len(dapo) == 17917 and dapo[0].task_id == "dapo-0" and dapo[0].reference == "34"
    assert len({t.task_id for t in dapo}) == len(dapo)


def test_data_dir_is_overridable_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gsm8k").mkdir()
    write(tmp_path / "gsm8k" / "test.jsonl", [json.dumps({"question": "q?", "answer": "x\n#### 5"})])
    monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    assert [t.reference for t in load_gsm8k("test").tasks] == ["5"]
    monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="POSTTRAIN_DATA_DIR"):
        data_dir()
