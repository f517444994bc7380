"""GRPO runner (``technique: grpo``): synchronous in this process, or over the asynchronous runtime.

Synchronous GRPO also runs on N ranks (``torchrun --nproc_per_node N -m posttrain.cli run CONFIG``):
each rank generates its share of the groups and trains its share of the batch
(``runners.grpo_sync``); rank 0 warm-starts, evaluates, tracks and registers.
"""

from __future__ import annotations

from posttrain.config import RunConfig
from posttrain.runners.common import (
    RunSummary,
    evaluate_and_log,
    infra_row,
    reward_curve,
    start_model,
    tracked_run,
)
from posttrain.runners.grpo_sync import run_grpo_sync
from posttrain.runners.sao import train_sao
from posttrain.runtime import RunContext
from posttrain.tracking import HELDOUT_METRIC


def run_grpo(config: RunConfig) -> RunSummary:
    """GRPO on the environment's tasks: synchronous in this process, or over the asynchronous runtime."""
    grpo = config.grpo
    mode = "async (runtime + DIS)" if grpo.async_ else "sync"
    with tracked_run(config) as run:
        world = run.world
        if world.is_main:
            print("[2/4] start model" + ("" if config.warm_start.steps > 0 else ": the base model (warm_start.steps=0)"),
                  flush=True)
        start_dir = start_model(run)
        # Rank 0 evaluates the start model; the others meet it at the first collective of training.
        before = evaluate_and_log(run, start_dir, "start") if world.is_main else {}
        if world.is_main:
            print(f"[3/4] grpo {mode}: {grpo.steps} steps of {grpo.prompts_per_step} x {grpo.group_size} rollouts"
                  f"{f' on {world.size} ranks' if world.distributed else ''}", flush=True)
        if grpo.async_:
            summary = train_sao(RunContext(config), start_dir, run.sink, clock=run.clock)
        else:
            # No tqdm bar: the console shows the stages and the summary, as the demo's does.
            summary = run_grpo_sync(config, start_model_dir=start_dir, sink=run.sink, progress=False, world=world,
                                    clock=run.clock)
            run.generators_in_process = True
        run.generator_stats = summary.generator_stats
        run.trained_tokens = summary.this_life("action_tokens_trained")  # not the earlier lives' (a re-run)
        run.trained_nothing = not summary.trained_this_life
        if not world.is_main:
            return run.summary([])  # rank 0 evaluates, registers and reports
        print("[4/4] held-out eval, registration", flush=True)
        after = evaluate_and_log(run, summary.final_model_dir, "grpo")
        version = run.register(summary.final_model_dir, [], {HELDOUT_METRIC: after["accuracy"],
                                                             f"{config.data.env}.accuracy": after["accuracy"]})
        quarantined = run.ctx.quarantined_rows()
        run.sink({"data/quarantined_rows": float(quarantined)}, summary.policy_version)
        rewards = reward_curve(run.ctx.run_dir / "metrics.jsonl")
        k = max(1, len(rewards) // 4)
        early = sum(rewards[:k]) / k if rewards else 0.0
        late = sum(rewards[-k:]) / k if rewards else 0.0
        c = summary.counters
        return run.summary([
            ("mode", mode),
            ("environment", config.data.env),
            ("policy versions", str(summary.policy_version)),
            ("rollouts trained", f"{c.get('rollouts_trained', 0.0):.0f}"),
            ("optimizer steps skipped (non-finite gradient)", f"{c.get('skipped_nonfinite', 0.0):.0f}"),
            ("episodes failed for the infrastructure (never trained)", infra_row(c)),
            ("train reward, first -> last quarter", f"{early:.3f} -> {late:.3f}"),
            ("generator busy fraction", f"{c.get('generator_busy_fraction', 0.0):.2f}"),
            ("quarantined rows", str(quarantined)),
            ("held-out accuracy before -> after", f"{before['accuracy']:.3f} -> {after['accuracy']:.3f}"),
            ("registered model version", version),
        ])
