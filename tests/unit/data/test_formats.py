import json
from pathlib import Path

import pytest

from posttrain.data.formats import load_rl_tasks, load_rows, main, validate_file
from posttrain.data.tasks import DatasetError

EXAMPLES = Path(__file__).resolve().parents[3] / "data" / "examples"

GOOD_SFT = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "#### 4"}]}


def _write(path: Path, rows: list[object]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["sft", "cpt", "dpo", "rl"])
def test_each_example_file_has_only_valid_rows(fmt):
    """data/examples/<fmt>.jsonl (built from GSM8K by scripts/build_example_data.py): 200 rows, none bad."""
    num_valid, errors = validate_file(EXAMPLES / f"{fmt}.jsonl", fmt)
    assert errors == []
    assert num_valid == 200


def test_bad_sft_role_stops_with_file_line_and_field(tmp_path):
    """Row 2 of 3 has role 'bot' in its second message: the error names line 2 and messages[1].role."""
    bad = {"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]}
    path = _write(tmp_path / "sft.jsonl", [GOOD_SFT, bad, GOOD_SFT])
    with pytest.raises(DatasetError) as info:
        load_rows(path, "sft")
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 2, "messages[1].role")
    assert f"{path}:2: field 'messages[1].role'" in str(err)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q2"}]}, "messages[1].role"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}, "messages[1].content"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": 4}]}, "messages[1].content"),
        ({"messages": [{"role": "user", "content": "q"}]}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"prompt": "q"}, "prompt"),
        ({**GOOD_SFT, "id": 7}, "id"),
        ("{not json", "<json>"),
        ("[1, 2]", "<json>"),
    ],
)
def test_every_kind_of_bad_sft_row_names_its_field(tmp_path, row, field):
    path = _write(tmp_path / "sft.jsonl", [row])
    with pytest.raises(DatasetError) as info:
        load_rows(path, "sft")
    assert (info.value.line, info.value.field) == (1, field)


def test_quarantine_keeps_good_rows_and_writes_each_bad_one_with_its_reason(tmp_path):
    """Rows: good, bad (no assistant), good, bad (duplicate id 'a'): 2 kept (lines 1, 3), 2 quarantined."""
    rows = [
        {**GOOD_SFT, "id": "a"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"}]},
        GOOD_SFT,
        {**GOOD_SFT, "id": "a"},
    ]
    path = _write(tmp_path / "sft.jsonl", rows)
    quarantine = tmp_path / "out" / "quarantine.jsonl"
    loaded = load_rows(path, "sft", on_bad_row="quarantine", quarantine_path=quarantine)
    assert loaded.lines == [1, 3]
    assert [r.example_id for r in loaded.records] == ["a", "sft-3"]
    assert loaded.num_quarantined == 2 and loaded.quarantine_path == quarantine
    written = [json.loads(line) for line in quarantine.read_text(encoding="utf-8").splitlines()]
    assert [(w["line"], w["field"]) for w in written] == [(2, "messages[1].role"), (4, "id")]
    assert "duplicate id 'a'" in written[1]["reason"]
    assert written[0]["row"] == rows[1] and written[0]["file"] == str(path)


def test_dpo_rows_need_prompt_chosen_and_a_different_rejected(tmp_path):
    """Line 1 is good; line 2 lacks 'prompt'; line 3 has rejected == chosen; line 4 has an unknown field."""
    rows = [
        {"prompt": "q", "chosen": "#### 4", "rejected": "#### 5"},
        {"chosen": "#### 4", "rejected": "#### 5"},
        {"prompt": "q", "chosen": "#### 4", "rejected": "#### 4"},
        {"prompt": "q", "chosen": "#### 4", "rejected": "#### 5", "score": 1},
    ]
    num_valid, errors = validate_file(_write(tmp_path / "dpo.jsonl", rows), "dpo")
    assert num_valid == 1
    assert [(e.line, e.field) for e in errors] == [(2, "prompt"), (3, "rejected"), (4, "score")]


def test_cpt_rows_need_non_empty_text(tmp_path):
    rows = [{"text": "Once upon a time."}, {"text": ""}, {"txt": "typo"}]
    num_valid, errors = validate_file(_write(tmp_path / "cpt.jsonl", rows), "cpt")
    assert num_valid == 1
    assert [(e.line, e.field) for e in errors] == [(2, "text"), (3, "txt")]


def test_rl_rows_need_prompt_and_reference(tmp_path):
    rows = [{"prompt": "Compute 2 + 2.", "reference": 4}, {"prompt": "Compute 1 + 1."}]
    num_valid, errors = validate_file(_write(tmp_path / "rl.jsonl", rows), "rl")
    assert num_valid == 1
    assert [(e.line, e.field) for e in errors] == [(2, "reference")]
    tasks = load_rl_tasks(tmp_path / "rl.jsonl", "synthetic_arith", on_bad_row="quarantine",
                          quarantine_path=tmp_path / "q.jsonl")
    assert tasks.records[0].reference == "4" and tasks.num_quarantined == 1


def test_limit_stops_after_that_many_valid_rows(tmp_path):
    path = _write(tmp_path / "sft.jsonl", [GOOD_SFT] * 5)
    assert len(load_rows(path, "sft", limit=2).records) == 2


def test_a_file_without_any_valid_row_is_an_error(tmp_path):
    path = _write(tmp_path / "cpt.jsonl", [{"text": ""}])
    with pytest.raises(DatasetError) as info:
        load_rows(path, "cpt", on_bad_row="quarantine", quarantine_path=tmp_path / "q.jsonl")
    assert info.value.field == "<file>"


def test_command_line_lists_every_bad_row_and_fails(tmp_path, capsys):
    path = _write(tmp_path / "dpo.jsonl", [{"prompt": "q", "chosen": "a"}, {"prompt": "q", "chosen": "a", "rejected": "a"}])
    assert main([str(path), "dpo"]) == 1
    out = capsys.readouterr().out
    assert f"{path}:1: field 'rejected': missing" in out
    assert f"{path}:2: field 'rejected'" in out
    assert "0 valid rows, 2 bad rows" in out
    assert main([str(EXAMPLES / "dpo.jsonl"), "dpo"]) == 0


def test_command_line_names_the_files_kind_and_refuses_an_unknown_kind_in_one_line(tmp_path, capsys):
    """The checker called a missing SFT file a "task file", and an unknown kind printed only the usage."""
    assert main([str(tmp_path / "mine.jsonl"), "sft"]) == 1
    assert capsys.readouterr().err.strip() == f"error: sft file {tmp_path / 'mine.jsonl'} does not exist"
    assert main([str(EXAMPLES / "sft.jsonl"), "chat"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: unknown kind 'chat': expected one of sft, cpt, dpo, rl ")
