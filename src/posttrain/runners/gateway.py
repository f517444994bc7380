"""The gateway in ``posttrain run``: start ``posttrain gateway`` beside the learner, and the example agents.

With ``gateway.mode`` other than ``disabled`` the SAO runner starts one gateway process (``gw0``) on
the run's Redis, and with ``gateway.agents > 0`` that many example agent processes
(``gateway.agent_script``, ``examples/external_agent/agent.py`` by default) as its traffic. It writes,
whatever ``gateway.agents`` (0: the user's own agents):

* ``<run>/gateway/token``: the run's bearer token (created once, mode 0600; ``gateway.token_env``
  in the environment wins), handed to the gateway in ``gateway.token_env`` and to the agents as
  ``OPENAI_API_KEY``;
* ``<run>/gateway/url``: where the gateway listens (``gateway.port: 0`` picks a free port); it
  writes the file as soon as its socket listens, so agents may connect while it still waits for
  the learner's first weights (their requests wait in the listen queue);
* ``<run>/gateway/tasks.jsonl``: the run's training tasks as the environment poses them
  (``{"task_id", "messages"}``), written before the gateway starts: the agents' work list (the
  example's ``--tasks``); they close each episode with its task id and, with ``gateway.verifier:
  environment``, the gateway's verifier grades it (it accepts only these training task ids);
* logs: ``<run>/logs/gateway-gw0.log`` and ``<run>/logs/agent-<i>.log``.

``stop_agents`` ends the agents (SIGTERM, then SIGKILL after a grace period) before the runner sets
the run's stop key, which stops the gateway like a generator.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.runtime import RunContext

GATEWAY_ID = "gw0"
"""The id of the gateway ``posttrain run`` starts (heartbeat, stats, ``Rollout.generator_id``)."""

URL_WAIT_S = 120.0
"""Longest wait (seconds) for the gateway's URL file after its start."""


@dataclass
class GatewayProcesses:
    """The gateway process ``posttrain run`` started, its URL, token and task file, and the example agents.

    Attributes:
        gateway: The ``posttrain gateway`` process.
        url: ``http://HOST:PORT``.
        token: The run's bearer token.
        tasks: ``<run>/gateway/tasks.jsonl``, the training tasks it serves (``write_agent_tasks``).
        agents: The example agent processes.
    """

    gateway: subprocess.Popen[bytes]
    url: str
    token: str
    tasks: Path
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)


def gateway_dir(ctx: RunContext) -> Path:
    """``<run>/gateway``: token, URL and the task file (``tasks.jsonl``) of the agents, ours or the user's."""
    return ctx.run_dir / "gateway"


def run_token(ctx: RunContext) -> str:
    """The run's bearer token: ``gateway.token_env`` if set, else ``<run>/gateway/token`` (created once, mode 0600)."""
    given = os.environ.get(ctx.config.gateway.token_env)
    if given:
        return given
    path = gateway_dir(ctx) / "token"
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token


def write_agent_tasks(ctx: RunContext) -> Path:
    """``<run>/gateway/tasks.jsonl``: each training task's id and the messages its environment opens with."""
    env = ctx.environment()
    path = gateway_dir(ctx) / "tasks.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for task in ctx.tasks("train"):
            episode = env.start(task)
            try:
                fh.write(json.dumps({"task_id": task.task_id, "messages": episode.messages()}) + "\n")
            finally:
                episode.close()
    return path


def start_gateway(ctx: RunContext, redis_url: str, config_path: Path) -> GatewayProcesses:
    """Write the task file, start ``posttrain gateway`` and, with ``gateway.agents > 0``, the example agents.

    The task file is written whatever ``gateway.agents``: the user's own agents read it too (module docstring).

    Raises:
        RuntimeError: the gateway exited, or wrote no URL within ``URL_WAIT_S`` seconds (the log's tail
            is in the message).
        FileNotFoundError: ``gateway.agents > 0`` and ``gateway.agent_script`` does not exist.
    """
    cfg = ctx.config.gateway
    if cfg.agents and not Path(cfg.agent_script).is_file():
        raise FileNotFoundError(f"gateway.agent_script: {cfg.agent_script} not found (run from the repository root, "
                                "or set it)")
    token = run_token(ctx)
    tasks = write_agent_tasks(ctx)
    logs = ctx.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    url_file = gateway_dir(ctx) / "url"
    url_file.unlink(missing_ok=True)
    log_path = logs / f"gateway-{GATEWAY_ID}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "gateway", str(config_path), "--gateway-id", GATEWAY_ID,
         "--url-file", str(url_file)],
        env={**os.environ, "REDIS_URL": redis_url, cfg.token_env: token},
        stdout=log_path.open("ab"), stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + URL_WAIT_S
    while not url_file.is_file():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
            raise RuntimeError(f"the gateway did not start (exit status {proc.returncode}); {log_path} ends with:\n{tail}")
        time.sleep(0.1)
    out = GatewayProcesses(proc, url_file.read_text(encoding="utf-8").strip(), token, tasks)
    if cfg.agents:
        out.agents = start_agents(ctx, out.url, token, tasks)
    return out


def start_agents(ctx: RunContext, url: str, token: str, tasks: Path) -> list[subprocess.Popen[bytes]]:
    """``gateway.agents`` example agent processes against ``url``, seeded ``seed * 1000 + i``; logs in ``<run>/logs``."""
    cfg, gen = ctx.config.gateway, ctx.config.generator
    logs = ctx.run_dir / "logs"
    sandbox = f"{sys.executable} -m posttrain.envs.sandbox --exec --" if cfg.agent_sandbox else ""
    procs = []
    for i in range(cfg.agents):
        cmd = [sys.executable, cfg.agent_script, "--gateway", url, "--model", cfg.model_name or ctx.config.run_name,
               "--tasks", str(tasks), "--episodes-in-flight", str(cfg.agent_episodes_in_flight),
               "--max-turns", str(gen.max_turns), "--seed", str(ctx.config.seed * 1000 + i), "--tool-sandbox", sandbox]
        procs.append(subprocess.Popen(cmd, env={**os.environ, "OPENAI_API_KEY": token},
                                      stdout=(logs / f"agent-{i}.log").open("ab"), stderr=subprocess.STDOUT))
    return procs


def stop_agents(procs: list[subprocess.Popen[bytes]], grace_s: float = 15.0) -> None:
    """SIGTERM each agent, wait up to ``grace_s`` seconds in all, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
