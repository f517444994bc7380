"""TRL's GRPOTrainer (pinned: trl 1.16.0) against our synchronous GRPO and SAO: same task, model and budget, CPU.

On ``synthetic_arith`` (no agent loop), every method trains from one SFT warm start for the same steps of prompts x
group size (SAO: as many rollouts, one per prompt) at the same learning rate: ``trl_grpo`` is ``trl.GRPOTrainer``
(``loss_type="dapo"``, group-std scaling, clip 0.2 / 0.28, no KL) on the ``grpo_sync`` config of
``bench/configs/vs_trl/`` (``key=value`` overrides apply to both configs). Measured: action tokens generated and
trained per second between the first and the last step, wall time, and seconds to the probe reward target (warm
start + ``TARGET_GAIN``; snapshots every ``--eval-every`` steps, evaluated on training prompts).

Run: ``make bench-deps`` once (TRL pinned in ``bench/requirements-trl.txt``), then ``.venv/bin/python -m
bench.vs_trl`` (2 minutes on 2 cores, plus 2 of warm start the first time) or
``.venv/bin/python -m bench.vs_trl grpo.steps=4 --methods trl_grpo grpo_sync`` for a quick look.
"""

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench import async_vs_sync as avs
from bench import common
from posttrain.envs.synthetic.arith import parse_integer_answer
from posttrain.runtime import RunContext

TRL_PIN = "trl==1.16.0"
"""The TRL version this benchmark was written and run against (``bench/requirements-trl.txt``, ``make bench-deps``)."""
METHODS = ("trl_grpo", "grpo_sync", "sao")
TARGET_GAIN = 0.1
"""The probe target: the warm start's probe reward + this."""


def run_trl(config: Any, base: Any, sft: Path, snap_dir: Path, eval_every: int) -> tuple[avs.MethodRun, str]:
    """Train ``trl.GRPOTrainer`` from ``sft`` with the ``grpo_sync`` ``config``, recording steps and snapshots as
    ``bench.async_vs_sync.run_method`` does; the run and TRL's version. ImportError without TRL (``make bench-deps``)."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from posttrain.models.hf import load_tokenizer

    g = config.grpo
    run, batch = avs.MethodRun("trl_grpo", load_avg=[os.getloadavg()[0]]), g.batch_rollouts
    shutil.rmtree(snap_dir, ignore_errors=True)  # save_pretrained makes the snapshot folders
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": t.prompt}], "reference": t.reference}
                                 for t in base.tasks("train")])

    def arith_reward(prompts: list[Any], completions: list[Any], reference: list[str], **_: Any) -> list[float]:
        """1.0 when the integer after the last ``####`` equals the reference (``SyntheticArithEnv``'s verifier)."""
        texts = [c[0]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [1.0 if (a := parse_integer_answer(t)) is not None and str(a) == ref.strip() else 0.0
                for t, ref in zip(texts, reference, strict=True)]

    args = trl.GRPOConfig(
        output_dir=str(base.run_dir.parent / "trl_grpo"), use_cpu=True, seed=config.seed, max_steps=g.steps,
        learning_rate=g.optim.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=g.group_size,
        max_completion_length=config.generator.max_new_tokens, temperature=1.0, top_p=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, loss_type="dapo", scale_rewards="group", num_iterations=1, logging_steps=1,
        save_strategy="no", report_to=[], bf16=False, disable_tqdm=True, dataloader_num_workers=0)
    t0 = time.monotonic()

    class Recorder(TrainerCallback):
        """Records each step's metrics and time; saves weight snapshots every ``eval_every`` steps."""

        def on_log(self, _args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            if logs and "reward" in logs:
                generated = float(logs.get("completions/mean_length", 0.0)) * batch
                trained = generated * (1.0 - float(logs.get("frac_reward_zero_std", 0.0)))
                run.steps.append(avs.StepRecord(time.monotonic() - t0, state.global_step, True, float(batch), trained,
                                            generated, float(logs.get("step_time", 0.0)), float(logs["reward"])))

        def on_step_end(self, _args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if state.global_step % eval_every == 0 or state.global_step == g.steps:
                dst = snap_dir / f"v{state.global_step:06d}"
                model.save_pretrained(str(dst), safe_serialization=True)
                run.snapshots[state.global_step] = (time.monotonic() - t0, dst)

    print(f"[trl_grpo] {g.steps} steps of {g.prompts_per_step} x {g.group_size} rollouts (trl {trl.__version__})", flush=True)
    trl.GRPOTrainer(model=str(sft), reward_funcs=arith_reward, args=args, train_dataset=dataset,
                    processing_class=load_tokenizer(sft), callbacks=[Recorder()]).train()
    run.wall_s = time.monotonic() - t0
    run.load_avg.append(os.getloadavg()[0])
    return run, trl.__version__


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, settings and the table."""
    rows = [[name, f"{r['action_tokens_per_s']:.0f}", f"{r['trained_action_tokens_per_s']:.0f}",
             "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}",
             common.joined(r["heldout_reward"].values())] for name, r in result["methods"].items()]
    s = result["settings"]
    return "\n".join([
        common.machine_line(result["machine"]), "",
        f"Command: `{result['command']}`; TRL `{result['trl_version']}` (pin `{TRL_PIN}`, beside torch "
        f"{result['machine'].get('torch')}).", "",
        f"Setting: `synthetic_arith` (sums of two integers below {s['operand_high']}), {s['train_tasks']} train tasks, "
        f"{s['steps']} optimizer steps of {s['prompts']} prompts x {s['group_size']} rollouts (SAO: "
        f"{s['prompts'] * s['group_size']} rollouts of different prompts), at most {s['max_new_tokens']} new tokens, "
        f"lr {s['lr']}, tiny Qwen2-shaped model after {s['sft_steps']} SFT steps, everything on the CPU.", "",
        common.markdown_table(["method", "action tokens/s", "trained action tokens/s",
                        f"s to probe reward {result['target']:.2f}", "probe reward at snapshots"], rows), "",
        "Rollouts/s and wall seconds: the results file.", "",
        f"Probe reward (the first {s['eval_tasks']} training prompts x {s['eval_samples']} samples, temperature 1) of "
        f"the warm start: {result['start_reward']:.3f}; snapshots every {s['eval_every']} steps. The tiny model does "
        "not learn to add unseen numbers in this budget, so the reward is measured on training prompts.",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, common.RESULTS_DIR / "vs_trl.json")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides of both configs, e.g. grpo.steps=4")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--eval-every", type=int, default=20, help="snapshot every this many steps")
    args = p.parse_intermixed_args(argv)
    configs = {m: common.load_method("vs_trl", m, args.overrides, p) for m in ("grpo_sync", "sao")}
    if args.eval_every < 1:
        p.error(f"--eval-every: must be >= 1 steps, got {args.eval_every}")
    import torch

    torch.set_num_threads(1)  # learner and in-process engine; generator processes use 1 too
    grpo = configs["grpo_sync"]
    base, sft = avs.shared_warm_start(grpo)
    runs, trl_version = [], None
    for method in args.methods:
        snap = Path(grpo.output_dir).parent / "snapshots" / method
        if method == "trl_grpo":
            run, trl_version = run_trl(grpo, base, sft, snap, args.eval_every)
        else:
            run = avs.run_method(configs[method].model_copy(update={"run_name": method}), method, base, sft, snap, args.eval_every)
        runs.append(run)
    # the probe set: the first eval.num_tasks training tasks (the tiny model does not learn to add unseen numbers in
    # this budget, so learning speed is measured on training prompts)
    probe = base.run_dir.parent.parent / "tasks" / "train_probe.jsonl"
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("".join(json.dumps({"task_id": t.task_id, "prompt": t.prompt, "reference": t.reference,
                                         "metadata": t.metadata}) + "\n"
                             for t in base.tasks("train")[: base.config.eval.num_tasks]), encoding="utf-8")
    data = base.config.data.model_copy(update={"eval_path": str(probe)})
    start, rewards = avs.evaluate_snapshots(RunContext(base.config.model_copy(update={"data": data})), sft, runs)
    target = round(start + TARGET_GAIN, 3)
    methods = {r.method: avs.summarise(r, rewards[r.method], target) for r in runs}
    g, data = grpo.grpo, grpo.data
    result = {"command": common.command_line("bench.vs_trl", argv), "machine": common.machine_info(),
              "trl_version": trl_version, "trl_pin": TRL_PIN, "settings": {
                  "operand_high": data.env_args.get("high"), "train_tasks": data.num_train_tasks, "steps": g.steps,
                  "prompts": g.prompts_per_step, "group_size": g.group_size, "max_new_tokens": grpo.generator.max_new_tokens,
                  "lr": g.optim.lr, "sft_steps": grpo.warm_start.steps, "eval_tasks": grpo.eval.num_tasks,
                  "eval_samples": grpo.eval.samples_per_task, "eval_every": args.eval_every, "seed": grpo.seed,
                  "overrides": args.overrides}, "start_reward": start, "target": target, "methods": methods}
    common.publish_result(args.out, result, "vs_trl", lambda: render(result), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    common.run_main("bench.vs_trl", main)
