"""The gateway process: ``posttrain gateway CONFIG`` (``REDIS_URL`` and the run's token in the environment).

A generator whose episodes come from outside. It is built from the generator's own parts and
behaves as one towards the learner:

* a heartbeat under its id (``gw0`` by default), so the learner counts it alive and returns its
  admission tickets at once if it dies;
* it waits for the learner's first weights and policy-version key (``generator.worker``), then
  builds the engine (``generator.engine``: ``vllm`` or ``hf``) on the latest version;
* the ``WeightWatcher`` reloads the engine between requests when the learner publishes, publishes
  the gateway's stats in the run's telemetry hash, and watches the run's stop key;
* admission: one ticket per open segment through the ``AsyncTicketGate``, settled by the
  ``RolloutSender`` that puts each closed episode's rollouts on the stream;
* an engine that runs whole batches (``hf``) gets the batching gate (``gateway.batch_wait_ms``,
  ``posttrain.generator.gateway.batching``), so the open episodes' turns share its batches;
* uvicorn serves the FastAPI app (``gateway.app``) on ``gateway.host:gateway.port`` on the same
  event loop; a reaper abandons idle episodes every second.

On stop (the run's stop key, SIGTERM or SIGINT) the server stops taking requests, open episodes
are abandoned (tickets released, counted) and rollouts being sent are sent first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
import uvicorn

from posttrain.config import ConfigError, RunConfig
from posttrain.config.roles import async_rl_settings
from posttrain.generator.gateway.app import build_app
from posttrain.generator.gateway.episodes import EpisodeBook
from posttrain.generator.gateway.service import GatewayService, GatewaySettings
from posttrain.generator.gateway.stats import GatewayStats
from posttrain.generator.gateway.verifier import EnvironmentVerifier
from posttrain.generator.inflight import InFlightEpisodes
from posttrain.generator.sender import RolloutSender
from posttrain.generator.watcher import WeightWatcher
from posttrain.generator.worker import first_version, say_goodbye, wait_for_learner
from posttrain.inference.factory import make_engine
from posttrain.inference.metering import MeteredEngine
from posttrain.models.hf import load_tokenizer
from posttrain.rollout.admission import AsyncTicketGate, RedisAdmissionController
from posttrain.rollout.liveness import Heartbeat
from posttrain.rollout.redis_streams import RedisStreamQueue, check_reachable, connect
from posttrain.runtime import RunContext
from posttrain.weight_sync.announce import WeightAnnouncements
from posttrain.weight_sync.factory import open_weight_store

log = logging.getLogger("posttrain.gateway")

REAP_EVERY_S = 1.0
"""Seconds between two looks for idle episodes."""

LISTEN_BACKLOG = 2048
"""Connections the kernel queues before the server accepts them (uvicorn's default)."""

MIN_TOKEN_CHARS = 16
"""Shortest bearer token the gateway accepts (characters)."""


@dataclass
class GatewaySummary:
    """What a gateway did (from ``GatewayStats.snapshot``)."""

    gateway_id: str
    stats: dict[str, float]


def gateway_token(config: RunConfig, environ: dict[str, str] | None = None) -> str:
    """The run's bearer token from the variable ``gateway.token_env``.

    Raises:
        ConfigError: the variable is unset, or shorter than ``MIN_TOKEN_CHARS`` characters.
    """
    env = os.environ if environ is None else environ
    name = config.gateway.token_env
    token = env.get(name, "")
    if len(token) < MIN_TOKEN_CHARS:
        what = "not set" if not token else f"{len(token)} characters"
        raise ConfigError(f"{name}: the gateway's bearer token is {what}; set at least {MIN_TOKEN_CHARS} random "
                          f"characters (gateway.token_env names the variable)")
    return token


def settings_for(config: RunConfig, gateway_id: str) -> GatewaySettings:
    """The ``GatewaySettings`` of a run config (limits from ``generator``, rules from ``gateway``)."""
    gen, gw = config.generator, config.gateway
    return GatewaySettings(
        model_name=gw.model_name or config.run_name, generator_id=gateway_id, max_new_tokens=gen.max_new_tokens,
        max_episode_tokens=gen.max_episode_tokens, temperature=gen.temperature, top_p=gen.top_p,
        edited_history=gw.edited_history, admission_wait_s=gw.admission_wait_s, env_name=config.data.env,
        wrap_tool_results=gw.wrap_tool_results,
    )


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: the gateway stops on its own ``stopping`` event."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing (uvicorn would re-raise the signal after shutdown and skip our clean-up)."""
        yield


class GatewayBindError(OSError):
    """The gateway's address cannot be bound (taken, or not this machine's); the message names it."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), for uvicorn to serve on.

    It is made with ``IPPROTO_TCP`` named: accepted connections inherit the listening socket's
    protocol number, and asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on sockets
    whose protocol is TCP. With protocol 0, uvicorn's two writes per response (head, then body)
    left the body waiting for the client's delayed ACK: about 40 ms per request on a kept-alive
    connection (issue 33, the overhead benchmark).

    Raises:
        GatewayBindError: the address cannot be bound (one line naming it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        raise GatewayBindError(f"gateway: cannot listen on {host}:{port} ({exc.strerror or exc}); set gateway.port "
                               "or --port") from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _reap(service: GatewayService, stopping: asyncio.Event) -> None:
    while not stopping.is_set():
        service.reap()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), REAP_EVERY_S)


async def serve_gateway(config: RunConfig, gateway_id: str, redis_url: str, token: str, *, seed: int = 0,
                        host: str | None = None, port: int | None = None, url_file: Path | None = None,
                        sock: socket.socket | None = None) -> GatewaySummary:
    """Run the gateway until the run's stop key, SIGTERM or SIGINT (module docstring).

    Args:
        config: The run config (``technique: sao``).
        gateway_id: Its name in rollouts, stats and the heartbeat (``gw0``).
        redis_url: The run's Redis.
        token: The run's bearer token.
        seed: Engine sampling seed (requests may carry their own).
        host: Listen address; None: ``gateway.host``.
        port: TCP port; None: ``gateway.port`` (0: a free one).
        url_file: Where to write ``http://HOST:PORT`` as soon as the socket listens (replaced atomically);
            requests sent before the engine is ready wait in the listen queue.
        sock: A socket from ``listen_socket`` to serve on (``host`` and ``port`` are then unused); it is
            closed when the gateway stops. None: bind one here.

    Returns:
        The gateway's final stats.

    Raises:
        posttrain.config.ConfigError: the technique is not sao.
        posttrain.rollout.queue.RedisUnreachableError: Redis does not answer (checked first).
        TimeoutError: no weights or version key within ``FIRST_WEIGHTS_TIMEOUT_S``.
        GatewayBindError: the address cannot be bound.
    """
    if config.technique != "sao":
        raise ConfigError(f"technique: the gateway serves SAO runs (one rollout per episode), got {config.technique!r}")
    ctx = RunContext(config)
    client = connect(redis_url, reconnect_window_s=config.queue.reconnect_window_s)
    check_reachable(client, redis_url, config.queue.reconnect_window_s)
    heartbeat = Heartbeat(client, ctx.keys, gateway_id, config.generator.heartbeat_ttl_s).start()
    try:
        return await _serve(config, ctx, gateway_id, redis_url, token, seed, host, port, url_file, client, sock)
    finally:
        with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
            heartbeat.stop()


async def _serve(config: RunConfig, ctx: RunContext, gateway_id: str, redis_url: str, token: str, seed: int,
                 host: str | None, port: int | None, url_file: Path | None, client: redis.Redis,
                 sock: socket.socket | None) -> GatewaySummary:
    gw = config.gateway
    if sock is None:  # a taken port fails before any wait
        sock = listen_socket(host or gw.host, gw.port if port is None else port)
    try:
        if url_file is not None:  # clients may connect now: they wait in the listen queue until the engine serves
            tmp = url_file.with_suffix(".tmp")
            tmp.write_text(_url(sock) + "\n", encoding="utf-8")
            tmp.replace(url_file)
        return await _serve_on(config, ctx, gateway_id, redis_url, token, seed, sock, url_file, client)
    finally:
        sock.close()


async def _serve_on(config: RunConfig, ctx: RunContext, gateway_id: str, redis_url: str, token: str, seed: int,
                    sock: socket.socket, url_file: Path | None, client: redis.Redis) -> GatewaySummary:
    settings, gen, gw = async_rl_settings(config), config.generator, config.gateway
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    store = open_weight_store(ctx)
    version = await first_version(store, ctx.weights_dir, config.weights_timeout_s, stopping)
    if version is None or not await wait_for_learner(client, ctx.keys, stopping):
        return GatewaySummary(gateway_id, GatewayStats().snapshot())
    stats = GatewayStats()
    raw_engine = make_engine(
        gen.engine, store.path_for(version), policy_version=version, seed=seed,
        max_model_len=gen.max_episode_tokens + gen.max_new_tokens, kv_cache_gib=gen.vllm_kv_cache_gib,
        max_batch=max(gen.episodes_in_flight, 1),
    )
    batch_wait_s = gw.batch_wait_ms / 1000 if getattr(raw_engine, "whole_batches", False) else 0.0
    if batch_wait_s > 0:  # the gate hands the engine whole groups: its own batching window would only add latency
        raw_engine.batch_wait_s = 0.0  # type: ignore[attr-defined]
    engine = MeteredEngine(raw_engine, stats)
    queue = RedisStreamQueue(client, ctx.keys, consumer=f"gateway-{gateway_id}", maxlen=config.queue.maxlen, retries=0)
    admission = RedisAdmissionController(client, ctx.keys, batch_size=settings.batch_rollouts,
                                         max_staleness=settings.max_staleness, lease_s=gen.admission_lease_s,
                                         retries=0, owner=gateway_id)
    gate = AsyncTicketGate(admission)
    announcements = WeightAnnouncements(redis_url, ctx.keys)
    await announcements.subscribe()
    sender = RolloutSender(queue, admission, stats, gateway_id)
    verifier = (EnvironmentVerifier(ctx.environment(), ctx.tasks("train"), gen.episode_timeout_s)
                if gw.verifier == "environment" else None)
    service = GatewayService(settings_for(config, gateway_id), engine, load_tokenizer(ctx.tokenizer_dir), gate,
                             admission, sender, stats, EpisodeBook(gw.idle_timeout_s, gen.episode_timeout_s), verifier,
                             batch_wait_s=batch_wait_s)
    server = _Server(uvicorn.Config(build_app(service, token, gw.max_request_bytes), log_level="warning",
                                    access_log=False, lifespan="off"))
    watcher = WeightWatcher(
        engine, store, version, client, ctx.keys, announcements, gate, InFlightEpisodes(), stats, gateway_id,
        max_staleness=settings.max_staleness, abort_stale_episodes=False, stopping=stopping,
        store_timeout_s=config.weights_timeout_s,
    )
    stats.mark_started()
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="gateway-http")
    others = [asyncio.create_task(watcher.run(), name="gateway-weights"),
              asyncio.create_task(_reap(service, stopping), name="gateway-reaper")]
    try:
        while not server.started:
            if serving.done():
                raise OSError("the gateway's HTTP server stopped before it listened")
            await asyncio.sleep(0.05)
        log.info("gateway %s: serving %s at %s (policy version %d)", gateway_id,
                 settings_for(config, gateway_id).model_name, _url(sock), version)
        stopped = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait([serving, *others, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        for task in done:
            if task is not stopped and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        stopping.set()
        service.stopping.set()  # requests waiting for a ticket end with 503; no new turn starts
        server.should_exit = True
        await asyncio.wait([serving], timeout=10.0)  # in-flight requests finish first
        if not serving.done():
            serving.cancel()
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        abandoned = service.shutdown()
        if abandoned:
            log.info("gateway %s: stopping; %d open episode(s) abandoned", gateway_id, abandoned)
        await sender.drain()
        await announcements.close()
        engine.close()
        say_goodbye(client, ctx.keys, gateway_id, stats)
    return GatewaySummary(gateway_id, stats.snapshot())


def run_gateway(config: RunConfig, gateway_id: str, redis_url: str, token: str, **options: object) -> GatewaySummary:
    """``serve_gateway`` on a new event loop, with one torch thread on a CPU machine.

    Raises:
        As ``serve_gateway``.
    """
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    t0 = time.monotonic()
    summary = asyncio.run(serve_gateway(config, gateway_id, redis_url, token, **options))  # type: ignore[arg-type]
    log.info("gateway %s: stopped after %.0f s", gateway_id, time.monotonic() - t0)
    return summary
