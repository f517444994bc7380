"""What the simulator needs from one ``bench.async_vs_sync`` setting, measured on its warm start.

``trace`` (the warm start's episode lengths and rewards, instantaneous tools: the workload ``bench.sim`` draws from),
``engine_modes`` (one ``hf`` engine fed by real episodes three ways, every batch and episode recorded, with
``engine_probe`` s around it), ``learner_cost`` (an SAO against a GRPO iteration on one batch) and ``weight_sync``
(the ``tiny`` row of ``bench/results/weight_sync.json``). Writes ``bench/results/sim/<setting>.json`` (the ``sao``
config's setting with the given overrides) and re-renders the ``async_vs_sync`` section.

Run after ``bench.weight_sync`` (6 minutes, plus the warm start the first time): ``.venv/bin/python -m
bench.sim.collect``; compute-bound: ``... data.env_args.tool_latency_median_s=0 generator.episodes_in_flight=64``.
"""

import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from bench import common
from posttrain.envs.synthetic.longtail import codes_of
from posttrain.episodes.runner import EpisodeLimits, run_episode
from posttrain.inference.base import GenerationRequest
from posttrain.inference.factory import make_engine
from posttrain.inference.hf import HFEngine
from posttrain.learner.batching import collate_rollouts
from posttrain.learner.critic import CriticModel
from posttrain.learner.grpo_step import grpo_train_step
from posttrain.learner.ledger import turn_lengths
from posttrain.learner.optim import build_optimizer
from posttrain.learner.sao_step import sao_train_step
from posttrain.learner.types import Trainable
from posttrain.models.hf import load_policy, load_tokenizer

PROBE_BATCHES = ((64, 384), (8, 128))
"""``(rows, width)`` of the static batches ``engine_probe`` times, each 5 times (the median is kept)."""


def busy_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds the machine's processes spent busy since boot (user, nice, system, irq, softirq of ``stat``'s
    ``cpu`` line), None without ``stat``; ValueError when its first line is not the ``cpu`` line."""
    if not stat.exists():
        return None
    first = stat.read_text().split("\n", 1)[0].split()
    if first[:1] != ["cpu"]:
        raise ValueError(f"{stat}: first line is not the aggregate 'cpu' line: {' '.join(first[:3])!r}")
    return sum(int(first[1 + i]) for i in (0, 1, 2, 5, 6)) / os.sysconf("SC_CLK_TCK")


@contextmanager
def other_cpu() -> Iterator[list[float]]:
    """Yields a list that, after the block, holds the cores other processes kept busy meanwhile: busy CPU seconds of
    the machine less this process's, over wall seconds (empty off Linux)."""
    wall, busy, own, out = time.monotonic(), busy_cpu_seconds(), time.process_time(), []
    yield out
    if busy is not None:
        out.append(max(0.0, (busy_cpu_seconds() - busy - time.process_time() + own) / (time.monotonic() - wall)))


@contextmanager
def one_thread_engine(model_dir: Path, max_batch: int, max_model_len: int) -> Iterator[HFEngine]:
    """An ``hf`` engine at one torch thread, as in a generator process; closed, and the thread count restored, after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = HFEngine(model_dir, max_batch=max_batch, max_model_len=max_model_len)
    try:
        yield engine
    finally:
        engine.close()
        torch.set_num_threads(threads)


def engine_probe(sft: Path, new_tokens: int) -> dict[str, Any]:
    """The ``hf`` engine's speed now: the summed median seconds of ``PROBE_BATCHES`` (ids in [3, 300) or the model's
    smaller vocabulary, no stop token, ``new_tokens`` decode steps) at one torch thread, the ``background_cores`` other
    processes kept busy meanwhile (``other_cpu``) and the time (``bench.sim`` compares a run's probes with these)."""
    rng, top = random.Random(0), min(300, json.loads((sft / "config.json").read_text())["vocab_size"])
    with one_thread_engine(sft, max(r for r, _ in PROBE_BATCHES), max(w for _, w in PROBE_BATCHES) + new_tokens + 1) as engine:

        async def timed(rows: int, width: int, new: int) -> float:
            reqs = [GenerationRequest(prompt_token_ids=[rng.randrange(3, top) for _ in range(width)], max_new_tokens=new,
                                      temperature=1.0, stop_token_ids=[], seed=rng.randrange(2**31)) for _ in range(rows)]
            t = time.perf_counter()
            await asyncio.gather(*(engine.generate(r) for r in reqs))
            return time.perf_counter() - t

        asyncio.run(timed(1, 8, 1))  # warm-up, not timed
        with other_cpu() as other:
            batches = [[rows, width, round(statistics.median(asyncio.run(timed(rows, width, new_tokens)) for _ in range(5)), 6)]
                       for rows, width in PROBE_BATCHES]
    return {"seconds": sum(b[2] for b in batches), "background_cores": other[0] if other else None, "batches": batches,
            "when": common.utc_now()}


def _limits(gen: Any) -> EpisodeLimits:
    return EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                         max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)


def collect_trace(base: Any, sft: Path, tasks: int, samples: int, seed: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """``samples`` episodes of the warm start on each of the first ``tasks`` training tasks: per task ``task_id``,
    ``required_calls`` and ``rollouts`` (turn lengths, reward, finish reason); and the ``Rollout`` records."""
    gen, chosen = base.config.generator, base.tasks("train")[:tasks]
    tokenizer, env, limits = load_tokenizer(sft), base.environment(), _limits(gen)
    engine = make_engine("hf", sft, seed=seed, max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                         max_batch=gen.episodes_in_flight)

    async def go() -> list[Any]:
        sem = asyncio.Semaphore(gen.episodes_in_flight)

        async def one(i: int, task: Any) -> Any:
            async with sem:
                return await run_episode(engine, tokenizer, env, task, limits, generator_id="trace", seed=seed + i)

        return await asyncio.gather(*(one(i * 100 + k, t) for i, t in enumerate(chosen) for k in range(samples)))

    try:
        rollouts = asyncio.run(go())
    finally:
        engine.close()

    return [{"task_id": t.task_id, "required_calls": len(codes_of(t)), "rollouts": [
        {**dict(zip(("prompt_tokens", "action_tokens", "observation_tokens"), turn_lengths(r.action_mask), strict=True)),
         "reward": r.reward, "finish_reason": r.finish_reason} for r in rollouts[i * samples:(i + 1) * samples]]}
        for i, t in enumerate(chosen)], rollouts


def measure_engine_modes(base: Any, sft: Path, seconds: float, slots: int, seed: int, group_size: int = 8) -> dict[str, Any]:
    """Rollouts per second of one ``hf`` engine (1 thread, alone) fed three ways, episodes started for ``seconds`` then
    drained: ``lockstep`` (``slots`` at once, the next ``slots`` when all are done: synchronous GRPO), ``continuous``
    (``slots`` slots, each starting an episode when its last ends: SAO), ``groups`` (``slots // group_size`` slots of
    ``group_size`` episodes of one task: asynchronous GRPO). Per mode: ``rollouts``, ``seconds``, ``rollouts_per_s``,
    ``mean_batch``, ``batches`` (``[rows, width, prompt_tokens, new_tokens, seconds, generated_tokens]``), ``episodes``."""
    gen, tasks, rng = base.config.generator, base.tasks("train"), random.Random(seed)
    tokenizer, env, limits = load_tokenizer(sft), base.environment(), _limits(gen)
    shapes: list[list[Any]] = []
    timings: list[Any] = []
    out: dict[str, Any] = {"load_avg_start": os.getloadavg()[0], "feed_s": seconds, "group_size": group_size,
                           "engine_probe": [engine_probe(sft, gen.max_new_tokens)]}
    with one_thread_engine(sft, slots, gen.max_episode_tokens + gen.max_new_tokens) as engine:
        engine.batch_observer = timings.append

        async def episode(task: Any, episode_seed: int) -> None:
            index = len(shapes)  # reserved at the start, so a group's members are consecutive
            shapes.append([])
            r = await run_episode(engine, tokenizer, env, task, limits, seed=episode_seed)
            shapes[index] = list(turn_lengths(r.action_mask))

        def draw() -> tuple[Any, int]:
            return tasks[rng.randrange(len(tasks))], rng.randrange(2**31)

        async def feed(stop: float, unit_slots: int, size: int, one_task: bool) -> None:
            async def slot() -> None:
                while time.monotonic() < stop:
                    task, first = draw() if one_task else (None, 0)
                    await asyncio.gather(*(episode(task, first + 1000 * k) if one_task else episode(*draw())
                                           for k in range(size)))

            await asyncio.gather(*(slot() for _ in range(unit_slots)))

        modes = {"lockstep": (1, slots, False), "continuous": (slots, 1, False),
                 "groups": (max(1, slots // group_size), group_size, True)}
        for name, (unit_slots, size, one_task) in modes.items():
            timings.clear()
            shapes.clear()
            t = time.monotonic()
            asyncio.run(feed(t + seconds, unit_slots, size, one_task))
            elapsed, n = time.monotonic() - t, len(shapes)  # every episode started is drained
            out[name] = {"rollouts": n, "seconds": elapsed, "rollouts_per_s": n / elapsed,
                         "mean_batch": statistics.fmean(b.rows for b in timings) if timings else 0.0,
                         "batches": [[b.rows, b.width, b.prompt_tokens, b.new_tokens, round(b.seconds, 6),
                                      b.generated_tokens] for b in timings], "episodes": list(shapes)}
    out["load_avg_end"] = os.getloadavg()[0]
    out["engine_probe"].append(engine_probe(sft, gen.max_new_tokens))
    return out


def measure_learner_cost(sao: Any, grpo: Any, sft: Path, rollouts: Sequence[Any], seed: int, repeats: int = 3) -> dict[str, float]:
    """Median seconds of an SAO learner iteration (after the critic's warm-up) and a GRPO one (every group trained) on
    the same ``sao.batch_size`` of ``rollouts``, their ratio, the batch's real and padded tokens, micro-batch and rows."""
    rng = random.Random(seed)
    picks = [rollouts[rng.randrange(len(rollouts))] for _ in range(sao.batch_size)]
    batch = collate_rollouts(picks, load_tokenizer(sft).pad_token_id or 0)  # no pad token: 0
    model = load_policy(sft)
    policy = Trainable(model, *build_optimizer(model, sao.optim, 100))
    critic_model = CriticModel.from_policy_path(sft)
    critic = Trainable(critic_model, *build_optimizer(critic_model, sao.optim.model_copy(update={"lr": sao.critic.lr}), 100))
    outs: list[Any] = []
    sao_s = [common.seconds(lambda r=r: outs.append(sao_train_step(policy=policy, critic=critic, batch=batch, config=sao,
                                                                   iteration=sao.critic.warmup_steps + r)))
             for r in range(repeats)]
    model = load_policy(sft)
    policy = Trainable(model, *build_optimizer(model, grpo.optim, 100))
    groups = [f"g{i // grpo.group_size}" for i in range(len(picks))]
    grpo_s = [common.seconds(lambda: grpo_train_step(policy=policy, batch=batch, group_ids=groups, config=grpo))
              for _ in range(repeats)]
    return {"sao_step_s": statistics.median(sao_s), "grpo_step_s": statistics.median(grpo_s),
            "ratio_sao_over_grpo": statistics.median(sao_s) / statistics.median(grpo_s),
            "padded_tokens": outs[-1].metrics["batch/padded_tokens"], "real_tokens": outs[-1].metrics["batch/real_tokens"],
            "micro_batch_size": float(sao.micro_batch_size), "rows": float(batch.token_ids.shape[0])}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    from bench import async_vs_sync as avs

    p = common.parser(__doc__, None)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides of the setting (as async_vs_sync)")
    p.add_argument("--trace-tasks", type=int, default=128, help="training tasks in the trace")
    p.add_argument("--trace-samples", type=int, default=8, help="episodes per trace task")
    p.add_argument("--feed-s", type=float, default=60.0, help="seconds each engine feeding starts episodes")
    args = p.parse_intermixed_args(argv)
    sao = avs.load_method("sao", args.overrides, p)
    grpo = avs.load_method("grpo_sync_g8", args.overrides, p).grpo.model_copy(update={"drop_uniform_groups": False})
    tiny = next((r for r in (common.read_result("weight_sync") or {}).get("rows", []) if r["shape"] == "tiny"), None)
    if args.feed_s <= 0 or tiny is None:
        p.error("--feed-s must be > 0" if args.feed_s <= 0 else "bench/results/weight_sync.json has no tiny row: "
                "run .venv/bin/python -m bench.weight_sync first")
    base, sft = avs.shared_warm_start(sao)
    trace, rollouts = collect_trace(base, sft, args.trace_tasks, args.trace_samples, sao.seed)
    result = {"setting": avs.setting_of(sao), "command": common.command_line("bench.sim.collect", argv),
              "settings": {**avs.settings_of(sao, 0, 1), "trace_tasks": args.trace_tasks, "trace_samples": args.trace_samples},
              "trace": trace, "learner_cost": measure_learner_cost(sao.sao, grpo, sft, rollouts, sao.seed),
              "engine_modes": measure_engine_modes(base, sft, args.feed_s, sao.generator.episodes_in_flight, sao.seed),
              "weight_sync": {"publish_s": tiny["publish_s"], "reload_s": tiny["reload_hf_s"],
                              "from": "bench/results/weight_sync.json, shape tiny"}, "machine": common.machine_info()}
    common.publish_result(args.out or common.RESULTS_DIR / "sim" / f"{result['setting']}.json", result, "async_vs_sync",
                          avs.render, docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    common.run_main("bench.sim.collect", main)
