"""Chat requests in the policy's own chat format, ready for the chat template (``posttrain.chat.format``).

The template sees role/content strings only (``posttrain.chat.openai.policy_messages``): an
assistant message becomes the action text the policy writes (its content, then its tool calls in
the tool-call format), and each run of ``tool`` messages becomes one ``tool`` message whose content
is the observation an environment would show (every result wrapped in ``<tool_result
name="...">``, joined by newlines), so a gateway episode and an environment episode of the same
exchange are the same tokens. A ``developer`` message is rendered as ``system``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from posttrain.chat.openai import MessageError, policy_messages
from posttrain.generator.gateway.protocol import ChatMessage, GatewayError


def template_messages(messages: Sequence[ChatMessage], start: int = 0, calls: Mapping[str, str] | None = None,
                      wrap_tool_results: bool = True) -> list[dict[str, str]]:
    """``messages`` as role/content strings in the policy's format (module docstring).

    Args:
        messages: The messages to render (API shapes).
        start: Index of ``messages[0]`` in the request (for error messages).
        calls: Tool call id -> tool name of calls made before ``messages[0]`` (the segment's last
            assistant turn).
        wrap_tool_results: Tool results in our environments' ``<tool_result>`` format, one observation
            per run (True), or each as its own ``tool`` message for the template to wrap (False).

    Returns:
        One dict per message, ``tool`` runs merged into one message.

    Raises:
        GatewayError: 400 naming the message (``policy_messages``' refusals).
    """
    try:
        return policy_messages([m.model_dump() for m in messages], start, calls, wrap_tool_results)
    except MessageError as exc:
        raise GatewayError(400, str(exc), param=exc.param) from None
