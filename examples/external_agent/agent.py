r"""A plain agent loop on the unmodified ``openai`` client: a stand-in for a team's own scaffold.

It knows nothing of posttrain (it imports nothing from it). It takes tasks from a JSONL file
(``{"task_id": ..., "messages": [...]}`` per line), asks the model, runs the ``calculator`` tool the
model calls, feeds the result back, and stops at the first reply without a tool call. Pointed at
posttrain's rollout gateway, every episode it runs becomes one training rollout; the only
gateway-specific line is the client's base URL, which names the episode::

    client = AsyncOpenAI(base_url=f"{gateway}/episodes/{episode_id}/v1", api_key=token)

and, at the end of an episode, one plain HTTP call that closes it (here with the task id, so the
run's verifier grades it; a scaffold with its own grader sends ``{"reward": r}`` instead).

The tool runs as a subprocess, by default inside posttrain's sandbox command
(``--tool-sandbox "python -m posttrain.envs.sandbox --exec --"``), as a team would run tools in its
own sandbox; pass ``--tool-sandbox ""`` for a plain subprocess.

Run (the gateway's URL and the run's token; ``posttrain run`` with ``gateway.agents > 0`` starts it
like this; ``posttrain run`` writes the URL, the token and the task file under ``runs/<run>/gateway/``
whatever ``gateway.agents``, and with ``gateway.port: 0``, as in ``configs/sao_gateway_cpu.yaml``,
the port is known only from the ``url`` file)::

    OPENAI_API_KEY=$(cat runs/sao-gateway/gateway/token) python examples/external_agent/agent.py \
        --gateway $(cat runs/sao-gateway/gateway/url) --model sao-gateway \
        --tasks runs/sao-gateway/gateway/tasks.jsonl --episodes 20

Exit status: 0 when at least one episode was closed and it did not stop at ``--max-errors``; 1 when
it stopped after ``--max-errors`` failed episodes, or when no episode succeeded (every one failed, or
it was stopped before the first was closed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import sys
import uuid

import httpx
from openai import APIConnectionError, APIStatusError, AsyncOpenAI

TOOLS = [{
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}]

CALCULATOR = "import sys; print(eval(sys.argv[1], {'__builtins__': {}}, {}))"
"""The tool's program: Python arithmetic, run in the sandbox (which bounds its time, memory and reach)."""


async def calculator(expression: str, sandbox: list[str], timeout_s: float) -> str:
    """Run the calculator on ``expression`` (in the sandbox command when given); its output or an error line."""
    argv = [*sandbox, os.path.abspath(sys.executable), "-I", "-c", CALCULATOR, expression]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return "error: the tool timed out"
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return f"error: {last[0]}"
    return out.decode(errors="replace").strip()


async def run_tool(name: str, arguments: str, sandbox: list[str], timeout_s: float) -> str:
    """One tool call's output (an error line for an unknown tool or bad arguments)."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        expression = json.loads(arguments).get("expression")
    except (json.JSONDecodeError, AttributeError):
        return "error: arguments must be a JSON object with an expression"
    if not isinstance(expression, str):
        return "error: expression must be a string"
    return await calculator(expression, sandbox, timeout_s)


async def episode(gateway: str, token: str, model: str, task: dict, args: argparse.Namespace,
                  http: httpx.AsyncClient) -> float | None:
    """One episode of ``task``: the agent loop, then the close call; returns the reward the gateway reports."""
    episode_id = uuid.uuid4().hex
    client = AsyncOpenAI(base_url=f"{gateway}/episodes/{episode_id}/v1", api_key=token, http_client=http,
                         max_retries=args.retries)
    messages = list(task["messages"])
    for _ in range(args.max_turns):
        reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls or reply.choices[0].finish_reason == "length":
            break
        for call in message.tool_calls:
            output = await run_tool(call.function.name, call.function.arguments, args.sandbox, args.tool_timeout_s)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    closed = await http.post(f"{gateway}/episodes/{episode_id}/reward", json={"task_id": task["task_id"]},
                             headers={"Authorization": f"Bearer {token}"})
    closed.raise_for_status()
    return closed.json().get("reward")


async def main(args: argparse.Namespace) -> int:
    """Run episodes until ``--episodes`` are done, ``--max-errors`` episodes failed, or SIGTERM.

    Prints one summary line; returns the exit status (module docstring): 1 after ``--max-errors`` or
    when no episode succeeded, else 0.
    """
    token = args.api_key or os.environ.get("OPENAI_API_KEY", "")
    with open(args.tasks, encoding="utf-8") as fh:
        tasks = [json.loads(line) for line in fh if line.strip()]
    rng = random.Random(args.seed)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    done, rewards, errors = 0, 0.0, 0
    budget = args.episodes
    gave_up = False

    def count_error(what: str, exc: Exception) -> None:
        """Count a failed episode; at ``--max-errors`` say so once and stop every worker."""
        nonlocal errors, gave_up
        errors += 1
        if errors >= args.max_errors and not gave_up:
            gave_up = True
            print(f"agent: stopping after {errors} {what} ({exc})", file=sys.stderr, flush=True)
            stopping.set()

    async def worker() -> None:
        nonlocal done, rewards, budget
        async with httpx.AsyncClient(timeout=args.timeout_s) as http:
            while not stopping.is_set() and (budget is None or budget > 0):
                if budget is not None:
                    budget -= 1
                try:
                    reward = await episode(args.gateway, token, args.model, rng.choice(tasks), args, http)
                except (APIConnectionError, httpx.TransportError) as exc:
                    count_error("connection errors", exc)
                    if not stopping.is_set():
                        await asyncio.sleep(1.0)
                    continue
                except (APIStatusError, httpx.HTTPStatusError) as exc:
                    print(f"agent: episode refused: {exc}", file=sys.stderr)
                    count_error("failed episodes", exc)
                    continue
                done += 1
                rewards += reward or 0.0

    workers = [asyncio.create_task(worker()) for _ in range(args.episodes_in_flight)]
    stop = asyncio.create_task(stopping.wait())
    # One future for all workers, awaited below whatever happens: a gather left unawaited after its
    # workers were cancelled was reported as "_GatheringFuture exception was never retrieved".
    finished = asyncio.gather(*workers, return_exceptions=True)
    await asyncio.wait([stop, finished], return_when=asyncio.FIRST_COMPLETED)
    for task in workers:
        task.cancel()
    outcomes = await finished
    stop.cancel()
    print(f"agent: {done} episodes, mean reward {rewards / max(done, 1):.3f}, {errors} errors", flush=True)
    for outcome in outcomes:  # an error the loop does not expect (a bad task line...) is a bug: shown whole
        if isinstance(outcome, Exception):
            raise outcome
    return 1 if gave_up or done == 0 else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gateway", required=True, help="the gateway's URL, http://HOST:PORT")
    p.add_argument("--model", required=True, help="the served model's name (GET /v1/models)")
    p.add_argument("--tasks", required=True, help="JSONL file of {task_id, messages}")
    p.add_argument("--api-key", default=None, help="the run's token (default: $OPENAI_API_KEY)")
    p.add_argument("--episodes", type=int, default=None, help="stop after this many episodes (default: until SIGTERM)")
    p.add_argument("--episodes-in-flight", type=int, default=8, help="concurrent episodes")
    p.add_argument("--max-turns", type=int, default=3, help="model calls per episode")
    p.add_argument("--seed", type=int, default=0, help="task order seed")
    p.add_argument("--tool-sandbox", default=f"{shlex.quote(sys.executable)} -m posttrain.envs.sandbox --exec --",
                   help="command prefix the tool runs under ('' for a plain subprocess)")
    p.add_argument("--tool-timeout-s", type=float, default=30.0, help="longest tool call (seconds)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest HTTP request (seconds)")
    p.add_argument("--retries", type=int, default=5, help="retries of a refused or failed request (429, 5xx)")
    p.add_argument("--max-errors", type=int, default=20, help="stop after this many failed episodes")
    args = p.parse_args(argv)
    args.sandbox = shlex.split(args.tool_sandbox)
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
