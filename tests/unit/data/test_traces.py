"""``posttrain traces import``: recorded conversations with rewards become SFT rows with their provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures_models import TinyModel
from posttrain.chat.format import ChatFormat, render_sft_example
from posttrain.cli import main
from posttrain.data.formats import load_rows
from posttrain.data.tasks import DatasetError
from posttrain.data.traces import IMPORTER, import_traces
from posttrain.envs.tool_calls import format_tool_result
from posttrain.models.hf import load_tokenizer

CALL = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "7*8+5"}'}}


def trace(reward: float, **extra) -> dict:
    return {"messages": [{"role": "system", "content": "Use the calculator."},
                         {"role": "user", "content": "Compute 7 * 8 + 5."},
                         {"role": "assistant", "content": None, "tool_calls": [CALL]},
                         {"role": "tool", "tool_call_id": "c1", "content": "61"},
                         {"role": "assistant", "content": "#### 61"},
                         {"role": "user", "content": "thanks"}],
            "reward": reward, **extra}


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rewarded_traces_become_sft_rows_in_the_policys_format_with_provenance(tmp_path: Path, tiny_model: TinyModel):
    src = write(tmp_path / "traces.jsonl", [trace(1.0, id="t-1", source="prod-v3", metadata={"ticket": "42"}),
                                            trace(0.0, id="t-2"), trace(1.0)])
    summary = import_traces(src, tmp_path / "sft.jsonl", min_reward=1.0)
    assert (summary.read, summary.imported, summary.below_min_reward, summary.bad) == (3, 2, 1, 0)
    loaded = load_rows(tmp_path / "sft.jsonl", "sft")  # the SFT loader takes the file as it is
    first, second = loaded.records
    assert first.example_id == "t-1" and second.example_id == "traces-3"
    assert first.provenance == {"metadata.ticket": "42", "source_file": "traces.jsonl", "line": "1", "trace_id": "t-1",
                                "reward": "1.0", "importer": IMPORTER, "source": "prod-v3",
                                "policy": "external: no behaviour logprobs of the trained policy"}
    roles = [m["role"] for m in first.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]  # the trailing user message is dropped
    assert first.messages[2]["content"].startswith("<tool_call>") and first.messages[3]["content"] == \
        format_tool_result("calculator", "61")
    # tokens: the SFT rendering holds the policy's format, assistant turns trained
    tok = load_tokenizer(tiny_model.path)
    ids, mask = render_sft_example(tok, first.messages, ChatFormat.for_tokenizer(tok))
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]).startswith('<tool_call>{"name": "calculator"')


def test_no_trace_at_the_bar_writes_nothing_and_says_so(tmp_path: Path):
    src = write(tmp_path / "traces.jsonl", [trace(0.2), trace(0.5)])
    with pytest.raises(DatasetError) as err:
        import_traces(src, tmp_path / "sft.jsonl", min_reward=0.9)
    assert "2 below" in str(err.value) and not (tmp_path / "sft.jsonl").exists()


def test_a_bad_trace_names_file_line_and_field_or_goes_to_quarantine(tmp_path: Path):
    orphan = trace(1.0)
    orphan["messages"][3]["tool_call_id"] = "nope"
    src = write(tmp_path / "traces.jsonl", [trace(1.0), orphan, "{not json", trace(float("nan")) | {"reward": "x"}])
    with pytest.raises(DatasetError) as err:
        import_traces(src, tmp_path / "sft.jsonl")
    assert err.value.line == 2 and err.value.field == "messages[3].tool_call_id"
    summary = import_traces(src, tmp_path / "sft.jsonl", on_bad_row="quarantine",
                            quarantine_path=tmp_path / "bad.jsonl")
    assert (summary.imported, summary.bad) == (1, 3)
    fields = [json.loads(line)["field"] for line in (tmp_path / "bad.jsonl").read_text().splitlines()]
    assert fields == ["messages[3].tool_call_id", "<json>", "reward"]


def test_the_command_imports_and_prints_one_summary_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    src = write(tmp_path / "traces.jsonl", [trace(1.0), trace(0.0)])
    assert main(["traces", "import", str(src), "--out", str(tmp_path / "out.jsonl")]) == 0
    assert "1 SFT rows written" in capsys.readouterr().out
    assert main(["traces", "import", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert main(["traces", str(src)]) == 2  # the verb is required
