"""TRL's GRPOTrainer (pinned: trl 1.16.0) against our synchronous GRPO and SAO: same task, model and budget, CPU.

Task: ``synthetic_arith`` (single turn: ``Compute 7 + 12.`` -> ``#### 19``), the task TRL's
GRPOTrainer runs without an agent loop. Every method starts from the same tiny Qwen2-shaped
model after the same SFT warm start, samples at temperature 1 with at most ``--max-new-tokens``
tokens, and trains ``--steps`` optimizer steps of ``--prompts`` prompts x ``--group-size``
rollouts (SAO: the same number of rollouts, one per prompt) at the same learning rate:

* ``trl_grpo``: ``trl.GRPOTrainer`` (generation with transformers ``generate`` in the trainer's
  process, ``loss_type="dapo"`` = token sum over the batch's token count, group-std scaling,
  clip 0.2 / 0.28, no KL), reward = the environment's verifier;
* ``grpo_sync``: ``posttrain.runners.grpo_sync.run_grpo_sync`` (the same loss family: DAPO clipping,
  group-std scaling, no KL; uniform groups dropped);
* ``sao``: ``posttrain.runners.sao.train_sao`` (embedded Redis, ``--generators`` generator processes, the
  learner with critic and DIS).

Measured: ``action_tokens_per_s`` (completion tokens generated per second between the first and
the last step), ``trained_action_tokens_per_s`` (tokens of groups with unequal rewards for the
GRPO variants, every token for SAO), wall time, and seconds to reach the probe reward target
(the warm start's probe reward plus ``--target-gain``), from weight snapshots every
``--eval-every`` steps evaluated after training with ``evaluate_policy`` on a fixed probe set
of training prompts (same tasks and seeds for every snapshot; see ``probe_context``).

Writes ``bench/results/vs_trl.json`` and the ``vs_trl`` section of docs/benchmarks.md.

Run: ``make bench-deps`` once (TRL and what it adds, pinned in ``bench/requirements-trl.txt``), then
``.venv/bin/python -m bench.vs_trl`` (2 minutes on 2 cores, plus about 2 minutes of SFT warm
start the first time, cached under ``--work-dir``) or
``.venv/bin/python -m bench.vs_trl --steps 4 --methods trl_grpo grpo_sync`` for a quick look.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.async_vs_sync import (
    MethodRun,
    StepRecord,
    evaluate_snapshots,
    run_method,
    summarise,
)
from bench.common import (
    REPO,
    command_line,
    machine_info,
    machine_line,
    markdown_table,
    publish_result,
    settings_of,
)

TRL_PIN = "trl==1.16.0"
"""The TRL version this benchmark was written and run against (``bench/requirements-trl.txt``, ``make bench-deps``)."""

METHODS = ("trl_grpo", "grpo_sync", "sao")
"""Methods compared."""

log = logging.getLogger("bench.vs_trl")


def arith_config(args: argparse.Namespace, work: Path, method: str) -> dict[str, Any]:
    """The run config dict of ``method`` (``base`` for the shared warm start; ``trl_grpo`` uses its model and eval)."""
    batch = args.prompts * args.group_size
    cfg: dict[str, Any] = {
        "run_name": method,
        "output_dir": str(work / "runs"),
        "seed": args.seed,
        "model": {"tiny": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
                           "intermediate_size": 384, "vocab_size": 512}},
        "data": {"env": "synthetic_arith", "env_args": {"low": 0, "high": args.operand_high},
                 "num_train_tasks": args.train_tasks, "num_eval_tasks": args.eval_tasks},
        "warm_start": {"steps": args.sft_steps, "batch_size": 16,
                       "optim": {"lr": 3.0e-3, "warmup_steps": 10, "schedule": "cosine"}},
        "generator": {"engine": "hf", "num_processes": args.generators, "episodes_in_flight": batch,
                      "max_new_tokens": args.max_new_tokens, "max_turns": 1, "max_episode_tokens": 96},
        "eval": {"num_tasks": args.eval_tasks, "samples_per_task": args.eval_samples},
        "tracking": {"experiment": "bench-vs-trl"},
    }
    optim = {"lr": args.lr, "grad_clip": 1.0}
    if method == "sao":
        cfg["technique"] = "sao"
        cfg["sao"] = {"steps": args.steps, "batch_size": batch, "micro_batch_size": batch, "max_staleness": 2,
                      "checkpoint_every": args.steps, "optim": optim,
                      "critic": {"lr": 1.0e-3, "warmup_steps": 1, "updates_per_step": 2}}
    elif method == "grpo_sync":
        cfg["technique"] = "grpo"
        cfg["grpo"] = {"steps": args.steps, "prompts_per_step": args.prompts, "group_size": args.group_size,
                       "micro_batch_size": batch, "mini_batches": 1, "drop_uniform_groups": True,
                       "loss": {"clip_eps_low": 0.2, "clip_eps_high": 0.28, "kl_coef": 0.0},
                       "checkpoint_every": args.steps, "optim": optim}
    return cfg


def run_trl(args: argparse.Namespace, base: Any, sft: Path, snap_dir: Path) -> tuple[MethodRun, str]:
    """Train ``trl.GRPOTrainer`` from the warm start; record steps and snapshots like ``make_sink``.

    Returns:
        The ``MethodRun`` and the TRL version string.

    Raises:
        ImportError: TRL is not installed (``make bench-deps`` installs ``bench/requirements-trl.txt``).
    """
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from posttrain.envs.synthetic.arith import parse_integer_answer
    from posttrain.models.hf import load_tokenizer

    run = MethodRun("trl_grpo")
    if snap_dir.exists():
        shutil.rmtree(snap_dir)
    snap_dir.mkdir(parents=True)
    tasks = base.tasks("train")
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "reference": t.reference}
                                 for t in tasks])

    def arith_reward(prompts: list[Any], completions: list[Any], reference: list[str], **_: Any) -> list[float]:
        """1.0 when the integer after the last ``####`` equals the reference (``SyntheticArithEnv``'s verifier)."""
        out = []
        for completion, ref in zip(completions, reference, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else str(completion)
            answer = parse_integer_answer(text)
            out.append(1.0 if answer is not None and str(answer) == ref.strip() else 0.0)
        return out

    batch = args.prompts * args.group_size
    out_dir = base.run_dir.parent / "trl_grpo"
    config = trl.GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, seed=args.seed, max_steps=args.steps, learning_rate=args.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=args.group_size,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1, logging_steps=1,
        save_strategy="no", report_to=[], bf16=False, disable_tqdm=True, dataloader_num_workers=0,
    )
    tokenizer = load_tokenizer(sft)
    run.load_avg.append(os.getloadavg()[0])
    t0 = time.monotonic()

    class Recorder(TrainerCallback):
        """Records each step's metrics and time; saves weight snapshots every ``--eval-every`` steps."""

        def on_log(self, _args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            if not logs or "reward" not in logs:
                return
            now = time.monotonic() - t0
            generated = float(logs.get("completions/mean_length", 0.0)) * batch
            trained = generated * (1.0 - float(logs.get("frac_reward_zero_std", 0.0)))
            run.steps.append(StepRecord(now, state.global_step, True, float(batch), trained, generated,
                                        float(logs.get("step_time", 0.0)), float(logs["reward"])))

        def on_step_end(self, _args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            step = state.global_step
            if step % args.eval_every == 0 or step == args.steps:
                dst = snap_dir / f"v{step:06d}"
                model.save_pretrained(str(dst), safe_serialization=True)
                run.snapshots[step] = (time.monotonic() - t0, dst)

    print(f"[trl_grpo] {args.steps} steps of {args.prompts} x {args.group_size} rollouts (trl {trl.__version__})",
          flush=True)
    trainer = trl.GRPOTrainer(model=str(sft), reward_funcs=arith_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Recorder()])
    trainer.train()
    run.wall_s = time.monotonic() - t0
    run.load_avg.append(os.getloadavg()[0])
    run.counters = {}
    return run, trl.__version__


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, settings and the table."""
    rows = []
    for name, r in result["methods"].items():
        ttt = r["time_to_target_s"]
        rows.append([name, f"{r['action_tokens_per_s']:.0f}", f"{r['trained_action_tokens_per_s']:.0f}",
                     f"{r['rollouts_per_s']:.1f}", f"{r['wall_s']:.0f}", "not reached" if ttt is None else f"{ttt:.0f}",
                     " / ".join(f"{v:.2f}" for v in r["heldout_reward"].values()) or "-"])
    s = result["settings"]
    return "\n".join([
        machine_line(result["machine"]),
        "",
        f"Command: `{result['command']}`; TRL `{result['trl_version']}` (pin `{TRL_PIN}`; it installed beside "
        f"torch {result['machine'].get('torch')} without replacing it, adding accelerate and datasets).",
        "",
        f"Setting: `synthetic_arith` (sums of two integers below {s['operand_high']}), {s['train_tasks']} train tasks, "
        f"{s['steps']} optimizer steps of {s['prompts']} prompts x {s['group_size']} rollouts (SAO: "
        f"{s['prompts'] * s['group_size']} rollouts of different prompts), at most {s['max_new_tokens']} new tokens, "
        f"lr {s['lr']}, tiny Qwen2-shaped model after {s['sft_steps']} SFT steps, everything on the CPU.",
        "",
        markdown_table(["method", "action tokens/s", "trained action tokens/s", "rollouts/s", "wall s",
                        f"s to probe reward {result['target']:.2f}", "probe reward at snapshots"], rows),
        "",
        f"Probe reward (the first {s['eval_tasks']} training prompts x {s['eval_samples']} samples, temperature 1) of "
        f"the warm start: {result['start_reward']:.3f}; snapshots every {s['eval_every']} steps. The tiny model does "
        "not learn to add unseen numbers in this budget (with operands below 20, every method's held-out reward stayed "
        "between 2% and 8% over 40 steps), so the time to a reward is measured on training prompts.",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--generators", type=int, default=1, help="SAO generator processes")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--operand-high", type=int, default=10)
    p.add_argument("--train-tasks", type=int, default=360)
    p.add_argument("--eval-tasks", type=int, default=40)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3.0e-4)
    p.add_argument("--target-gain", type=float, default=0.1)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=REPO / "runs" / "bench" / "vs_trl")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch threads of this process (learner and in-process engines); generator processes use 1")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(args.torch_threads)
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)

    base, sft, prep_s = prepare_shared_arith(args, work)
    print(f"warm start ready in {prep_s:.0f} s: {sft}", flush=True)
    runs: list[MethodRun] = []
    trl_version = None
    for method in args.methods:
        snap = work / "snapshots" / method
        if method == "trl_grpo":
            run, trl_version = run_trl(args, base, sft, snap)
        else:
            run = run_method(arith_config(args, work, method), method, base, sft, snap, args.eval_every)
        runs.append(run)
    print("evaluating snapshots", flush=True)
    start, rewards = evaluate_snapshots(probe_context(args, work, base), sft, runs)
    target = args.target if args.target is not None else round(start + args.target_gain, 3)
    methods = {r.method: summarise(r, rewards[r.method], target) for r in runs}
    result = {
        "command": command_line("bench.vs_trl", argv),
        "machine": machine_info(),
        "trl_version": trl_version,
        "trl_pin": TRL_PIN,
        "settings": settings_of(args),
        "start_reward": start,
        "target": target,
        "action_tokens_per_s": {k: v["action_tokens_per_s"] for k, v in methods.items()},
        "time_to_target_s": {k: v["time_to_target_s"] for k, v in methods.items()},
        "methods": methods,
        "prepare_s": prep_s,
    }
    publish_result("vs_trl", result, render(result), docs=not args.no_docs)
    return 0


def probe_context(args: argparse.Namespace, work: Path, base: Any) -> Any:
    """A ``RunContext`` whose evaluation tasks are the first ``--eval-tasks`` training tasks (the probe set).

    The tiny model does not learn to add unseen numbers within this budget (with operands below
    20, held-out reward stayed between 2% and 8% for every method), so learning speed is measured
    on training prompts, the
    same fixed probe set, sampling seeds and evaluation code for every method and snapshot.
    """
    import json

    from posttrain.config import RunConfig
    from posttrain.runtime import RunContext

    path = work / "tasks" / "train_probe.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for t in base.tasks("train")[: args.eval_tasks]:
            f.write(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "reference": t.reference,
                                "metadata": t.metadata}) + "\n")
    cfg = arith_config(args, work, "base")
    cfg["data"]["eval_path"] = str(path)
    return RunContext(RunConfig.model_validate(cfg))


def prepare_shared_arith(args: argparse.Namespace, work: Path) -> tuple[Any, Path, float]:
    """Tokenizer, base model and SFT warm start on ``synthetic_arith`` (cached in ``work``)."""
    from posttrain.config import RunConfig
    from posttrain.runners.common import prepare, warm_start
    from posttrain.runtime import RunContext

    ctx = RunContext(RunConfig.model_validate(arith_config(args, work, "base")))
    t0 = time.monotonic()
    prepare(ctx)
    sft = warm_start(ctx)
    for f in ctx.tokenizer_dir.iterdir():
        if not (sft / f.name).exists():
            shutil.copy2(f, sft / f.name)
    return ctx, sft, time.monotonic() - t0


if __name__ == "__main__":
    sys.exit(main())
