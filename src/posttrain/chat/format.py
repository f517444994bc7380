"""The chat template cut into token segments, and SFT conversations rendered through it.

``ChatFormat`` renders a conversation's prompt once and every later turn as template segments,
so RL rollouts (``posttrain.episodes.runner``) and SFT/DPO examples (``render_sft_example``) of the
same assistant tokens are token-for-token identical. The tokenisation rules are in
``posttrain.episodes.runner``'s module docstring.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

_CHAT_FORMATS: OrderedDict[int, tuple[Any, Any, ChatFormat]] = OrderedDict()
"""id(tokenizer) -> (tokenizer, chat_template, ChatFormat); the few most recent, holding the tokenizer."""


_CHAT_FORMATS_MAX = 8


_CHAT_FORMATS_LOCK = threading.Lock()


_ACTION_SENTINEL = "QZXACTIONQZX"


_CONTENT_SENTINEL = "QZXCONTENTQZX"


def _nth_sentinel(i: int) -> str:
    """The content placeholder of the ``i``-th message of a run of observation messages."""
    return f"QZXCONTENT{i}QZX"


def _ids(encoded: Any) -> list[int]:
    """Token ids from ``apply_chat_template(tokenize=True)``: a list, or a dict with ``input_ids``."""
    if isinstance(encoded, Mapping) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    ids = list(encoded)
    if ids and isinstance(ids[0], list):  # a batch of one
        ids = list(ids[0])
    return [int(t) for t in ids]


class ChatFormat:
    r"""The chat template cut into segments: the prompt, assistant ends, and turns of other roles.

    Built once per tokenizer. ``segment(role)`` is the text the template writes between an
    assistant's end-of-turn token and the start of the next assistant content, around a message
    of ``role``: ``(before_content, after_content)``; for ChatML and role ``tool`` that is
    ``("\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")``.

    Args:
        tokenizer: A transformers tokenizer with a ``chat_template``.

    Raises:
        ValueError: the template has no recognisable end-of-turn token, or it does not render an
            assistant message's content verbatim followed by that token.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        stop_id = None
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and tokenizer.convert_ids_to_tokens(im_end) == "<|im_end|>":
            stop_id = im_end
        elif tokenizer.eos_token_id is not None:
            stop_id = int(tokenizer.eos_token_id)
        if stop_id is None:
            raise ValueError("tokenizer: no <|im_end|> token and no eos_token_id to stop a turn with")
        self.stop_token_id: int = stop_id
        self.stop_text: str = tokenizer.decode([stop_id], skip_special_tokens=False)
        self._segments: dict[str, tuple[str, str]] = {}
        self._runs: dict[tuple[str, ...], list[str]] = {}
        self.segment("tool")  # fail early on a template we cannot cut

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatFormat:
        """The ``ChatFormat`` of ``tokenizer``, cached for the 8 most recent tokenizers (per chat template).

        Raises:
            ValueError: as the constructor.
        """
        template = getattr(tokenizer, "chat_template", None)
        with _CHAT_FORMATS_LOCK:
            cached = _CHAT_FORMATS.get(id(tokenizer))
            if cached is not None and cached[0] is tokenizer and cached[1] == template:
                _CHAT_FORMATS.move_to_end(id(tokenizer))
                return cached[2]
        chat = cls(tokenizer)
        with _CHAT_FORMATS_LOCK:
            _CHAT_FORMATS[id(tokenizer)] = (tokenizer, template, chat)
            while len(_CHAT_FORMATS) > _CHAT_FORMATS_MAX:
                _CHAT_FORMATS.popitem(last=False)
        return chat

    def segment(self, role: str) -> tuple[str, str]:
        """``(before, after)`` template text around a ``role`` message that follows an assistant turn.

        Raises:
            ValueError: the template does not render the probe conversation as expected.
        """
        if role in self._segments:
            return self._segments[role]
        probe = [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": _ACTION_SENTINEL},
            {"role": role, "content": _CONTENT_SENTINEL},
        ]
        text = self.tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
        marker = _ACTION_SENTINEL + self.stop_text
        start = text.find(marker)
        if start < 0 or text.count(_CONTENT_SENTINEL) != 1:
            raise ValueError(
                f"chat_template: cannot find assistant content followed by {self.stop_text!r} and one "
                f"{role!r} message in its rendering {text!r}"
            )
        rest = text[start + len(marker) :]
        before, after = rest.split(_CONTENT_SENTINEL)
        self._segments[role] = (before, after)
        return before, after

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of the initial messages with the assistant turn opened (template applied once).

        Args:
            messages: ``role``/``content`` dicts (the template may read more keys).
            tools: Tool schemas handed to the template (``apply_chat_template(tools=...)``); a
                template that does not use them ignores them. None: no tools.
        """
        extra = {"tools": [dict(t) for t in tools]} if tools else {}
        return _ids(
            self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], add_generation_prompt=True, tokenize=True, **extra
            )
        )

    def run_segments(self, roles: Sequence[str]) -> list[str]:
        r"""Template text around a run of non-assistant messages that follows an assistant turn.

        For roles ``r_0 .. r_{n-1}`` returns ``n + 1`` pieces ``p_0 .. p_n``: the template writes
        ``p_0 c_0 p_1 c_1 ... c_{n-1} p_n`` after the assistant's end-of-turn token, where ``c_i`` is
        message ``i``'s content and ``p_n`` ends with the next assistant opening. For one message this
        is ``segment(role)``; for ChatML and two ``tool`` messages ``["\n<|im_start|>tool\n",
        "<|im_end|>\n<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n"]``.

        Raises:
            ValueError: ``roles`` is empty or holds ``assistant``, or the template does not render
                the probe conversation with each content once, in order.
        """
        key = tuple(roles)
        if key in self._runs:
            return self._runs[key]
        if not key or "assistant" in key:
            raise ValueError(f"roles: expected one or more non-assistant roles, got {list(key)}")
        probe = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _ACTION_SENTINEL}]
        probe += [{"role": role, "content": _nth_sentinel(i)} for i, role in enumerate(key)]
        text = self.tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
        marker = _ACTION_SENTINEL + self.stop_text
        start = text.find(marker)
        rest = text[start + len(marker):] if start >= 0 else ""
        pieces: list[str] = []
        for i in range(len(key)):
            sentinel = _nth_sentinel(i)
            if start < 0 or rest.count(sentinel) != 1:
                raise ValueError(
                    f"chat_template: cannot find assistant content followed by {self.stop_text!r} and the "
                    f"messages {list(key)} each once in its rendering {text!r}"
                )
            before, rest = rest.split(sentinel)
            pieces.append(before)
        pieces.append(rest)
        self._runs[key] = pieces
        return pieces

    def observation_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Tokens of a run of non-assistant messages after an assistant turn, ending with the next assistant opening.

        Template text is encoded as such; each content with ``encode_text`` (special-token strings
        in it stay plain text, so a message cannot forge a turn boundary). For one message this is
        ``turn_ids(role, content)``.

        Raises:
            ValueError: as ``run_segments``.
        """
        pieces = self.run_segments([m["role"] for m in messages])
        ids = list(self.tokenizer.encode(pieces[0], add_special_tokens=False))
        for message, piece in zip(messages, pieces[1:], strict=True):
            ids += self.encode_text(message["content"])
            ids += list(self.tokenizer.encode(piece, add_special_tokens=False))
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Content tokens; special-token strings inside ``text`` are encoded as plain text."""
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def turn_ids(self, role: str, content: str) -> list[int]:
        """Tokens of a ``role`` message after an assistant turn, ending with the next assistant opening."""
        before, after = self.segment(role)
        return (
            list(self.tokenizer.encode(before, add_special_tokens=False))
            + self.encode_text(content)
            + list(self.tokenizer.encode(after, add_special_tokens=False))
        )

    def assistant_ids(self, content: str) -> list[int]:
        """Tokens of an assistant turn as the policy would emit them: content then the stop token."""
        return self.encode_text(content) + [self.stop_token_id]


def render_sft_example(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], chat: ChatFormat | None = None
) -> tuple[list[int], list[bool]]:
    """Render an SFT conversation exactly as the agent loop would tokenise the same episode.

    The messages before the first assistant message are rendered with the chat template once
    (``add_generation_prompt=True``); each assistant message becomes its content tokens plus the
    end-of-turn token (loss on all of them); each later non-assistant message (``tool``, or
    ``user`` for multi-turn chat) becomes a template segment as in ``ChatFormat.turn_ids`` (no loss).

    Args:
        tokenizer: transformers tokenizer with a chat template.
        messages: ``role``/``content`` dicts; at least one assistant message, and the last
            message is an assistant message.
        chat: A prebuilt ``ChatFormat`` for ``tokenizer`` (``ChatFormat.for_tokenizer`` when ``None``).

    Returns:
        ``(token_ids, loss_mask)``: ``token_ids`` [T] int; ``loss_mask`` [T] bool, True on
        assistant tokens (the tokens an RL rollout would mark ``action_mask`` True).

    Raises:
        ValueError: no assistant message, the conversation does not end with one, two
            assistant messages in a row, or a message without ``role``/``content`` strings.
    """
    chat = chat or ChatFormat.for_tokenizer(tokenizer)
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}]: needs string 'role' and 'content', got {dict(m)!r}")
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("messages: no assistant message to train on")
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"messages[{len(messages) - 1}]: the conversation must end with an assistant message")
    if first == 0:
        raise ValueError("messages[0]: the conversation must start with a non-assistant (prompt) message")
    token_ids = chat.prompt_ids(messages[:first])
    loss_mask = [False] * len(token_ids)
    previous = ""
    for i in range(first, len(messages)):
        role, content = messages[i]["role"], messages[i]["content"]
        if role == "assistant":
            if previous == "assistant":
                raise ValueError(f"messages[{i}]: two assistant messages in a row")
            ids = chat.assistant_ids(content)
            token_ids += ids
            loss_mask += [True] * len(ids)
        else:
            ids = chat.turn_ids(role, content)
            token_ids += ids
            loss_mask += [False] * len(ids)
        previous = role
    return token_ids, loss_mask
