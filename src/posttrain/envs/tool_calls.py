r"""The one tool-call format every posttrain environment speaks.

The policy calls a tool by writing a JSON object between ``<tool_call>`` tags. One action may hold
any number of calls; text outside the tags is the model's own reasoning and is ignored here::

    I will check the arithmetic first.
    <tool_call>{"name": "python", "arguments": {"code": "print(1+1)"}}</tool_call>

The JSON object has exactly two keys: ``name`` (a non-empty string) and ``arguments`` (an object,
``{}`` when omitted). Calls are returned in the order written. A literal ``</tool_call>`` inside a
string argument must be written with JSON's optional slash escape, ``<\/tool_call>``.

The environment answers with one observation per call, made by ``format_tool_result``::

    <tool_result name="python">
    2
    </tool_result>

Run ``python -m posttrain.envs.tool_calls 'TEXT'`` to see how an action parses.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
"""Opens one tool call."""

CLOSE_TAG = "</tool_call>"
"""Closes one tool call."""

TOOL_CALL_FORMAT_PROMPT = (
    "To call a tool, write a JSON object with the keys \"name\" and \"arguments\" between "
    f"{OPEN_TAG} and {CLOSE_TAG} tags, for example:\n"
    f'{OPEN_TAG}{{"name": "python", "arguments": {{"code": "print(1+1)"}}}}{CLOSE_TAG}\n'
    "You may write several calls in one message; they run in order. Text outside the tags is "
    "not executed. Each call's output comes back inside <tool_result> tags."
)
"""Instructions for system prompts, so every environment describes the format the same way."""

_CALL_RE = re.compile(re.escape(OPEN_TAG) + r"(.*?)" + re.escape(CLOSE_TAG), re.DOTALL)
_ALLOWED_KEYS = frozenset({"name", "arguments"})


class ToolCallError(ValueError):
    """An action's tool call is malformed; the message says which call and why."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: Tool name as written by the model (not checked against any tool list here).
        arguments: The call's JSON arguments object (``{}`` when the model omitted it).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _check_tags(action_text: str) -> None:
    """Raise ``ToolCallError`` for an unclosed ``<tool_call>`` or a stray ``</tool_call>``."""
    depth_open_at = -1
    for match in re.finditer(re.escape(OPEN_TAG) + "|" + re.escape(CLOSE_TAG), action_text):
        if match.group(0) == OPEN_TAG:
            if depth_open_at >= 0:
                raise ToolCallError(
                    f"{OPEN_TAG} at character {depth_open_at} is not closed before the next "
                    f"{OPEN_TAG} at character {match.start()}"
                )
            depth_open_at = match.start()
        else:
            if depth_open_at < 0:
                raise ToolCallError(f"{CLOSE_TAG} at character {match.start()} has no matching {OPEN_TAG}")
            depth_open_at = -1
    if depth_open_at >= 0:
        raise ToolCallError(f"{OPEN_TAG} at character {depth_open_at} is never closed with {CLOSE_TAG}")


def parse_tool_calls(action_text: str) -> list[ToolCall]:
    """Extract every tool call from one action, in order.

    Args:
        action_text: The policy's decoded action (one turn of generated text).

    Returns:
        The calls in the order written; ``[]`` when the action holds no ``<tool_call>`` tag.

    Raises:
        ToolCallError: an unclosed or unmatched tag, JSON that does not decode, a JSON value that is
            not an object, a missing or non-string or empty ``name``, ``arguments`` that is not an
            object, or an unknown key. The message names the call (1-based) and the field.

    Example:
        >>> parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>')
        [ToolCall(name='python', arguments={'code': '1'})]
    """
    _check_tags(action_text)
    calls: list[ToolCall] = []
    for index, match in enumerate(_CALL_RE.finditer(action_text), start=1):
        body = match.group(1).strip()
        where = f"tool call {index}"
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ToolCallError(f"{where}: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
        if not isinstance(payload, dict):
            raise ToolCallError(f"{where}: expected a JSON object, got {type(payload).__name__}")
        unknown = sorted(set(payload) - _ALLOWED_KEYS)
        if unknown:
            raise ToolCallError(f"{where}: unknown key(s) {unknown}; allowed keys are 'name' and 'arguments'")
        name = payload.get("name")
        if name is None:
            raise ToolCallError(f"{where}: missing field 'name'")
        if not isinstance(name, str) or not name.strip():
            raise ToolCallError(f"{where}: field 'name' must be a non-empty string, got {name!r}")
        arguments = payload.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ToolCallError(
                f"{where}: field 'arguments' must be a JSON object, got {type(arguments).__name__}"
            )
        calls.append(ToolCall(name=name.strip(), arguments=arguments))
    return calls


def format_tool_call(call: ToolCall) -> str:
    """Write ``call`` in the tool-call format (for scripted actions and SFT data).

    The output always round-trips: ``parse_tool_calls(format_tool_call(c)) == [c]``, also when an
    argument contains ``</tool_call>`` (its slash is escaped).
    """
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return OPEN_TAG + body.replace("</", "<\\/") + CLOSE_TAG


def truncate_middle(text: str, max_chars: int) -> str:
    """Shorten ``text`` to at most ``max_chars`` characters, keeping its head and tail.

    The cut part is replaced by a marker ``[... N characters truncated ...]`` so the reader knows
    output is missing; the head and tail are kept because errors usually sit at the end.

    Raises:
        ValueError: ``max_chars`` below 64 (no room for the marker).
    """
    if max_chars < 64:
        raise ValueError(f"max_chars: must be >= 64, got {max_chars}")
    if len(text) <= max_chars:
        return text
    # The marker's digits depend on the cut length; size it for the worst case first.
    marker_len = len(f"\n[... {len(text)} characters truncated ...]\n")
    keep = max_chars - marker_len
    head = keep // 2
    tail = keep - head
    cut = len(text) - head - tail
    marker = f"\n[... {cut} characters truncated ...]\n"
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def format_tool_result(name: str, output: str, max_chars: int = 8000) -> str:
    r"""Wrap one tool's output as the observation text the policy reads next turn.

    Args:
        name: Tool name, echoed in the tag.
        output: What the tool printed or returned (text).
        max_chars: Most characters of ``output`` kept (characters, >= 64); longer output keeps its
            head and tail around a truncation marker (see ``truncate_middle``).

    Returns:
        ``<tool_result name="NAME">\nOUTPUT\n</tool_result>`` (``\n`` a newline).

    Raises:
        ValueError: ``max_chars`` below 64.
    """
    return f'<tool_result name="{name}">\n{truncate_middle(output, max_chars)}\n</tool_result>'


def _main(argv: list[str]) -> int:
    """Print the calls parsed from ``argv[1]``; exit 1 with the reason when it is malformed."""
    if len(argv) != 2:
        print("usage: python -m posttrain.envs.tool_calls 'ACTION TEXT'", file=sys.stderr)
        return 2
    try:
        calls = parse_tool_calls(argv[1])
    except ToolCallError as exc:
        print(f"malformed: {exc}", file=sys.stderr)
        return 1
    for call in calls:
        print(json.dumps({"name": call.name, "arguments": call.arguments}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
