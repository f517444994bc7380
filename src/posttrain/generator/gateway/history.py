"""The history rule: a later turn's conversation must extend, message for message, what the gateway produced.

Each episode segment keeps its *transcript*: the messages of the request that opened it, then,
turn by turn, the assistant message the gateway returned and the new messages of the next request.
A later request's ``messages`` must start with that transcript exactly; only what follows it is new
and is rendered and appended as observation tokens. Nothing before it is ever re-tokenised.

Two messages are the same when their canonical forms are equal (``canonical``): same role, same
content text (a null content equals ``""``; a list of text parts equals their concatenation), same
tool calls (id, function name, and arguments equal as JSON values, so key order and spacing do not
matter) and, for a tool message, the same ``tool_call_id``. Anything else the client changed (a
reworded, dropped, truncated or reordered message, an assistant message the gateway did not write,
a tool call id it did not issue) is an edit, at the first index where the two differ.

What an edit does is the episode's rule (``gateway.edited_history``, or the ``X-Episode-History``
header of the request that opened it): ``split`` starts a new segment rendered afresh from the
request (a new rollout at close, with its own admission ticket), ``refuse`` answers 400
``history_mismatch`` and leaves the episode as it was.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.chat.openai import content_text
from posttrain.generator.gateway.protocol import ChatMessage

Canonical = tuple[str, str, tuple[tuple[str, str, str], ...], str | None]
"""``(role, content, ((call id, name, arguments as sorted JSON), ...), tool_call_id)``."""


def _json_key(arguments: str) -> str:
    """Arguments as canonical JSON (sorted keys, no spaces); text that is not JSON stays as it is."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except json.JSONDecodeError:
        return arguments


def canonical(message: ChatMessage, where: str = "messages") -> Canonical:
    """The form two messages are compared in (module docstring).

    Raises:
        ValueError: a content part that is not text (names ``where``).
    """
    calls = tuple((c.id, c.function.name, _json_key(c.function.arguments)) for c in message.tool_calls or ())
    return (message.role, content_text(message.content, f"{where}.content"), calls,
            message.tool_call_id if message.role == "tool" else None)


@dataclass(frozen=True)
class HistoryCheck:
    """How a request's messages relate to a segment's transcript.

    Attributes:
        extends: True when the messages start with the whole transcript.
        new: Index of the first message after the transcript (``len(transcript)`` when ``extends``).
        edit_at: Index of the first message that differs (or where the request ends early); None when
            ``extends``.
        reason: One line on what differs at ``edit_at`` ("" when ``extends``).
    """

    extends: bool
    new: int
    edit_at: int | None = None
    reason: str = ""


def check_history(transcript: Sequence[Canonical], messages: Sequence[Canonical]) -> HistoryCheck:
    """Whether ``messages`` extend ``transcript`` (module docstring), and where they stop doing so.

    Returns:
        ``HistoryCheck``; a request that repeats the transcript and adds nothing, or whose first new
        message is an assistant message, does not extend it (the gateway did not write that message).
    """
    for i, expected in enumerate(transcript):
        if i >= len(messages):
            return HistoryCheck(False, len(transcript), i, f"the request ends at message {i}; the episode has "
                                f"{len(transcript)} (a truncated history)")
        got = messages[i]
        if got != expected:
            return HistoryCheck(False, len(transcript), i, f"messages[{i}] differs from what the episode holds "
                                f"({_difference(expected, got)})")
    new = messages[len(transcript):]
    if not new:
        return HistoryCheck(False, len(transcript), len(transcript),
                            "no new message after the assistant's last reply")
    for k, message in enumerate(new):
        if message[0] == "assistant":
            i = len(transcript) + k
            return HistoryCheck(False, len(transcript), i, f"messages[{i}] is an assistant message the gateway did "
                                "not write")
    return HistoryCheck(True, len(transcript))


def _difference(expected: Canonical, got: Canonical) -> str:
    """Which part of a message differs: role, content, tool calls or tool_call_id."""
    for name, a, b in zip(("role", "content", "tool calls", "tool_call_id"), expected, got, strict=True):
        if a != b:
            return f"its {name}"
    return "it"
