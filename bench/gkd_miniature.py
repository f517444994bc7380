"""The GKD miniature (issue 34): does on-policy distillation close the held-out gap from student to teacher, and how
does it compare with SFT on the teacher's samples at equal student tokens?

Per seed (3 by default), all on the shipped ``configs/gkd_cpu.yaml`` (the synthetic sums of two digits, a tiny
model trained from scratch):

1. **GKD**: ``posttrain run configs/gkd_cpu.yaml seed=S``: the run builds its teacher (the base model after
   ``gkd.teacher.build_steps`` SFT steps) and its student (the same base model after ``warm_start.steps``), then
   distils on the student's own samples. Its trained tokens (sum of ``gkd/trained_tokens``) are the budget.
2. **SFT on the teacher's samples** (sequence-level KD, the paper's "SeqKD" baseline): the same teacher samples one
   answer per training task, in the task order the generators use, through the same inference engine at the same
   temperature; the same student is fine-tuned on them (``technique: sft``, no packing, GKD's batch size, learning
   rate and schedule) for as many steps as make its trained tokens equal GKD's.
3. Teacher, student before, GKD and the SFT baseline are graded on the same held-out tasks and sampling seeds
   (``eval.num_tasks`` x ``eval.samples_per_task`` at temperature 1). Gap closed = (after - before) / (teacher - before).

Writes ``bench/results/gkd_miniature.json`` and the ``gkd_miniature`` section of ``docs/results.md``.
Run: ``.venv/bin/python -m bench.gkd_miniature [--seeds 0,1,2] [--work DIR]`` (about 6 minutes per seed on 2 cores).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import common
from posttrain.config import RunConfig, load_config
from posttrain.runtime import RunContext

NAME = "gkd_miniature"
CONFIG = common.REPO / "configs" / "gkd_cpu.yaml"
DOCS = common.REPO / "docs" / "results.md"
RESULT = common.RESULTS_DIR / f"{NAME}.json"


def teacher_samples(ctx: RunContext, teacher_dir: Path, count: int, out: Path) -> dict[str, float]:
    """``count`` answers of the teacher to the run's training tasks (in order, cycled), as chat rows in ``out``.

    Sampled like the generators sample the student: the run's engine, ``generator`` limits and temperature, one
    seed per sample. Returns the rows written, the empty answers left out (an SFT row needs an answer), the rows'
    mean trained tokens (answer plus end-of-turn, as an SFT row trains them) and the teacher's training reward.
    """
    from posttrain.chat.format import ChatFormat, render_sft_example
    from posttrain.episodes.runner import EpisodeLimits, run_episode
    from posttrain.inference.factory import make_engine
    from posttrain.models.hf import load_tokenizer

    cfg, gen = ctx.config, ctx.config.generator
    tasks = ctx.tasks("train")
    tokenizer = load_tokenizer(teacher_dir)
    env = ctx.environment()
    limits = EpisodeLimits(max_turns=gen.max_turns, max_new_tokens=gen.max_new_tokens,
                           max_episode_tokens=gen.max_episode_tokens, timeout_s=gen.episode_timeout_s)
    engine = make_engine(gen.engine, teacher_dir, policy_version=0, seed=cfg.seed,
                         max_model_len=gen.max_episode_tokens + gen.max_new_tokens, kv_cache_gib=gen.vllm_kv_cache_gib,
                         max_batch=max(gen.episodes_in_flight, 16))

    async def go() -> list[Any]:
        sem = asyncio.Semaphore(max(gen.episodes_in_flight, 16))

        async def one(i: int) -> Any:
            async with sem:
                return await run_episode(engine, tokenizer, env, tasks[i % len(tasks)], limits, generator_id="teacher",
                                         seed=cfg.seed * 1_000_003 + i, temperature=gen.temperature, top_p=gen.top_p)

        return await asyncio.gather(*(one(i) for i in range(count)))

    try:
        rollouts = list(asyncio.run(go()))
    finally:
        engine.close()
    chat = ChatFormat(tokenizer)
    trained, rows = 0, 0
    with out.open("w", encoding="utf-8") as f:
        for i, r in enumerate(rollouts):
            answer = tokenizer.decode([t for t, a in zip(r.token_ids, r.action_mask, strict=True) if a],
                                      skip_special_tokens=True)
            if not answer.strip():
                continue  # an SFT row needs an answer to train on (docs/data.md); counted in empty_dropped
            messages = [{"role": "user", "content": tasks[i % len(tasks)].prompt},
                        {"role": "assistant", "content": answer}]
            trained += sum(render_sft_example(tokenizer, messages, chat)[1][1:])
            rows += 1
            f.write(json.dumps({"id": f"teacher-{i}", "messages": messages}) + "\n")
    return {"rows": float(rows), "empty_dropped": float(len(rollouts) - rows), "tokens_mean": trained / max(rows, 1),
            "reward_mean": sum(r.reward for r in rollouts) / max(len(rollouts), 1)}


def _trained_tokens(run_dir: Path, key: str) -> float:
    from posttrain.data.jsonl_log import read_json_lines

    return sum(float(row[key]) for row in read_json_lines(run_dir / "metrics.jsonl", "step") if key in row)


def one_seed(seed: int, work: Path, overrides: list[str]) -> dict[str, Any]:
    """GKD, the teacher's samples and the SFT baseline for ``seed`` (module docstring); their accuracies and costs."""
    from posttrain.eval.heldout import evaluate_policy
    from posttrain.runners import run

    common_overrides = [f"seed={seed}", f"output_dir={work / 'runs'}",
                        f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}", "tracking.register_final=false",
                        *overrides]
    gkd_cfg = load_config(CONFIG, [f"run_name=gkd-s{seed}", *common_overrides])
    ctx = RunContext(gkd_cfg)
    t0 = time.monotonic()
    run(gkd_cfg)
    gkd_s = time.monotonic() - t0
    gkd_tokens = _trained_tokens(ctx.run_dir, "gkd/trained_tokens")
    samples_path = work / f"teacher-samples-s{seed}.jsonl"
    g = gkd_cfg.gkd
    t0 = time.monotonic()
    samples = teacher_samples(ctx, ctx.teacher_model_dir, g.steps * g.on_policy_rows, samples_path)
    sample_s = time.monotonic() - t0
    sft_steps = max(1, round(gkd_tokens / (g.batch_size * samples["tokens_mean"])))
    optim = g.optim
    sft_cfg = load_config(CONFIG, [
        f"run_name=sft-s{seed}", *common_overrides, "technique=sft", f"model.path={ctx.sft_model_dir}",
        f"sft.data_path={samples_path}", f"sft.steps={sft_steps}", f"sft.batch_size={g.batch_size}",
        f"sft.micro_batch_size={g.micro_batch_size}", "sft.packing=false", f"sft.max_seq_len={g.max_seq_len}",
        f"sft.checkpoint_every={sft_steps}", f"sft.optim.lr={optim.lr}", f"sft.optim.warmup_steps={optim.warmup_steps}",
        f"sft.optim.schedule={optim.schedule}", f"sft.optim.grad_clip={optim.grad_clip}"])
    t0 = time.monotonic()
    run(sft_cfg)
    sft_s = time.monotonic() - t0
    sft_ctx = RunContext(sft_cfg)
    accuracy = {name: evaluate_policy(ctx, model)["accuracy"] for name, model in (
        ("teacher", ctx.teacher_model_dir), ("student", ctx.sft_model_dir), ("gkd", ctx.final_model_dir),
        ("sft_on_teacher_samples", sft_ctx.final_model_dir))}
    return {"seed": seed, "accuracy": accuracy, "gkd_trained_tokens": gkd_tokens,
            "sft_trained_tokens": _trained_tokens(sft_ctx.run_dir, "sft/tokens"), "sft_steps": sft_steps,
            "teacher_samples": samples, "seconds": {"gkd_run": gkd_s, "teacher_samples": sample_s, "sft_run": sft_s},
            "load_avg_end": [round(x, 2) for x in os.getloadavg()]}


def gap_closed(acc: dict[str, float], method: str) -> float:
    """(method - student) / (teacher - student); NaN without a gap."""
    gap = acc["teacher"] - acc["student"]
    return (acc[method] - acc["student"]) / gap if gap > 0 else math.nan


def gap_closed_se(acc: dict[str, float], method: str, n: int) -> float:
    """One-sigma sampling error of ``gap_closed`` from the binomial errors of the three accuracies (``n`` samples
    each), treated as independent: sqrt(var(after) + (1 - c)^2 var(before) + c^2 var(teacher)) / gap."""
    gap = acc["teacher"] - acc["student"]
    if gap <= 0:
        return math.nan
    c = gap_closed(acc, method)

    def var(p: float) -> float:
        return p * (1 - p) / n

    return math.sqrt(var(acc[method]) + (1 - c) ** 2 * var(acc["student"]) + c ** 2 * var(acc["teacher"])) / gap


def render(result: dict[str, Any]) -> str:
    """The ``gkd_miniature`` section of docs/results.md."""
    n = result["eval_samples"]
    rows = []
    for r in result["seeds"]:
        a = r["accuracy"]
        se = {k: math.sqrt(v * (1 - v) / n) for k, v in a.items()}
        rows.append([r["seed"], f"{a['teacher']:.3f} ± {se['teacher']:.3f}", f"{a['student']:.3f} ± {se['student']:.3f}",
                     f"{a['gkd']:.3f} ± {se['gkd']:.3f}",
                     f"{gap_closed(a, 'gkd'):.2f} ± {gap_closed_se(a, 'gkd', n):.2f}",
                     f"{a['sft_on_teacher_samples']:.3f} ± {se['sft_on_teacher_samples']:.3f}",
                     f"{gap_closed(a, 'sft_on_teacher_samples'):.2f} ± {gap_closed_se(a, 'sft_on_teacher_samples', n):.2f}",
                     f"{r['gkd_trained_tokens']:.0f} / {r['sft_trained_tokens']:.0f}",
                     f"{r['seconds']['gkd_run']:.0f} / {r['seconds']['teacher_samples'] + r['seconds']['sft_run']:.0f}"])
    closed = [gap_closed(r["accuracy"], "gkd") for r in result["seeds"]]
    base = [gap_closed(r["accuracy"], "sft_on_teacher_samples") for r in result["seeds"]]
    met = sum(c >= 0.5 for c in closed)
    cfg = result["config"]
    loads = [x for r in result["seeds"] for x in r["load_avg_end"][:1]]
    return "\n\n".join([
        f"Asks: does GKD close at least half of the held-out gap from student to teacher, and how does SFT on the "
        f"teacher's samples do at equal student tokens? Measured {result['machine']['when']}; seeds "
        f"{', '.join(str(r['seed']) for r in result['seeds'])}; `configs/gkd_cpu.yaml`: teacher = base model + "
        f"{cfg['teacher_build_steps']} SFT steps, student = base model + {cfg['warm_start_steps']} SFT steps, GKD "
        f"{cfg['steps']} versions of {cfg['batch_size']} student samples (lambda {cfg['lmbda']}, {cfg['divergence']} "
        f"beta {cfg['beta']}, tau {cfg['max_staleness']}); held-out accuracy on {n} samples per model "
        f"({cfg['eval_tasks']} tasks x {cfg['eval_samples']}, temperature 1), ± one binomial sigma.",
        common.machine_line(result["machine"]) + f" Load average (1 min) at the end of each seed: "
        f"{', '.join(f'{x:.1f}' for x in loads)}.",
        common.markdown_table(
            ["seed", "teacher", "student before", "GKD", "GKD gap closed", "SFT on teacher samples", "SFT gap closed",
             "trained tokens GKD / SFT", "s GKD run / samples + SFT"], rows),
        f"GKD closed at least half of the gap in {met} of {len(closed)} seeds (mean {statistics.fmean(closed):.2f}); "
        f"SFT on the teacher's samples at equal tokens closed {statistics.fmean(base):.2f} on average. "
        f"Seconds: the whole GKD run (teacher build, warm start, three evaluations, distillation) / sampling the "
        f"teacher's answers plus the SFT run (with its evaluation); wall-clock on a shared machine, not a cost "
        f"comparison. Cells: accuracy ± sqrt(p(1-p)/{n}); gap closed ± the three accuracies' errors propagated as independent "
        f"(the held-out set has {cfg['heldout_problems']} distinct problems, each asked {n // max(cfg['heldout_problems'], 1)} "
        f"times, so the samples are not independent and the true error is larger).",
        f"Command: `{result['command']}`",
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, RESULT)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--work", type=Path, default=common.REPO / "runs" / "bench" / NAME,
                   help="where the runs go (default runs/bench/gkd_miniature)")
    p.add_argument("overrides", nargs="*", help="dotted overrides of configs/gkd_cpu.yaml for every run")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.work.mkdir(parents=True, exist_ok=True)
    cfg: RunConfig = load_config(CONFIG, list(args.overrides))
    results = []
    for seed in seeds:
        results.append(one_seed(seed, args.work, list(args.overrides)))
        print(json.dumps(results[-1]["accuracy"]), flush=True)
    g = cfg.gkd
    given = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--work", "--out"):  # where the runs and the file go changes no number: left out of the command
        if flag in given:
            i = given.index(flag)
            del given[i:i + 2]
    result = {
        "command": common.command_line(f"bench.{NAME}", given),
        "machine": common.machine_info(),
        "eval_samples": cfg.eval.num_tasks * cfg.eval.samples_per_task,
        "config": {"teacher_build_steps": g.teacher.build_steps, "warm_start_steps": cfg.warm_start.steps,
                   "steps": g.steps, "batch_size": g.batch_size, "lmbda": g.lmbda, "divergence": g.loss.divergence,
                   "beta": g.loss.beta, "max_staleness": g.max_staleness, "eval_tasks": cfg.eval.num_tasks,
                   "eval_samples": cfg.eval.samples_per_task,
                   "heldout_problems": len({t.prompt for t in RunContext(cfg).tasks("eval")[: cfg.eval.num_tasks]})},
        "seeds": results,
    }
    common.write_result(args.out, result)
    text = render(result)
    if not args.no_docs:
        common.update_docs_section(NAME, text, DOCS)
    print(text + f"\n\nWrote {common.display_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
