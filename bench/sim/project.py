"""The simulator's command: check the model against the measured small runs, then project to a GPU cluster.

``validate_all`` re-simulates every measured run of ``bench.async_vs_sync`` with what the run and ``bench.sim.collect``
measured and reports each quantity's relative error; ``project`` runs SAO and synchronous GRPO for N = 8 ... 1024
generators under the assumptions of ``bench/configs/sim/gpu.yaml`` (dotted ``key=value`` overrides; every assumption
is printed beside the result). Writes ``bench/results/simulate.json`` and ``docs/benchmarks/simulate.png``.

Run: ``.venv/bin/python -m bench.sim`` (7 minutes on one core, 3 of them for N = 1024) or
``.venv/bin/python -m bench.sim --ns 8 --repeats 1 --out /tmp/simulate.json --no-docs`` for a quick look.
"""

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from bench import common
from bench.sim.calibrate import load_settings, validate_all
from bench.sim.model import ClusterConfig, EngineModel, LearnerModel, Workload, simulate
from posttrain.config.load import parse_overrides


def gpu_assumptions(inputs: dict[str, Any], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """``bench/configs/sim/gpu.yaml`` with ``overrides``, SAO's learner cost over GRPO's as ``inputs`` measured it,
    and the tool latency of ``inputs``' setting; ValueError for an override of a key the file does not have."""
    a = yaml.safe_load((common.REPO / "bench" / "configs" / "sim" / "gpu.yaml").read_text(encoding="utf-8"))
    for key, value in parse_overrides(list(overrides)).items():
        if key not in a or isinstance(value, dict) != isinstance(a[key], dict) or not set(value or {}) <= set(a[key]):
            raise ValueError(f"override {key}: not an assumption of bench/configs/sim/gpu.yaml (keys: {', '.join(a)})")
        a[key] = {**a[key], **value} if isinstance(value, dict) else value
    s = inputs["settings"]
    return {**a, "engine": asdict(EngineModel(**a["engine"])), "episodes_in_flight": a["engine"]["max_batch"],
            "sao_learner_cost_ratio": inputs["learner_cost"]["ratio_sao_over_grpo"],
            **{k: float(s[k]) for k in ("tool_latency_median_s", "tool_latency_sigma", "tool_latency_max_s")}}


def project(ns: Sequence[int], a: dict[str, Any], workload: Workload, learner_ratio: float | None = None) -> list[dict[str, Any]]:
    """SAO and synchronous GRPO per N under the assumptions ``a`` (``learner_ratio``: learner GPUs per generator)."""
    rows = []
    for n in ns:
        gpus = max(1, round(n * (a["learner_gpus_per_generator"] if learner_ratio is None else learner_ratio)))
        batch = n * a["rollouts_per_generator_per_step"]
        batch -= batch % a["group_size"]
        shared = dict(generators=n, episodes_in_flight=a["episodes_in_flight"], batch_rollouts=batch,
                      max_staleness=a["max_staleness"], steps=a["steps"], publish_s=a["publish_s"], reload_s=a["reload_s"],
                      engine=EngineModel(**a["engine"]), seed=0, tool_latency_median_s=a["tool_latency_median_s"],
                      tool_latency_sigma=a["tool_latency_sigma"], tool_latency_max_s=a["tool_latency_max_s"])
        t0 = time.monotonic()
        sao = simulate(ClusterConfig(method="sao", group_size=1, learner=LearnerModel(
            gpus=gpus, s_per_token=a["grpo_learner_s_per_token"] * a["sao_learner_cost_ratio"]), **shared), workload)
        grpo = simulate(ClusterConfig(method="grpo_sync", group_size=a["group_size"], learner=LearnerModel(
            gpus=gpus, s_per_token=a["grpo_learner_s_per_token"]), **shared), workload)
        speedup = sao.trained_action_tokens_per_s / grpo.trained_action_tokens_per_s if grpo.trained_action_tokens_per_s else None
        rows.append({"generators": n, "learner_gpus": gpus, "batch_rollouts": batch, "sao": asdict(sao),
                     "grpo_sync": asdict(grpo), "speedup_sao_over_grpo_sync": speedup, "sim_seconds": time.monotonic() - t0})
        print(f"  N={n}: busy SAO {sao.busy_fraction:.2f} / GRPO {grpo.busy_fraction:.2f}, speedup {speedup:.2f}x "
              f"({rows[-1]['sim_seconds']:.0f} s)", flush=True)
    return rows


def plot(rows: list[dict[str, Any]], out_png: Path) -> Path:
    """Busy fraction and slot occupancy (left) and the SAO/GRPO speedup (right) against N."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, nothing to close

    ns, fig = [r["generators"] for r in rows], Figure(figsize=(10, 3.8))
    left, right = fig.subplots(1, 2)
    for method, marker in (("sao", "o"), ("grpo_sync", "s")):
        left.plot(ns, [r[method]["busy_fraction"] for r in rows], marker=marker, ls="-", label=f"{method} busy fraction")
        left.plot(ns, [r[method]["slot_occupancy"] for r in rows], marker=marker, ls="--", alpha=0.6,
                  label=f"{method} slot occupancy")
    right.plot(ns, [r["speedup_sao_over_grpo_sync"] for r in rows], "-o", color="tab:green")
    right.axhline(1.5, color="grey", ls=":", label="target 1.5x")
    for ax, ylabel, title in ((left, "fraction of wall time", "Generator utilisation"),
                              (right, "SAO / sync GRPO trained tokens per s", "Projected speedup")):
        ax.set(xlabel="generators N", ylabel=ylabel, title=title)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylim(0, 1.05)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    return out_png


def render(result: dict[str, Any]) -> str:
    """The docs section: machine, command, the check's table, the projection's assumptions and tables, the plot."""
    v, a = result["validation"], result["assumptions"]
    e, worst, w = a["engine"], v["max_abs_relative_error"], v.get("worst") or {}
    quantities = ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s")
    by_run: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in v["rows"]:  # one row per run: measured / simulated (error) per quantity; the rest stays in the JSON
        by_run.setdefault((r["setting"], r["method"]), {})[r["quantity"]] = r
    vrows = [[setting, method, *(f"{q[k]['measured']:.3g} / {q[k]['predicted']:.3g} ({100 * q[k]['relative_error']:+.0f}%)"
                                 if k in q else "-" for k in quantities)] for (setting, method), q in by_run.items()]
    tool = (f"tool latency median {a['tool_latency_median_s']} s (sigma {a['tool_latency_sigma']}, max "
            f"{a['tool_latency_max_s']} s) per call" if a.get("tool_latency_median_s") else "instantaneous tools")
    prow = [[r["generators"], r["learner_gpus"], *(f"{r[m]['busy_fraction']:.2f}" for m in ("sao", "grpo_sync")),
             f"{r['speedup_sao_over_grpo_sync']:.2f}"] for r in result["projection"]]
    return "\n".join([
        common.machine_line(result["machine"]), "",
        f"Command: `{result['command']}` (inputs: `{result['measured_from']}`, measured at {result['measured_when']})", "",
        f"**Check against the small runs** (mean of {v['repeats']} seeds per run; how each run's twin is built: below "
        f"the section). Worst relative error: **{100 * worst:.0f}%** ({w.get('setting')}, {w.get('method')}, "
        f"{w.get('quantity')}; target: within 15%, {'met' if worst <= 0.15 else 'not met'}).", "",
        "Worst error by setting: " + ", ".join(f"`{b['setting']}` {100 * b['max_abs_relative_error']:.0f}%"
                                               for b in v["by_setting"])
        + " (each setting's engine speed factors per feeding: `simulate.json`, `validation.by_setting`).", "",
        common.markdown_table(["setting", "method", "busy fraction", "trained action tokens/s", "rollouts/s"], vrows,
                              align="llrrr"), "",
        "Cells: measured / simulated (error). Each row's measured standard error, engine probe, replayed episodes and "
        "where its engine speed came from: `simulate.json`, `validation.rows`.", "",
        f"**Projection** to a GPU cluster (assumed, not measured: continuous batching, decode step {e['step_s'] * 1e3:.0f} "
        f"ms + {e['step_s_per_row'] * 1e3:.2f} ms per row, up to {e['max_batch']} rows, prefill "
        f"{e['prefill_s_per_token'] * 1e6:.0f} us/token; GRPO learner {a['grpo_learner_s_per_token'] * 1e6:.0f} us per "
        f"trained token per GPU, SAO learner x{a['sao_learner_cost_ratio']:.2f} (critic; the ratio measured on one batch); "
        f"{a['learner_gpus_per_generator']} learner GPU per generator; {a['rollouts_per_generator_per_step']} rollouts per "
        f"generator per step; publish {a['publish_s']} s, reload {a['reload_s']} s; turn lengths of the trace "
        f"x{a['token_scale']}; {tool}; G = {a['group_size']}, tau = {a['max_staleness']}, {a['steps']} versions per run).", "",
        common.markdown_table(["N", "learner GPUs", "busy SAO", "busy GRPO", "speedup SAO/GRPO"], prow), "",
        "Rollouts per step and slot occupancy per N: `simulate.json`, `projection`.", "",
        f"![utilisation and speedup against N]({result['plot']})", "",
        f"Learner GPUs per generator at N = {result['learner_sensitivity'][0]['generators']} (same assumptions otherwise):", "",
        common.markdown_table(["learner GPUs per generator", "learner GPUs", "busy SAO", "busy GRPO", "speedup SAO/GRPO"],
                              [[f"{r['learner_ratio']:g}", r["learner_gpus"], f"{r['sao']['busy_fraction']:.2f}",
                                f"{r['grpo_sync']['busy_fraction']:.2f}", f"{r['speedup_sao_over_grpo_sync']:.2f}"]
                               for r in result["learner_sensitivity"]]),
    ])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, common.RESULTS_DIR / "simulate.json")  # --no-docs: the plot goes beside --out
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="assumptions, e.g. engine.step_s=0.03")
    p.add_argument("--ns", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512, 1024], help="generator counts")
    p.add_argument("--repeats", type=int, default=5, help="seeds per measured run in the check")
    p.add_argument("--results-dir", type=Path, default=common.RESULTS_DIR, help="where async_vs_sync/ and sim/ are read")
    args = p.parse_intermixed_args(argv)
    if args.repeats < 1 or min(args.ns) < 1:
        p.error(f"--repeats and --ns: must be >= 1, got {args.repeats} and {args.ns}")
    t0 = time.monotonic()
    try:
        settings = load_settings(args.results_dir)
        first = next(iter(settings.values()))[0]
        assumptions = gpu_assumptions(first, args.overrides)
        print("validating against the measured small runs", flush=True)
        validation = validate_all(settings, args.repeats)
    except (OSError, ValueError, KeyError) as exc:  # one line naming the file or entry; nothing written
        print(f"bench.sim: {exc}", file=sys.stderr)
        return 2
    for r in validation["rows"]:
        print(f"  {r['setting']:>13} {r['method']:>24} {r['quantity']:<28} measured {r['measured']:.3g} "
              f"simulated {r['predicted']:.3g} ({100 * r['relative_error']:+.0f}%)")
    workload = Workload.from_trace(first["trace"], token_scale=assumptions["token_scale"])
    rows = project(args.ns, assumptions, workload)
    sensitivity = [{"learner_ratio": r, **project([assumptions["sensitivity_n"]], assumptions, workload, r)[0]}
                   for r in assumptions["sensitivity_ratios"]]
    plot(rows, args.out.with_suffix(".png") if args.no_docs else common.DOCS.with_suffix("") / "simulate.png")
    result = {"command": common.command_line("bench.sim", argv), "machine": common.machine_info(),
              "measured_from": f"{common.display_path(args.results_dir)}/async_vs_sync/, sim/",
              "measured_when": first["machine"]["when"], "validation": validation, "assumptions": assumptions,
              "projection": rows, "learner_sensitivity": sensitivity, "plot": "benchmarks/simulate.png",
              "seconds": time.monotonic() - t0}
    common.publish_result(args.out, result, "simulate", lambda: render(result), docs=not args.no_docs)
    return 0
