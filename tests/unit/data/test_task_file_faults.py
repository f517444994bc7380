"""Bad task files are refused with one line naming the file (issue 23, items 4, 8, 9 and 14).

Each test is a fault the fault-injection audit reproduced through ``posttrain run``: an empty
file hung the run, non-UTF-8 bytes gave a traceback, a 200 MB line was killed for memory, and a
misspelt field name was silently dropped.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from posttrain.data import tasks as task_module
from posttrain.data.formats import validate_file
from posttrain.data.tasks import MAX_ROW_BYTES, DatasetError, load_tasks_jsonl, read_tasks_jsonl

GOOD = json.dumps({"prompt": "Compute 2 + 2.", "reference": "4"})


def test_empty_task_file_is_refused_at_load_time_naming_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "tasks_empty.jsonl"
    empty.write_bytes(b"")
    with pytest.raises(DatasetError) as info:
        load_tasks_jsonl(empty, "gsm8k")
    assert str(empty) in str(info.value) and info.value.field == "<file>"
    assert "no valid task" in info.value.reason


def test_task_file_of_only_bad_rows_in_quarantine_mode_is_refused_too(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": "p"}\n', encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        read_tasks_jsonl(f, "gsm8k", on_bad_row="quarantine", quarantine_path=tmp_path / "q.jsonl")
    assert "no valid task (1 quarantined)" in str(info.value)


def test_non_utf8_row_names_file_line_and_byte_offset(tmp_path: Path) -> None:
    f = tmp_path / "latin1.jsonl"
    bad = '{"prompt": "caf\u00e9", "reference": "1"}'.encode("latin-1")
    f.write_bytes(GOOD.encode() + b"\n" + bad + b"\n")
    with pytest.raises(DatasetError) as info:
        load_tasks_jsonl(f, "gsm8k")
    err = info.value
    offset = len(GOOD) + 1 + bad.index(b"\xe9")
    assert (err.line, err.field) == (2, "<utf-8>")
    assert f"byte offset {offset}" in err.reason and "0xe9" in err.reason
    assert str(err).startswith(f"{f}:2: ")


def test_non_utf8_row_is_quarantined_and_the_good_rows_kept(tmp_path: Path) -> None:
    f = tmp_path / "mixed.jsonl"
    f.write_bytes(b'{"prompt": "\xff", "reference": "1"}\n' + GOOD.encode() + b"\n")
    result = read_tasks_jsonl(f, "gsm8k", on_bad_row="quarantine", quarantine_path=tmp_path / "q.jsonl")
    assert len(result.tasks) == 1 and result.num_quarantined == 1
    row = json.loads((tmp_path / "q.jsonl").read_text(encoding="utf-8"))
    assert (row["line"], row["field"]) == (1, "<utf-8>")


def test_row_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB row against a 1 MiB limit: refused as line 2, and the reader's peak memory stays far below it."""
    monkeypatch.setattr(task_module, "MAX_ROW_BYTES", 2**20)
    f = tmp_path / "huge.jsonl"
    with f.open("wb") as fh:
        fh.write(GOOD.encode() + b"\n")
        fh.write(b'{"prompt": "')
        for _ in range(64):
            fh.write(b"x" * 2**20)
        fh.write(b'", "reference": "1"}\n')
        fh.write(json.dumps({"prompt": "3 + 3", "reference": "6"}).encode() + b"\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    result = read_tasks_jsonl(f, "gsm8k", on_bad_row="quarantine", quarantine_path=tmp_path / "q.jsonl")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert [t.reference for t in result.tasks] == ["4", "6"] and result.num_quarantined == 1
    row = json.loads((tmp_path / "q.jsonl").read_text(encoding="utf-8"))
    assert (row["line"], row["field"]) == (2, "<row>") and "over the limit of 1048576 bytes" in row["reason"]
    assert grown_kib < 32 * 1024  # the 64 MiB row was never held in memory
    with pytest.raises(DatasetError, match=r"huge.jsonl:2: field '<row>': row is 67108\d{3} bytes"):
        load_tasks_jsonl(f, "gsm8k")


def test_stated_row_limit_is_a_few_mebibytes() -> None:
    assert MAX_ROW_BYTES == 8 * 2**20


@pytest.mark.parametrize("typo", ["refrence", "metdata", "taskid"])
def test_misspelt_field_is_an_error_not_silently_dropped(tmp_path: Path, typo: str) -> None:
    f = tmp_path / "typo.jsonl"
    row = {"prompt": "p", "reference": "1", typo: "x"}
    f.write_text(GOOD + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        load_tasks_jsonl(f, "gsm8k")
    assert (info.value.line, info.value.field) == (2, typo)
    assert "unknown field (allowed: task_id, prompt, reference, metadata)" in info.value.reason


def test_format_check_lists_an_empty_rl_file_as_zero_valid_rows(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_bytes(b"\n\n")
    assert validate_file(f, "rl") == (0, [])
