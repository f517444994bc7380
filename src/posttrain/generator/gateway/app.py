"""The gateway's HTTP routes (FastAPI), in the OpenAI API's shapes.

Routes (every one but ``/health`` needs ``Authorization: Bearer <run token>``):

=========================================================  ===============================================
``POST /episodes/{episode_id}/v1/chat/completions``        one chat turn of the episode (path segment)
``POST /v1/chat/completions`` + ``X-Episode-Id: <id>``      the same, episode named by a header
``POST /episodes/{episode_id}/v1/completions``              one text-completion turn (or with the header)
``GET  /v1/models``, ``GET /v1/models/{model}``             the served model (also under ``/episodes/{id}``)
``POST /episodes/{episode_id}/reward``                      close: ``{"reward", "metrics", "infra_error", "infra_cause", "task_id"}``
``GET  /v1/gateway/stats``                                  the gateway's counters
``GET  /health``                                            liveness, no token
=========================================================  ===============================================

The first request of an unknown episode id opens it (``X-Task-Id`` may name its task,
``X-Episode-History: split|refuse`` its history rule). An agent built on the ``openai`` client
needs one line: ``OpenAI(base_url=f"{gateway}/episodes/{episode_id}/v1", api_key=token)``.

Errors are the API's error object with the HTTP status: 401 (no or wrong token), 400 (malformed
JSON, a field out of range, an edited history under ``refuse``, a context too long), 404 (unknown
model or episode), 409 (the episode is serving another request), 413 (body over
``gateway.max_request_bytes``), 429 (no admission ticket in time), 500 (engine or verifier failure).
A refused request changes nothing. Streaming (``stream: true``) sends the whole turn as one
server-sent event, then the finish (the engine returns a turn whole).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from posttrain.generator.gateway.protocol import (
    ChatCompletionRequest,
    CloseRequest,
    CompletionRequest,
    GatewayError,
    chat_chunks,
    completion_chunks,
    error_body,
    model_object,
    models_response,
    validation_error,
)
from posttrain.generator.gateway.service import GatewayService

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger("posttrain.gateway")

EPISODE_HEADER = "x-episode-id"
TASK_HEADER = "x-task-id"
HISTORY_HEADER = "x-episode-history"


def build_app(service: GatewayService, token: str, max_request_bytes: int) -> FastAPI:
    """The FastAPI application of one gateway (module docstring).

    Args:
        service: Serves the episodes.
        token: The run's bearer token (compared in constant time).
        max_request_bytes: Largest request body (bytes).

    Raises:
        ValueError: an empty token.
    """
    if not token:
        raise ValueError("token: the gateway needs the run's bearer token")
    app = FastAPI(title="posttrain rollout gateway", docs_url=None, redoc_url=None, openapi_url=None)
    expected = f"Bearer {token}".encode()

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Redis unreachable past queue.reconnect_window_s, a bug: still the API's error object.
        log.error("gateway: %s %s failed: %r", request.method, request.url.path, exc)
        return JSONResponse(error_body(f"the gateway failed on this request ({type(exc).__name__}: {exc})",
                                       type="server_error", code="internal_error"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _request_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        return JSONResponse(error_body(f"{param}: {first.get('msg', 'invalid')}", param=param), status_code=400)

    def authorize(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            service.stats.unauthorized += 1
            what = "no bearer token" if not given else "a token that is not this run's"
            raise GatewayError(401, f"Incorrect API key: the request carries {what}; use the run's gateway token",
                               code="invalid_api_key")

    async def body_of(request: Request, model: type[M]) -> M:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_request_bytes:
            raise GatewayError(413, f"request body of {length} bytes is over gateway.max_request_bytes "
                                    f"({max_request_bytes})", code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise GatewayError(413, f"request body is over gateway.max_request_bytes ({max_request_bytes})",
                                   code="request_too_large")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GatewayError(400, f"We could not parse the JSON body of your request ({exc})",
                               code="invalid_json") from None
        if not isinstance(data, dict):
            raise GatewayError(400, f"the body must be a JSON object, got {type(data).__name__}", code="invalid_json")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise validation_error(exc) from None

    def episode_of(request: Request, path_id: str | None) -> str:
        episode_id = path_id or request.headers.get(EPISODE_HEADER)
        if not episode_id:
            raise GatewayError(400, "no episode: use the base URL <gateway>/episodes/<episode id>/v1, or send the "
                                    "X-Episode-Id header", param="X-Episode-Id", code="episode_required")
        return episode_id

    def respond(body: dict[str, Any], episode_id: str, stream: bool,
                chunks: Callable[[], list[dict[str, Any]]]) -> Any:
        headers = {"X-Episode-Id": episode_id, "X-Policy-Version": str(int(service.stats.last_policy_version))}
        if not stream:
            return JSONResponse(body, headers=headers)

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks():
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def chat(request: Request, episode_id: str | None = None) -> Any:
        authorize(request)
        req = await body_of(request, ChatCompletionRequest)
        eid = episode_of(request, episode_id)
        body = await service.chat(eid, req, task_id=request.headers.get(TASK_HEADER),
                                  rule_header=request.headers.get(HISTORY_HEADER))
        include = bool(req.stream_options and req.stream_options.include_usage)
        return respond(body, eid, req.stream, lambda: chat_chunks(body, include))

    async def complete(request: Request, episode_id: str | None = None) -> Any:
        authorize(request)
        req = await body_of(request, CompletionRequest)
        eid = episode_of(request, episode_id)
        body = await service.complete(eid, req, task_id=request.headers.get(TASK_HEADER),
                                      rule_header=request.headers.get(HISTORY_HEADER))
        include = bool(req.stream_options and req.stream_options.include_usage)
        return respond(body, eid, req.stream, lambda: completion_chunks(body, include))

    async def models(request: Request, episode_id: str | None = None) -> Any:
        authorize(request)
        return JSONResponse(models_response(service.settings.model_name, service.created))

    async def model(request: Request, model: str, episode_id: str | None = None) -> Any:
        authorize(request)
        service.check_model(model)
        return JSONResponse(model_object(model, service.created))

    async def reward(request: Request, episode_id: str) -> Any:
        authorize(request)
        req = await body_of(request, CloseRequest)
        return JSONResponse(await service.close(episode_id, req))

    async def stats(request: Request) -> Any:
        authorize(request)
        return JSONResponse({**service.stats.snapshot(), "open_episodes": float(len(service.book))})

    async def health() -> Any:
        return JSONResponse({"status": "ok"})

    for prefix in ("", "/episodes/{episode_id}"):
        app.add_api_route(f"{prefix}/v1/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/completions", complete, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])
        app.add_api_route(f"{prefix}/v1/models/{{model}}", model, methods=["GET"])
    app.add_api_route("/episodes/{episode_id}/reward", reward, methods=["POST"])
    app.add_api_route("/v1/gateway/stats", stats, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    return app
