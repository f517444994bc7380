"""Gang admission of a whole SAO JobSet against an elastic generator pool on borrowed cohort quota (issue 35).

A queueing model, not a measurement: a Kueue cohort of ``capacity`` GPUs shared with other teams' jobs, and one
team's SAO run that needs a learner of ``learner_gpus`` and ``generators`` one-GPU generators and must produce
``rollouts`` rollouts. Two ways to admit the run:

* **gang** (today: one JobSet = one Workload, all pod sets admitted at once, ``posttrain.cluster.jobset``): the run
  waits until ``learner_gpus + generators`` GPUs are free at once, then runs at full rate;
* **elastic**: the learner and one generator are one Workload (admitted when ``learner_gpus + 1`` are free); every
  further generator is a one-GPU Workload of its own, admitted whenever one GPU is free (on the cohort's borrowed
  quota), and joins the run at once (SAO's generators are independent: ``docs/architecture.md``). Reclaim of
  borrowed quota (preemption) is not modelled: an admitted generator stays to the end.

Other teams' jobs arrive as a Poisson process sized 1, 2, 4 or 8 GPUs (equally likely) with exponential durations
(mean ``job_mean_s``) at the arrival rate that gives the cohort the utilisation ``load`` on its own; every job is
admitted all-or-nothing, in arrival order among those that fit (Kueue's ``BestEffortFIFO``). The SAO rate per
generator (rollouts per second) comes from the calibrated simulator's projection at 8 generators
(``bench/results/simulate.json``: SAO's rate grows linearly with generators there, 0.75 rollouts/s each); the
learner is sized for all ``generators``, so the run's rate is that times the generators it holds.

For each load and ``trials`` random submission times: the wait until the run starts, until it holds every
generator, its completion time, and the GPU-seconds it held (learner + generators), as medians and 90th
percentiles. Writes ``bench/results/gang_admission.json`` and the section ``gang-admission`` of docs/kubeflow.md.

Run: ``.venv/bin/python -m bench.gang_admission`` (seconds; pure Python).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
from dataclasses import dataclass
from typing import Any

from bench import common

RESULTS = common.RESULTS_DIR / "gang_admission.json"
DOC = common.REPO / "docs" / "kubeflow.md"
SECTION = "gang-admission"
SIZES = (1, 2, 4, 8)
"""Other teams' job sizes (GPUs), equally likely."""


@dataclass(frozen=True)
class Setting:
    """The model's numbers (module docstring); seconds and GPUs."""

    capacity: int = 64
    learner_gpus: int = 8
    generators: int = 8
    rollouts: float = 21_600.0
    rate_per_generator: float = 0.75
    job_mean_s: float = 3600.0
    warmup_s: float = 50_000.0


def _run(setting: Setting, load: float, seed: int, elastic: bool) -> dict[str, float]:
    """One trial: the cohort warmed up for ``warmup_s``, then the team submits its run; its numbers."""
    rng = random.Random(seed)
    mean_size = sum(SIZES) / len(SIZES)
    arrival_rate = load * setting.capacity / (mean_size * setting.job_mean_s)
    free = setting.capacity
    ends: list[tuple[float, int]] = []  # (end time, gpus) of admitted background jobs
    queue: list[tuple[float, int, str]] = []  # (arrival, gpus, kind) waiting, in arrival order
    t = 0.0
    next_arrival = rng.expovariate(arrival_rate)
    submitted = False
    started = full = done = None
    held_gpus = 0
    progress = 0.0
    held_gpu_s = 0.0
    last = setting.warmup_s

    def admit(now: float) -> None:
        nonlocal free, started, full, held_gpus, last, progress, held_gpu_s
        i = 0
        while i < len(queue):
            arrival, gpus, kind = queue[i]
            if gpus <= free:
                free -= gpus
                queue.pop(i)
                if kind == "bg":
                    heapq.heappush(ends, (now + rng.expovariate(1.0 / setting.job_mean_s), gpus))
                else:  # the team's run (or one of its generators)
                    if started is not None:
                        progress += (now - last) * setting.rate_per_generator * max(held_gpus - setting.learner_gpus, 0)
                        held_gpu_s += (now - last) * held_gpus
                    last = now
                    started = now if started is None else started
                    held_gpus += gpus
                    if held_gpus == setting.learner_gpus + setting.generators:
                        full = now
                continue
            i += 1

    while done is None:
        t_end = ends[0][0] if ends else float("inf")
        t = min(next_arrival, t_end)
        if not submitted and t >= setting.warmup_s:
            t = setting.warmup_s
            submitted = True
            if elastic:
                queue.append((t, setting.learner_gpus + 1, "team"))
                queue.extend((t, 1, "team") for _ in range(setting.generators - 1))
            else:
                queue.append((t, setting.learner_gpus + setting.generators, "team"))
            admit(t)
            continue
        if started is not None:  # would the run finish before the next event?
            rate = setting.rate_per_generator * max(held_gpus - setting.learner_gpus, 0)
            finish = last + (setting.rollouts - progress) / rate if rate > 0 else float("inf")
            if finish <= t:
                held_gpu_s += (finish - last) * held_gpus
                done = finish
                break
        if t == next_arrival:
            queue.append((t, rng.choice(SIZES), "bg"))
            next_arrival = t + rng.expovariate(arrival_rate)
        else:
            _, gpus = heapq.heappop(ends)
            free += gpus
        admit(t)
    start = setting.warmup_s
    return {"wait_to_start_s": (started or start) - start, "wait_to_full_s": (full or done) - start,
            "completion_s": done - start, "held_gpu_s": held_gpu_s}


def summarise(values: list[float]) -> dict[str, float]:
    """Median and 90th percentile."""
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p90": ordered[int(0.9 * (len(ordered) - 1))]}


def run(setting: Setting, loads: list[float], trials: int) -> list[dict[str, Any]]:
    """Every load: gang and elastic over the same ``trials`` seeds (the same other teams' jobs)."""
    rows = []
    for load in loads:
        row: dict[str, Any] = {"load": load}
        for mode in ("gang", "elastic"):
            trials_out = [_run(setting, load, seed, mode == "elastic") for seed in range(trials)]
            row[mode] = {k: summarise([t[k] for t in trials_out]) for k in trials_out[0]}
        rows.append(row)
    return rows


def section(data: dict[str, Any]) -> str:
    """The docs section: the answers table (median / p90 seconds), then the setting."""
    s = data["setting"]
    lines = ["| other teams' load | gang: wait to start | elastic: wait to start | elastic: wait for all generators | "
             "gang: completion | elastic: completion | completion saved (median) | GPU-s held, gang / elastic |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        g, e = r["gang"], r["elastic"]

        def mp(x: dict[str, float]) -> str:
            return f"{x['median'] / 60:.0f} / {x['p90'] / 60:.0f} min"

        saved = 1 - e["completion_s"]["median"] / g["completion_s"]["median"]
        lines.append(f"| {r['load']:.0%} | {mp(g['wait_to_start_s'])} | {mp(e['wait_to_start_s'])} | "
                     f"{mp(e['wait_to_full_s'])} | {mp(g['completion_s'])} | {mp(e['completion_s'])} | {saved:.0%} | "
                     f"{g['held_gpu_s']['median'] / 3600:.0f} / {e['held_gpu_s']['median'] / 3600:.0f} GPU-h |")
    lines += ["", f"Median / 90th percentile over {data['trials']} submission times per load. Cohort of "
              f"{s['capacity']} GPUs; the run: a {s['learner_gpus']}-GPU learner and {s['generators']} one-GPU "
              f"generators, {s['rollouts']:.0f} rollouts at {s['rate_per_generator']} rollouts/s per generator "
              f"(SAO in the calibrated simulator) = {s['rollouts'] / s['rate_per_generator'] / s['generators'] / 60:.0f} "
              f"min at full rate; other teams' jobs of 1-8 GPUs, {s['job_mean_s'] / 60:.0f} min on average. "
              f"A model (`bench/gang_admission.py`), not a measurement; {data['when']}, commit {data['commit']}. "
              f"Command: `{data['command']}`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the model, write the results file and the docs section; returns the exit status."""
    import subprocess

    parser = argparse.ArgumentParser(prog="bench.gang_admission", description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default="0.5,0.7,0.85,0.95", help="other teams' utilisation of the cohort")
    parser.add_argument("--trials", type=int, default=200, help="submission times per load")
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite the docs section")
    args = parser.parse_args(argv)
    setting = Setting()
    loads = [float(x) for x in args.loads.split(",")]
    if any(not 0 < x < 1 for x in loads) or args.trials < 10:
        parser.error("--loads: each in (0, 1); --trials: at least 10")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    data = {"setting": setting.__dict__, "rows": run(setting, loads, args.trials), "trials": args.trials,
            "when": common.utc_now(), "commit": commit, "command": common.command_line("bench.gang_admission", argv)}
    common.write_result(RESULTS, data)
    if not args.no_docs:
        common.update_docs_section(SECTION, section(data), DOC)
    print(json.dumps(data["rows"], indent=1)[:3000])
    print(section(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
