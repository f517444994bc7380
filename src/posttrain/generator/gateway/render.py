"""Chat requests in the policy's own chat format, ready for the chat template (``posttrain.chat.format``).

The template sees role/content strings only: an assistant message becomes the action text the
policy writes (its content, then its tool calls in the tool-call format: ``chat.openai.action_text``),
and each run of ``tool`` messages becomes one ``tool`` message whose content is the observation an
environment would show (``chat.openai.observation_text``: every result wrapped in ``<tool_result
name="...">``, joined by newlines), so a gateway episode and an environment episode of the same
exchange are the same tokens. A ``developer`` message is rendered as ``system``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from posttrain.chat.openai import ApiToolCall, action_text, content_text, observation_text
from posttrain.generator.gateway.protocol import ChatMessage, GatewayError


def _calls(message: ChatMessage) -> list[ApiToolCall]:
    return [ApiToolCall(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def _tool_name(message: ChatMessage, index: int, calls: Mapping[str, str]) -> str:
    """The tool a ``tool`` message answers: the call with its ``tool_call_id``, else its ``name``.

    Raises:
        GatewayError: 400 when neither names a tool.
    """
    if message.tool_call_id and message.tool_call_id in calls:
        return calls[message.tool_call_id]
    if message.name:
        return message.name
    raise GatewayError(400, f"messages[{index}].tool_call_id: {message.tool_call_id!r} answers no tool call of "
                            "this conversation (and the message has no name)", param=f"messages.{index}.tool_call_id")


def template_messages(messages: Sequence[ChatMessage], start: int = 0,
                      calls: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """``messages`` as role/content strings in the policy's format (module docstring).

    Args:
        messages: The messages to render (API shapes).
        start: Index of ``messages[0]`` in the request (for error messages).
        calls: Tool call id -> tool name of calls made before ``messages[0]`` (the segment's last
            assistant turn); calls of assistant messages inside ``messages`` are added as they come.

    Returns:
        One dict per message, ``tool`` runs merged into one message.

    Raises:
        GatewayError: 400 for a content part that is not text, an assistant message with neither
            content nor tool calls or with arguments that are not a JSON object, or a tool message
            that answers no known call.
    """
    known = dict(calls or {})
    out: list[dict[str, str]] = []
    results: list[tuple[str, str]] = []

    def flush() -> None:
        if results:
            out.append({"role": "tool", "content": observation_text(results)})
            results.clear()

    for k, message in enumerate(messages):
        i = start + k
        try:
            text = content_text(message.content, f"messages[{i}].content")
        except ValueError as exc:
            raise GatewayError(400, str(exc), param=f"messages.{i}.content") from None
        if message.role == "tool":
            results.append((_tool_name(message, i, known), text))
            continue
        flush()
        if message.role == "assistant":
            calls_here = _calls(message)
            known.update({c.call_id: c.name for c in calls_here})
            try:
                text = action_text(text, calls_here)
            except ValueError as exc:
                raise GatewayError(400, f"messages[{i}]: {exc}", param=f"messages.{i}") from None
        out.append({"role": "system" if message.role == "developer" else message.role, "content": text})
    flush()
    return out
