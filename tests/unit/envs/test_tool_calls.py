"""Tests for the shared tool-call format (``posttrain.envs.tool_calls``)."""

from __future__ import annotations

import pytest

from posttrain.envs.tool_calls import (
    ToolCall,
    ToolCallError,
    format_tool_call,
    format_tool_result,
    parse_tool_calls,
    truncate_middle,
)


def test_single_call_is_parsed_and_reasoning_outside_tags_is_ignored():
    action = 'Let me compute.\n<tool_call>{"name": "python", "arguments": {"code": "print(1+1)"}}</tool_call>\nDone.'
    assert parse_tool_calls(action) == [ToolCall(name="python", arguments={"code": "print(1+1)"})]


def test_several_calls_come_back_in_written_order():
    action = (
        '<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call> then '
        '<tool_call>\n{"name": "submit"}\n</tool_call>'
    )
    calls = parse_tool_calls(action)
    assert [c.name for c in calls] == ["view", "submit"]
    assert calls[1].arguments == {}


def test_action_without_tags_has_no_calls():
    assert parse_tool_calls("The answer is 4.") == []


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ('<tool_call>{"name": "python", "arguments": {</tool_call>', "tool call 1: invalid JSON"),
        ('<tool_call>["python"]</tool_call>', "expected a JSON object, got list"),
        ('<tool_call>{"arguments": {}}</tool_call>', "missing field 'name'"),
        ('<tool_call>{"name": ""}</tool_call>', "field 'name' must be a non-empty string"),
        ('<tool_call>{"name": 3}</tool_call>', "field 'name' must be a non-empty string"),
        ('<tool_call>{"name": "x", "arguments": "{}"}</tool_call>', "field 'arguments' must be a JSON object"),
        ('<tool_call>{"name": "x", "args": {}}</tool_call>', "unknown key(s) ['args']"),
        ('<tool_call>{"name": "x"}', "never closed"),
        ('{"name": "x"}</tool_call>', "has no matching"),
        ('<tool_call><tool_call>{"name": "x"}</tool_call>', "is not closed before the next"),
    ],
)
def test_malformed_call_raises_with_the_reason(action, reason):
    with pytest.raises(ToolCallError) as info:
        parse_tool_calls(action)
    assert reason in str(info.value)


def test_second_malformed_call_is_named_by_its_position():
    action = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": 1}</tool_call>'
    with pytest.raises(ToolCallError, match="tool call 2"):
        parse_tool_calls(action)


def test_format_tool_call_round_trips_even_with_a_closing_tag_inside_an_argument():
    call = ToolCall(name="bash", arguments={"command": "echo '</tool_call>' && echo ü"})
    text = format_tool_call(call)
    assert text.count("</tool_call>") == 1
    assert parse_tool_calls("thinking " + text) == [call]


def test_format_tool_result_wraps_output_in_named_tags():
    assert format_tool_result("python", "2") == '<tool_result name="python">\n2\n</tool_result>'


def test_long_output_keeps_head_and_tail_around_a_marker_within_the_limit():
    """200 characters cut to 100: the marker is sized for the worst case (3 digits, as for "200"):
    "\\n" + "[... " (5) + "200" (3) + " characters truncated ...]" (26) + "\\n" = 36 characters,
    leaving 64 = 32 head + 32 tail; 200 - 64 = 136 characters cut."""
    text = "h" * 100 + "t" * 100
    out = truncate_middle(text, 100)
    assert len(out) <= 100
    assert out.startswith("h" * 32) and out.endswith("t" * 32)
    assert "[... 136 characters truncated ...]" in out
    assert truncate_middle("short", 100) == "short"


def test_truncation_limit_below_marker_size_is_rejected():
    with pytest.raises(ValueError, match="max_chars"):
        format_tool_result("x", "y", max_chars=10)
