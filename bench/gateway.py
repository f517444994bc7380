"""Gateway overhead: episodes through the rollout gateway (HTTP, the openai client) against direct engine calls.

Same tiny model, same engine kind, same episodes: each of ``C`` concurrent episodes runs ``--turns`` turns of
``--tokens`` sampled tokens (the untrained model rarely samples its end-of-turn token, so nearly every turn is
full), a short user message between turns. **direct**: the turns are ``engine.generate`` calls in this process, on
the token ids a generator would send (the prompt rendered once, each new message appended as observation tokens).
**gateway**: a real ``posttrain gateway`` process (embedded Redis, admission, the stream) serves them to the
``openai`` client in this process; every episode is closed with a reward call, so its rollout is on the stream
before the clock stops. Reported per concurrency (medians over rounds, the two paths alternating): wall seconds
per generated token and gateway / direct (target: at most 1.2x); the CPU seconds per token of each side (the direct
process; the gateway process and, apart, the client) and the requests per engine batch (the ``hf`` engine runs
padded batches of what has arrived, so requests that arrive spread out make smaller batches). Two core layouts, each
measured in the same command (rounds alternate between them): **shared**, every process on every core this process
may use, so the client's HTTP and JSON work competes with the engine as an agent on the inference host would; and
**split** (measured too by default where at least 2 cores are allowed), the engine side on ``--engine-cores`` and the agent on
the disjoint ``--agent-cores``, as a production agent runs in its own pod. In the split layout the engine gets the
same cores in both paths: the gateway process and its embedded Redis stay on the engine cores; this process, which
runs the direct engine and the client in turn, moves to the engine cores for each direct round and to the agent
cores for each gateway round (every thread, ``os.sched_setaffinity`` on each task of ``/proc/<pid>/task``; new
threads inherit it). On a CPU machine both engines run torch on one thread (the gateway process sets it, as
``posttrain gateway`` does; this process sets it for the direct engine), so neither side's engine spins a second
thread against the other processes. The gateway runs with its default ``gateway.batch_wait_ms`` (its batching gate).

Run: ``.venv/bin/python -m bench.gateway`` (70 s on 2 cores at load 2-3, both layouts; ``hf`` engine),
``--engine vllm`` on a GPU; ``--layouts shared`` for the old layout alone.
"""

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import redis
import torch

from bench import common
from posttrain.chat.format import ChatFormat
from posttrain.config import load_config
from posttrain.inference.base import GenerationRequest
from posttrain.inference.factory import make_engine
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.rollout.redis_streams import RedisPolicyVersionStore
from posttrain.runners.common import prepare
from posttrain.runtime import RunContext
from posttrain.services.embedded_redis import EmbeddedRedis
from posttrain.weight_sync.factory import open_weight_store

MODEL = "bench-gateway"
FIRST = "Compute 17 + 25 using the calculator."
FOLLOW_UP = "Go on."


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Layout:
    """Where the processes run: ``engine`` cores for the engine side (the direct engine's rounds, the gateway
    process, its Redis), ``agent`` cores for the ``openai`` client's rounds; equal sets in the shared layout."""

    name: str
    engine: frozenset[int]
    agent: frozenset[int]


def parse_cores(text: str, field: str) -> frozenset[int]:
    """CPU ids from a ``taskset -c`` style list (``"0"``, ``"0,2"``, ``"0-3,6"``).

    Raises:
        ValueError: one line naming ``field``: an empty list, a part that is not a number or range, or a range
            that runs backwards.
    """
    cores: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{field}: {part.strip()!r} is not a core number or range (e.g. 0 or 0-3), in {text!r}")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ValueError(f"{field}: range {part.strip()!r} runs backwards")
        cores.update(range(first, last + 1))
    return frozenset(cores)


def core_list(cores: frozenset[int]) -> str:
    """``cores`` as a sorted comma-separated list (``"0,1"``), the way the results and docs show them."""
    return ",".join(str(c) for c in sorted(cores))


def resolve_layouts(names: list[str], engine_cores: str | None, agent_cores: str | None,
                    allowed: frozenset[int]) -> list[Layout]:
    """The layouts to measure, in order, from ``--layouts``, ``--engine-cores``, ``--agent-cores``.

    ``shared`` puts everything on ``allowed`` (the cores this process may use). ``split`` puts the engine side on
    ``engine_cores`` (default: ``allowed`` without its highest core) and the agent on ``agent_cores`` (default: the
    highest allowed core).

    Raises:
        ValueError: one line: an unknown or repeated layout name, ``split`` with fewer than 2 allowed cores, a core
            list that does not parse (``parse_cores``), a core outside ``allowed``, or engine and agent cores that
            overlap.
    """
    layouts = []
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"--layouts: give shared and/or split once each, got {names}")
    for name in names:
        if name == "shared":
            layouts.append(Layout("shared", allowed, allowed))
        elif name == "split":
            if len(allowed) < 2:
                raise ValueError(f"--layouts split: needs at least 2 cores, this process may use only "
                                 f"{core_list(allowed)}")
            top = frozenset({max(allowed)})
            engine = allowed - top if engine_cores is None else parse_cores(engine_cores, "--engine-cores")
            agent = top if agent_cores is None else parse_cores(agent_cores, "--agent-cores")
            for field, cores in (("--engine-cores", engine), ("--agent-cores", agent)):
                if not cores <= allowed:
                    raise ValueError(f"{field}: core(s) {core_list(cores - allowed)} not available to this process "
                                     f"(allowed: {core_list(allowed)})")
            if engine & agent:
                raise ValueError(f"--engine-cores and --agent-cores overlap on core(s) {core_list(engine & agent)}")
            layouts.append(Layout("split", engine, agent))
        else:
            raise ValueError(f"--layouts: unknown layout {name!r} (shared or split)")
    return layouts


def pin_process(pid: int, cores: frozenset[int]) -> None:
    """Set the CPU affinity of every thread of process ``pid`` to ``cores`` (threads it starts later inherit it).

    ``os.sched_setaffinity`` acts on one thread, so each task of ``/proc/<pid>/task`` is set; the listing is read
    again until a pass finds no thread it had not set (at most 5 passes). A thread that ends meanwhile is skipped.

    Raises:
        RuntimeError: threads still appearing after 5 passes.
        OSError: ``pid`` gone or not ours; a core this process may not use.
    """
    done: set[int] = set()
    for _ in range(5):
        tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")} - done
        if not tids:
            return
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:
                pass  # the thread ended between the listing and the call
            done.add(tid)
    raise RuntimeError(f"pin_process: process {pid} kept starting threads over 5 passes")


def direct_round(engine: Any, chat: ChatFormat, concurrency: int, episodes: int, turns: int, tokens: int) -> tuple[float, int]:
    """Seconds and generated tokens for ``episodes`` episodes, ``concurrency`` at a time, by direct engine calls."""
    prompt = chat.prompt_ids([{"role": "user", "content": FIRST}])
    follow = chat.observation_ids([{"role": "user", "content": FOLLOW_UP}])
    stop = chat.stop_token_id

    async def episode(sem: asyncio.Semaphore) -> int:
        async with sem:
            ids, made = list(prompt), 0
            for turn in range(turns):
                result = await engine.generate(GenerationRequest(prompt_token_ids=list(ids), max_new_tokens=tokens,
                                                                 stop_token_ids=[stop]))
                ids += result.token_ids + ([] if result.token_ids[-1] == stop else [stop])
                ids += follow if turn < turns - 1 else []
                made += len(result.token_ids)
            return made

    async def go() -> int:
        sem = asyncio.Semaphore(concurrency)
        return sum(await asyncio.gather(*(episode(sem) for _ in range(episodes))))

    t0 = time.perf_counter()
    made = asyncio.run(go())
    return time.perf_counter() - t0, made


CLIENTS = ("openai", "http")
"""``--client``: the ``openai`` library (an agent as users write it), or ``http``: the same requests as plain JSON over
``httpx`` (the least an agent can spend on a request, so the gateway's own cost shows apart from the client's)."""


def gateway_round(url: str, token: str, concurrency: int, episodes: int, turns: int, tokens: int,
                  tag: str, client_kind: str = "openai") -> tuple[float, int]:
    """Seconds and generated tokens for ``episodes`` episodes through the gateway (each closed, its rollout sent),
    each turn sent by ``client_kind`` (``CLIENTS``)."""

    async def turn_of(http: httpx.AsyncClient, client: openai.AsyncOpenAI | None, eid: str,
                      messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        if client is None:
            body = {"model": MODEL, "messages": messages, "max_tokens": tokens}
            reply = (await http.post(f"{url}/episodes/{eid}/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {token}"})).raise_for_status().json()
            message = {k: v for k, v in reply["choices"][0]["message"].items() if v is not None}
            return reply["usage"]["completion_tokens"], message
        done = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=tokens)
        return done.usage.completion_tokens, done.choices[0].message.model_dump(exclude_none=True)

    async def episode(i: int, sem: asyncio.Semaphore, http: httpx.AsyncClient) -> int:
        async with sem:
            eid = f"{tag}-{i}"
            client = None if client_kind == "http" else openai.AsyncOpenAI(
                base_url=f"{url}/episodes/{eid}/v1", api_key=token, http_client=http, max_retries=0)
            messages: list[dict[str, Any]] = [{"role": "user", "content": FIRST}]
            made = 0
            for turn in range(turns):
                n, message = await turn_of(http, client, eid, messages)
                made += n
                messages.append(message)
                if turn < turns - 1:
                    messages.append({"role": "user", "content": FOLLOW_UP})
            closed = await http.post(f"{url}/episodes/{eid}/reward", json={"reward": 0.0},
                                     headers={"Authorization": f"Bearer {token}"})
            if not closed.json()["rollouts"][0]["sent"]:
                raise RuntimeError(f"episode {eid}: rollout not sent")
            return made

    async def go() -> int:
        sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            return sum(await asyncio.gather(*(episode(i, sem, http) for i in range(episodes))))

    t0 = time.perf_counter()
    made = asyncio.run(go())
    return time.perf_counter() - t0, made


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, the layouts and the table (a results file from before the layouts: one
    shared layout)."""
    rows = [[r.get("layout", "shared"), r["concurrency"],
             f"{r['direct_ms_per_token']:.2f}/{r['gateway_ms_per_token']:.2f}", f"**{r['ratio']:.2f}**",
             f"{r['direct_cpu_ms_per_token']:.2f}",
             f"{r['gateway_cpu_ms_per_token']:.2f}+{r['client_cpu_ms_per_token']:.2f}",
             f"{r['direct_batch_rows']:.1f}/{r['gateway_batch_rows']:.1f}"] for r in result["rows"]]
    worst = result.get("worst_ratio_by_layout") or {"shared": result["worst_ratio"]}
    cores = {x["name"]: x for x in result.get("layouts", [])}
    split = cores.get("split")
    where = (f"shared, all on all cores; split, engine side (direct engine, gateway, Redis) on core "
             f"{split['engine_cores']}, agent on {split['agent_cores']}." if split else "shared, all on all cores.")
    return "\n".join([
        common.machine_line(result["machine"]), "",
        f"Command: `{result['command']}` ({result['engine']} engine; {result.get('client', 'openai')} client; "
        f"{result['turns']} turns of {result['tokens']} tokens "
        f"per episode; medians over {result['rounds']} rounds, paths and layouts alternating). Layouts: {where}", "",
        common.markdown_table(["layout", "concurrent episodes", "ms/token: direct/gateway", "gateway/direct",
                               "CPU ms/token: direct", "CPU ms/token: gateway+client",
                               "requests per batch: direct/gateway"], rows), "",
        "Worst ratio: " + ", ".join(f"**{w:.2f}x** {name}" for name, w in worst.items()) + " (goal: 1.2x).",
    ])


def measure(args: argparse.Namespace, layouts: Sequence[Any], allowed: frozenset[int], work: Path,
            p: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Build the tiny model and its gateway under ``work``, then time direct engine calls against gateway requests at
    each of ``args.concurrency`` in each layout (module docstring); returns the result rows. ``p.error`` (exit 2) for
    a bad config override; RuntimeError with the log's tail when the gateway process dies before it serves."""
    try:
        cfg = load_config(None, [f"output_dir={work}", f"run_name={MODEL}", "warm_start.steps=0", "model.tiny.vocab_size=512",
                                 f"generator.engine={args.engine}", f"generator.episodes_in_flight={max(args.concurrency)}",
                                 f"generator.max_new_tokens={args.tokens}",
                                 f"generator.max_episode_tokens={128 + args.turns * (args.tokens + 16)}",
                                 "sao.batch_size=1024", "queue.maxlen=100000", "gateway.mode=only", "gateway.port=0",
                                 *args.overrides])
    except ValueError as exc:
        p.error(str(exc))
    ctx = RunContext(cfg)
    prepare(ctx)
    store = open_weight_store(ctx)
    store.publish(load_policy(ctx.base_model_dir).state_dict(), 0, ctx.base_model_dir)
    config_path = ctx.save_resolved_config()
    token = secrets.token_urlsafe(24)
    tokenizer = load_tokenizer(ctx.tokenizer_dir)
    chat = ChatFormat.for_tokenizer(tokenizer)
    gen = cfg.generator
    rows = []
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(EmbeddedRedis())
        RedisPolicyVersionStore(redis.Redis.from_url(server.url), ctx.keys).set(0)
        url_file = work / "url"
        log = stack.enter_context((work / "gateway.log").open("ab"))
        proc = subprocess.Popen([sys.executable, "-m", "posttrain.cli", "gateway", str(config_path), "--url-file",
                                 str(url_file)], env={**os.environ, "REDIS_URL": server.url, cfg.gateway.token_env: token},
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            while not url_file.is_file():
                if proc.poll() is not None:
                    raise RuntimeError((work / "gateway.log").read_text()[-2000:])
                time.sleep(0.1)
            url = url_file.read_text().strip()
            httpx.get(f"{url}/health", timeout=600)
            engine = make_engine(args.engine, store.path_for(0), seed=cfg.seed,
                                 max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                                 max_batch=gen.episodes_in_flight, kv_cache_gib=gen.vllm_kv_cache_gib)
            gateway_round(url, token, 1, 1, args.turns, args.tokens, "warmup", args.client)  # first-request costs out of the clock
            direct_round(engine, chat, 1, 1, args.turns, args.tokens)
            auth = {"Authorization": f"Bearer {token}"}

            def engine_rows() -> tuple[float, float, float, float]:
                snap = httpx.get(f"{url}/v1/gateway/stats", headers=auth, timeout=60).json()
                return snap["engine_batches"], snap["engine_batch_rows"], snap["gate_releases"], snap["gate_timeouts"]

            gateway_pids = [proc.pid] + ([server.pid] if server.pid is not None else [])
            for c in args.concurrency:
                n = max(c * args.episodes_per_slot, args.min_episodes)
                tally = {lay.name: {"direct": [], "through": [], "cpu": {"direct": 0.0, "gateway": 0.0, "client": 0.0},
                                    "rows_of": {"direct": [0, 0], "gateway": [0.0, 0.0], "gate": [0.0, 0.0]}}
                         for lay in layouts}
                for k in range(args.rounds):
                    for lay in layouts:  # alternating, so a change of load falls on both layouts
                        acc = tally[lay.name]
                        cpu, rows_of = acc["cpu"], acc["rows_of"]
                        for pid in gateway_pids:
                            pin_process(pid, lay.engine)
                        pin_process(os.getpid(), lay.engine)  # the direct engine runs in this process
                        history = getattr(engine, "batch_sizes", None)  # the hf engine's; vLLM batches continuously
                        mine, sizes = time.process_time(), len(history) if history is not None else 0
                        done = direct_round(engine, chat, c, n, args.turns, args.tokens)
                        cpu["direct"] += time.process_time() - mine
                        new = list(history)[sizes:] if history is not None and len(history) < (history.maxlen or 0) else []
                        rows_of["direct"][0] += len(new)
                        rows_of["direct"][1] += sum(new)
                        acc["direct"].append(done)
                        batches, served, groups, timeouts = engine_rows()
                        pin_process(os.getpid(), lay.agent)  # now this process is the agent
                        mine, theirs = time.process_time(), process_cpu_s(proc.pid)
                        acc["through"].append(gateway_round(url, token, c, n, args.turns, args.tokens,
                                                          f"{lay.name}-c{c}-r{k}", args.client))
                        cpu["client"] += time.process_time() - mine
                        cpu["gateway"] += process_cpu_s(proc.pid) - theirs
                        after = engine_rows()
                        rows_of["gateway"][0] += after[0] - batches
                        rows_of["gateway"][1] += after[1] - served
                        rows_of["gate"][0] += after[2] - groups
                        rows_of["gate"][1] += after[3] - timeouts
                for lay in layouts:
                    acc = tally[lay.name]
                    direct, through, cpu, rows_of = acc["direct"], acc["through"], acc["cpu"], acc["rows_of"]
                    d = statistics.median(s / t for s, t in direct)
                    g = statistics.median(s / t for s, t in through)
                    made_d, made_g = sum(t for _, t in direct), sum(t for _, t in through)
                    rows.append({"layout": lay.name, "engine_cores": core_list(lay.engine),
                                 "agent_cores": core_list(lay.agent), "concurrency": c, "episodes": n,
                                 "direct_tokens": direct[0][1], "gateway_tokens": through[0][1],
                                 "direct_ms_per_token": d * 1e3, "gateway_ms_per_token": g * 1e3, "ratio": g / d,
                                 "direct_cpu_ms_per_token": cpu["direct"] / made_d * 1e3,
                                 "gateway_cpu_ms_per_token": cpu["gateway"] / made_g * 1e3,
                                 "client_cpu_ms_per_token": cpu["client"] / made_g * 1e3,
                                 "direct_batch_rows": rows_of["direct"][1] / max(rows_of["direct"][0], 1),
                                 "gateway_batch_rows": rows_of["gateway"][1] / max(rows_of["gateway"][0], 1),
                                 "gate_groups": rows_of["gate"][0], "gate_timeouts": rows_of["gate"][1],
                                 "direct_rounds": direct, "gateway_rounds": through})
                    print(f"{lay.name} concurrency {c}: direct {d * 1e3:.2f} ms/token, gateway {g * 1e3:.2f} ms/token, "
                          f"ratio {g / d:.2f}", file=sys.stderr, flush=True)
            pin_process(os.getpid(), allowed)
            engine.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, common.RESULTS_DIR / "gateway.json")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="concurrent episodes")
    p.add_argument("--episodes-per-slot", type=int, default=2, help="episodes per concurrent slot and round")
    p.add_argument("--min-episodes", type=int, default=8, help="at least this many episodes per round")
    p.add_argument("--turns", type=int, default=3, help="turns per episode")
    p.add_argument("--tokens", type=int, default=24, help="sampled tokens per turn")
    p.add_argument("--rounds", type=int, default=3, help="rounds per concurrency (medians)")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--layouts", nargs="+", default=None,
                   help="core layouts to measure: shared and/or split (default: both where >= 2 cores are allowed)")
    p.add_argument("--engine-cores", help="split layout: the engine side's cores, e.g. 0 or 0-2 (default: all "
                                          "allowed but the highest)")
    p.add_argument("--agent-cores", help="split layout: the agent's cores, disjoint from the engine's (default: the "
                                         "highest allowed)")
    p.add_argument("--client", choices=CLIENTS, default="openai", help="the agent's client (default openai; http: "
                                                                        "plain JSON over httpx)")
    p.add_argument("overrides", nargs="*", help="config overrides after the benchmark's own, e.g. "
                                                "gateway.batch_wait_ms=50 or model.tiny.num_layers=8")
    args = p.parse_args(argv)
    allowed = frozenset(os.sched_getaffinity(0))
    names = args.layouts or (["shared", "split"] if len(allowed) >= 2 else ["shared"])
    try:
        layouts = resolve_layouts(names, args.engine_cores, args.agent_cores, allowed)
    except ValueError as e:
        p.error(str(e))
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # as run_gateway does in the gateway process (module docstring)
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    try:
        rows = measure(args, layouts, allowed, work, p)
    finally:  # the run's model, weights and gateway log: hundreds of MB with vLLM, left behind by every run before
        shutil.rmtree(work, ignore_errors=True)
    result = {"command": common.command_line("bench.gateway", argv), "machine": common.machine_info(),
              "engine": args.engine, "client": args.client, "overrides": list(args.overrides), "turns": args.turns, "tokens": args.tokens, "rounds": args.rounds, "rows": rows,
              "layouts": [{"name": lay.name, "engine_cores": core_list(lay.engine), "agent_cores": core_list(lay.agent)}
                          for lay in layouts],
              "worst_ratio_by_layout": {lay.name: max(r["ratio"] for r in rows if r["layout"] == lay.name)
                                        for lay in layouts}}
    # the target (bench.common.targets_rows) stays on the shared layout where it ran, as before the split existed
    result["worst_ratio"] = result["worst_ratio_by_layout"].get("shared", max(r["ratio"] for r in rows))
    common.publish_result(args.out, result, "gateway", lambda: render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
