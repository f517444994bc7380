"""``read_json_lines``: the run's own JSONL files (metrics, ledger) read whole, a bad line named by file and line."""

from pathlib import Path

import pytest

from posttrain.data.jsonl_log import read_json_lines


def test_objects_come_back_in_order_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "reward/mean": 0.5}\n\n{"step": 2}\n', encoding="utf-8")
    assert read_json_lines(path, "step") == [{"step": 1, "reward/mean": 0.5}, {"step": 2}]


@pytest.mark.parametrize(("text", "required", "message"), [
    ('{"step": 1}\n{"step": 2', "step", r"metrics.jsonl:2: not JSON \("),
    ('{"step": 1}\n[1, 2]\n', None, r"metrics.jsonl:2: expected an object$"),
    ('{"step": 1}\n\n{"iteration": 3}\n', "step", r"metrics.jsonl:3: expected an object with 'step'"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, text: str, required: str | None, message: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_json_lines(path, required)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_json_lines(tmp_path / "none.jsonl")
