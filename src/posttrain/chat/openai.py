r"""OpenAI chat messages and the policy's own chat format: tool calls and tool results, both ways.

The policy writes a tool call as text (``posttrain.envs.tool_calls``)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "7*8+5"}}</tool_call>

and reads each tool's output wrapped as ``<tool_result name="calculator">\n61\n</tool_result>``
inside one message of role ``tool`` (several results joined by a newline), exactly as our
environments render an observation. An OpenAI client sees the same turn as an assistant message
with ``tool_calls`` (``function.name``, ``function.arguments`` as a JSON string) and answers with one
``tool`` message per call (``tool_call_id``, ``content``). This module maps one onto the other:

* ``split_action(text)``: sampled action text -> ``(content, calls)`` for the API response;
* ``action_text(content, calls)``: an assistant message of a recorded conversation -> the text the
  policy would have written (``posttrain traces import``);
* ``observation_text(results)``: the tool messages after one assistant turn -> the observation text;
* ``policy_messages(messages)``: a conversation in the API's shapes -> role/content strings in the
  policy's format, ready for the chat template (the gateway's renders, ``posttrain traces import``):
  an assistant message becomes its action text, each run of ``tool`` messages one ``tool`` message
  holding the observation, a ``developer`` message a ``system`` one.

Run ``python -m posttrain.chat.openai 'TEXT'`` to see how an action maps to an API message.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.envs.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    ToolCall,
    ToolCallError,
    format_tool_call,
    format_tool_result,
    parse_tool_calls,
)


@dataclass(frozen=True)
class ApiToolCall:
    """One tool call as the OpenAI API carries it.

    Attributes:
        call_id: The call's id (``tool_call_id`` of the tool message that answers it).
        name: ``function.name``.
        arguments: ``function.arguments``: a JSON object, as text.
    """

    call_id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, Any]:
        """``{"id", "type": "function", "function": {"name", "arguments"}}`` (the API's shape)."""
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def split_action(text: str, call_ids: Sequence[str]) -> tuple[str | None, list[ApiToolCall]]:
    """An action's text as an API message: the text outside the tool-call tags, and the calls.

    Args:
        text: The decoded action (without the end-of-turn token).
        call_ids: Ids for the calls, in order (at least as many as there are calls).

    Returns:
        ``(content, calls)``: ``content`` is the text with every ``<tool_call>...</tool_call>`` block
        removed and stripped, None when nothing is left and there are calls; ``calls`` in the order
        written, ``arguments`` as compact JSON. An action whose calls do not parse
        (``parse_tool_calls`` raises) comes back whole as ``content`` with no calls: the agent sees
        what the policy wrote, as the environments do.

    Raises:
        ValueError: fewer ``call_ids`` than calls.
    """
    try:
        calls = parse_tool_calls(text)
    except ToolCallError:
        return text, []
    if not calls:
        return text, []
    if len(call_ids) < len(calls):
        raise ValueError(f"call_ids: {len(call_ids)} ids for {len(calls)} tool calls")
    rest = text
    while OPEN_TAG in rest:
        start = rest.index(OPEN_TAG)
        end = rest.index(CLOSE_TAG, start) + len(CLOSE_TAG)
        rest = rest[:start] + rest[end:]
    content = rest.strip() or None
    api = [ApiToolCall(call_id, call.name, json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":")))
           for call_id, call in zip(call_ids, calls, strict=False)]
    return content, api


def action_text(content: str | None, calls: Sequence[ApiToolCall]) -> str:
    """The text the policy writes for an assistant message with ``content`` and ``calls``.

    ``content`` first, then each call in the tool-call format, one per line.

    Raises:
        ValueError: a call's ``arguments`` is not a JSON object, or the message is empty.
    """
    parts = [content.strip()] if content and content.strip() else []
    for call in calls:
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call {call.call_id!r}: arguments are not JSON ({exc.msg})") from exc
        if not isinstance(arguments, dict):
            raise ValueError(f"tool call {call.call_id!r}: arguments must be a JSON object, got {type(arguments).__name__}")
        parts.append(format_tool_call(ToolCall(name=call.name, arguments=arguments)))
    if not parts:
        raise ValueError("assistant message: neither content nor tool calls")
    return "\n".join(parts)


def observation_text(results: Sequence[tuple[str, str]]) -> str:
    """The observation the policy reads for tool outputs ``(tool name, output)``, in order.

    Each is wrapped by ``format_tool_result``; several are joined by a newline, as an environment
    joins the results of the calls of one action.
    """
    return "\n".join(format_tool_result(name, output) for name, output in results)


def content_text(content: Any, where: str) -> str:
    """A message's ``content`` as one string: a string, None (empty), or a list of ``text`` parts joined.

    Raises:
        ValueError: a part that is not text (images, audio), or another type; the message names ``where``.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}[{i}]: only text parts are supported, got {kind!r}")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"{where}: expected a string or a list of text parts, got {type(content).__name__}")


class MessageError(ValueError):
    """A message that cannot be put in the policy's format; ``param`` names it (``messages.3.tool_call_id``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _api_calls(message: Mapping[str, Any], where: str) -> list[ApiToolCall]:
    calls = []
    for k, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise MessageError(f"{where}.tool_calls[{k}]: needs function.name", f"{where}.tool_calls.{k}")
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):  # a recorded trace may hold the object itself
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ApiToolCall(str(call.get("id") or f"call_{k}"), function["name"], arguments))
    return calls


def policy_messages(messages: Sequence[Mapping[str, Any]], start: int = 0,
                    calls: Mapping[str, str] | None = None, wrap_tool_results: bool = True) -> list[dict[str, str]]:
    """A conversation in the API's shapes as role/content strings in the policy's format (module docstring).

    Args:
        messages: Dicts with ``role``, ``content`` (string, text parts or null), and ``tool_calls``
            (assistant) or ``tool_call_id`` / ``name`` (tool).
        start: Index of ``messages[0]`` in the whole conversation (for error messages).
        calls: Tool call id -> tool name of calls made before ``messages[0]``; calls of assistant
            messages inside ``messages`` are added as they come.
        wrap_tool_results: True (our environments' format): each run of tool messages becomes one
            ``tool`` message of ``observation_text``. False: each tool message stays one ``tool``
            message with its own content, for a chat template that renders tool results itself
            (Qwen's ``<tool_response>``).

    Returns:
        One dict per message (each run of tool messages merged into one when ``wrap_tool_results``).

    Raises:
        MessageError: a content part that is not text, an assistant message with neither content
            nor tool calls (or arguments that are not a JSON object), or a tool message that answers
            no known call and has no ``name``.
    """
    known = dict(calls or {})
    out: list[dict[str, str]] = []
    results: list[tuple[str, str]] = []

    def flush() -> None:
        if results:
            out.append({"role": "tool", "content": observation_text(results)})
            results.clear()

    for k, message in enumerate(messages):
        where = f"messages[{start + k}]"
        param = f"messages.{start + k}"
        try:
            text = content_text(message.get("content"), f"{where}.content")
        except ValueError as exc:
            raise MessageError(str(exc), f"{param}.content") from None
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            name = known.get(call_id) if isinstance(call_id, str) else None
            name = name or message.get("name")
            if not isinstance(name, str) or not name:
                raise MessageError(f"{where}.tool_call_id: {call_id!r} answers no tool call of this conversation "
                                   "(and the message has no name)", f"{param}.tool_call_id")
            if wrap_tool_results:
                results.append((name, text))
            else:
                out.append({"role": "tool", "content": text})
            continue
        flush()
        if role == "assistant":
            calls_here = _api_calls(message, where)
            known.update({c.call_id: c.name for c in calls_here})
            try:
                text = action_text(text, calls_here)
            except ValueError as exc:
                raise MessageError(f"{where}: {exc}", param) from None
        out.append({"role": "system" if role == "developer" else str(role), "content": text})
    flush()
    return out


def _main(argv: list[str]) -> int:
    """Print the API message of the action ``argv[1]``."""
    if len(argv) != 2:
        print("usage: python -m posttrain.chat.openai 'ACTION TEXT'", file=sys.stderr)
        return 2
    content, calls = split_action(argv[1], [f"call_{i}" for i in range(argv[1].count(OPEN_TAG))])
    print(json.dumps({"role": "assistant", "content": content, "tool_calls": [c.as_dict() for c in calls] or None}))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
