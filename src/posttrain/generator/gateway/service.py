"""The gateway's work behind the HTTP routes: serve a turn of an episode, close it, abandon idle ones.

``GatewayService`` holds the generator's parts (engine, admission gate, rollout sender, stats) and
the open episodes (``EpisodeBook``). Per request:

* **chat turn** (``chat``): the request's messages are checked against the episode's transcript
  (``history``); a new episode, or a new segment after an edit under ``split``, renders the whole
  request with the chat template once (``render`` + ``ChatFormat.prompt_ids``); otherwise only the
  new messages are rendered (``ChatFormat.observation_ids``) and appended to the tokens already
  held. Then one engine call samples the turn from all tokens so far (through the batching gate,
  ``batching``, which lets the open episodes' turns into one engine batch), with the run's
  temperature and top-p and the template's end-of-turn token as the stop token; the sampled ids, their
  behaviour logprobs and the engine's policy version join the segment, and the action text comes
  back as an assistant message (tool calls in the API's shape, ``chat.openai.split_action``).
* **completion turn** (``complete``): the same on raw text or token ids: a later prompt must start
  with the segment's text (or token ids) so far; only the rest is tokenised.
* **close** (``close``): the reward (given, or from the verifier with a task id), then one
  rollout per segment goes to the stream and consumes that segment's ticket; an ``infra_error``
  close sends nothing, releases the tickets and counts the failure by its cause in the run's
  infrastructure counters (``release_infra``; the client, not the run, retries the task).
* **reap** (``reap``): episodes idle for ``gateway.idle_timeout_s``, or open longer than
  ``generator.episode_timeout_s``, are abandoned: tickets released, counted.

Everything a request could be refused for is checked before anything changes: a refused request
(400, 404, 409, 413, 429) leaves its episode exactly as it was, and a request that fails in the
engine (500) too. A new episode takes its admission ticket only once its first request is valid,
and gives it back if that request fails. Tested in ``tests/unit/generator/test_gateway_service.py``
and, over HTTP with the ``openai`` client, ``tests/integration/test_gateway.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from jinja2 import TemplateError

from posttrain.chat.format import ChatFormat
from posttrain.chat.openai import split_action
from posttrain.generator.gateway.batching import BatchGate
from posttrain.generator.gateway.episodes import Api, Episode, EpisodeBook, HistoryRule, Segment
from posttrain.generator.gateway.history import Canonical, canonical, check_history
from posttrain.generator.gateway.protocol import (
    CLIENT_INFRA_CAUSES,
    UNSPECIFIED_INFRA_CAUSE,
    ChatCompletionRequest,
    ChatMessage,
    CloseRequest,
    CompletionRequest,
    GatewayError,
    chat_finish_reason,
    chat_response,
    completion_id,
    completion_response,
)
from posttrain.generator.gateway.render import template_messages
from posttrain.generator.gateway.stats import GatewayStats
from posttrain.generator.gateway.verifier import EnvironmentVerifier
from posttrain.generator.sender import RolloutSender
from posttrain.inference.base import GenerationRequest, GenerationResult, InferenceEngine
from posttrain.records import RecordError, Rollout
from posttrain.rollout.admission import AdmissionController, AsyncTicketGate, Ticket

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("posttrain.gateway")

EPISODE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
"""Allowed episode ids (path segment or ``X-Episode-Id``)."""

MAX_METRICS = 64
"""Most metrics one reward call may carry."""


@dataclass(frozen=True)
class GatewaySettings:
    """The numbers a ``GatewayService`` works with (from the run config; ``serve.settings_for``).

    Attributes:
        model_name: The ``model`` clients must name.
        generator_id: Stored in each rollout (``gw0``...).
        max_new_tokens: Most sampled tokens per turn (``generator.max_new_tokens``).
        max_episode_tokens: Most tokens in one segment: prompt, actions and observations
            (``generator.max_episode_tokens``).
        temperature: The run's sampling temperature (``generator.temperature``).
        top_p: The run's nucleus mass (``generator.top_p``).
        edited_history: The default history rule (``gateway.edited_history``).
        admission_wait_s: Longest wait of a new episode or segment for its ticket (seconds).
        env_name: ``Rollout.env_name`` of episodes the verifier graded (``data.env``).
        wrap_tool_results: Tool results in our environments' format (``gateway.wrap_tool_results``).
    """

    model_name: str
    generator_id: str
    max_new_tokens: int
    max_episode_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    edited_history: HistoryRule = "split"
    admission_wait_s: float = 30.0
    env_name: str = "gateway"
    wrap_tool_results: bool = True


@dataclass
class _Turn:
    """One sampled turn before it is committed to its segment."""

    prompt_ids: list[int]
    observation: list[int]
    result: GenerationResult
    text: str


class GatewayService:
    """Serves episodes over the generator's engine, admission and stream (module docstring).

    Args:
        settings: Limits, names and rules.
        engine: The engine (a ``MeteredEngine`` in the gateway process).
        tokenizer: The policy's tokenizer, with its chat template.
        gate: Admission tickets, waited for on the event loop.
        admission: The controller behind ``gate`` (tickets are released to it).
        sender: Puts rollouts on the stream and settles their tickets.
        stats: The gateway's counters (published like a generator's).
        book: The open episodes.
        verifier: Grades episodes closed with a task id; None: a reward is required.
        batch_wait_s: The batching gate's longest engine-idle wait (``BatchGate``; seconds, >= 0);
            None or 0: no gate, each turn goes to the engine as it arrives (engines that batch
            continuously).

    Raises:
        ValueError: ``batch_wait_s`` negative.
    """

    def __init__(self, settings: GatewaySettings, engine: InferenceEngine, tokenizer: PreTrainedTokenizerBase,
                 gate: AsyncTicketGate, admission: AdmissionController, sender: RolloutSender, stats: GatewayStats,
                 book: EpisodeBook, verifier: EnvironmentVerifier | None = None,
                 batch_wait_s: float | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.tokenizer = tokenizer
        self.chat_format = ChatFormat.for_tokenizer(tokenizer)
        self.gate = gate
        self.admission = admission
        self.sender = sender
        self.stats = stats
        self.book = book
        self.verifier = verifier
        self._awaiting_tickets = 0
        self.batch_gate = BatchGate(engine, batch_wait_s or 0.0, lambda: len(book) - self._awaiting_tickets, stats)
        """Gathers the open episodes' turns into one engine batch (``posttrain.generator.gateway.batching``);
        an episode whose first request waits for its admission ticket cannot join one and is not waited for."""
        self.created = int(time.time())
        self.stopping = asyncio.Event()
        """Set when the gateway stops: new turns get 503, waits for tickets end."""

    # --- checks shared by both APIs -------------------------------------------------------------

    def check_model(self, model: str) -> None:
        """Raise 404 ``model_not_found`` unless ``model`` is the served model."""
        if model != self.settings.model_name:
            raise GatewayError(404, f"The model {model!r} does not exist; this gateway serves "
                                    f"{self.settings.model_name!r} (GET /v1/models)", param="model",
                               code="model_not_found")

    def _check_sampling(self, req: ChatCompletionRequest | CompletionRequest) -> None:
        """Refuse what the gateway cannot sample exactly as asked (module docstring of ``protocol``)."""
        self.check_model(req.model)
        s = self.settings
        if req.n not in (None, 1):
            raise GatewayError(400, f"n: the gateway samples one completion per request (an episode is one "
                                    f"trajectory), got {req.n}", param="n")
        if req.stop:
            raise GatewayError(400, "stop: stop strings are not supported; a turn ends at the chat template's "
                                    "end-of-turn token", param="stop")
        for name, asked, run in (("temperature", req.temperature, s.temperature), ("top_p", req.top_p, s.top_p)):
            if asked is not None and asked != run:
                raise GatewayError(400, f"{name}: this run samples at {name} {run} (training needs the behaviour "
                                        f"distribution of the policy it trains), got {asked}; leave it unset",
                                   param=name)

    def _budget(self, prompt_len: int, asked: int | None) -> int:
        """Tokens the turn may sample: ``asked`` (refused when too many), else what the limits leave.

        Raises:
            GatewayError: 400 ``context_length_exceeded`` when the prompt leaves no room or ``asked``
                does not fit, or 400 ``max_tokens`` above ``generator.max_new_tokens``.
        """
        s = self.settings
        room = s.max_episode_tokens - prompt_len
        if room < 1:
            raise GatewayError(400, f"This episode's maximum context length is {s.max_episode_tokens} tokens "
                                    f"(generator.max_episode_tokens); the request holds {prompt_len} tokens. Close "
                                    "the episode, or start a new one", param="messages", code="context_length_exceeded")
        if asked is None:
            return min(s.max_new_tokens, room)
        if asked > s.max_new_tokens:
            raise GatewayError(400, f"max_tokens: at most {s.max_new_tokens} per turn (generator.max_new_tokens), "
                                    f"got {asked}", param="max_tokens")
        if asked > room:
            raise GatewayError(400, f"This episode's maximum context length is {s.max_episode_tokens} tokens; "
                                    f"you requested {prompt_len + asked} ({prompt_len} in the prompt, {asked} in the "
                                    "completion)", param="max_tokens", code="context_length_exceeded")
        return asked

    def _check_running(self) -> None:
        if self.stopping.is_set():
            raise GatewayError(503, "the gateway is stopping (the run ended); no new turn is served",
                               type="server_error", code="gateway_stopping")

    async def _ticket(self) -> Ticket:
        """An admission ticket within ``admission_wait_s``; 429 when capacity stayed full, 503 when stopping."""
        self._check_running()
        t0 = time.monotonic()
        waiting = asyncio.ensure_future(self.gate.acquire(self.settings.admission_wait_s))
        stop = asyncio.ensure_future(self.stopping.wait())
        self._awaiting_tickets += 1
        self.batch_gate.check()  # turns held for this episode's need not wait for it
        try:
            await asyncio.wait([waiting, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._awaiting_tickets -= 1
            stop.cancel()
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
        self.stats.admission_wait_s += time.monotonic() - t0
        ticket = None if waiting.cancelled() else waiting.result()
        if self.stopping.is_set():
            if ticket is not None:
                self.admission.release(ticket)
            self._check_running()
        if ticket is None:
            self.stats.admission_timeouts += 1
            raise GatewayError(429, f"no admission ticket within {self.settings.admission_wait_s:.0f} s: the learner "
                                    "is more than max_staleness versions behind the episodes in flight; retry later",
                               type="rate_limit_error", code="admission_full")
        self.stats.episode_started()
        return ticket

    def _release(self, tickets: Sequence[Ticket]) -> None:
        for ticket in tickets:
            self.admission.release(ticket)
            self.stats.episode_finished()

    async def _sample(self, segment_tokens: Sequence[int], observation: list[int], asked: int | None,
                      seed: int | None) -> _Turn:
        """Sample one turn after ``segment_tokens + observation`` (nothing is changed here)."""
        self._check_running()
        prompt = [*segment_tokens, *observation]
        budget = self._budget(len(prompt), asked)
        stop = self.chat_format.stop_token_id
        request = GenerationRequest(prompt_token_ids=prompt, max_new_tokens=budget, stop_token_ids=[stop],
                                    temperature=self.settings.temperature, top_p=self.settings.top_p, seed=seed)
        try:
            result = await self.batch_gate.generate(request)
        except (RuntimeError, ValueError, OSError) as exc:
            self.stats.failed += 1
            log.error("gateway %s: engine call failed: %s", self.settings.generator_id, exc)
            raise GatewayError(500, f"the engine failed on this request ({type(exc).__name__}: {exc}); the episode "
                                    "is unchanged, retry", type="server_error", code="engine_error") from exc
        if not result.token_ids or len(result.token_ids) != len(result.logprobs):
            raise GatewayError(500, "the engine returned a malformed result; the episode is unchanged, retry",
                               type="server_error", code="engine_error")
        ended = result.token_ids[-1] == stop and result.finish_reason == "stop"
        text = self._decode(result.token_ids[:-1] if ended else result.token_ids, skip_special_tokens=False)
        return _Turn(prompt, observation, result, text)

    def _finish(self, turn: _Turn) -> Literal["stop", "length"]:
        stop = self.chat_format.stop_token_id
        return "stop" if turn.result.finish_reason == "stop" and turn.result.token_ids[-1] == stop else "length"

    def _commit(self, segment: Segment, turn: _Turn) -> None:
        segment.add_observation(turn.observation)
        segment.add_action(turn.result.token_ids, turn.result.logprobs, int(turn.result.policy_version), turn.text,
                           self._finish(turn))
        self.stats.turns += 1

    def _decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids`` (special tokens written out)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def _token_logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> list[dict[str, Any]]:
        out = []
        for token, lp in zip(token_ids, logprobs, strict=True):
            piece = self._decode([token], skip_special_tokens=False)
            out.append({"token": piece, "logprob": float(lp), "bytes": list(piece.encode("utf-8")), "top_logprobs": []})
        return out

    # --- opening, finding and locking episodes ----------------------------------------------------

    def _lookup(self, episode_id: str, api: Api) -> Episode | None:
        """The open episode ``episode_id`` of ``api``, or None when it is new.

        Raises:
            GatewayError: 400 for a malformed id or the other API; 404 when it finished already;
                409 when a request of it is being served.
        """
        if not EPISODE_ID.match(episode_id):
            raise GatewayError(400, f"episode id {episode_id!r}: expected 1-128 of A-Z a-z 0-9 . _ : -",
                               param="episode_id", code="invalid_episode_id")
        episode = self.book.get(episode_id)
        if episode is None:
            outcome = self.book.outcome(episode_id)
            if outcome is not None:
                raise GatewayError(404, f"episode {episode_id!r} is {outcome['status']} ({outcome.get('reason', '')}); "
                                        "open a new episode with a new id", code=f"episode_{outcome['status']}")
            return None
        if episode.api != api:
            raise GatewayError(400, f"episode {episode_id!r} speaks the {episode.api} API; one episode uses one API",
                               code="episode_api_mismatch")
        if episode.lock.locked():
            raise GatewayError(409, f"episode {episode_id!r} is serving another request; an episode takes one request "
                                    "at a time", code="episode_busy")
        return episode

    def _rule(self, header: str | None) -> HistoryRule:
        if header is None:
            return self.settings.edited_history
        if header not in ("split", "refuse"):
            raise GatewayError(400, f"X-Episode-History: expected 'split' or 'refuse', got {header!r}",
                               param="X-Episode-History")
        return header  # type: ignore[return-value]

    async def _open_segment(self, episode: Episode, prompt: list[int], asked: int | None, seed: int | None,
                            setup: Any) -> tuple[Segment, _Turn]:
        """A new segment of ``episode`` (a new episode, or a split): budget, ticket, first turn; nothing kept on failure."""
        self._budget(len(prompt), asked)  # refused before a ticket is taken
        ticket = await self._ticket()
        segment = Segment(ticket)
        try:
            turn = await self._sample([], prompt, asked, seed)
        except BaseException:
            self._release([ticket])
            raise
        setup(segment)
        self._commit(segment, turn)
        episode.segments.append(segment)
        return segment, turn

    async def _serve(self, episode_id: str, api: Api, task_id: str | None, rule_header: str | None,
                     turn: Any) -> Any:
        """Find or open the episode, hold its lock, run ``turn(episode, is_new)``; a new episode that fails is forgotten."""
        rule = self._rule(rule_header)
        episode = self._lookup(episode_id, api)
        if episode is not None:
            async with episode.lock:
                episode.touch()
                try:
                    return await turn(episode, False)
                finally:
                    episode.touch()  # idle time counts from the end of the last request
        if task_id is not None and (not task_id or len(task_id) > 200):
            raise GatewayError(400, "X-Task-Id: expected 1-200 characters", param="X-Task-Id")
        episode = Episode(episode_id, api, rule, task_id)
        self.book.add(episode)
        try:
            async with episode.lock:
                out = await turn(episode, True)
        except BaseException:
            self.book.discard(episode)
            self.batch_gate.check()  # one open episode fewer for held turns to wait for
            raise
        self.stats.episodes_opened += 1
        return out

    # --- the chat API ----------------------------------------------------------------------------

    async def chat(self, episode_id: str, req: ChatCompletionRequest, *, task_id: str | None = None,
                   rule_header: str | None = None) -> dict[str, Any]:
        """Serve one chat turn of episode ``episode_id`` (module docstring); returns the ``chat.completion`` body.

        Raises:
            GatewayError: the request is refused (the episode is unchanged) or the engine failed.
        """
        self._check_sampling(req)
        if req.tool_choice not in (None, "auto", "none"):
            raise GatewayError(400, "tool_choice: only 'auto' and 'none' are supported (the policy decides when "
                                    "to call a tool)", param="tool_choice")
        if req.response_format not in (None, {"type": "text"}):
            raise GatewayError(400, "response_format: only text is supported", param="response_format")
        if req.top_logprobs:
            raise GatewayError(400, "top_logprobs: only the sampled token's logprob is returned", param="top_logprobs")
        try:
            canon = [canonical(m, f"messages[{i}]") for i, m in enumerate(req.messages)]
        except ValueError as exc:
            raise GatewayError(400, str(exc), param="messages") from None
        asked = req.max_completion_tokens or req.max_tokens

        async def turn(episode: Episode, new: bool) -> dict[str, Any]:
            if not new:
                segment = episode.current
                check = check_history(segment.transcript, canon)
                if check.extends:
                    messages = template_messages(req.messages[check.new:], start=check.new, calls=segment.calls,
                                                 wrap_tool_results=self.settings.wrap_tool_results)
                    observation = self._close_cut_turn(segment) + self._observation(messages, check.new)
                    t = await self._sample(segment.token_ids, observation, asked, req.seed)
                    self._commit(segment, t)
                    return self._chat_reply(segment, t, canon, req)
                if episode.rule == "refuse":
                    self.stats.history_refused += 1
                    raise GatewayError(400, f"edited history: {check.reason}; this episode refuses edits (rule "
                                            "'refuse'): send the conversation as returned, or close the episode",
                                       param=f"messages.{check.edit_at}", code="history_mismatch")
            if req.messages[-1].role == "assistant":
                raise GatewayError(400, f"messages[{len(req.messages) - 1}]: the last message is an assistant "
                                        "message; the gateway samples the next assistant turn",
                                   param=f"messages.{len(req.messages) - 1}")
            rendered = template_messages(req.messages, wrap_tool_results=self.settings.wrap_tool_results)
            try:
                prompt = self.chat_format.prompt_ids(rendered, req.tools)
            except (ValueError, TypeError, KeyError, TemplateError) as exc:  # the template itself refused
                raise GatewayError(400, f"messages: the chat template cannot render them ({exc})",
                                   param="messages") from None
            segment, t = await self._open_segment(episode, prompt, asked, req.seed, lambda s: None)
            if not new:
                self.stats.splits += 1
            return self._chat_reply(segment, t, canon, req)

        return await self._serve(episode_id, "chat", task_id, rule_header, turn)

    def _close_cut_turn(self, segment: Segment) -> list[int]:
        """The end-of-turn token, as an observation, after a turn cut by its budget (the template's next segment expects it)."""
        return [self.chat_format.stop_token_id] if segment.mask and segment.mask[-1] and segment.finish == "length" else []

    def _observation(self, messages: list[dict[str, str]], start: int) -> list[int]:
        try:
            return self.chat_format.observation_ids(messages)
        except ValueError as exc:
            raise GatewayError(400, f"messages[{start}:]: the chat template cannot render them after an assistant "
                                    f"turn ({exc})", param=f"messages.{start}") from None

    def _chat_reply(self, segment: Segment, t: _Turn, canon: list[Canonical],
                    req: ChatCompletionRequest) -> dict[str, Any]:
        """Build the response; record the reply in the segment's transcript (its next request must start with it)."""
        n_calls = t.text.count("<tool_call>")
        content, calls = split_action(t.text, [f"call_{uuid.uuid4().hex[:24]}" for _ in range(n_calls)])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [c.as_dict() for c in calls]
        reply = ChatMessage.model_validate(message)
        segment.transcript = [*canon, canonical(reply)]
        segment.calls = {c.call_id: c.name for c in calls}
        segment.tool_calls += len(calls)
        result = t.result
        self.stats.last_policy_version = float(result.policy_version)
        return chat_response(
            response_id=completion_id("chatcmpl"), model=self.settings.model_name, message=message,
            finish_reason=chat_finish_reason(self._finish(t), bool(calls)), prompt_tokens=len(t.prompt_ids),
            completion_tokens=len(result.token_ids),
            logprobs=self._token_logprobs(result.token_ids, result.logprobs) if req.logprobs else None,
            prompt_token_ids=t.prompt_ids if req.return_token_ids else None,
            token_ids=list(result.token_ids) if req.return_token_ids else None,
        )

    # --- the completions API ---------------------------------------------------------------------

    async def complete(self, episode_id: str, req: CompletionRequest, *, task_id: str | None = None,
                       rule_header: str | None = None) -> dict[str, Any]:
        """Serve one text-completion turn of episode ``episode_id``; returns the ``text_completion`` body.

        A later prompt (text or token ids) must start with everything the segment holds: the
        first prompt and each completion returned (module docstring); only the rest is tokenised.

        Raises:
            GatewayError: the request is refused (the episode is unchanged) or the engine failed.
        """
        self._check_sampling(req)
        if req.echo or req.suffix:
            raise GatewayError(400, "echo / suffix: not supported", param="echo" if req.echo else "suffix")
        prompt = _one_prompt(req.prompt)

        async def turn(episode: Episode, new: bool) -> dict[str, Any]:
            if not new:
                segment = episode.current
                rest = self._prompt_rest(segment, prompt)
                if rest is not None:
                    t = await self._sample(segment.token_ids, rest, req.max_tokens, req.seed)
                    self._commit(segment, t)
                    if isinstance(prompt, str):
                        segment.text = prompt + t.text
                    else:
                        segment.text += self._decode(rest, skip_special_tokens=False) + t.text
                    return self._completion_reply(t, req)
                if episode.rule == "refuse":
                    self.stats.history_refused += 1
                    raise GatewayError(400, "edited history: the prompt does not start with this episode's text (or "
                                            "token ids) so far; this episode refuses edits (rule 'refuse')",
                                       param="prompt", code="history_mismatch")
            ids = (list(self.tokenizer(prompt)["input_ids"]) if isinstance(prompt, str) else list(prompt))
            if not ids:
                raise GatewayError(400, "prompt: empty", param="prompt")
            text = prompt if isinstance(prompt, str) else self._decode(ids, skip_special_tokens=False)

            def setup(segment: Segment) -> None:
                segment.text = text

            segment, t = await self._open_segment(episode, ids, req.max_tokens, req.seed, setup)
            segment.text += t.text
            if not new:
                self.stats.splits += 1
            return self._completion_reply(t, req)

        return await self._serve(episode_id, "completion", task_id, rule_header, turn)

    def _prompt_rest(self, segment: Segment, prompt: str | list[int]) -> list[int] | None:
        """The token ids a later prompt adds to ``segment``, or None when it does not extend it."""
        if isinstance(prompt, str):
            if not prompt.startswith(segment.text):
                return None
            rest = prompt[len(segment.text):]
            return list(self.tokenizer.encode(rest, add_special_tokens=False)) if rest else []
        n = len(segment.token_ids)
        if list(prompt[:n]) != segment.token_ids:
            return None
        return list(prompt[n:])

    def _completion_reply(self, t: _Turn, req: CompletionRequest) -> dict[str, Any]:
        result = t.result
        logprobs = None
        if req.logprobs is not None:
            pieces = [self._decode([tok], skip_special_tokens=False) for tok in result.token_ids]
            offsets, at = [], 0
            for piece in pieces:
                offsets.append(at)
                at += len(piece)
            logprobs = {"tokens": pieces, "token_logprobs": [float(x) for x in result.logprobs],
                        "top_logprobs": [{p: float(x)} for p, x in zip(pieces, result.logprobs, strict=True)]
                        if req.logprobs else None, "text_offset": offsets}
        self.stats.last_policy_version = float(result.policy_version)
        return completion_response(
            response_id=completion_id("cmpl"), model=self.settings.model_name, text=t.text,
            finish_reason=self._finish(t), prompt_tokens=len(t.prompt_ids), completion_tokens=len(result.token_ids),
            logprobs=logprobs, prompt_token_ids=t.prompt_ids if req.return_token_ids else None,
            token_ids=list(result.token_ids) if req.return_token_ids else None,
        )

    # --- closing and abandoning ------------------------------------------------------------------

    async def close(self, episode_id: str, req: CloseRequest) -> dict[str, Any]:
        """Close an episode: one rollout per segment to the stream, or none for an ``infra_error``.

        A repeated close of a closed episode returns the first close's answer. Every check comes
        before anything changes: a refused close leaves the episode open.

        Returns:
            ``{"episode_id", "status", "reward", "rollouts": [{"rollout_id", "policy_version",
            "num_turns", "action_tokens", "sent"}], ...}``.

        Raises:
            GatewayError: 404 unknown episode, 400 a bad reward / metrics / task id or no way to a
                reward, 500 the verifier failed (the episode stays open).
        """
        if not EPISODE_ID.match(episode_id):
            raise GatewayError(400, f"episode id {episode_id!r}: expected 1-128 of A-Z a-z 0-9 . _ : -",
                               param="episode_id", code="invalid_episode_id")
        episode = self.book.get(episode_id)
        if episode is None:
            outcome = self.book.outcome(episode_id)
            if outcome is not None and outcome["status"] in ("closed", "infra_error"):
                return {**outcome, "repeated": True}
            if outcome is not None:
                raise GatewayError(404, f"episode {episode_id!r} is {outcome['status']} ({outcome.get('reason', '')})",
                                   code=f"episode_{outcome['status']}")
            raise GatewayError(404, f"episode {episode_id!r} was never opened here", code="episode_not_found")
        _check_metrics(req.metrics)
        cause = _infra_cause(req)
        if req.reward is not None and not math.isfinite(req.reward):
            raise GatewayError(400, f"reward: must be a finite number, got {req.reward}", param="reward")
        async with episode.lock:
            if self.book.get(episode_id) is not episode:  # closed or abandoned while this call waited
                return await self.close(episode_id, req)
            if cause is not None:
                return self._close_infra(episode, cause)
            reward, metrics, env_name, task_id, finish = await self._reward(episode, req)
            return await self._close_with(episode, reward, metrics, env_name, task_id, finish)

    def _close_infra(self, episode: Episode, cause: str) -> dict[str, Any]:
        """Close an episode whose client's infrastructure failed: nothing trained, counted in the run's infra counters.

        The episode counts once, by ``cause``, in the admission counters the learner reads
        (``infra/*`` metrics, the summary's row, ``generator.max_infra_error_share``), as a failure
        of our own generators does; its first segment's ticket carries the count, the others are
        released. It is not re-issued: the task is the client's, and so is the retry
        (``client_retry_total``, ``infra/left_to_client``).
        """
        tickets = [s.ticket for s in episode.segments]
        self.admission.release_infra(tickets[0], cause, None, client_retries=True)
        self._release(tickets[1:])
        self.stats.infra_errors += 1
        outcome = {"episode_id": episode.episode_id, "status": "infra_error", "reason": "closed with infra_error",
                   "infra_cause": cause, "rollouts": [], "segments": len(episode.segments)}
        self._finish_episode(episode, outcome)
        log.info("gateway %s: episode %s closed with infra_error (%s; %d segment(s), nothing trained; its client "
                 "retries the task)", self.settings.generator_id, episode.episode_id, cause, len(episode.segments))
        return outcome

    async def _reward(self, episode: Episode, req: CloseRequest) -> tuple[float, dict[str, float], str, str, Any]:
        """``(reward, metrics, env_name, task_id, finish_reason)`` of a close (given, or from the verifier)."""
        task_id = req.task_id or episode.task_id
        if req.reward is not None:
            return float(req.reward), dict(req.metrics), "gateway", task_id or f"gateway:{episode.episode_id}", None
        if self.verifier is None:
            raise GatewayError(400, "reward: required (this run names no verifier: gateway.verifier is 'none')",
                               param="reward")
        if task_id is None:
            raise GatewayError(400, "reward or task_id: one is required (the run's verifier grades an episode of a "
                                    "named training task)", param="task_id")
        task = self.verifier.task(task_id)
        if task is None:
            raise GatewayError(400, f"task_id: {task_id!r} is not one of the run's training tasks", param="task_id")
        actions = [a for s in episode.segments for a in s.actions]
        try:
            grade = await self.verifier.grade(task, actions)
        except Exception as exc:  # noqa: BLE001 - any failure of the environment: the episode stays open
            self.stats.verifier_errors += 1
            log.error("gateway %s: verifier failed on %s: %r", self.settings.generator_id, task_id, exc)
            raise GatewayError(500, f"the verifier failed on task {task_id!r} ({type(exc).__name__}: {exc}); the "
                                    "episode is still open: close it again, with a reward, or with infra_error",
                               type="server_error", code="verifier_failed") from None
        self.stats.verified += 1
        return grade.reward, {**grade.metrics, **req.metrics}, self.settings.env_name, task_id, grade.finish_reason

    async def _close_with(self, episode: Episode, reward: float, metrics: dict[str, float], env_name: str,
                          task_id: str, finish: Any) -> dict[str, Any]:
        pairs: list[tuple[Ticket, Rollout]] = []
        rows: list[dict[str, Any]] = []
        empty: list[Ticket] = []
        for k, segment in enumerate(episode.segments):
            if not segment.turns:
                empty.append(segment.ticket)
                continue
            extra = {**metrics, "segment": float(k), "segments": float(len(episode.segments))}
            try:
                rollout = segment.rollout(task_id=task_id, env_name=env_name, generator_id=self.settings.generator_id,
                                          reward=reward, metrics=extra, finish_reason=finish)
            except RecordError as exc:
                self.stats.rejected += 1
                empty.append(segment.ticket)
                log.warning("gateway %s: segment %d of episode %s rejected: %s", self.settings.generator_id, k,
                            episode.episode_id, exc)
                rows.append({"segment": k, "sent": False, "error": str(exc)})
                continue
            pairs.append((segment.ticket, rollout))
            rows.append({"segment": k, "rollout_id": rollout.rollout_id, "policy_version": rollout.policy_version,
                         "num_turns": rollout.num_turns, "action_tokens": rollout.num_action_tokens})
        self._release(empty)
        sent = await self.sender.send_shielded(pairs) if pairs else []
        for _ in pairs:
            self.stats.episode_finished()
        flags = iter(sent)
        for row in rows:
            if "rollout_id" in row:
                row["sent"] = next(flags)
        self.stats.episodes_closed += 1
        outcome = {"episode_id": episode.episode_id, "status": "closed", "reason": "closed by its reward call",
                   "reward": reward, "task_id": task_id, "segments": len(episode.segments), "rollouts": rows}
        self._finish_episode(episode, outcome)
        return outcome

    def _finish_episode(self, episode: Episode, outcome: dict[str, Any]) -> None:
        """Move ``episode`` to the finished ones; turns held at the batching gate wait for one episode fewer."""
        self.book.finish(episode, outcome)
        self.batch_gate.check()

    def abandon(self, episode: Episode, reason: str) -> None:
        """Give up an open episode: release its tickets, count it, remember why (``idle``, ``too_old``, ``stopping``)."""
        self._release([s.ticket for s in episode.segments])
        self.stats.abandoned += 1
        self._finish_episode(episode, {"episode_id": episode.episode_id, "status": "abandoned", "reason": reason,
                                       "rollouts": [], "segments": len(episode.segments)})
        log.info("gateway %s: episode %s abandoned (%s); %d ticket(s) released", self.settings.generator_id,
                 episode.episode_id, reason, len(episode.segments))

    def reap(self) -> int:
        """Abandon the episodes that are due (``EpisodeBook.due``); returns how many."""
        due = self.book.due()
        for episode, reason in due:
            self.abandon(episode, reason)
        return len(due)

    def shutdown(self) -> int:
        """Abandon every open episode (the gateway is stopping; its server no longer serves); returns how many.

        Call it once the HTTP server has stopped: an episode whose request was cut off then still
        holds its lock, and is abandoned all the same (its tickets released).
        """
        self.stopping.set()
        n = 0
        for episode in self.book.open_episodes():
            if episode.segments:
                self.abandon(episode, "stopping")
                n += 1
        return n


def _one_prompt(prompt: Any) -> str | list[int]:
    """The one prompt of a completions request (text or token ids).

    Raises:
        GatewayError: 400 for several prompts or an empty one.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise GatewayError(400, f"prompt: one prompt per request (an episode is one trajectory), got {len(prompt)}",
                               param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise GatewayError(400, "prompt: empty", param="prompt")
    return prompt  # type: ignore[no-any-return]


def _infra_cause(req: CloseRequest) -> str | None:
    """The infrastructure cause of an ``infra_error`` close (``unspecified`` when not named), None for another close.

    Raises:
        GatewayError: 400 ``invalid_infra_cause``: a cause outside ``CLIENT_INFRA_CAUSES``, or a cause
            without ``infra_error: true``.
    """
    if not req.infra_error:
        if req.infra_cause is not None:
            raise GatewayError(400, f"infra_cause: given ({req.infra_cause!r:.60}) without infra_error: true; send "
                                    "both to close an episode whose infrastructure failed", param="infra_cause",
                               code="invalid_infra_cause")
        return None
    if req.infra_cause is None:
        return UNSPECIFIED_INFRA_CAUSE
    if req.infra_cause not in CLIENT_INFRA_CAUSES:
        raise GatewayError(400, f"infra_cause: {req.infra_cause!r:.60} is not a known cause; expected one of "
                                f"{', '.join(CLIENT_INFRA_CAUSES)}", param="infra_cause", code="invalid_infra_cause")
    return req.infra_cause


def _check_metrics(metrics: dict[str, float]) -> None:
    if len(metrics) > MAX_METRICS:
        raise GatewayError(400, f"metrics: at most {MAX_METRICS} entries, got {len(metrics)}", param="metrics")
    for key, value in metrics.items():
        if not key or len(key) > 100:
            raise GatewayError(400, f"metrics: key {key[:40]!r} must have 1-100 characters", param="metrics")
        if not math.isfinite(value):
            raise GatewayError(400, f"metrics.{key}: must be a finite number, got {value}", param=f"metrics.{key}")
