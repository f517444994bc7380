"""SAO against synchronous GRPO (G = 4, 8) and asynchronous GRPO + DIS on a long-tailed multi-turn workload.

One command trains one method (``bench/configs/async_vs_sync/<method>.yaml`` on ``base.yaml``, then dotted
``key=value`` overrides) ``--repeats`` times (seeds ``seed``, ``seed + 1``, ...) from a shared SFT warm start and
writes ``bench/results/async_vs_sync/<setting>/<method>.json``, from which the docs section renders (``sweep/``:
SAO's capacity sweep). The setting is ``tool_latency`` (the default, where the targets are judged: each tool call
waits a log-normal wall time seeded per task) unless ``data.env_args.tool_latency_median_s=0`` (``compute_bound``).
Per run: ``busy_fraction``, ``trained_action_tokens_per_s`` (GRPO: kept groups only) and ``rollouts_per_s`` between
the first and the last policy update, ``time_to_target_s`` (the first run's snapshots every ``--eval-every``
versions against the warm start's held-out reward + ``TARGET_GAIN``) and an ``engine_probe`` before and after.

Equal resources (the headline, ``<setting>/equal/<method>.json`` via ``--out``): SAO and synchronous GRPO with the same
episodes in flight (GRPO's batch of ``prompts_per_step x G`` fills SAO's slots); ``--steady-from V`` measures throughput
over the iterations after version V and reports the mean required calls of the tasks trained there beside the train
population's, so the window is past the short episodes that finish first. The targets table reads this ratio.

Staleness rules side by side (SAO; ``sao.staleness_rule``): ``--rules token,episode`` trains the method once per
rule in the same command (same warm start, seeds and overrides; snapshots of each evaluated on the same held-out
tasks) and writes ``<setting>/rules/<method>.json``: per rule, episodes started and trained by tool-call and
action-token bucket (``posttrain.rollout.lengths``, from the learner's counters and the generators' cancellations),
mean tool calls started against trained, the shares of update tokens masked by staleness and by DIS, the ledger's
staleness check (``posttrain.learner.ledger.staleness_violations``), throughput and held-out reward.

Run (31 minutes for the four methods on 2 cores, plus 8 of warm start once): ``.venv/bin/python -m
bench.async_vs_sync sao --repeats 3``; compute-bound: ``... sao --repeats 3 data.env_args.tool_latency_median_s=0
generator.episodes_in_flight=64 sao.max_staleness=4 generator.abort_stale_episodes=false``; smoke: ``... sao
sao.steps=2 sao.checkpoint_every=2 warm_start.steps=5 data.num_train_tasks=64 output_dir=/tmp/avs --eval-every 2
--out /tmp/avs.json --no-docs``.
"""

import json
import os
import shutil
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench import common
from bench.sim.model import method_kind
from posttrain.envs.synthetic.longtail import summarise_calls
from posttrain.eval.heldout import evaluate_policy
from posttrain.learner.ledger import LEDGER_NAME, read_ledger, staleness_violations
from posttrain.rollout.lengths import CALL_BUCKETS, TOKEN_BUCKETS, labels, length_metrics
from posttrain.runtime import RunContext

RESULTS = common.RESULTS_DIR / "async_vs_sync"
"""``<setting>/<method>.json`` and ``<setting>/sweep/<point>.json``."""
METHODS = ("sao", "grpo_sync_g4", "grpo_sync_g8", "grpo_async_g8")
"""The methods, in the order the tables show them."""
SETTINGS = ("tool_latency", "compute_bound")
RULES = ("token", "episode")
"""``sao.staleness_rule`` values ``--rules`` accepts."""
TARGET_GAIN = 0.05
"""The held-out target: the warm start's reward + this."""
load_method = partial(common.load_method, "async_vs_sync")
"""``load_method(method, overrides=(), parser=None)``: ``bench.common.load_method`` on ``bench/configs/async_vs_sync``."""


def setting_of(config: Any) -> str:
    """``tool_latency`` when tool calls wait, else ``compute_bound``."""
    return "tool_latency" if float(config.data.env_args.get("tool_latency_median_s", 0.0)) > 0 else "compute_bound"


def settings_of(config: Any, eval_every: int, repeats: int) -> dict[str, Any]:
    """The numbers of a run that the tables and the simulator read, flat."""
    tech = config.grpo if config.technique == "grpo" else config.sao
    env, gen = config.data.env_args, config.generator
    return {"steps": tech.steps, "batch_rollouts": tech.batch_rollouts if config.technique == "grpo" else tech.batch_size,
            "generators": gen.num_processes, "episodes_in_flight": gen.episodes_in_flight, "engine": gen.engine,
            "calls_median": env.get("calls_median", 3.0), "calls_sigma": env.get("calls_sigma", 0.8),
            "max_calls": env.get("max_calls", 16), "tool_latency_median_s": env.get("tool_latency_median_s", 0.0),
            "tool_latency_sigma": env.get("tool_latency_sigma", 1.0), "tool_latency_max_s": env.get("tool_latency_max_s", 60.0),
            "max_new_tokens": gen.max_new_tokens, "max_episode_tokens": gen.max_episode_tokens,
            "train_tasks": config.data.num_train_tasks, "eval_tasks": config.eval.num_tasks,
            "eval_samples": config.eval.samples_per_task, "eval_every": eval_every, "sft_steps": config.warm_start.steps,
            "lr": tech.optim.lr, "max_staleness": tech.max_staleness, "micro_batch_size": tech.micro_batch_size,
            "critic_warmup": config.sao.critic.warmup_steps, "seed": config.seed,
            "staleness_rule": config.sao.staleness_rule if config.technique == "sao" else "episode",
            "keep_stale_episodes": not gen.abort_stale_episodes, "repeats": repeats}


def shared_warm_start(config: Any) -> tuple[Any, Path]:
    """The base ``RunContext`` (run ``base``, no tool latency) and its SFT warm start, built once per ``output_dir``."""
    from posttrain.runners.common import prepare, warm_start

    data = config.data.model_copy(update={"env_args": {k: v for k, v in config.data.env_args.items()
                                                       if not k.startswith("tool_latency")}})
    # One warm start for every method: the base run carries one technique whatever the method's (a run directory
    # refuses a config of another technique, and the warm start does not depend on it).
    base = RunContext(config.model_copy(update={"run_name": "base", "data": data, "technique": "sao"}))
    prepare(base)
    sft = warm_start(base)
    common.copy_missing(base.tokenizer_dir, sft)  # snapshots and evaluation load the tokenizer beside the weights
    return base, sft


@dataclass
class StepRecord:
    """One learner iteration as the metrics sink saw it (seconds since the start; the version after it)."""

    t: float
    policy_version: int
    updated: bool
    rollouts: float
    trained_action_tokens: float
    action_tokens: float
    step_s: float
    reward_mean: float
    metrics: dict[str, float] = field(default_factory=dict)
    """Every metric the learner reported for this iteration (``staleness/token_lag_mean``, ``grpo/rollouts_kept``...)."""


@dataclass
class MethodRun:
    """What one run produced before held-out evaluation."""

    method: str
    wall_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    snapshots: dict[int, tuple[float, Path]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    batch_gen_s: list[float] = field(default_factory=list)
    load_avg: list[float] = field(default_factory=list)
    when: str = ""
    engine_probe: list[dict[str, Any]] = field(default_factory=list)
    episodes: list[list[Any]] = field(default_factory=list)
    episode_wait_mismatches: int = 0
    name: str = ""
    """A label distinct among the runs evaluated together (``evaluate_snapshots`` keys by it); ``method`` when empty."""

    @property
    def key(self) -> str:
        """``name``, or ``method`` when no name was given."""
        return self.name or self.method


def run_method(config: Any, method: str, base: Any, sft: Path, snap_dir: Path, eval_every: int, *, name: str = "",
               episodes: bool = True) -> MethodRun:
    """Train one method from ``sft``; snapshot every ``eval_every``-th version and the last into ``snap_dir`` (emptied).

    ``name`` labels the run among others evaluated together (``MethodRun.key``); ``episodes`` False skips reading the
    ledger's episodes with their tool waits (``run_episodes``: environments with ``call_latency_s`` only)."""
    from bench.sim.collect import engine_probe
    from posttrain.runners.grpo_sync import run_grpo_sync
    from posttrain.runners.sao import train_sao
    from posttrain.weight_sync.store import FilesystemWeightStore

    ctx = RunContext(config)
    for d in (ctx.run_dir, snap_dir):
        shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base.tokenizer_dir, ctx.tokenizer_dir)
    ctx.save_resolved_config()
    grpo = config.technique == "grpo"
    steps, batch = (config.grpo.steps, config.grpo.batch_rollouts) if grpo else (config.sao.steps, config.sao.batch_size)
    run = MethodRun(method, name=name, engine_probe=[engine_probe(sft, config.generator.max_new_tokens)], load_avg=[os.getloadavg()[0]])
    t0, store = time.monotonic(), FilesystemWeightStore(ctx.weights_dir)

    def snapshot(version: int, t: float) -> None:
        shutil.copytree(store.path_for(version), snap_dir / f"v{version:06d}", dirs_exist_ok=True)
        run.snapshots[version] = (t, snap_dir / f"v{version:06d}")

    def sink(metrics: dict[str, float], version: int) -> None:
        now, updated = time.monotonic() - t0, version > (run.steps[-1].policy_version if run.steps else 0)
        generated = metrics.get("response/action_tokens_mean", 0.0) * batch
        tokens = metrics.get("grpo/action_tokens_kept", generated)  # GRPO trains kept groups only
        run.steps.append(StepRecord(now, version, updated, float(batch), tokens if updated else 0.0, generated,
                                    metrics.get("learner/step_s", 0.0), metrics.get("reward/mean", 0.0), dict(metrics)))
        run.batch_gen_s += [metrics["generator/batch_s"]] if "generator/batch_s" in metrics else []
        if updated and (version % eval_every == 0 or version == steps):
            snapshot(version, now)

    print(f"[{method}] {steps} policy versions of {batch} rollouts", flush=True)
    summary = (run_grpo_sync(config, start_model_dir=sft, sink=sink, progress=False) if grpo and not config.grpo.async_
               else train_sao(ctx, sft, sink))
    run.wall_s, run.when, run.counters = time.monotonic() - t0, common.utc_now(), dict(summary.counters)
    run.load_avg.append(os.getloadavg()[0])
    run.engine_probe.append(engine_probe(sft, config.generator.max_new_tokens))
    if episodes:
        run.episodes, run.episode_wait_mismatches = run_episodes(ctx, method)
    updated = [s for s in run.steps if s.updated]
    if updated and updated[-1].policy_version not in run.snapshots:  # GRPO may skip a batch: keep the last version
        snapshot(updated[-1].policy_version, updated[-1].t)
    return run


def evaluate_snapshots(base: Any, sft: Path, runs: list[MethodRun], metric: str = "reward_mean",
                       start: float | None = None) -> tuple[float, dict[str, dict[int, float]]]:
    """Held-out ``metric`` (``evaluate_policy``'s ``reward_mean`` or ``accuracy``; the same tasks and seeds) of the warm
    start (unless ``start`` gives it already) and of every snapshot of every run, keyed by ``MethodRun.key`` then
    policy version; ValueError for a key shared by two runs."""
    if len({run.key for run in runs}) != len(runs):
        raise ValueError(f"evaluate_snapshots: runs need distinct keys (name or method), got {[r.key for r in runs]}")
    start = evaluate_policy(base, sft, engine_kind="hf")[metric] if start is None else start
    out: dict[str, dict[int, float]] = {run.key: {} for run in runs}
    for run in runs:
        for version, (_, path) in sorted(run.snapshots.items()):
            common.copy_missing(base.tokenizer_dir, path)
            out[run.key][version] = evaluate_policy(base, path, engine_kind="hf")[metric]
            print(f"  eval {metric} {run.key} v{version}: {out[run.key][version]:.3f}", flush=True)
    return start, out


def run_episodes(ctx: Any, method: str) -> tuple[list[list[Any]], int]:
    """A run's ledger as ``[unit, prompt_tokens, action_tokens, observation_tokens, reward, tool_waits_s]`` per episode
    (the task's tool latency after each turn but the last) in replay order (SAO by start; GRPO groups together, the
    asynchronous ones by their first start), and how many waits miss the reported ``tool_wait_s``; FileNotFoundError
    without a ledger, ValueError for a malformed line or a rollout of a task the run lacks."""
    rollouts = [r for line in read_ledger(ctx.run_dir / LEDGER_NAME) for r in line["rollouts"] + line.get("dropped", [])]
    if (kind := method_kind(method)) == "sao":
        units = [[r] for r in sorted(rollouts, key=lambda r: r["started_at"])]
    else:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rollouts:
            groups.setdefault(str(r["group_id"]), []).append(r)
        units = list(groups.values())
        if kind == "grpo_async":
            units.sort(key=lambda g: min(r["started_at"] for r in g))
    env, tasks = ctx.environment(), {t.task_id: t for t in ctx.tasks("train")}
    episodes, mismatched = [], 0
    for unit, members in enumerate(units):
        for r in sorted(members, key=lambda r: r["started_at"]):
            if r["task_id"] not in tasks:
                raise ValueError(f"{ctx.run_dir / LEDGER_NAME}: rollout {r['rollout_id']} ran task {r['task_id']!r}, "
                                 "which the run's train task file does not have")
            calls = int(r["metrics"].get("tool_calls", 0))
            waits = [env.call_latency_s(tasks[r["task_id"]], k) if k < calls else 0.0
                     for k in range(max(0, len(r["action_tokens"]) - 1))]
            mismatched += abs(sum(waits) - float(r["metrics"].get("tool_wait_s", 0.0))) > 1e-6
            episodes.append([unit, r["prompt_tokens"], r["action_tokens"], r["observation_tokens"], r["reward"],
                             [round(w, 2) for w in waits]])
    return episodes, mismatched


def trained_calls(ctx: Any, steady_from: int) -> dict[str, float | None]:
    """Mean required tool calls (``synthetic_longtail``: codes per task) of the tasks a run trained on: over the whole
    run (``all``) and over the iterations that made versions after ``steady_from`` (``steady``); None where no rollout
    was trained. Set beside the train tasks' mean (``task_calls``) it shows whether the window's task mix matches the
    population (early versions train the episodes that finish first, the short ones). Reads ``learner_ledger.jsonl``;
    FileNotFoundError without it."""
    from posttrain.envs.synthetic.longtail import codes_of

    tasks = {t.task_id: t for t in ctx.tasks("train")}
    lines = read_ledger(ctx.run_dir / LEDGER_NAME)

    def mean(keep: Any) -> float | None:
        calls = [len(codes_of(tasks[r["task_id"]])) for line in lines if keep(line) for r in line["rollouts"]]
        return statistics.fmean(calls) if calls else None

    return {"all": mean(lambda line: True), "steady": mean(lambda line: line["policy_version"] > steady_from)}


def summarise(run: MethodRun, rewards: dict[int, float], target: float, steady_from: int = 1) -> dict[str, Any]:
    """One run's numbers in the results file; its throughputs are the iterations after the update that made policy
    version ``steady_from`` (default 1: the first update) over the seconds from it to the last update (zeros with
    fewer than two updates in that window)."""
    ups = [i for i, s in enumerate(run.steps) if s.updated and s.policy_version >= steady_from]
    updated, inside = [run.steps[i] for i in ups], run.steps[ups[0] + 1 : ups[-1] + 1] if len(ups) > 1 else []
    window = run.steps[ups[-1]].t - run.steps[ups[0]].t if inside else 0.0
    reached = [run.snapshots[v][0] for v in sorted(rewards) if rewards[v] >= target]
    return {
        "busy_fraction": run.counters.get("generator_busy_fraction"), "steady_window_s": window,
        "steady_from_version": steady_from,
        **{f"{k}_per_s": sum(getattr(s, k) for s in inside) / window if inside else 0.0
           for k in ("trained_action_tokens", "action_tokens", "rollouts")}, "wall_s": run.wall_s,
        "policy_versions": max((s.policy_version for s in run.steps), default=0), "iterations": len(run.steps),
        "learner_step_s_mean": statistics.fmean(s.step_s for s in updated) if updated else None,
        "learner_step_s": [s.step_s for s in run.steps],
        "trained_action_tokens_per_update": [s.trained_action_tokens for s in updated],
        "step_times_s": [s.t for s in run.steps], "generator_batch_s": run.batch_gen_s,
        "train_reward_first_last": [run.steps[0].reward_mean, run.steps[-1].reward_mean] if run.steps else None,
        "heldout_reward": {str(v): r for v, r in sorted(rewards.items())},
        "time_to_target_s": reached[0] if reached else None,
        "stale_dropped": run.counters.get("stale_dropped", 0.0), "stale_aborted": run.counters.get("generator_stale_aborted", 0.0),
        "load_avg_start_end": run.load_avg, "engine_probe": run.engine_probe, "when": run.when, "counters": run.counters,
        "episode_wait_mismatches": run.episode_wait_mismatches, "episodes_recorded": len(run.episodes),
        **({"episodes": run.episodes} if method_kind(run.method) == "grpo_sync" else {}),
    }


def rule_result(run: MethodRun, ctx: Any, rewards: dict[int, float], target: float) -> dict[str, Any]:
    """One rule's run: ``summarise`` plus its length accounting and the ledger's staleness check.

    ``lengths`` is ``length_metrics`` of the run's counters (the learner's ``length/*`` and ``tokens/*`` with the
    generators' cancellations); ``staleness_violations`` counts rollouts the ledger shows trained past tau."""
    return {**summarise(run, rewards, target), "lengths": length_metrics(run.counters),
            "staleness_violations": len(staleness_violations(read_ledger(ctx.run_dir / LEDGER_NAME)))}


def done_when(lengths: dict[str, float]) -> dict[str, Any]:
    """Issue 21's two length criteria of one run: the trained share of the longest tool-call bucket that has started
    episodes over the shortest such bucket's (target >= 0.8; None with fewer than two such buckets), which buckets
    those are, and mean tool calls trained over started (target >= 0.9; None without episodes)."""
    names = [b for b in labels(CALL_BUCKETS) if lengths[f"length/started_calls_{b}"]]
    short, long = (lengths[f"length/trained_share_calls_{b}"] for b in (names[0], names[-1])) if names else (0.0, 0.0)
    mean_started = lengths["length/calls_mean_started"]
    return {"share_ratio": long / short if len(names) > 1 and short else None,
            "buckets": f"{names[-1]} / {names[0]}" if len(names) > 1 else None,
            "calls_ratio": lengths["length/calls_mean_trained"] / mean_started if mean_started else None}


def render_rules(files: Sequence[dict[str, Any]]) -> str:
    """The side-by-side staleness-rule table(s) of a setting (``--rules``): by bucket, then the run's totals."""
    out: list[str] = []
    for f in files:
        rules = list(f["rules"])
        first = {r: f["rules"][r][0] for r in rules}
        head = ["", *[f"{r}: trained / started (share)" for r in rules]]
        rows = []
        for kind, buckets, unit in (("calls", CALL_BUCKETS, "tool calls"), ("tokens", TOKEN_BUCKETS, "action tokens")):
            for b in labels(buckets):
                if not any(first[r]["lengths"][f"length/started_{kind}_{b}"] for r in rules):
                    continue  # no episode of any rule in this bucket: the row is all zeros
                cells = []
                for r in rules:
                    m = first[r]["lengths"]
                    cells.append(f"{m[f'length/trained_{kind}_{b}']:.0f} / {m[f'length/started_{kind}_{b}']:.0f} "
                                 f"({m[f'length/trained_share_{kind}_{b}']:.2f})")
                rows.append([f"{unit} {b}", *cells])
        for label, fn in (
            ("cancelled in flight (in started)", lambda x: f"{x['lengths']['length/cancelled']:.0f}"),
            ("mean tool calls started / trained", lambda x: f"{x['lengths']['length/calls_mean_started']:.2f} / "
                                                             f"{x['lengths']['length/calls_mean_trained']:.2f}"),
            ("longest / shortest bucket with episodes, trained share (>= 0.8)",
             lambda x: f"{_ratio(done_when(x['lengths'])['share_ratio'])} ({done_when(x['lengths'])['buckets']} calls)"),
            ("mean calls trained / started (>= 0.9)", lambda x: _ratio(done_when(x["lengths"])["calls_ratio"])),
            ("update tokens masked: staleness / DIS", lambda x: f"{x['lengths']['tokens/stale_masked_share']:.3f} / "
                                                                f"{x['lengths']['tokens/dis_masked_share']:.3f}"),
            ("rollouts trained past tau (ledger check)", lambda x: str(x["staleness_violations"])),
            ("trained action tokens/s", lambda x: f"{x['trained_action_tokens_per_s']:.1f}"),
            ("held-out reward at snapshots", lambda x: common.joined(x["heldout_reward"].values())),
        ):
            rows.append([label, *[fn(first[r]) for r in rules]])
        s = f["settings"]
        out += [f"**Staleness rules side by side** (`{f['method']}`; token: stale tokens masked, a rollout dropped only "
                "when its newest turn is past tau, nothing cancelled; episode: dropped by its oldest turn, cancelled in "
                f"flight). tau = {s['max_staleness']}, {s['steps']} versions of {s['batch_rollouts']} rollouts, "
                f"{s['episodes_in_flight']} slots; episodes still running at the stop are in neither column; buckets "
                f"with no episode are left out. Held-out reward of the warm start: {f['start_reward']:.3f}.", "",
                common.machine_line(f["machine"]), "",
                common.markdown_table(head, rows), "", f"Command: `{f['command']}` ({f['when']})."]
    return "\n".join(out)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def setting_order(names: Iterable[str]) -> list[str]:
    """Setting names in display order: tool latency, compute-bound, then any other, sorted."""
    return sorted(names, key=lambda n: (SETTINGS.index(n) if n in SETTINGS else len(SETTINGS), n))


def read_setting(name: str, results: Path = RESULTS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A setting's method files (in ``METHODS`` order, then by name) and its capacity-sweep files (marked
    ``sweep``; by tau, then slots, letting stale episodes finish first); ValueError for a file that is not JSON."""
    main = [common.read_json(p) for p in sorted((results / name).glob("*.json"), key=lambda p: (
        METHODS.index(p.stem) if p.stem in METHODS else len(METHODS), p.stem))]
    sweep = sorted(({**common.read_json(p), "sweep": True} for p in (results / name).glob("sweep/*.json")), key=lambda r: (
        r["settings"]["max_staleness"], r["settings"]["episodes_in_flight"], not r["settings"]["keep_stale_episodes"]))
    return main, sweep


def mean_of(result: dict[str, Any], quantity: str) -> float | None:
    """Mean of a quantity over a results file's runs (None when no run has it)."""
    values = [float(r[quantity]) for r in result["runs"] if r.get(quantity) is not None]
    return statistics.fmean(values) if values else None


def cell(result: dict[str, Any], quantity: str, digits: int) -> str:
    """The mean over the runs with their range, e.g. ``0.91 (0.86-0.96)``; one run: its value; ``-`` if none."""
    values = [float(r[quantity]) for r in result["runs"] if r.get(quantity) is not None]
    if len(values) > 1:
        return f"{statistics.fmean(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
    return f"{values[0]:.{digits}f}" if values else "-"


def ratios(files: Sequence[dict[str, Any]]) -> dict[str, float]:
    """SAO's mean trained action tokens per second over each synchronous GRPO variant's."""
    rates = {f["method"]: mean_of(f, "trained_action_tokens_per_s") for f in files}
    sao = rates.get("sao")
    return {k: sao / v for k, v in rates.items() if k.startswith("grpo_sync") and sao and v}


def read_equal(name: str, results: Path = RESULTS) -> list[dict[str, Any]]:
    """A setting's equal-concurrency files (``<setting>/equal/<method>.json``, in ``METHODS`` order): each method run
    with the same episodes in flight (synchronous GRPO's batch fills SAO's slots), throughput over a steady window."""
    return [common.read_json(p) for p in sorted((results / name).glob("equal/*.json"), key=lambda p: (
        METHODS.index(p.stem) if p.stem in METHODS else len(METHODS), p.stem))]


def in_flight(result: dict[str, Any]) -> int:
    """Episodes a method can have in flight: its slots (asynchronous), or its whole batch (synchronous GRPO runs each
    batch's episodes at once and nothing else)."""
    s = result["settings"]
    return s["batch_rollouts"] if method_kind(result["method"]) == "grpo_sync" else s["episodes_in_flight"]


def targets(results: Path = RESULTS) -> dict[str, float | None]:
    """SAO's busy fraction (tool-latency setting) and its throughput over the faster synchronous GRPO at equal episodes
    in flight (``equal/``; means). The equal-batch ratio of the setting's main files is not a target: there SAO had
    8x the episodes in flight."""
    files, _ = read_setting("tool_latency", results)
    sao, by = next((f for f in files if f["method"] == "sao"), None), ratios(read_equal("tool_latency", results))
    return {"busy": mean_of(sao, "busy_fraction") if sao else None, "ratio": min(by.values()) if by else None}


def render_equal(name: str, results: Path = RESULTS) -> str:
    """The equal-resources comparison of a setting: SAO beside synchronous GRPO at equal episodes in flight (the
    headline; ``equal/``) and at equal learner batch (the setting's main files, where SAO has more in flight), with
    each run's steady window and its trained task mix against the population's. Empty without ``equal/`` files."""
    equal = read_equal(name, results)
    if not equal:
        return ""
    main, _ = read_setting(name, results)
    population = equal[0]["task_calls"]["train"]["mean"]

    def mix(f: dict[str, Any]) -> str:
        calls = [r["trained_calls"]["steady"] for r in f["runs"] if (r.get("trained_calls") or {}).get("steady")]
        return f"{statistics.fmean(calls):.2f}" if calls else "-"

    def row(f: dict[str, Any], comparison: str) -> list[Any]:
        r0, s = f["runs"][0], f["settings"]
        return [comparison, f["method"], in_flight(f), s["batch_rollouts"],
                f"{r0.get('steady_from_version', 1) + 1}-{s['steps']}", cell(f, "trained_action_tokens_per_s", 1),
                mix(f), len(f["runs"])]

    rows = [row(f, "equal episodes in flight") for f in equal]
    rows += [row(f, "equal batch (SAO 8x in flight)") for f in main if f["method"] == "sao" or
             method_kind(f["method"]) == "grpo_sync"]
    eq, eb = ratios(equal), ratios(main)

    def ratio_text(by: dict[str, float]) -> str:
        return (f"**{min(by.values()):.2f}x**" + f" ({', '.join(f'{k}: {v:.2f}x' for k, v in by.items())})"
                if by else "needs sao and a grpo_sync_g<G>")

    return "\n".join([
        "**Equal resources** (the headline): SAO's trained action tokens/s over the faster synchronous GRPO's, each over "
        "its steady window (the versions listed, past the short episodes that finish first; the population's tasks "
        f"need {population:.2f} calls).", "",
        common.machine_line(max((f["machine"] for f in equal), key=lambda m: m["when"])), "",
        common.markdown_table(["comparison", "method", "episodes in flight", "rollouts per version",
                               "steady versions", "trained action tokens/s", "required calls of trained tasks", "runs"],
                              rows), "",
        f"SAO / synchronous GRPO at **equal episodes in flight**: {ratio_text(eq)}; at equal batch, with SAO holding 8x "
        f"the episodes in flight: {ratio_text(eb)} (the earlier headline: most of it is concurrency, not asynchrony).",
        "", "Rollouts/s, the steady window's seconds and the load at each run's start and end: the results files "
        f"(`{name}/equal/<method>.json`), with each method's `command`."])


def render_setting(name: str, results: Path = RESULTS) -> str:
    """One setting's part of the docs section."""
    files, sweep = read_setting(name, results)
    inputs_path = results.parent / "sim" / f"{name}.json"
    inputs = common.read_json(inputs_path) if inputs_path.exists() else {}
    first, s, by = files[0], files[0]["settings"], ratios(files)
    calls = first["task_calls"]["train"]
    rows = [[f["method"], cell(f, "busy_fraction", 2), cell(f, "trained_action_tokens_per_s", 1),
             cell(f, "rollouts_per_s", 2), cell(f, "learner_step_s_mean", 2),
             common.joined(f["runs"][0]["heldout_reward"].values())] for f in files]
    repeated = [f"{f['method']}: {len(f['runs'])}" for f in files if len(f["runs"]) > 1]
    head = (f"**Tool-latency setting** (targets judged here): each tool call waits a log-normal wall time, median "
            f"{s['tool_latency_median_s']} s, sigma {s['tool_latency_sigma']}, capped at {s['tool_latency_max_s']} s, "
            "seeded per task (sandbox / test execution: wall time, no accelerator time)." if name == "tool_latency" else
            "**Compute-bound setting**: tool calls are instantaneous; generation and training share the same 2 CPU cores.")
    out = [head, "", common.machine_line(max((f["machine"] for f in files), key=lambda m: m["when"])), "",
           f"Setting: `synthetic_longtail` (required calls per task: median {s['calls_median']}, train mean "
           f"{calls['mean']:.1f}, max {calls['max']:.0f}); {s['batch_rollouts']} rollouts per version, {s['steps']} versions, "
           f"up to {s['episodes_in_flight']} episodes in flight, tau = {s['max_staleness']}, one `{s['engine']}` engine, "
           f"tiny model after {s['sft_steps']} SFT steps; stale episodes "
           + ("kept, stale tokens masked (`token` rule)" if s.get("staleness_rule", "episode") == "token" else
              "run to their end for the learner to drop" if s["keep_stale_episodes"] else "cancelled in flight")
           + ". Every setting and each method's `command`: its results file.", "",
           common.markdown_table(["method", "busy fraction", "trained action tokens/s", "rollouts/s", "learner s/step",
                                  "held-out reward at snapshots"], rows), ""]
    if repeated:
        out += [f"Repeated runs ({', '.join(repeated)}; seeds seed, seed + 1, ...): mean (range); held-out rewards: the "
                "first run's.",
                ""]
    out += [f"Held-out reward of the warm start: {first['start_reward']:.3f} ({s['eval_tasks']} tasks x {s['eval_samples']} "
            f"samples); snapshots every {s['eval_every']} versions.",
            "Throughput ratio SAO / synchronous GRPO (trained action tokens per second): "
            + (f"**{min(by.values()):.2f}x** against the faster synchronous variant "
               f"({', '.join(f'{k}: {v:.2f}x' for k, v in by.items())})." if by else "needs sao and a grpo_sync_g<G>.")]
    if inputs:
        lc, em = inputs["learner_cost"], inputs["engine_modes"]
        names = {"lockstep": "lockstep", "continuous": "continuous", "groups": f"in groups of {em['group_size']} of one task"}
        out += [f"Learner alone, one batch of {lc['rows']:.0f} rollouts: SAO {lc['sao_step_s']:.2f} s, GRPO "
                f"{lc['grpo_step_s']:.2f} s per iteration (**{lc['ratio_sao_over_grpo']:.1f}x**: the critic).",
                f"`hf` engine alone ({inputs['settings']['episodes_in_flight']} episodes; `bench.sim.collect`, batches and "
                f"probes in `sim/{name}.json`): "
                + ", ".join(f"fed {names[m]} {em[m]['rollouts_per_s']:.1f} rollouts/s" for m in names) + "."]
    if sweep:
        runs = len(sweep[0]["runs"])
        srows = []
        for f in sweep:
            p, rs = f["settings"], f["runs"]
            share = statistics.fmean(float(r["stale_dropped"] or 0.0) / max(float(r["stale_dropped"] or 0.0)
                                     + float(r["counters"].get("rollouts_trained") or 0.0), 1.0) for r in rs)
            srows.append([p["max_staleness"], p["episodes_in_flight"], (p["max_staleness"] + 1) * p["batch_rollouts"],
                          "finish (learner drops)" if p["keep_stale_episodes"] else "cancelled in flight",
                          cell(f, "busy_fraction", 2), cell(f, "trained_action_tokens_per_s", 1),
                          f"{share:.2f}", f"{statistics.fmean(float(r.get('stale_aborted') or 0.0) for r in rs):.0f}"])
        out += ["", f"**SAO against its admission capacity** ({runs} run{'s' if runs > 1 else ''} per point).", "",
                common.machine_line(max((f["machine"] for f in sweep), key=lambda m: m["when"])), "",
                common.markdown_table(["tau", "slots per engine", "admission capacity (rollouts)", "stale episodes",
                                "busy fraction", "trained action tokens/s", "stale-dropped share",
                                "cancelled in flight per run"], srows), "",
                f"Rollouts/s, the most episodes in flight, held-out rewards and each point's `command`: "
                f"`{name}/sweep/*.json`."]
    if equal := render_equal(name, results):
        out += ["", equal]
    rules = [common.read_json(p) for p in sorted((results / name).glob("rules/*.json"))]
    if rules:
        out += ["", render_rules(rules)]
    return "\n".join(out)


def render(results: Path = RESULTS) -> str:
    """The docs section: every setting that has results, tool latency first."""
    names = setting_order(p.name for p in results.iterdir() if any(p.glob("*.json"))) if results.is_dir() else []
    return "\n\n".join(render_setting(n, results) for n in names)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    p = common.parser(__doc__, None)
    p.add_argument("method", help=f"a file of bench/configs/async_vs_sync/: {', '.join(METHODS)}")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides, e.g. sao.max_staleness=4")
    p.add_argument("--repeats", type=int, default=1, help="runs (seeds seed, seed + 1, ...); the first is evaluated")
    p.add_argument("--eval-every", type=int, default=4, help="snapshot every this many versions (first run)")
    p.add_argument("--steady-from", type=int, default=1, help="throughputs over the iterations after the update "
                   "that made this policy version (default 1: all but the first); the trained task mix is reported for "
                   "the same window")
    p.add_argument("--rules", default="", help=f"comma-separated sao.staleness_rule values ({', '.join(RULES)}) to run "
                   "side by side in this command; writes <setting>/rules/<method>.json")
    args = p.parse_intermixed_args(argv)
    if args.repeats < 1 or args.eval_every < 1:
        p.error(f"--repeats and --eval-every: must be >= 1, got {args.repeats} and {args.eval_every}")
    if args.steady_from < 1:
        p.error(f"--steady-from: a policy version >= 1, got {args.steady_from}")
    rules = [r for r in args.rules.split(",") if r]
    if any(r not in RULES for r in rules) or len(set(rules)) != len(rules):
        p.error(f"--rules: comma-separated distinct values of {', '.join(RULES)}, got {args.rules!r}")
    config = load_method(args.method, args.overrides, p)
    if args.steady_from >= (versions := config.grpo.steps if config.technique == "grpo" else config.sao.steps):
        p.error(f"--steady-from: must be below the run's {versions} policy versions, got {args.steady_from}")
    if rules and config.technique != "sao":
        p.error(f"--rules: sao.staleness_rule is an SAO setting; method {args.method!r} runs {config.technique}")
    import torch

    torch.set_num_threads(1)  # learner and in-process engine; generator processes use 1 too
    base, sft = shared_warm_start(config)
    snaps = Path(config.output_dir) / "snapshots" / args.method
    if rules:
        return compare_rules(config, args, argv, rules, base, sft, snaps)
    runs = [run_method(config.model_copy(update={"seed": config.seed + i, "run_name": f"{args.method}_r{i}"}), args.method,
                       base, sft, snaps / f"r{i}", args.eval_every if i == 0 else 10**9) for i in range(args.repeats)]
    start, rewards = evaluate_snapshots(base, sft, runs[:1])
    target = round(start + TARGET_GAIN, 3)
    setting = setting_of(config)
    result = {"setting": setting, "method": args.method, "command": common.command_line("bench.async_vs_sync", argv),
              "machine": common.machine_info(), "settings": settings_of(config, args.eval_every, args.repeats),
              "task_calls": {split: summarise_calls(base.tasks(split)) for split in ("train", "eval")},
              "start_reward": start, "target": target,
              "runs": [{**summarise(r, rewards[r.method] if i == 0 else {}, target, args.steady_from),
                        "trained_calls": trained_calls(RunContext(config.model_copy(update={
                            "seed": config.seed + i, "run_name": f"{args.method}_r{i}"})), args.steady_from),
                        "seed": config.seed + i} for i, r in enumerate(runs)]}
    common.publish_result(args.out or RESULTS / setting / f"{args.method}.json", result, "async_vs_sync", render,
                          docs=not args.no_docs)
    print(json.dumps({q: cell(result, q, 3) for q in ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s")}))
    return 0


def compare_rules(config: Any, args: Any, argv: list[str] | None, rules: list[str], base: Any, sft: Path,
                  snaps: Path) -> int:
    """``--rules``: the method once per staleness rule (``--repeats`` runs each), evaluated alike, in one results file."""
    runs: dict[str, list[tuple[MethodRun, Any]]] = {}
    for rule in rules:
        for i in range(args.repeats):
            cfg = config.model_copy(update={"seed": config.seed + i, "run_name": f"{args.method}_{rule}_r{i}",
                                            "sao": config.sao.model_copy(update={"staleness_rule": rule})})
            run = run_method(cfg, f"{args.method} rule={rule}", base, sft, snaps / rule / f"r{i}",
                             args.eval_every if i == 0 else 10**9)
            runs.setdefault(rule, []).append((run, RunContext(cfg)))
    start, rewards = evaluate_snapshots(base, sft, [rs[0][0] for rs in runs.values()])
    target = round(start + TARGET_GAIN, 3)
    setting = setting_of(config)
    result = {"setting": setting, "method": args.method, "command": common.command_line("bench.async_vs_sync", argv),
              "machine": common.machine_info(), "when": common.utc_now(),
              "settings": settings_of(config, args.eval_every, args.repeats), "start_reward": start, "target": target,
              "rules": {rule: [{**rule_result(run, ctx, rewards[run.method] if i == 0 else {}, target),
                                "seed": config.seed + i} for i, (run, ctx) in enumerate(rs)]
                        for rule, rs in runs.items()}}
    common.publish_result(args.out or RESULTS / setting / "rules" / f"{args.method}.json", result, "async_vs_sync", render,
                          docs=not args.no_docs)
    for rule, rs in result["rules"].items():
        print(json.dumps({"rule": rule, **done_when(rs[0]["lengths"]), "violations": rs[0]["staleness_violations"]}))
    return 0


if __name__ == "__main__":
    common.run_main("bench.async_vs_sync", main)
