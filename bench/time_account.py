"""Where the generator's time goes: SAO against synchronous GRPO at equal episodes in flight (issue 35).

Each method runs through ``posttrain run`` (``posttrain.runners.run``), so the run records its time account
(``account.json``: ``posttrain.account``, ``posttrain.runners.accounting``) exactly as any user's run does; this
script reads the accounts and writes ``bench/results/time_account.json`` and the section ``time-account`` of
docs/kubeflow.md. The settings are ``bench.async_vs_sync``'s (``bench/configs/async_vs_sync``: the long-tailed
``synthetic_longtail`` task with log-normal tool latency), reduced so each run takes a few minutes on 2 cores:
fewer steps, a short warm start (built before the run, without tool waits), a small evaluation, shorter tool
waits (``REDUCED``). Equal episodes in flight:
synchronous GRPO's batch (``prompts_per_step x group_size`` = 64 episodes at once) is SAO's
``generator.episodes_in_flight`` (64), and SAO trains batches of 64 rollouts.

"Waiting for the group" is the share of the generator's episode capacity (slot-seconds) whose episode has ended
while its group (synchronous GRPO: its whole batch) still runs (``posttrain.inference.metering``); its complement
splits into running episodes, waiting for admission (SAO's staleness bound) and waiting for the learner
(synchronous GRPO between batches).

Run: ``.venv/bin/python -m bench.time_account`` (about 8 minutes on 2 cores; ``--methods sao`` for one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench import common

RESULTS = common.RESULTS_DIR / "time_account.json"
"""The results file."""
DOC = common.REPO / "docs" / "kubeflow.md"
"""The docs page whose generated section this script writes."""
SECTION = "time-account"
"""The generated section's name (``<!-- bench:time-account:begin -->`` ... ``<!-- bench:time-account:end -->``)."""
METHODS = {"sao": "sao", "grpo_sync": "grpo_sync_g8"}
"""Label -> ``bench/configs/async_vs_sync`` method."""
REDUCED = [
    "warm_start.steps=40", "data.num_train_tasks=400", "data.num_eval_tasks=16", "eval.num_tasks=16",
    "eval.samples_per_task=1", "data.env_args.tool_latency_median_s=1.0", "data.env_args.tool_latency_max_s=10.0",
    "generator.episodes_in_flight=64", "tracking.register_final=false",
]
"""Overrides on ``bench.async_vs_sync``'s settings (both methods)."""
PER_METHOD = {"sao": ["sao.steps=4", "sao.batch_size=64", "sao.checkpoint_every=4"],
              "grpo_sync": ["grpo.steps=4", "grpo.prompts_per_step=8", "grpo.group_size=8", "grpo.checkpoint_every=4"]}
"""Each method's steps and batch: 4 policy versions of 64 rollouts."""


def run_one(label: str, out_dir: Path, extra: list[str]) -> dict[str, Any]:
    """Train ``label`` through ``posttrain run``; its account and load, as JSON-able numbers."""
    from posttrain.account import RunAccount
    from posttrain.runners import run
    from posttrain.runners.common import prepare, warm_start
    from posttrain.runtime import RunContext

    config = common.load_method("async_vs_sync", METHODS[label],
                                [*REDUCED, *PER_METHOD[label], f"output_dir={out_dir}", f"run_name={label}", *extra])
    # The warm start first, without the tool latency (as bench.async_vs_sync's shared warm start): its reference
    # episodes step the environment one task after another, and 400 tasks of tool waits would take half an hour.
    # The run then finds its tokenizer, base model and warm start in place and skips them (its account's
    # preparing and warm_start shares are the time to find them).
    data = config.data.model_copy(update={"env_args": {k: v for k, v in config.data.env_args.items()
                                                       if not k.startswith("tool_latency")}})
    base = RunContext(config.model_copy(update={"data": data, "run_name": f"{label}-warm-start"}))
    prepare(base)
    warm_start(base)
    ctx = RunContext(config)  # the run's own directory: the tokenizer, base model and warm start copied in
    for src, dst in ((base.tokenizer_dir, ctx.tokenizer_dir), (base.base_model_dir, ctx.base_model_dir),
                     (base.sft_model_dir, ctx.sft_model_dir)):
        if not dst.exists():
            shutil.copytree(src, dst)
    t0 = time.monotonic()
    summary = run(config)
    wall = time.monotonic() - t0
    account = RunAccount.from_json((summary.run_dir / "account.json").read_text(encoding="utf-8"))
    roles = {r.role: {"wall_s": r.wall_s, "processes": r.processes, "shares_s": r.shares, "fractions": r.fractions(),
                      "requested_cpu_s": r.requested_cpu_s, "used_cpu_s": r.used_cpu_s, "used_by": r.used_by}
             for r in account.roles}
    return {"method": METHODS[label], "wall_s": wall, "roles": roles, "derived": account.derived(),
            "load_avg_after": [round(x, 2) for x in os.getloadavg()]}


def section(data: dict[str, Any]) -> str:
    """The docs section: the answers table, then the generator's and learner's shares per method."""
    runs = data["runs"]
    lines = ["| method | waiting for the group (slot-s share) | slots running | slots waiting for admission | "
             "slots waiting for the learner | engine generating | engine waiting on tools | "
             "engine waiting for admission | engine waiting for the learner | engine idle | learner waiting for a batch |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, r in runs.items():
        slots = r["roles"]["generator_slots"]["fractions"]
        engine = r["roles"]["generator"]["fractions"]
        learner = r["roles"]["learner"]["fractions"]
        lines.append(f"| {label} | **{slots.get('waiting_for_group', 0):.1%}** | {slots.get('running', 0):.1%} | "
                     f"{slots.get('waiting_for_admission', 0):.1%} | {slots.get('waiting_for_learner', 0):.1%} | "
                     f"{engine.get('generating', 0):.1%} | {engine.get('waiting_on_tools', 0):.1%} | "
                     f"{engine.get('waiting_for_admission', 0):.1%} | {engine.get('waiting_for_learner', 0):.1%} | "
                     f"{engine.get('idle', 0):.1%} | {learner.get('waiting_for_batch', 0):.1%} |")
    walls = ", ".join(f"{k} {v['wall_s']:.0f}" for k, v in runs.items())
    loads = ", ".join(f"{k} {v['load_avg_after']}" for k, v in runs.items())
    lines += ["", f"Wall time per run (s): {walls}. "
              f"Commit {data['commit']}, {data['when']}. {common.machine_line(data['machine'])} "
              f"Load average after each run: {loads}.",
              "", f"Command: `{data['command']}`; settings: `bench/configs/async_vs_sync` with "
              f"`{' '.join(REDUCED)}` and per method {json.dumps(PER_METHOD)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the methods, write the results file and the docs section; returns the exit status."""
    import subprocess

    parser = argparse.ArgumentParser(prog="bench.time_account", description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: sao, grpo_sync")
    parser.add_argument("--out-dir", default="runs/bench/time_account", help="run directories")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite the docs section")
    parser.add_argument("overrides", nargs="*", help="dotted key=value for both methods")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    labels = [m for m in args.methods.split(",") if m]
    unknown = [m for m in labels if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; known: {sorted(METHODS)}")
    out = Path(args.out_dir).resolve()
    previous = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.is_file() else {"runs": {}}
    runs = dict(previous.get("runs", {}))
    for label in labels:
        runs[label] = run_one(label, out, list(args.overrides))
        print(f"{label}: {json.dumps(runs[label]['roles']['generator_slots']['fractions'])}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    data = {"runs": runs, "machine": common.machine_info(), "when": common.utc_now(), "commit": commit,
            "command": common.command_line("bench.time_account", argv)}
    common.write_result(RESULTS, data)
    if not args.no_docs:
        common.update_docs_section(SECTION, section(data), DOC)
    print(section(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
