"""The gateway's routes and service in one process: the ``openai`` client over an in-process transport.

The app, the service, the tiny model's ``hf`` engine and the admission and stream twins in memory
are real; the HTTP hop is httpx's ASGI transport instead of a socket (the real server and the
``posttrain gateway`` process are in ``tests/integration/test_gateway.py``). Where a test needs the
policy to write a tool call, a ``ScriptedEngine`` stands in for sampling: it returns the token ids
of given texts, so the gateway's translation, history and verifier paths see the turns an SFT-trained
policy writes. Everything asserted is a count, a token id or a field of a response.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from fixtures_models import TinyModel
from posttrain.envs.synthetic.tool import SyntheticToolEnv, reference_episode
from posttrain.generator.gateway.app import build_app
from posttrain.generator.gateway.episodes import EpisodeBook
from posttrain.generator.gateway.service import GatewayService, GatewaySettings
from posttrain.generator.gateway.stats import GatewayStats
from posttrain.generator.gateway.verifier import EnvironmentVerifier
from posttrain.generator.sender import RolloutSender
from posttrain.inference.base import GenerationRequest, GenerationResult
from posttrain.inference.factory import make_engine
from posttrain.models.hf import load_tokenizer
from posttrain.rollout.admission import AsyncTicketGate, MemoryAdmissionController
from posttrain.rollout.memory_queue import MemoryPolicyVersionStore, MemoryRolloutQueue

TOKEN = "t" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class ScriptedEngine:
    """Returns the token ids of the next scripted text plus the end-of-turn token, logprob -0.25 each."""

    def __init__(self, tokenizer, stop_id: int, texts: list[str], policy_version: int = 0) -> None:
        self.tokenizer, self.stop_id, self.texts = tokenizer, stop_id, list(texts)
        self.policy_version = policy_version
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        ids = list(self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)) + [self.stop_id]
        return GenerationResult(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop",
                                policy_version=self.policy_version)

    async def update_weights(self, weights_dir: Path, policy_version: int) -> None:
        self.policy_version = policy_version

    def close(self) -> None:
        pass


@dataclass
class Rig:
    service: GatewayService
    http: httpx.AsyncClient
    queue: MemoryRolloutQueue
    admission: MemoryAdmissionController

    def client(self, episode_id: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"http://gw/episodes/{episode_id}/v1", api_key=TOKEN, http_client=self.http,
                                  max_retries=0)

    async def close(self, episode_id: str, **body) -> httpx.Response:
        return await self.http.post(f"/episodes/{episode_id}/reward", json=body, headers=AUTH)


@pytest.fixture(scope="module")
def hf_engine(tiny_model: TinyModel) -> Iterator:
    engine = make_engine("hf", tiny_model.path, max_model_len=512)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def tool_env() -> SyntheticToolEnv:
    return SyntheticToolEnv()


def _rig(tiny_model: TinyModel, engine, *, verifier=None, rule="split", capacity_batch=4, max_new_tokens=16,
         max_episode_tokens=256, admission_wait_s=2.0, max_request_bytes=1 << 16) -> Rig:
    tok = load_tokenizer(tiny_model.path)
    stats = GatewayStats()
    admission = MemoryAdmissionController(MemoryPolicyVersionStore(), batch_size=capacity_batch, max_staleness=0)
    queue = MemoryRolloutQueue(consumer="learner")
    sender = RolloutSender(queue, admission, stats, "gw0")
    settings = GatewaySettings("tiny", "gw0", max_new_tokens, max_episode_tokens, edited_history=rule,
                               admission_wait_s=admission_wait_s, env_name="synthetic_tool")
    service = GatewayService(settings, engine, tok, AsyncTicketGate(admission), admission, sender, stats,
                             EpisodeBook(60, 600), verifier)
    app = build_app(service, TOKEN, max_request_bytes)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gw")
    return Rig(service, http, queue, admission)


def test_a_tool_calling_episode_is_the_environment_loops_tokens_and_the_verifier_grades_it(tiny_model, tool_env):
    """The reference episode of a synthetic_tool task, written by the scripted policy, through the gateway.

    The agent answers the call with the calculator's output; the rollout's token ids equal those of
    ``run_episode`` (the environment loop) on the same turns, and the verifier's replay gives 1.0.
    """
    from posttrain.chat.format import ChatFormat
    from posttrain.episodes.runner import EpisodeLimits, run_episode

    tok = load_tokenizer(tiny_model.path)
    stop = ChatFormat.for_tokenizer(tok).stop_token_id
    task = tool_env.tasks("train", 1)[0]
    turns = reference_episode(task)
    engine = ScriptedEngine(tok, stop, turns, policy_version=3)
    rig = _rig(tiny_model, engine, verifier=EnvironmentVerifier(tool_env, [task], 30.0), max_new_tokens=96)

    async def go() -> tuple[dict, list]:
        client = rig.client("ep-tool")
        messages = tool_env.start(task).messages()
        first = await client.chat.completions.create(model="tiny", messages=messages, tools=[{"type": "function",
                                                     "function": {"name": "calculator"}}])
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "calculator"
        assert json.loads(call.function.arguments) == {"expression": task.metadata["expression"].replace(" ", "")}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": task.reference}]
        second = await client.chat.completions.create(model="tiny", messages=messages)
        assert second.choices[0].message.content == turns[1]
        closed = (await rig.close("ep-tool", task_id=task.task_id)).json()
        return closed, rig.queue.get_batch(4, 1.0)

    closed, entries = asyncio.run(go())
    assert closed["reward"] == 1.0 and closed["rollouts"][0]["sent"] is True
    (entry,) = entries
    rollout = entry.rollout
    env_rollout = asyncio.run(run_episode(ScriptedEngine(tok, stop, turns, 3), tok, tool_env, task,
                                          EpisodeLimits(max_turns=3, max_new_tokens=96, max_episode_tokens=256)))
    assert list(rollout.token_ids) == list(env_rollout.token_ids)
    assert list(rollout.action_mask) == list(env_rollout.action_mask)
    assert rollout.reward == env_rollout.reward == 1.0
    assert rollout.turn_policy_versions == [3, 3] and rollout.metrics["correct"] == 1.0
    assert rollout.metrics["tool_calls"] == 1.0 and rollout.env_name == "synthetic_tool"
    assert rig.admission.state().consumed == 1 and rig.admission.state().in_flight == 0


def test_completions_extend_the_text_so_far_and_tokenise_only_what_is_new(tiny_model, hf_engine):
    tok = load_tokenizer(tiny_model.path)
    rig = _rig(tiny_model, hf_engine, max_new_tokens=8)

    async def go() -> tuple[list, list, dict]:
        client = rig.client("ep-text")
        one = await client.completions.create(model="tiny", prompt="Question: 2 + 3 =", extra_body={"return_token_ids": True})
        text = "Question: 2 + 3 =" + one.choices[0].text + "\nQuestion: 4 + 4 ="
        two = await client.completions.create(model="tiny", prompt=text, logprobs=1, extra_body={"return_token_ids": True})
        ids = list(two.choices[0].model_extra["prompt_token_ids"]) + list(two.choices[0].model_extra["token_ids"])
        three = await client.completions.create(model="tiny", prompt=ids + [tok.convert_tokens_to_ids("<|im_start|>")],
                                                extra_body={"return_token_ids": True})
        closed = (await rig.close("ep-text", reward=0.5)).json()
        batch = rig.queue.get_batch(4, 1.0)
        return [one, two, three], batch, closed

    (one, two, three), (entry,), closed = asyncio.run(go())
    first = one.choices[0].model_extra
    assert first["prompt_token_ids"] == tok("Question: 2 + 3 =")["input_ids"]
    second = two.choices[0].model_extra
    held = first["prompt_token_ids"] + first["token_ids"]
    assert second["prompt_token_ids"][:len(held)] == held  # never re-tokenised
    assert second["prompt_token_ids"][len(held):] == tok.encode("\nQuestion: 4 + 4 =", add_special_tokens=False)
    assert len(two.choices[0].logprobs.token_logprobs) == len(second["token_ids"])
    third = three.choices[0].model_extra
    assert list(entry.rollout.token_ids) == third["prompt_token_ids"] + third["token_ids"]
    assert entry.rollout.reward == 0.5 and closed["rollouts"][0]["num_turns"] == 3


def test_a_streamed_turn_is_one_event_and_the_same_record(tiny_model, hf_engine):
    rig = _rig(tiny_model, hf_engine, max_new_tokens=6)

    async def go() -> tuple[str, list]:
        client = rig.client("ep-stream")
        stream = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        await rig.close("ep-stream", reward=0.0)
        return text, chunks

    text, chunks = asyncio.run(go())
    assert chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    (entry,) = rig.queue.get_batch(4, 1.0)
    assert entry.rollout.num_action_tokens == chunks[-1].usage.completion_tokens


def test_infra_error_close_sends_nothing_and_counts_in_the_runs_infra_metrics_and_bound_by_the_clients_cause(
        tiny_model, hf_engine):
    """Two episodes whose client's sandbox failed: one closed naming its cause (tool_killed), one naming none
    (unspecified). Nothing is sent, the tickets come back, and each counts once by cause in the admission
    counters the learner reads: the run's infra/* metrics, the summary's row and the share bound
    (generator.max_infra_error_share), as our own generators' failures do; neither is re-issued (the client
    retries). A cause outside the list, or a cause without infra_error, is a one-line 400 that closes nothing."""
    from posttrain.learner.liveness import InfraShareBound
    from posttrain.rollout.infra import infra_metrics
    from posttrain.runners.common import infra_row

    rig = _rig(tiny_model, hf_engine, max_new_tokens=4)

    async def go() -> tuple[dict, httpx.Response, httpx.Response, dict]:
        for episode in ("ep-infra", "ep-other"):
            await rig.client(episode).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        assert rig.admission.state().in_flight == 2
        first = (await rig.close("ep-infra", infra_error=True, infra_cause="tool_killed")).json()
        unknown = await rig.close("ep-other", infra_error=True, infra_cause="disk_full")
        no_flag = await rig.close("ep-other", infra_cause="tool_killed", reward=1.0)
        assert rig.admission.state().in_flight == 1  # both refused: the episode is still open
        second = (await rig.close("ep-other", infra_error=True)).json()
        return first, unknown, no_flag, second

    first, unknown, no_flag, second = asyncio.run(go())
    assert first["status"] == "infra_error" and first["rollouts"] == [] and first["infra_cause"] == "tool_killed"
    assert second["infra_cause"] == "unspecified"
    for refused in (unknown, no_flag):
        error = refused.json()["error"]
        assert refused.status_code == 400 and (error["code"], error["param"]) == ("invalid_infra_cause", "infra_cause")
        assert "\n" not in error["message"]
    assert "'disk_full' is not a known cause; expected one of sandbox_error," in unknown.json()["error"]["message"]
    state = rig.admission.state()
    assert (state.in_flight, state.consumed, state.released_total) == (0, 0, 2)
    assert rig.queue.get_batch(4, 0.1) == [] and rig.service.stats.infra_errors == 2
    assert state.infra_by_cause == {"tool_killed": 1, "unspecified": 1}
    assert (state.client_retry_total, state.reissued_total, state.abandoned_total) == (2, 0, 0)
    assert rig.admission.take_reissued() is None
    metrics = infra_metrics(state)
    assert (metrics["infra/errors"], metrics["infra/tool_killed"], metrics["infra/left_to_client"]) == (2.0, 1.0, 2.0)
    assert infra_row(metrics) == "2 (tool_killed 1, unspecified 1); 0 re-issued, 0 given up, 2 left to its client (gateway)"
    reason = InfraShareBound(rig.admission.state, max_share=0.25, min_episodes=2).check()
    assert reason is not None and reason.startswith(
        "2 of 2 finished episodes failed for the infrastructure (tool_killed 1, unspecified 1): 100% > "
        "generator.max_infra_error_share=0.25")


def test_a_repeated_close_returns_the_first_answer_and_sends_nothing_twice(tiny_model, hf_engine):
    rig = _rig(tiny_model, hf_engine, max_new_tokens=4)

    async def go() -> tuple[dict, dict, httpx.Response]:
        await rig.client("ep-twice").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        first = (await rig.close("ep-twice", reward=1.0)).json()
        again = (await rig.close("ep-twice", reward=0.0)).json()
        late = await rig.http.post("/episodes/ep-twice/v1/chat/completions", headers=AUTH,
                                   json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
        return first, again, late

    first, again, late = asyncio.run(go())
    assert again["repeated"] is True and again["rollouts"] == first["rollouts"] and again["reward"] == 1.0
    assert len(rig.queue.get_batch(4, 0.1)) == 1
    assert late.status_code == 404 and late.json()["error"]["code"] == "episode_closed"


def test_no_capacity_gives_429_and_opens_nothing_a_busy_episode_409_a_big_body_413(tiny_model, hf_engine):
    rig = _rig(tiny_model, hf_engine, capacity_batch=1, admission_wait_s=0.2, max_new_tokens=4,
               max_request_bytes=2048)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        await rig.client("ep-a").chat.completions.create(**body)  # takes the one ticket (capacity 1)
        full = await rig.http.post("/episodes/ep-b/v1/chat/completions", json=body, headers=AUTH)
        episode = rig.service.book.get("ep-a")
        async with episode.lock:  # a request of ep-a being served
            busy = await rig.http.post("/episodes/ep-a/v1/chat/completions", json=body, headers=AUTH)
        big = await rig.http.post("/episodes/ep-a/v1/chat/completions", headers=AUTH,
                                  json={**body, "messages": [{"role": "user", "content": "y" * 4096}]})
        return full, busy, big

    full, busy, big = asyncio.run(go())
    assert full.status_code == 429 and full.json()["error"]["code"] == "admission_full"
    assert full.headers["retry-after"] == "1" and rig.service.book.get("ep-b") is None
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "episode_busy"
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    assert rig.admission.state().in_flight == 1 and rig.service.stats.admission_timeouts == 1


class FailingEngine(ScriptedEngine):
    """An engine whose every call fails (a crashed vLLM worker, say)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(None, 0, [])
        self.error = error

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise self.error


@pytest.mark.parametrize("error, code", [(RuntimeError("worker died"), "engine_error"),
                                         (KeyError("a bug"), "internal_error")])
def test_an_engine_failure_is_a_500_in_the_error_shape_and_opens_nothing(tiny_model, error, code):
    rig = _rig(tiny_model, FailingEngine(error))

    async def go() -> httpx.Response:
        return await rig.http.post("/episodes/ep-fail/v1/chat/completions", headers=AUTH,
                                   json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]})

    reply = asyncio.run(go())
    assert reply.status_code == 500 and reply.json()["error"]["code"] == code
    assert reply.json()["error"]["type"] == "server_error"
    assert rig.service.book.get("ep-fail") is None  # a later request opens it afresh
    state = rig.admission.state()
    assert state.in_flight == 0 and state.released_total == 1
