"""The learning race (issue 22): does SAO reach a better model sooner than GRPO at equal resources, and the paper's
ablations in miniature.

One command per study; each writes ``bench/results/learning_race/<study>.json``, its PNG plots under
``docs/results/`` and its section of ``docs/results.md`` (between ``<!-- bench:learning_race_<study>:begin/end -->``):

* ``race``: the calculator tool task (``synthetic_tool``) with a log-normal wall time per tool call; SAO, synchronous
  GRPO G = 4 and G = 8, asynchronous GRPO + DIS (G = 8), each ``bench/configs/learning_race/<method>.yaml`` on
  ``base.yaml``: the same episodes in flight, learner batch, policy versions, warm start, generator count and
  hardware. Per run: held-out accuracy of snapshots against wall-clock seconds and trained rollouts, time to
  ``--target`` accuracy, trained tokens/s and rollouts/s after the first quarter of the versions.
* ``tail``: the race's setting with a heavier tool-latency tail (``TAIL``), SAO, synchronous and asynchronous GRPO
  G = 8.
* ``correction`` (ablation a): SAO with ``sao.loss.correction`` dis / tis / none at a mean staleness >= 2
  (``STUDY_OVERRIDES``: more slots than the batch, a larger tau); the realised staleness is measured per run.
* ``baseline`` (ablation b): ``sao.advantage`` gae (critic + skip-observation GAE) / running_mean / batch_norm.
* ``grid`` (ablation d): tau in {1, 4} x SAO lr in {1e-4, 4e-4} (the setting of ``correction``, where tau binds).
* ``stability`` (ablation c): ``stability.yaml`` (SAO, 1,000 versions; hours, run by hand) or, with ``--from-run
  DIR``, only reads that run directory's ``metrics.jsonl``: reward, entropy, masked fraction, mismatch KL, grad norm
  and the critic's explained variance against version, and a table by version window.

Every training study runs seed-major (``for seed: for variant:``) so the machine's load hits every variant alike,
from one SFT warm start (``bench.async_vs_sync.shared_warm_start``), and grades every snapshot of every run on the
same held-out tasks afterwards (``evaluate_snapshots``). ``--quick``: 2 versions, 1 seed, 4 held-out tasks, a 5-step
warm start, into a temporary folder (or ``--out-dir``), no docs rewrite (``make test`` runs it).

Run: ``.venv/bin/python -m bench.learning_race race`` (then ``correction``, ``baseline``, ``grid``;
``stability --from-run runs/bench/learning_race/stability-sao``); ``... race --quick`` for the smoke run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import common
from bench import longtail_evidence as lte
from bench.async_vs_sync import MethodRun, evaluate_snapshots, run_method, shared_warm_start
from posttrain.data.jsonl_log import read_json_lines

NAME = "learning_race"
RESULTS = common.RESULTS_DIR / NAME
"""``<study>.json``."""
DOCS = common.REPO / "docs" / "results.md"
"""The results page; each study rewrites its section."""
PLOTS = common.REPO / "docs" / "results"
"""``learning_race_<study>*.png``."""
LOG = common.REPO / "docs" / "log.md"
ON_LOG = ("tail", "correction", "baseline", "stability", "grid", "longtail_baseline", "longtail_correction",
          "longtail_stability")
"""Studies whose sections live in ``LOG``: the ablations on ``synthetic_tool``, superseded on docs/results.md by their
``longtail_*`` reruns (issue 29), the older studies moved with them, and the tables of the long-tail ablations and
stability runs (their reading stays on docs/results.md), to keep the results page short."""
METHODS = ("sao", "grpo_sync_g4", "grpo_sync_g8", "grpo_async_g8")
"""The race's methods, files of ``bench/configs/learning_race/``, in the order the tables show them."""
DESCRIPTION = ("The learning race (issue 22): does SAO reach a better model sooner than GRPO at equal resources? "
               "One study per command (the race, a heavier tool-latency tail, the paper's ablations in miniature, "
               "their long-tail reruns); each writes its results JSON, plots and docs section.")
"""``--help``'s description (the module docstring's first line stops mid-sentence)."""

STUDIES = ("race", "tail", "correction", "baseline", "grid", "stability", "longtail", "longtail_baseline",
           "longtail_correction", "longtail_stability", "longtail_gain", "longtail_critic")
RACES = ("race", "tail", "longtail")
"""Studies plotted and tabled as races: accuracy against seconds and rollouts, time to target, rates."""
TAIL = ("data.env_args.tool_latency_sigma=1.5", "data.env_args.tool_latency_max_s=20")
"""The long-tail race: a heavier tool-latency tail (sigma 1.5, cap 20 s against the race's 1 and 10 s), where a
synchronous batch waits for its slowest episode's tool."""
TAIL_METHODS = ("sao", "grpo_sync_g8", "grpo_async_g8")
"""The long-tail race's methods (synchronous G = 4 left out: level with G = 8 in the race, and as slow per version)."""
CONTENDED = ("generator.episodes_in_flight=96", "sao.batch_size=16", "sao.micro_batch_size=16", "sao.max_staleness=4")
"""More slots than the batch and a larger tau, so the mean staleness reaches 2 (ablations a and d)."""
STUDY_VARIANTS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "race": {m: (m, ()) for m in METHODS},
    "tail": {m: (m, TAIL) for m in TAIL_METHODS},
    "correction": {c: ("sao", (*CONTENDED, f"sao.loss.correction={c}")) for c in ("dis", "tis", "none")},
    "baseline": {a: ("sao", (f"sao.advantage={a}",)) for a in ("gae", "running_mean", "batch_norm")},
    "grid": {f"tau{t}_lr{lr}": ("sao", (*CONTENDED[:3], f"sao.max_staleness={t}", f"sao.optim.lr={lr}"))
             for t in (1, 4) for lr in ("1e-4", "4e-4")},
    "longtail": {m: (m, ()) for m in METHODS},
    "longtail_baseline": {a: ("sao", (f"sao.advantage={a}",)) for a in ("gae", "running_mean", "batch_norm")},
    "longtail_correction": {c: ("sao", (f"sao.loss.correction={c}",)) for c in ("dis", "tis", "none")},
    "longtail_stability": {m: (m, ()) for m in ("sao", "grpo_async_g8")},
    "longtail_gain": {"sao": ("sao", ())},
    "longtail_critic": {f"critic_lr{lr}": ("sao", (f"sao.critic.lr={lr}",)) for lr in ("3e-4", "1e-4")},
}
"""Per training study: variant -> (method file, overrides on it)."""
LONGTAIL = "learning_race/longtail"
"""The long-tail studies' config folder (``bench/configs/learning_race/longtail/``: ``synthetic_longtail``, 1-16
required tool calls per task, tool latency median 1 s; issue 29)."""
STUDY_CONFIGS = {s: LONGTAIL for s in STUDY_VARIANTS if s.startswith("longtail")}
"""Studies whose method files live in another folder than ``bench/configs/learning_race/``."""
QUESTIONS = {
    "race": "held-out accuracy against wall-clock seconds and trained rollouts at equal resources",
    "tail": "the race again with a heavier tool-latency tail, where a synchronous batch waits for its slowest tool call",
    "correction": "the off-policy correction (DIS / truncated IS / none) at a mean staleness of at least 2",
    "baseline": "the critic with skip-observation GAE against a running-mean baseline and whitened reward",
    "grid": "the staleness bound tau against the policy learning rate",
    "longtail": "the race on long, jagged multi-turn episodes (1-16 tool calls per task), SAO's home ground",
    "longtail_baseline": "on long-tailed episodes: the critic with skip-observation GAE against a running mean and "
                         "whitened reward",
    "longtail_correction": "on long-tailed episodes: the off-policy correction (DIS / truncated IS / none)",
    "longtail_stability": "on long-tailed episodes over many policy versions: does SAO or asynchronous GRPO + DIS "
                          "collapse, and when",
    "longtail_gain": "on long-tailed episodes: does SAO at its defaults end 3 standard errors above its warm start in "
                     "every seed, given more versions than the race",
    "longtail_critic": "on long-tailed episodes: how much of the return the critic explains before its update, at its "
                       "learning rate (3e-4) and at 1e-4, against what the left count and the policy's progress explain",
}
STABILITY_METRICS = {"reward/mean": "training reward", "policy/entropy": "policy entropy (nats/token)",
                     "mask/frac_total": "masked fraction of action tokens", "mismatch/k3_kl": "mismatch KL (k3)",
                     "policy/grad_norm": "policy grad norm (before clipping)",
                     "value/explained_variance": "critic explained variance"}
"""The stability study's quantities (``metrics.jsonl`` keys) and their labels."""
QUICK = ("warm_start.steps=5", "data.num_train_tasks=64", "eval.num_tasks=4", "eval.samples_per_task=1",
         "generator.episodes_in_flight=8", "sao.batch_size=8", "sao.micro_batch_size=8", "sao.critic.warmup_steps=1",
         "grpo.prompts_per_step=2", "grpo.drop_uniform_groups=false",
         "data.env_args.tool_latency_median_s=0.05", "data.env_args.tool_latency_max_s=0.2")
"""``--quick``'s overrides on top of 2 versions and 1 seed: a 5-step warm start, batches of 8 (GRPO: 2 groups),
4 held-out tasks, short tool waits; uniform GRPO groups still make a version (the barely warmed model scores 0)."""


def docs_for(study: str) -> Path:
    """The page that holds ``study``'s generated section: ``LOG`` for an ``ON_LOG`` study, else ``DOCS``."""
    return LOG if study in ON_LOG else DOCS


def load_variant(study: str, variant: str, versions: int, overrides: Sequence[str] = (),
                 parser: argparse.ArgumentParser | None = None) -> Any:
    """The ``RunConfig`` of one variant of a training study: its method file on ``base.yaml``, the variant's overrides,
    ``versions`` policy versions (``sao.steps`` / ``grpo.steps``, one checkpoint at the end) and ``overrides``;
    ``ConfigError`` (or ``parser.error``) in one line for a bad value."""
    method, own = STUDY_VARIANTS[study][variant]
    steps = [f"{t}.{k}={versions}" for t in ("sao", "grpo") for k in ("steps", "checkpoint_every")]
    return common.load_method(STUDY_CONFIGS.get(study, NAME), method, [*own, *steps, *overrides], parser)


def equal_resources(config: Any) -> dict[str, Any]:
    """What every variant of a study shares or differs in: episodes in flight, rollouts per policy version,
    generators, engine, tau, lr and the method's shape (G x prompts for GRPO)."""
    grpo = config.technique == "grpo"
    tech = config.grpo if grpo else config.sao
    sync = grpo and not config.grpo.async_
    return {"technique": config.technique, "asynchronous": not sync,
            "episodes_in_flight": config.grpo.batch_rollouts if sync else config.generator.episodes_in_flight,
            "batch_rollouts": config.grpo.batch_rollouts if grpo else config.sao.batch_size,
            "group_size": config.grpo.group_size if grpo else 1, "prompts_per_version": config.grpo.prompts_per_step
            if grpo else config.sao.batch_size, "generators": 1 if sync else config.generator.num_processes,
            "engine": config.generator.engine, "max_staleness": None if sync else tech.max_staleness,
            "lr": tech.optim.lr, "policy_versions": tech.steps,
            "advantage": None if grpo else config.sao.advantage,
            "correction": "dis" if grpo and config.grpo.loss.dis_mask else None if grpo else _correction(config)}


def _correction(config: Any) -> str:
    """``sao.loss.correction`` where the config has it, else ``dis`` (SAO's only policy loss before it)."""
    return str(getattr(config.sao.loss, "correction", "dis"))


def steady_rates(run: MethodRun, skip: int) -> dict[str, float | None]:
    """Trained action tokens, consumed rollouts and kept rollouts per second over the updates after policy version
    ``skip`` (the window starts at that update; the first versions train the episodes that finish first), with the
    window in seconds and versions; None without two updates in the window."""
    ups = [s for s in run.steps if s.updated and s.policy_version >= skip]
    if len(ups) < 2 or ups[-1].t <= ups[0].t:
        return {"window_s": None, "window_versions": None, "trained_action_tokens_per_s": None, "rollouts_per_s": None,
                "kept_rollouts_per_s": None}
    inside, span = ups[1:], ups[-1].t - ups[0].t
    return {"window_s": span, "window_versions": [ups[0].policy_version, ups[-1].policy_version],
            "trained_action_tokens_per_s": sum(s.trained_action_tokens for s in inside) / span,
            "rollouts_per_s": sum(s.rollouts for s in inside) / span,
            "kept_rollouts_per_s": sum(s.metrics.get("grpo/rollouts_kept", s.rollouts) for s in inside) / span}


def _mean_metric(run: MethodRun, key: str) -> float | None:
    values = [s.metrics[key] for s in run.steps if s.updated and key in s.metrics and math.isfinite(s.metrics[key])]
    return statistics.fmean(values) if values else None


def trained_mix(config: Any, skip: int) -> dict[str, float | None]:
    """The task mix the learner trained on, beside the population's: mean ``tool_wait_s`` (seconds of tool latency per
    episode) of the rollouts trained at versions after ``skip`` (the run's ledger), and the mean first-call latency
    over the run's train tasks (``call_latency_s``); None where the environment or the ledger has no such number.
    Asynchronous methods train the episodes that finish first: a trained wait below the population's shows it."""
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger
    from posttrain.runtime import RunContext

    ctx = RunContext(config)
    env = ctx.environment()
    lines = read_ledger(ctx.run_dir / LEDGER_NAME) if (ctx.run_dir / LEDGER_NAME).exists() else []
    waits = [float(r["metrics"]["tool_wait_s"]) for line in lines if int(line.get("policy_version", 0)) > skip
             for r in line["rollouts"] if "tool_wait_s" in r.get("metrics", {})]
    population = ([env.call_latency_s(t, 0) for t in ctx.tasks("train")] if hasattr(env, "call_latency_s") else [])
    return {"trained_tool_wait_s_mean": statistics.fmean(waits) if waits else None, "trained_rollouts_in_mix": len(waits),
            "population_first_call_latency_s_mean": statistics.fmean(population) if population else None}


def run_record(run: MethodRun, seed: int, accuracy: dict[int, float], start: float, target: float, skip: int,
               batch: int, mix: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's numbers in the results file: held-out accuracy by policy version with the run's seconds and
    consumed rollouts at that version (version 0: the warm start at 0 s), the first snapshot at or above ``target``,
    steady-window rates (``steady_rates``), training reward by version, the realised staleness and load averages."""
    ups = {s.policy_version: s for s in run.steps if s.updated}
    curve = [[0, 0.0, 0, start]] + [[v, round(run.snapshots[v][0], 2), v * batch, a] for v, a in sorted(accuracy.items())]
    reached = [c for c in curve[1:] if c[3] >= target]
    first = ups[min(ups)].t if ups else 0.0
    return {"seed": seed, "when": run.when, "wall_s": run.wall_s, "load_avg_start_end": run.load_avg,
            "policy_versions": max(ups, default=0), "accuracy_curve": curve,
            "final_accuracy": curve[-1][3] if len(curve) > 1 else None,
            "time_to_target_s": reached[0][1] if reached else None,
            "time_to_target_after_first_version_s": reached[0][1] - first if reached else None,
            "rollouts_to_target": reached[0][2] if reached else None,
            **steady_rates(run, skip),
            "train_reward_by_version": [[v, ups[v].reward_mean] for v in sorted(ups)],
            "version_times_s": [[v, round(ups[v].t, 2)] for v in sorted(ups)],
            "first_version_s": ups[min(ups)].t if ups else None,
            "staleness_token_lag_mean": _mean_metric(run, "staleness/token_lag_mean"),
            "staleness_mean": _mean_metric(run, "staleness/mean"),
            "masked_fraction_mean": _mean_metric(run, "mask/frac_total"), **(mix or {}),
            "counters": run.counters}


def is_longtail(config: Any) -> bool:
    """Whether a run config trains on ``synthetic_longtail`` (its studies add accuracy by required calls)."""
    return str(config.data.env) == "synthetic_longtail"


def grade_by_calls(ctx: Any, model_dir: Path) -> tuple[float, dict[str, list[float | None]]]:
    """Held-out accuracy of ``model_dir`` (``evaluate_policy``'s: the same tasks, seeds and infrastructure rule) and,
    from the same samples, ``[samples, accuracy]`` per required-calls bucket (``longtail_evidence.CALLS``; accuracy None
    for an empty bucket). ``synthetic_longtail`` only: KeyError for a held-out task without codes."""
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.eval.heldout import heldout_rollouts, heldout_scores

    samples = heldout_rollouts(ctx, model_dir, engine_kind="hf")
    accuracy = heldout_scores(samples, max_infra_share=ctx.config.eval.max_infra_error_share)["accuracy"]
    calls = {t.task_id: len(codes_of(t)) for t in ctx.tasks("eval")}
    buckets: dict[str, list[float]] = {b: [] for b in lte.labels(lte.CALLS)}
    for r in samples.rollouts:
        buckets[lte.label_of(calls[r.task_id], lte.CALLS)].append(float(r.metrics.get("correct", 0.0)))
    return accuracy, {b: [len(v), statistics.fmean(v) if v else None] for b, v in buckets.items()}


def grade_runs(base: Any, sft: Path, runs: Sequence[MethodRun], start: float | None,
               start_by_calls: dict[str, Any] | None) -> tuple[float, dict[str, dict[int, float]],
                                                               dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """Held-out accuracy of the warm start (unless ``start`` gives it) and of every snapshot of ``runs``, keyed by
    ``MethodRun.key`` then version (``evaluate_snapshots``); on ``synthetic_longtail`` also by required-calls bucket
    (``grade_by_calls``): the warm start's (unless ``start_by_calls`` gives it) and each run's last snapshot's."""
    if not is_longtail(base.config):
        start, acc = evaluate_snapshots(base, sft, list(runs), metric="accuracy", start=start)
        return start, acc, None, {}
    if start is None or start_by_calls is None:
        start, start_by_calls = grade_by_calls(base, sft)
    acc: dict[str, dict[int, float]] = {run.key: {} for run in runs}
    last: dict[str, dict[str, Any]] = {}
    for run in runs:
        for version, (_, path) in sorted(run.snapshots.items()):
            common.copy_missing(base.tokenizer_dir, path)
            acc[run.key][version], by_calls = grade_by_calls(base, path)
            last[run.key] = {"policy_version": version, "accuracy_by_calls": by_calls}
            print(f"  eval accuracy {run.key} v{version}: {acc[run.key][version]:.3f}", flush=True)
    return start, acc, start_by_calls, last


LONGTAIL_SERIES = {"reward": "training reward", "calls_mean": "tool calls per episode",
                   "policy/entropy": "policy entropy (nats/token)", "stale_masked_share": "stale-masked share",
                   "dis_masked_share": "DIS-masked share", "value/explained_variance_before":
                   "critic explained variance (before its update)", "policy/grad_norm": "policy grad norm"}
"""Per-version quantities a long-tail run records (``longtail_evidence.analyse``'s and the learner's), for the
stability plots."""


def longtail_record(config: Any, run: MethodRun) -> dict[str, Any]:
    """A ``synthetic_longtail`` run's evidence from its learner ledger: trained and dropped rollouts and the train tasks'
    share by required-calls bucket (``longtail_evidence.population``), the critic's value against the return by the
    ``left`` count (``value_by_left``; SAO only) and per version the ``LONGTAIL_SERIES`` quantities.
    FileNotFoundError without the ledger."""
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger
    from posttrain.runtime import RunContext

    ctx = RunContext(config)
    lines = read_ledger(ctx.run_dir / LEDGER_NAME)
    tasks = {t.task_id: len(codes_of(t)) for t in ctx.tasks("train")}
    rows = lte.analyse(lines, tasks, {i + 1: s.metrics for i, s in enumerate(run.steps)})
    series = {k: [[r["policy_version"], r.get(k, r["learner"].get(k))] for r in rows] for k in LONGTAIL_SERIES}
    series["broken_share"] = [[r["policy_version"], lte.broken_share(r)] for r in rows]
    return {"trained_by_calls": lte.population(lines, tasks), **critic_record(lines, tasks),
            "first_broken_version": lte.collapse_version(rows), "series": series}


def critic_record(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, int]) -> dict[str, Any]:
    """The critic's part of a long-tail run's record, from its ledger ``lines`` (``tasks``: required calls by train task
    id): ``value_by_left`` and the ``value_reference`` beside it (both empty for GRPO)."""
    return {"value_by_left": lte.value_by_left(lines, tasks), "value_reference": lte.value_reference(lines, tasks)}


def reread(result: dict[str, Any], run_dirs: Sequence[Path]) -> list[str]:
    """``--reread``: refresh ``critic_record`` in ``result`` from each run directory's ledger (after a change to the
    analysis, without training again). A directory is matched to its variant and seed by its run name,
    ``<study>_<variant>_s<seed>``, and read with its own ``resolved_config.yaml``. Returns the run names refreshed.

    Raises:
        ValueError: a path that is no directory, a directory whose name matches no variant and seed of the study's
            results, or one without a ledger or resolved config (the message names it).
    """
    from posttrain.config import load_config
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger
    from posttrain.runtime import RunContext

    done = []
    for d in run_dirs:
        if not d.is_dir():
            raise ValueError(f"{d}: no such run directory")
        name, prefix = d.name, f"{result['study']}_"
        variant, _, seed = name[len(prefix):].rpartition("_s")
        runs = result["variants"].get(variant, {}).get("runs", []) if name.startswith(prefix) else []
        run = next((r for r in runs if seed.isdigit() and r["seed"] == int(seed) and "longtail" in r), None)
        if run is None:
            raise ValueError(f"{name}: no run of that variant and seed in the {result['study']!r} results "
                             f"(run names are {prefix}<variant>_s<seed>)")
        for need in (LEDGER_NAME, "resolved_config.yaml"):
            if not (d / need).is_file():
                raise ValueError(f"{name}: no {need} in the run directory")
        ctx = RunContext(load_config(d / "resolved_config.yaml"))
        tasks = {t.task_id: len(codes_of(t)) for t in ctx.tasks("train")}
        run["longtail"].update(critic_record(read_ledger(d / LEDGER_NAME), tasks))
        done.append(name)
    return done


def sampling_se(p: float, n: int) -> float:
    """Standard error of an accuracy ``p`` measured on ``n`` independent samples: ``sqrt(p (1 - p) / n)``."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / max(n, 1))


def gain_in_se(start: float, final: float, n: int) -> float | None:
    """``(final - start)`` in standard errors of the difference of two independent accuracies on ``n`` samples each
    (``sqrt(se_start^2 + se_final^2)``, conservative for the same tasks); None when both are 0 or 1."""
    se = math.hypot(sampling_se(start, n), sampling_se(final, n))
    return (final - start) / se if se > 0 else None


def mean_se(values: Sequence[float | None], digits: int = 3) -> str:
    """``mean ± standard error over the values`` (``-`` without values; one value: itself)."""
    got = [float(v) for v in values if v is not None]
    if len(got) > 1:
        return f"{statistics.fmean(got):.{digits}f} ± {statistics.stdev(got) / math.sqrt(len(got)):.{digits}f}"
    return f"{got[0]:.{digits}f}" if got else "-"


def render_longtail(result: dict[str, Any]) -> str:
    """A long-tail study's extra tables: accuracy by required calls (warm start and each variant's last snapshot, mean
    over seeds) beside the trained share by required calls, the seeds that end 3 standard errors above the warm start,
    and the critic's explained variance before its update by the ``left`` count (variants with a critic)."""
    buckets = lte.labels(lte.CALLS)
    n = result["eval"]["tasks"] * result["eval"]["samples_per_task"]
    start_by = result.get("start_accuracy_by_calls") or {}
    rows = [["warm start", "-", "-", *[lte.fmt(start_by.get(b, [0, None])[1], 3) for b in buckets],
             *[lte.fmt(next(iter(result["variants"].values()))["runs"][0]["longtail"]["trained_by_calls"][b]["task_share"],
                       2) if result["variants"] else "-" for b in buckets]]]
    ev_rows = []
    for v, d in result["variants"].items():
        rs = [r for r in d["runs"] if "longtail" in r]
        if not rs:
            continue
        gains = [gain_in_se(result["start_accuracy"], r["final_accuracy"], n) for r in rs if r["final_accuracy"] is not None]
        above = sum(g is not None and g >= 3.0 for g in gains)
        broken = ", ".join("none" if r["longtail"].get("first_broken_version") is None
                           else str(r["longtail"]["first_broken_version"]) for r in rs)
        rows.append([v, f"{above}/{len(rs)}", broken,
                     *[lte.fmt(lte.mean([r.get("final", {}).get("accuracy_by_calls", {}).get(b, [0, None])[1]
                                         for r in rs]), 3) for b in buckets],
                     *[lte.fmt(lte.mean([r["longtail"]["trained_by_calls"][b]["trained_share"] for r in rs]), 2)
                       for b in buckets]])
        vb = [r["longtail"] for r in rs if lte.FIRST in (r["longtail"].get("value_by_left") or {})]
        if vb:
            for label, field in ((v, "value_by_left"), (f"{v}: left count + version", "value_reference")):
                ev_rows.append([label, len(vb), *[lte.fmt(lte.mean([x.get(field, {}).get(k, {}).get("explained_variance")
                                                                   for x in vb]), 2) for k in ["all", *lte.seen_labels()]],
                                sum(x.get(field, {}).get("all", {}).get("n", 0) for x in vb)])
    out = [f"By required calls: last snapshot's accuracy and trained share (warm start: the tasks' share), means over "
           f"seeds; >= 3 SE: gain in standard errors of the difference ({n} samples each); broken: >= "
           f"{lte.BROKEN_SHARE:.0%} of a version's episodes with an extra call, a malformed action or a limit.", "",
           common.markdown_table(["", "seeds >= 3 SE", "first broken version", *[f"accuracy {b} calls" for b in buckets],
                                  *[f"trained share {b}" for b in buckets]], rows)]
    if ev_rows:
        out += ["", "Critic's explained variance before its update, turns' first tokens of the iterations that trained the "
                "policy, by the `left` count the turn saw (the first turn saw none), mean over seeds; below each critic, the same for group means of the return "
                "by `left` count and window of 8 versions, cross-fitted over halves of the run (a reference: the "
                "return the count and the policy's progress explain):", "",
                common.markdown_table(["variant", "seeds", "all turns", "first turn",
                                       *[f"left {b}" for b in lte.labels(lte.LEFTS)], "turns"], ev_rows)]
        if result.get("reread"):
            out += ["", f"Critic rows re-read from the runs' ledgers: `{result['reread']}`"]
    return "\n".join(out)


def train_study(study: str, seeds: Sequence[int], versions: int, eval_every: int, target: float | None,
                overrides: Sequence[str], parser: argparse.ArgumentParser | None = None,
                on_seed: Callable[[dict[str, Any]], None] | None = None,
                variants: Sequence[str] | None = None) -> dict[str, Any]:
    """Train every variant of ``study`` (or those named in ``variants``) for every seed (seed-major), grade the
    snapshots of each seed's runs once they are done, and return the results; ``on_seed`` receives the results of the
    seeds done so far after each seed (so a study stopped early keeps what ran)."""
    import torch

    torch.set_num_threads(1)
    variants = {v: STUDY_VARIANTS[study][v] for v in (variants or STUDY_VARIANTS[study])}
    configs = {v: load_variant(study, v, versions, overrides, parser) for v in variants}
    base, sft = shared_warm_start(next(iter(configs.values())))
    skip = max(1, versions // 4)
    records: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    start: float | None = None
    start_by_calls: dict[str, Any] | None = None
    result: dict[str, Any] = {}
    for n, seed in enumerate(seeds, start=1):
        done: list[tuple[str, int, MethodRun, dict[str, float | None]]] = []
        for variant, config in configs.items():
            cfg = config.model_copy(update={"seed": seed, "run_name": f"{study}_{variant}_s{seed}"})
            snaps = Path(config.output_dir) / "snapshots" / study / variant / f"s{seed}"
            method = STUDY_VARIANTS[study][variant][0]
            run = run_method(cfg, method, base, sft, snaps, eval_every, name=f"{variant} s{seed}", episodes=False)
            mix = trained_mix(cfg, skip)
            done.append((variant, seed, run, {**mix, "longtail": longtail_record(cfg, run)} if is_longtail(cfg) else mix))
        start, acc, start_by_calls, last = grade_runs(base, sft, [r for _, _, r, _ in done], start, start_by_calls)
        goal = round(target if target is not None else start + 0.5 * (1.0 - start), 3)
        for variant, s, run, mix in done:
            records[variant].append(run_record(run, s, acc[run.key], start, goal, skip,
                                               equal_resources(configs[variant])["batch_rollouts"],
                                               {**mix, **({"final": last[run.key]} if run.key in last else {})}))
        result = {"study": study, "question": QUESTIONS[study], "machine": common.machine_info(),
                  "when": common.utc_now(), "seeds": list(seeds[:n]), "seeds_planned": list(seeds), "versions": versions,
                  "eval_every": eval_every,
                  "eval": {"tasks": base.config.eval.num_tasks, "samples_per_task": base.config.eval.samples_per_task},
                  "warm_start_steps": base.config.warm_start.steps, "env": base.config.data.env,
                  "env_args": dict(next(iter(configs.values())).data.env_args),
                  "start_accuracy": start, "target_accuracy": goal, "steady_from_version": skip,
                  **({"start_accuracy_by_calls": start_by_calls} if start_by_calls is not None else {}),
                  "variants": {v: {"overrides": list(STUDY_VARIANTS[study][v][1]), "method": STUDY_VARIANTS[study][v][0],
                                   "resources": equal_resources(configs[v]), "runs": list(records[v])}
                               for v in variants}}
        if on_seed is not None and n < len(seeds):
            on_seed(result)
    return result


def spread(values: Sequence[float | None], digits: int = 3) -> str:
    """``median (min-max)`` of the values that are not None, with ``k/n reached`` when some are None; ``-`` if none."""
    got = [float(v) for v in values if v is not None]
    if not got:
        return f"not reached (0/{len(values)})" if values else "-"
    text = (f"{statistics.median(got):.{digits}f} ({min(got):.{digits}f}-{max(got):.{digits}f})" if len(got) > 1
            else f"{got[0]:.{digits}f}")
    return text + (f", {len(got)}/{len(values)} reached" if len(got) < len(values) else "")


def mean_range(values: Sequence[float | None], digits: int = 3) -> str:
    """``mean (min-max)`` of the values that are not None; one value: itself; ``-`` if none."""
    got = [float(v) for v in values if v is not None]
    if len(got) > 1:
        return f"{statistics.fmean(got):.{digits}f} ({min(got):.{digits}f}-{max(got):.{digits}f})"
    return f"{got[0]:.{digits}f}" if got else "-"


def _mean_curve(runs: Sequence[dict[str, Any]], x: int) -> tuple[list[float], list[float]]:
    """Mean x (column ``x`` of ``accuracy_curve``) and mean accuracy per snapshot index over the runs."""
    n = min(len(r["accuracy_curve"]) for r in runs)
    return ([statistics.fmean(r["accuracy_curve"][i][x] for r in runs) for i in range(n)],
            [statistics.fmean(r["accuracy_curve"][i][3] for r in runs) for i in range(n)])


def plot_study(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """The study's PNGs in ``out_dir``: for the race, accuracy against seconds and against consumed rollouts (per-seed
    thin lines, mean thick); for an ablation, held-out accuracy and training reward against policy version."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    study, variants, paths = result["study"], result["variants"], []
    colours = {v: f"C{i}" for i, v in enumerate(variants)}
    if study in RACES:
        for x, label, suffix in ((1, "wall-clock seconds", "seconds"), (2, "rollouts consumed by the learner", "rollouts")):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for v, d in variants.items():
                for r in d["runs"]:
                    ax.plot([c[x] for c in r["accuracy_curve"]], [c[3] for c in r["accuracy_curve"]], color=colours[v],
                            alpha=0.3, linewidth=0.8)
                mx, my = _mean_curve(d["runs"], x)
                ax.plot(mx, my, color=colours[v], linewidth=2.2, marker="o", label=f"{v} (mean of {len(d['runs'])})")
            ax.axhline(result["target_accuracy"], color="grey", linestyle=":", label="target")
            ax.set(xlabel=label, ylabel="held-out accuracy", title=f"{study}: accuracy vs {label}")
            ax.legend(fontsize=8)
            fig.tight_layout()
            paths.append(out_dir / f"{NAME}_{study}_{suffix}.png")
            fig.savefig(paths[-1], dpi=110)
            plt.close(fig)
        return paths
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for v, d in variants.items():
        for r in d["runs"]:
            a1.plot([c[0] for c in r["accuracy_curve"]], [c[3] for c in r["accuracy_curve"]], color=colours[v], alpha=0.3,
                    linewidth=0.8)
            a2.plot(*zip(*r["train_reward_by_version"], strict=True), color=colours[v], alpha=0.3, linewidth=0.8)
        mx, my = _mean_curve(d["runs"], 0)
        a1.plot(mx, my, color=colours[v], linewidth=2.2, marker="o", label=v)
        n = min(len(r["train_reward_by_version"]) for r in d["runs"])
        a2.plot([d["runs"][0]["train_reward_by_version"][i][0] for i in range(n)],
                [statistics.fmean(r["train_reward_by_version"][i][1] for r in d["runs"]) for i in range(n)],
                color=colours[v], linewidth=2.2, label=v)
    a1.set(xlabel="policy version", ylabel="held-out accuracy", title=f"{study}: held-out accuracy")
    a2.set(xlabel="policy version", ylabel="training reward (batch mean)", title=f"{study}: training reward")
    a1.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / f"{NAME}_{study}.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def plot_versions(result: dict[str, Any], out_dir: Path) -> Path:
    """A long-tail study's per-version PNG: each ``LONGTAIL_SERIES`` quantity and the broken share against policy
    version, one thin line per run and the mean over seeds thick, per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [*LONGTAIL_SERIES, "broken_share"]
    labels = {**LONGTAIL_SERIES, "broken_share": "broken share (extra call, malformed, limit)"}
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for i, (v, d) in enumerate(result["variants"].items()):
        runs = [r["longtail"]["series"] for r in d["runs"] if "longtail" in r]
        for ax, key in zip(axes.flat, keys, strict=True):
            curves = [{int(x): float(y) for x, y in run.get(key, []) if y is not None} for run in runs]
            for c in curves:
                ax.plot(sorted(c), [c[x] for x in sorted(c)], color=f"C{i}", alpha=0.25, linewidth=0.7)
            shared = sorted(set.intersection(*(set(c) for c in curves))) if curves and all(curves) else []
            if shared:
                ax.plot(shared, [statistics.fmean(c[x] for c in curves) for x in shared], color=f"C{i}", linewidth=2,
                        label=v)
            ax.set(xlabel="policy version", title=labels[key])
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{result['study']}: per policy version (thin: each seed; thick: mean)")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{NAME}_{result['study']}_versions.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def render_training(result: dict[str, Any]) -> str:
    """The Markdown section of a training study (tables; the hand-written text around the markers interprets)."""
    variants, race = result["variants"], result["study"] in RACES
    longtail = result.get("env") == "synthetic_longtail"
    rows, res_rows = [], []
    for v, d in variants.items():
        rs = d["runs"]
        row = [v, len(rs), (mean_se if longtail else mean_range)([r["final_accuracy"] for r in rs])]
        if race:
            row += [spread([r["time_to_target_s"] for r in rs], 0),
                    spread([r.get("time_to_target_after_first_version_s") for r in rs], 0),
                    spread([r["rollouts_to_target"] for r in rs], 0),
                    mean_range([r["trained_action_tokens_per_s"] for r in rs], 1)]
        else:
            last = [statistics.fmean(x[1] for x in r["train_reward_by_version"][-max(1, result["versions"] // 4):])
                    for r in rs if r["train_reward_by_version"]]
            row += [mean_range(last), mean_range([r["staleness_token_lag_mean"] for r in rs], 2),
                    mean_range([r["staleness_mean"] for r in rs], 2), mean_range([r["masked_fraction_mean"] for r in rs], 3)]
        row += [mean_range([r["wall_s"] for r in rs], 0)]
        rows.append(row)
        e = d["resources"]
        res_rows.append([v, e["episodes_in_flight"], e["batch_rollouts"],
                         f"{e['prompts_per_version']} x {e['group_size']}", e["generators"],
                         "-" if e["max_staleness"] is None else e["max_staleness"], e["lr"],
                         e["advantage"] or "group", e["correction"] or "none (on-policy)"])
    head = ["variant", "seeds", "final held-out accuracy" + (" (mean ± SE)" if longtail else "")]
    head += (["s to target (median, range)", "s to target after version 1", "rollouts to target",
              "trained action tokens/s"] if race else
             ["training reward, last quarter", "token lag (mean)", "rollout staleness (mean)", "masked fraction"])
    head += ["wall s"]
    m, ev = result["machine"], result["eval"]
    loads = [x for d in variants.values() for r in d["runs"] for x in r["load_avg_start_end"]]
    planned = result.get("seeds_planned", result["seeds"])
    partial = ("" if planned == result["seeds"] else
               f" (**{len(result['seeds'])} of the {len(planned)} planned seeds {', '.join(map(str, planned))} done**)")
    out = [f"Asks: {result['question']}. Measured {result['when']}; seeds {', '.join(map(str, result['seeds']))}{partial}; "
           f"{result['versions']} versions per run; warm start {result['start_accuracy']:.3f} on {ev['tasks']} tasks x "
           f"{ev['samples_per_task']}; target {result['target_accuracy']:.3f}; "
           + (f"steady from version {result['steady_from_version']}; " if race else "") +
           f"`{result['env']}`, tool latency median {result['env_args'].get('tool_latency_median_s', 0)} s, sigma "
           f"{result['env_args'].get('tool_latency_sigma', '-')}, cap {result['env_args'].get('tool_latency_max_s', '-')} s.",
           "", common.machine_line(m) + f" Load average (1 min) at run starts and ends: {min(loads):.1f}-{max(loads):.1f}."
           if loads else common.machine_line(m), "", "Resources per variant:", "",
           common.markdown_table(["variant", "episodes in flight", "rollouts per version", "prompts x G", "generators",
                                  "tau", "lr", "advantage", "correction"], res_rows), "",
           common.markdown_table(head, rows), "",
           "Cells: mean (min-max) over seeds" + ("; to target: median (min-max) of the seeds that reached it; seconds "
                                                 "include starting the generator. Rates, the tool waits and the "
                                                 "trained mix: the results file." if race else "."),
           "", f"Command: `{result['command']}`"]
    if longtail:
        out += ["", render_longtail(result)]
    if race:
        out += ["", f"![accuracy vs seconds](results/{NAME}_{result['study']}_seconds.png)",
                f"![accuracy vs rollouts](results/{NAME}_{result['study']}_rollouts.png)"]
    else:
        out += ["", f"![{result['study']}](results/{NAME}_{result['study']}.png)"]
    if longtail:
        out += [f"![{result['study']} per version](results/{NAME}_{result['study']}_versions.png)"]
    return "\n".join(out)


def read_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """The policy iterations of a ``posttrain run`` directory's ``metrics.jsonl`` by policy version (the last line of
    each version; warm-start lines skipped); FileNotFoundError without the file, ValueError naming a bad line."""
    rows = read_json_lines(run_dir / "metrics.jsonl", "step")
    return {int(row["step"]): row for row in rows if "reward/mean" in row and int(row["step"]) > 0}


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (fewer at the start); NaNs are skipped."""
    out = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - window + 1) : i + 1] if math.isfinite(v)]
        out.append(statistics.fmean(part) if part else math.nan)
    return out


def summary_rows(path: Path) -> dict[str, str]:
    """The ``| metric | value |`` rows of a run's ``summary.md``, leaving out values that are absolute paths (results carry
    no machine's paths)."""
    rows: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("metric", "") and not set(cells[0]) <= {"-"} \
                and not cells[1].startswith(("/", "~")):
            rows[cells[0]] = cells[1]
    return rows


def stability_result(run_dir: Path, planned: int, windows: int = 10) -> dict[str, Any]:
    """The stability study's numbers from a run directory: per quantity the per-version series and a table by version
    window (``windows`` equal windows of the ``planned`` versions; the last window may be partial or empty); the
    summary's final held-out accuracy when ``summary.md`` has it."""
    rows = read_metrics(run_dir)
    versions = sorted(rows)
    size = max(1, math.ceil(planned / windows))
    table = []
    for w in range(windows):
        lo, hi = w * size + 1, min(planned, (w + 1) * size)
        inside = [rows[v] for v in versions if lo <= v <= hi]
        if lo > planned:
            break
        table.append({"versions": [lo, hi], "count": len(inside),
                      **{k: (statistics.fmean(x for r in inside if math.isfinite(x := float(r.get(k, math.nan))))
                             if any(math.isfinite(float(r.get(k, math.nan))) for r in inside) else None)
                         for k in STABILITY_METRICS}})
    summary = summary_rows(run_dir / "summary.md") if (run_dir / "summary.md").exists() else {}
    return {"study": "stability", "run_name": run_dir.name, "planned_versions": planned,
            "covered_versions": [versions[0], versions[-1]] if versions else None, "versions_logged": len(versions),
            "finished": bool(versions) and versions[-1] >= planned, "summary": summary,
            "series": {k: [[v, rows[v].get(k)] for v in versions] for k in STABILITY_METRICS}, "windows": table,
            "machine": common.machine_info(), "when": common.utc_now()}


def plot_stability(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """One PNG: each stability quantity against policy version, raw (thin) and smoothed over a 25-version window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, label) in zip(axes.flat, STABILITY_METRICS.items(), strict=True):
        pts = [(v, float(x)) for v, x in result["series"][key] if x is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, color="C0", alpha=0.3, linewidth=0.7, label="raw")
            ax.plot(xs, smooth(ys, 25), color="C0", linewidth=2.0, label="25-version mean")
        ax.set(xlabel="policy version", title=label)
    if axes.flat[0].get_legend_handles_labels()[0]:
        axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"stability: SAO, {result['run_name']} (versions {result['covered_versions']} of "
                 f"{result['planned_versions']})")
    fig.tight_layout()
    path = out_dir / f"{NAME}_stability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def render_stability(result: dict[str, Any]) -> str:
    """The stability section: coverage, the table by version window, the command and the plot."""
    rows = [[f"{w['versions'][0]}-{w['versions'][1]}", w["count"],
             *["-" if w[k] is None else f"{w[k]:.3f}" for k in STABILITY_METRICS]] for w in result["windows"]]
    cov = result["covered_versions"]
    return "\n".join([
        f"Run `{result['run_name']}` read {result['when']}: versions {cov[0]}-{cov[1]} of {result['planned_versions']} "
        f"logged ({result['versions_logged']} versions){'' if result['finished'] else ', **still running**'}."
        if cov else f"Run `{result['run_name']}`: no policy version logged yet.", "",
        *([f"Held-out accuracy (the run's summary): {sm.get('held-out accuracy after SFT', '-')} after SFT, "
           f"{sm.get('held-out accuracy after SAO', '-')} after SAO; {sm.get('optimizer steps skipped (non-finite gradient)', '-')}"
           f" optimizer steps skipped for a non-finite gradient; wall time {sm.get('wall time (s, from the process start)', sm.get('wall time (s)', '-'))} s.", ""]
          if (sm := result.get("summary")) else []), common.machine_line(result["machine"]),
        "", common.markdown_table(["versions", "logged", *STABILITY_METRICS.values()], rows), "",
        f"Command: `{result['command']}`", "", f"![stability](results/{NAME}_stability.png)"])


MERGE_SAME = ("study", "versions", "eval_every", "eval", "warm_start_steps", "env", "env_args", "start_accuracy",
              "target_accuracy", "steady_from_version")
"""Fields every results file merged by ``merge_results`` must share."""


def merge_results(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One study's results from several results files of the same study and settings, each holding other (variant,
    seed) runs (seeds or variants run as parallel processes or on other machines): each variant's runs together,
    sorted by seed; variants in the study's order; ``commands`` lists each part's command, ``machine`` and ``when``
    are the last part's.

    Raises:
        ValueError: no parts, a part that differs in one of ``MERGE_SAME`` (named), or a (variant, seed) run in two
            parts.
    """
    if not parts:
        raise ValueError("merge: no results files")
    first = parts[0]
    for i, part in enumerate(parts[1:], start=2):
        for key in MERGE_SAME:
            if first.get(key) != part.get(key):
                raise ValueError(f"merge: part {i} differs from part 1 in {key!r}: {part.get(key)!r} != {first.get(key)!r}")
    pairs = [(v, r["seed"]) for part in parts for v, d in part["variants"].items() for r in d["runs"]]
    if len(set(pairs)) != len(pairs):
        twice = sorted({p for p in pairs if pairs.count(p) > 1})
        raise ValueError(f"merge: a run is in two parts (variant, seed): {twice}")
    order = list(STUDY_VARIANTS.get(first["study"], {}))
    names = sorted({v for part in parts for v in part["variants"]}, key=lambda v: (order.index(v) if v in order
                                                                                   else len(order), v))
    merged = {**parts[-1], "seeds": sorted({s for part in parts for s in part["seeds"]}),
              "seeds_planned": sorted({s for part in parts for s in part.get("seeds_planned", part["seeds"])}),
              "commands": [part.get("command", "") for part in parts]}
    merged["variants"] = {v: {**next(part["variants"][v] for part in parts if v in part["variants"]),
                              "runs": sorted((r for part in parts if v in part["variants"]
                                              for r in part["variants"][v]["runs"]), key=lambda r: r["seed"])}
                          for v in names}
    if "start_accuracy_by_calls" in first:
        merged["start_accuracy_by_calls"] = first["start_accuracy_by_calls"]
    return merged


def publish(study: str, result: dict[str, Any], out_dir: Path, plots: Path, docs: bool, write: bool = True) -> Path:
    """Write ``<out_dir>/<study>.json`` (unless ``write`` is False) and the PNGs under ``plots``; with ``docs``, rewrite
    the study's section."""
    made = plot_stability(result, plots) if study == "stability" else plot_study(result, plots)
    if result.get("env") == "synthetic_longtail":
        made.append(plot_versions(result, plots))
    result["plots"] = [common.display_path(p) for p in made]
    path = common.write_result(out_dir / f"{study}.json", result) if write else out_dir / f"{study}.json"
    if docs:
        text = render_stability(result) if study == "stability" else render_training(result)
        common.update_docs_section(f"{NAME}_{study}", text, docs_for(study))
        print(text)
    print(f"\nWrote {common.display_path(path)} and {', '.join(result['plots'])}")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = argparse.ArgumentParser(prog="bench.learning_race", description=DESCRIPTION)
    p.add_argument("study", choices=STUDIES)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides for every variant")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--versions", type=int, default=24, help="policy versions per run (default 24)")
    p.add_argument("--eval-every", type=int, default=6, help="snapshot every this many versions, and the last")
    p.add_argument("--target", type=float, default=None,
                   help="held-out accuracy target (default: halfway from the warm start to 1)")
    p.add_argument("--variants", default="", help="comma-separated variants of the study to run (default: all)")
    p.add_argument("--from-run", type=Path, default=None, help="stability: read this run directory instead of running")
    p.add_argument("--quick", action="store_true", help="2 versions, 1 seed, a tiny eval, a temporary folder, no docs")
    p.add_argument("--out-dir", type=Path, default=None, help="results folder (default bench/results/learning_race; "
                   "--quick: a temporary folder); the plots go to its plots/ unless it is the default")
    p.add_argument("--no-docs", action="store_true", help="write the results and plots only")
    p.add_argument("--merge", type=Path, nargs="+", default=None, metavar="FILE", help="merge these results files of "
                   "the study (disjoint seeds, the same settings) into the results folder's, then plot and render")
    p.add_argument("--reread", type=Path, nargs="+", default=None, metavar="RUN_DIR", help="refresh the critic's "
                   "tables in the study's results file from these runs' ledgers (run names <study>_<variant>_s<seed>), "
                   "then plot and render")
    p.add_argument("--render", action="store_true", help="only redraw the plots and the docs section from the study's "
                   "results file")
    args = p.parse_intermixed_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds: comma-separated integers, got {args.seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        p.error(f"--seeds distinct, at least one: got {args.seeds!r}")
    for flag, value in (("--versions", args.versions), ("--eval-every", args.eval_every)):
        if value < 1:
            p.error(f"{flag}: must be >= 1, got {value}")
    if args.target is not None and not 0.0 < args.target <= 1.0:
        p.error(f"--target: an accuracy in (0, 1], got {args.target}")
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    known = list(STUDY_VARIANTS.get(args.study, {}))
    if chosen and (not known or any(v not in known for v in chosen) or len(set(chosen)) != len(chosen)):
        p.error(f"--variants: distinct variants of {args.study!r} ({', '.join(known) or 'none'}), got {args.variants!r}")
    if args.from_run is not None and args.study != "stability":
        p.error(f"--from-run: only for the stability study, not {args.study!r}")
    overrides, docs = list(args.overrides), not (args.no_docs or args.quick)
    out_dir = args.out_dir or (Path(tempfile.mkdtemp(prefix="learning_race_")) if args.quick else RESULTS)
    plots = PLOTS if out_dir.resolve() == RESULTS.resolve() else out_dir / "plots"  # docs' plots: the committed results only
    if args.quick:
        seeds, args.versions, args.eval_every = seeds[:1], 2, 1
        overrides = [*QUICK, f"output_dir={out_dir / 'runs'}", *overrides]
    if args.merge:
        try:
            result = merge_results([common.read_json(f) for f in args.merge])
        except (OSError, ValueError) as exc:
            p.error(f"--merge: {exc}")
        if result["study"] != args.study:
            p.error(f"--merge: the files hold study {result['study']!r}, not {args.study!r}")
        result["command"] = common.command_line(f"bench.{NAME}", argv)
        publish(args.study, result, out_dir, plots, docs)
        return 0
    if args.reread:
        if not (out_dir / f"{args.study}.json").is_file():
            p.error(f"--reread: no results of {args.study!r} to refresh in {common.display_path(out_dir)} (expected "
                    f"{args.study}.json there: --out-dir names the folder, default bench/results/learning_race)")
        try:
            result = common.read_json(out_dir / f"{args.study}.json")
            names = reread(result, args.reread)
        except (OSError, ValueError) as exc:
            p.error(f"--reread: {exc}")
        command = common.command_line(f"bench.{NAME}", argv)
        for d in args.reread:  # results name the runs, not this machine's paths to them
            command = command.replace(str(d), f"<dir of run {d.name}>")
        result["reread"] = command
        print(f"re-read {len(names)} runs: {', '.join(names)}")
        publish(args.study, result, out_dir, plots, docs, write=True)
        return 0
    if args.render:
        result = common.read_json(out_dir / f"{args.study}.json")
        publish(args.study, result, out_dir, plots, docs, write=False)
        return 0
    command = common.command_line(f"bench.{NAME}", argv)
    if args.from_run is not None:  # results carry the run's name, not this machine's path to it
        command = command.replace(str(args.from_run), common.display_path(args.from_run) if args.from_run.resolve()
                                  .is_relative_to(common.REPO) else f"<dir of run {args.from_run.name}>")
    if args.study == "stability":
        result = stability(args, overrides, p, out_dir)
    else:
        def partial(result: dict[str, Any]) -> None:
            publish(args.study, {**result, "command": command, "quick": args.quick}, out_dir, plots, docs)

        result = train_study(args.study, seeds, args.versions, args.eval_every, args.target, overrides, p, partial,
                             variants=chosen or None)
    result["command"], result["quick"] = command, args.quick
    publish(args.study, result, out_dir, plots, docs)
    return 0


def stability(args: argparse.Namespace, overrides: list[str], parser: argparse.ArgumentParser,
              out_dir: Path) -> dict[str, Any]:
    """Run ``stability.yaml`` (``posttrain.runners.sao.run_sao``; ``--quick``: 2 versions) unless ``--from-run``, then
    read the run directory (``stability_result``)."""
    from posttrain.config import load_config
    from posttrain.runtime import RunContext

    path = common.REPO / "bench" / "configs" / NAME / "stability.yaml"
    extra = [f"sao.steps={args.versions}", f"sao.checkpoint_every={args.versions}", "eval.num_tasks=4",
             "warm_start.steps=5", "data.num_train_tasks=64", "generator.num_processes=1",
             "generator.engine=hf", "tracking.register_final=false"] if args.quick else []
    try:
        config = load_config(path, [*extra, *[o for o in overrides if not o.startswith("data.env_args.tool_")]])
    except ValueError as exc:
        parser.error(str(exc).splitlines()[0])
    if args.from_run is not None:
        if not (args.from_run / "metrics.jsonl").is_file():
            parser.error(f"--from-run: {args.from_run} has no metrics.jsonl")
        return stability_result(args.from_run, config.sao.steps)
    from posttrain.runners.sao import run_sao

    run_sao(config)
    return stability_result(RunContext(config).run_dir, config.sao.steps)


if __name__ == "__main__":
    common.run_main("bench.learning_race", main)
