"""The OpenAI API shapes the gateway speaks: request models, the error object, response builders.

Requests are validated with pydantic; fields the gateway does not know are ignored (clients send
``user``, ``store``, ``parallel_tool_calls``...), fields it knows but cannot honour exactly (a
``temperature`` other than the run's, ``n > 1``, ``stop`` strings) are refused with the error
object, so a training sample is never silently sampled otherwise than asked. Every refusal is a
``GatewayError``; ``error_body`` gives the API's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": null}}

Checked against the API reference of chat completions, completions and models (the ``openai``
3.57 client's types parse every response built here; ``tests/unit/generator/test_gateway_protocol.py``).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain.envs.base import INFRA_CAUSES


class GatewayError(Exception):
    """A request the gateway refuses, with the OpenAI error object's fields.

    Attributes:
        status: HTTP status (400 bad request, 401, 404, 409, 413, 429, 500, 503).
        message: One line saying what is wrong and what to do.
        type: ``invalid_request_error``, ``authentication_error``, ``rate_limit_error``,
            ``server_error``...
        param: The offending request field (dotted), or None.
        code: A machine-readable code (``model_not_found``, ``context_length_exceeded``,
            ``history_mismatch``...), or None.
    """

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,  # noqa: A002
               code: str | None = None) -> dict[str, Any]:
    """The OpenAI error object ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def validation_error(exc: ValidationError) -> GatewayError:
    """A 400 naming the first invalid field of a pydantic ``ValidationError`` (``messages.2.role``)."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    return GatewayError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param=param)


class _Lenient(BaseModel):
    """Request models ignore unknown fields (clients send many) and validate the known ones."""

    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Lenient):
    """``tool_calls[i].function`` of an assistant message."""

    name: str
    arguments: str = ""


class ToolCallIn(_Lenient):
    """``tool_calls[i]`` of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    """One message of ``messages``; ``content`` is a string, a list of text parts, or null."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class StreamOptions(_Lenient):
    """``stream_options``: only ``include_usage`` is read."""

    include_usage: bool = False


class _SamplingFields(_Lenient):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    """vLLM's extension: the response carries the prompt's and the sample's token ids."""


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None


UNSPECIFIED_INFRA_CAUSE = "unspecified"
"""The cause counted for an ``infra_error`` close that names none."""

CLIENT_INFRA_CAUSES = (*INFRA_CAUSES, UNSPECIFIED_INFRA_CAUSE)
"""The causes an ``infra_error`` close may name (``infra_cause``): the platform's own
(``posttrain.envs.base.INFRA_CAUSES``) and ``unspecified``. A fixed list: each cause names a metric
(``infra/<cause>``), so a client cannot create metrics at will."""


class CloseRequest(_Lenient):
    """``POST /episodes/{id}/reward``: close the episode with a reward, a task id to verify, or an infra error.

    ``infra_cause`` (with ``infra_error: true``): why the client's infrastructure failed, one of
    ``CLIENT_INFRA_CAUSES`` (checked by the service, which answers 400 ``invalid_infra_cause`` for
    another); ``unspecified`` when left out.
    """

    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    infra_error: bool = False
    infra_cause: str | None = Field(None, max_length=200)
    task_id: str | None = Field(None, min_length=1, max_length=200)


def completion_id(prefix: str) -> str:
    """A fresh response id: ``chatcmpl-<32 hex>`` / ``cmpl-<32 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """``usage``: prompt, completion and total token counts (tokens)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_finish_reason(finish: str, has_calls: bool) -> Literal["stop", "length", "tool_calls"]:
    """The API's ``finish_reason``: ``tool_calls`` when the turn ended with calls, else the engine's."""
    if finish == "length":
        return "length"
    return "tool_calls" if has_calls else "stop"


def chat_response(*, response_id: str, model: str, message: dict[str, Any], finish_reason: str,
                  prompt_tokens: int, completion_tokens: int, logprobs: list[dict[str, Any]] | None,
                  prompt_token_ids: list[int] | None, token_ids: list[int] | None) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice (``token_ids`` fields only when asked for)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason,
                              "logprobs": {"content": logprobs} if logprobs is not None else None}
    body: dict[str, Any] = {
        "id": response_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [choice], "usage": usage(prompt_tokens, completion_tokens),
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
        body["prompt_token_ids"] = prompt_token_ids
    return body


def chat_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed response of ``body`` (one delta, then the finish).

    The whole message arrives in the first chunk: the engine returns a turn whole.
    """
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    first = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]}
    last = {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]}
    chunks = [first, last]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


def completion_response(*, response_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                        completion_tokens: int, logprobs: dict[str, Any] | None,
                        prompt_token_ids: list[int] | None, token_ids: list[int] | None) -> dict[str, Any]:
    """A ``text_completion`` object with one choice (``token_ids`` fields only when asked for)."""
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
    if token_ids is not None:
        choice["token_ids"] = token_ids
        choice["prompt_token_ids"] = prompt_token_ids
    return {"id": response_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def completion_chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The streamed ``text_completion`` chunks of ``body``: the text, then the finish (and the usage)."""
    choice = body["choices"][0]
    base = {"id": body["id"], "object": "text_completion", "created": body["created"], "model": body["model"]}
    chunks = [
        {**base, "choices": [{"index": 0, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}]},
    ]
    if include_usage:
        chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


def models_response(model: str, created: int) -> dict[str, Any]:
    """``GET /v1/models``: a list with the one served model."""
    return {"object": "list", "data": [model_object(model, created)]}


def model_object(model: str, created: int) -> dict[str, Any]:
    """One ``model`` object."""
    return {"id": model, "object": "model", "created": created, "owned_by": "posttrain"}
