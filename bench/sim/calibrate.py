"""The simulator's calibration on the measured small runs, and its check against them (``validate_all``).

A setting's inputs are ``bench/results/sim/<setting>.json`` (``bench.sim.collect``) and its results files under
``bench/results/async_vs_sync/<setting>/``. A run's twin (``run_twin``) has engine costs fitted on every setting's
``engine_modes`` batches at a whole core's speed, times the speed of the feeding its method's generator produces
(``FEEDING_OF``), its engine probe over the one around ``engine_modes`` and the CPU share its load implied, or the
speed the run measured itself (``calibrate_engine_speed``); the run's learner step, the setting's publish, reload and
tool latency; a synchronous run replays its recorded episodes (asynchronous records lack those still running).
"""

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from bench.async_vs_sync import read_setting, setting_order
from bench.common import read_json
from bench.sim import model
from bench.sim.model import ClusterConfig, EngineModel, LearnerModel, RolloutShape, Workload

ENGINE_MODES = ("lockstep", "continuous", "groups")
"""The feedings ``engine_modes`` measures: synchronous GRPO's, SAO's and asynchronous GRPO's."""
FEEDING_OF = {"grpo_sync": "lockstep", "sao": "continuous", "grpo_async": "groups"}
"""The ``engine_modes`` feeding whose speed each simulated method's engine runs at."""
GENERATOR_BUSY_THREADS = 1
"""CPU-busy threads of a generating generator (its engine's; its event loop runs 12 ms between 0.1-1.7 s batches)."""
BATCH_COST_TERMS = ("prefill_s_per_token", "step_s", "step_s_per_row", "step_s_per_row_token", "step_s_per_kv_sq",
                    "sample_s_per_token")
"""``EngineModel`` coefficients ``fit_batch_costs`` fits, in the order of ``batch_cost_features``."""


def cpu_share(cores: int, background_load: float, busy: int) -> float:
    """Cores a busy thread gets beside ``busy - 1`` of ours and ``background_load`` others (at most 1)."""
    return min(1.0, cores / max(background_load + busy, 1e-9))


def probe_core_seconds(probes: Sequence[dict[str, Any]] | None, cores: int) -> float | None:
    """Mean ``engine_probe`` seconds, each scaled to a whole core by its ``background_cores`` (None without probes)."""
    values = [float(p["seconds"]) * cpu_share(cores, float(p.get("background_cores") or 0.0), 1)
              for p in probes or [] if p.get("seconds")]
    return statistics.fmean(values) if values else None


def batch_cost_features(rows: int, width: int, steps: int, sampled: int) -> list[float]:
    """What each ``BATCH_COST_TERMS`` coefficient multiplies in one static batch (``Engine._maybe_start``): ``rows``
    padded to ``width``, ``steps`` decode steps over ``width + steps // 2`` tokens of context, ``sampled`` tokens."""
    ctx = width + steps // 2
    return [rows * width, steps, steps * rows, steps * rows * ctx, steps * (rows * ctx) ** 2, sampled]


def fit_batch_costs(batches: Sequence[Sequence[float]]) -> dict[str, float]:
    """Non-negative least squares, in relative error, of the seconds of ``[rows, width, prompt_tokens, new_tokens,
    seconds, sampled_tokens]`` batches on ``batch_cost_features`` (``sample_s_per_token`` 0 unless every batch
    counts its sampled tokens); ValueError for fewer batches than terms or non-positive seconds."""
    if len(batches) < len(BATCH_COST_TERMS):
        raise ValueError(f"batches: need at least {len(BATCH_COST_TERMS)} to fit the engine's costs, got {len(batches)}")
    y = np.array([float(b[4]) for b in batches])
    if np.any(y <= 0):
        raise ValueError("batches: every batch needs positive seconds")
    sampled = all(len(b) > 5 for b in batches)
    a = np.array([batch_cost_features(int(b[0]), int(b[1]), int(b[3]), int(b[5]) if sampled else 0)
                  for b in batches], dtype=float)
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale / y[:, None], np.ones(len(y)))
    return {k: float(c) for k, c in zip(BATCH_COST_TERMS, coef / scale, strict=True)}


def engine_modes_share(inputs: dict[str, Any]) -> float:
    """CPU share the engine had during ``engine_modes`` (mean of its start and end load, our one busy thread)."""
    em, busy = inputs["engine_modes"], GENERATOR_BUSY_THREADS
    load = statistics.fmean([float(em["load_avg_start"]), float(em["load_avg_end"])])
    return cpu_share(int(inputs["machine"]["cpu_count"]), max(0.0, load - busy), busy)


def engine_mode_batches(inputs: dict[str, Any]) -> list[list[float]]:
    """The batches ``engine_modes`` timed (every feeding), their seconds scaled to a whole core."""
    share = engine_modes_share(inputs)
    return [[*b[:4], float(b[4]) * share, *b[5:6]] for mode in ENGINE_MODES
            for b in (inputs["engine_modes"].get(mode) or {}).get("batches", [])]


def feeding_episodes(em: dict[str, Any], mode: str) -> list[RolloutShape]:
    """The episodes an ``engine_modes`` feeding ran, in start order; ValueError naming a missing or malformed one."""
    out = []
    for i, entry in enumerate((em.get(mode) or {}).get("episodes") or []):
        if not isinstance(entry, list) or len(entry) != 3:
            raise ValueError(f"engine_modes.{mode}.episodes[{i}]: expected [prompt_tokens, action_tokens, "
                             f"observation_tokens], got {entry!r}")
        prompt, actions, observations = entry
        if not actions or len(observations) != len(actions):
            raise ValueError(f"engine_modes.{mode}.episodes[{i}]: needs >= 1 turn and one observation count per turn, "
                             f"got {len(actions)} turns and {len(observations)} observations")
        out.append(RolloutShape(int(prompt), tuple(int(a) for a in actions), tuple(int(o) for o in observations), 0.0))
    if not out:
        raise ValueError(f"engine_modes.{mode}.episodes: none recorded (collect again with bench.sim.collect)")
    return out


def run_replay(run: dict[str, Any], where: str) -> tuple[tuple[RolloutShape, ...], ...]:
    """A run's recorded units in start order from its ``[unit, prompt, actions, observations, reward, tool_waits_s]``
    episodes (consecutive equal units form a group; () without); ValueError naming ``where`` and a malformed entry."""
    units: list[list[RolloutShape]] = []
    for i, entry in enumerate(run.get("episodes") or []):
        if not isinstance(entry, list) or len(entry) != 6:
            raise ValueError(f"{where}.episodes[{i}]: expected [unit, prompt_tokens, action_tokens, "
                             f"observation_tokens, reward, tool_waits_s], got {entry!r}")
        unit, prompt, actions, observations, reward, waits = entry
        if i == 0 or unit != run["episodes"][i - 1][0]:
            units.append([])
        if not actions or len(observations) != len(actions) or len(waits) != len(actions) - 1:
            raise ValueError(f"{where}.episodes[{i}]: needs >= 1 turn, one observation count per turn and one tool "
                             f"wait per turn but the last, got {len(actions)} turns, {len(observations)} "
                             f"observations and {len(waits)} waits")
        units[-1].append(RolloutShape(int(prompt), tuple(int(a) for a in actions), tuple(int(o) for o in observations),
                                      float(reward), tuple(float(w) for w in waits)))
    return tuple(tuple(u) for u in units)


def measured_config(inputs: dict[str, Any], result: dict[str, Any], run: dict[str, Any], costs: dict[str, float],
                    engine_factor: float = 1.0) -> ClusterConfig:
    """The simulated twin of one measured ``run`` of ``result`` (a method's results file) at ``engine_factor``. CPU
    sharing: during the run the 1-minute load was L (mean of start and end), of which ours were the generator's
    ``GENERATOR_BUSY_THREADS`` plus, for the asynchronous methods, the learner's one. Engine times are divided by
    ``cpu_share(cores, L - ours, busy)``, busy = ours while the learner trains, else the generator's alone."""
    s, method, generator = result["settings"], result["method"], GENERATOR_BUSY_THREADS
    kind, cores, slots = model.method_kind(method), int(result["machine"]["cpu_count"]), s["episodes_in_flight"]
    ours = generator if kind == "grpo_sync" else generator + 1
    background = max(0.0, statistics.fmean(run["load_avg_start_end"]) - ours)
    return ClusterConfig(
        engine_scale_idle=engine_factor / cpu_share(cores, background, generator),
        engine_scale_learner_busy=engine_factor / cpu_share(cores, background, ours),
        method=kind, generators=s["generators"] if kind != "grpo_sync" else 1, episodes_in_flight=slots,
        batch_rollouts=s["batch_rollouts"], group_size=1 if kind == "sao" else int(method.rpartition("_g")[2]),
        max_staleness=s["max_staleness"], abort_stale=not s["keep_stale_episodes"], steps=max(2, int(run["policy_versions"])),
        publish_s=inputs["weight_sync"]["publish_s"], reload_s=inputs["weight_sync"]["reload_s"], seed=s["seed"],
        engine=EngineModel(batching="static", max_batch=max(slots, s["batch_rollouts"]) if kind == "grpo_sync" else slots, **costs),
        learner=LearnerModel(gpus=1, step_s_fixed=float(run["learner_step_s_mean"]), s_per_token=0.0,
                             warmup_iterations=s["critic_warmup"] if kind == "sao" else 0),
        **{k: float(s[k]) for k in ("tool_latency_median_s", "tool_latency_sigma", "tool_latency_max_s")})


def phase_identifies_engine_speed(phases: Sequence[float], engine_free_s: float, at_current_s: float) -> bool:
    """Whether measured synchronous generation phases (seconds) say anything about the engine's speed: its share
    ``at_current_s - engine_free_s`` (simulated) must exceed twice the standard error of the measured mean phase."""
    se = statistics.stdev(phases) / math.sqrt(len(phases)) if len(phases) > 1 else 0.0
    return at_current_s - engine_free_s > 2 * se


def simulated_mean(config: ClusterConfig, workload: Workload, repeats: int, quantity: str) -> float:
    """Mean of a ``SimResult`` quantity over ``repeats`` simulations, seeds ``config.seed`` + 0, 1, ... (Nones left out)."""
    values = [getattr(model.simulate(replace(config, seed=config.seed + k), workload), quantity) for k in range(repeats)]
    return statistics.fmean(x for x in values if x is not None)


def calibrate_engine_speed(base: ClusterConfig, run: dict[str, Any], workload: Workload,
                           repeats: int) -> tuple[ClusterConfig, str]:
    """Scale the twin's engine to the speed the run measured itself, and say where it came from: ``generator_batch_s``
    (synchronous GRPO's generation seconds per step): bisect the factor's log in [1/20, 20] until the simulated mean
    phase is the measured one, unless the phase is mostly tool waits; ``generator_busy_s`` (engine seconds and rollouts
    in ``counters``): 4 rounds of ``factor *= measured / simulated`` engine seconds per rollout; else ``base``."""
    phases, counters = run.get("generator_batch_s") or [], run.get("counters", {})
    busy_s, produced = counters.get("generator_busy_s"), counters.get("generator_rollouts")
    if base.method == "grpo_sync" and phases:
        target = statistics.fmean(phases)

        def phase(f: float) -> float:
            return simulated_mean(base.scaled(f), workload, repeats, "generation_phase_s")

        if not phase_identifies_engine_speed(phases, phase(1e-6), phase(1.0)):
            return base, "load average (generator_batch_s is tool waits)"
        lo, hi = math.log(1 / 20), math.log(20)
        for _ in range(14):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if phase(math.exp(mid)) < target else (lo, mid)
        return base.scaled(math.exp((lo + hi) / 2)), "generator_batch_s"
    if busy_s and produced:
        target, factor = float(busy_s) / float(produced), 1.0
        for _ in range(4):
            if (simulated := simulated_mean(base.scaled(factor), workload, repeats, "generating_s_per_rollout")) <= 0:
                break
            factor *= target / simulated
        return base.scaled(factor), "generator_busy_s"
    return base, "load average"


def engine_probe_ratio(inputs: dict[str, Any], run: dict[str, Any]) -> float | None:
    """The run's probe seconds over those around ``engine_modes``, each scaled to a whole core (None without both)."""
    cores = int(inputs["machine"]["cpu_count"])
    at_run, at_modes = (probe_core_seconds(p, cores) for p in (run.get("engine_probe"), inputs["engine_modes"].get("engine_probe")))
    return at_run / at_modes if at_run and at_modes else None


def run_twin(inputs: dict[str, Any], result: dict[str, Any], run: dict[str, Any], costs: dict[str, float],
             factor: float | None, workload: Workload, repeats: int,
             factor_from: str = "engine_modes") -> tuple[ClusterConfig, str]:
    """The twin of one run (module docstring) and where its engine speed came from (``speed_from``)."""
    ratio = engine_probe_ratio(inputs, run)
    base = measured_config(inputs, result, run, costs, engine_factor=(factor or 1.0) * (ratio or 1.0))
    base, speed_from = calibrate_engine_speed(base, run, workload, repeats)
    if speed_from.startswith("load average") and factor:
        speed_from = f"{factor_from} x " + ("engine probe x " if ratio else "") + speed_from
    return base, speed_from


def feeding_rate(inputs: dict[str, Any], costs: dict[str, float], factor: float, mode: str) -> float:
    """Simulated rollouts/s of the ``hf`` engine of ``engine_modes`` at its CPU share times ``factor``, fed as the
    feeding ``mode`` was (``simulate_feeding`` replaying its recorded episodes, with its window)."""
    em, slots = inputs["engine_modes"], int(inputs["settings"]["episodes_in_flight"])
    engine, scale = EngineModel(batching="static", max_batch=slots, **costs), 1.0 / engine_modes_share(inputs)
    return model.simulate_feeding(engine, scale * factor, feeding_episodes(em, mode), mode, slots, float(em["feed_s"]),
                                  int(em["group_size"]))


def fit_engine_speed(inputs: dict[str, Any], costs: dict[str, float], modes: Sequence[str] = ENGINE_MODES,
                     rounds: int = 4) -> float:
    """Speed factor on ``costs`` that fits the engine fed by real episodes in ``modes``: ``rounds`` times, move its
    log by the mean log ratio of ``feeding_rate`` to the measured rollouts/s."""
    factor = 1.0
    for _ in range(rounds):
        factor *= math.exp(statistics.fmean([math.log(feeding_rate(inputs, costs, factor, m)
                                                      / float(inputs["engine_modes"][m]["rollouts_per_s"])) for m in modes]))
    return factor


def measured_relative_se_over(runs: Sequence[dict[str, Any]], quantity: str) -> float | None:
    """Relative standard error of a quantity's mean over runs: from their spread with three or more, else the first
    run's per-update spread (tokens per update, intervals between iterations; the first left out) over sqrt(n)."""
    values = [float(r[quantity]) for r in runs if r.get(quantity) is not None]
    if len(values) >= 3 and statistics.fmean(values) > 0:
        return statistics.stdev(values) / math.sqrt(len(values)) / statistics.fmean(values)
    first = runs[0] if runs else {}
    if quantity == "trained_action_tokens_per_s":
        xs = [float(x) for x in (first.get("trained_action_tokens_per_update") or [])[1:]]
    elif quantity == "rollouts_per_s":
        xs = [b - a for a, b in itertools.pairwise(float(x) for x in first.get("step_times_s") or [])][1:]
    else:
        return None
    if len(xs) < 3 or statistics.fmean(xs) <= 0:
        return None
    return statistics.stdev(xs) / math.sqrt(len(xs)) / statistics.fmean(xs) / math.sqrt(max(len(values), 1))


def method_rows(inputs: dict[str, Any], result: dict[str, Any], costs: dict[str, float], speeds: dict[str, float],
                workload: Workload, repeats: int) -> list[dict[str, Any]]:
    """The busy fraction, trained action tokens/s and rollouts/s rows of one results file's runs, each twin's engine at
    ``speeds`` of its method's feeding; a capacity-sweep point's rows are labelled ``sao tau=<tau> slots=<slots>[ keep]``."""
    s, kind = result["settings"], model.method_kind(result["method"])
    label = (f"sao tau={s['max_staleness']} slots={s['episodes_in_flight']}" + (" keep" if s["keep_stale_episodes"] else "")
             if result.get("sweep") else result["method"])
    feeding, runs = FEEDING_OF[kind], [r for r in result["runs"] if r.get("learner_step_s_mean") is not None]
    sims, ratios, replayed, speed_from = [], [], 0, ""
    for i, run in enumerate(runs):
        replay = run_replay(run, f"{label}.runs[{i}]") if kind == "grpo_sync" else ()
        replayed += sum(len(u) for u in replay)
        run_workload = replace(workload, replay=replay)
        base, from_ = run_twin(inputs, result, run, costs, speeds[feeding], run_workload, repeats, f"engine_modes {feeding}")
        speed_from = speed_from or from_
        ratios.append(engine_probe_ratio(inputs, run))
        sims += [model.simulate(replace(base, seed=base.seed + k), run_workload) for k in range(repeats)]
    speed_from += f" (mean of {len(runs)} runs)" if len(runs) > 1 else ""
    known = [r for r in ratios if r is not None]
    batch_rows = [float(x) for r in runs if (x := (r.get("counters") or {}).get("generator_mean_batch_rows")) is not None]
    rows = []
    for quantity in ("busy_fraction", "trained_action_tokens_per_s", "rollouts_per_s"):
        pred = statistics.fmean(getattr(r, quantity) for r in sims)
        meas = statistics.fmean(float(r[quantity]) for r in runs)
        rows.append({"method": label, "quantity": quantity, "measured": meas, "predicted": pred,
                     "relative_error": (pred - meas) / meas if meas else math.inf, "speed_from": speed_from,
                     "runs": len(runs), "measured_relative_se": measured_relative_se_over(runs, quantity),
                     "engine_probe_ratio": statistics.fmean(known) if known else None, "replayed_episodes": replayed,
                     "predicted_mean_batch_rows": statistics.fmean(r.mean_batch_rows for r in sims),
                     "measured_mean_batch_rows": statistics.fmean(batch_rows) if batch_rows else None})
    return rows


def validate_setting(inputs: dict[str, Any], results: Sequence[dict[str, Any]], costs: dict[str, float],
                     repeats: int) -> dict[str, Any]:
    """Rows of every results file of one setting, then one calibration row per ``engine_modes`` feeding (the engine
    alone at one speed for every feeding; left out of the worst error), and the fitted speed factors."""
    workload, factor = Workload.from_trace(inputs["trace"]), fit_engine_speed(inputs, costs)
    speeds = {mode: fit_engine_speed(inputs, costs, (mode,)) for mode in ENGINE_MODES}
    rows = [row for result in results for row in method_rows(inputs, result, costs, speeds, workload, repeats)]
    for mode in ENGINE_MODES:
        pred, meas = feeding_rate(inputs, costs, factor, mode), float(inputs["engine_modes"][mode]["rollouts_per_s"])
        rows.append({"method": f"engine_{mode}", "quantity": "rollouts_per_s", "measured": meas, "predicted": pred,
                     "relative_error": (pred - meas) / meas, "calibration": True,
                     "speed_from": "engine_modes (one speed for every feeding)"})
    worst = max((r for r in rows if not r.get("calibration")), key=lambda r: abs(r["relative_error"]), default=None)
    return {"rows": rows, "max_abs_relative_error": abs(worst["relative_error"]) if worst else None, "worst": worst,
            "measured_when": inputs["machine"]["when"], "engine_factor": factor, "feeding_factors": speeds}


def validate_all(settings: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], repeats: int = 5) -> dict[str, Any]:
    """``validate_setting`` of every setting (``load_settings``) with costs fitted on all their batches: ``rows``,
    the worst (calibration rows left out), ``repeats`` and ``by_setting``; ValueError starting with the setting."""
    costs = fit_batch_costs([b for inputs, _ in settings.values() for b in engine_mode_batches(inputs)])
    rows, by_setting = [], []
    for name, (inputs, results) in settings.items():
        try:
            v = validate_setting(inputs, results, costs, repeats)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        rows += [{"setting": name, **r} for r in v.pop("rows")]
        by_setting.append({"setting": name, **v})
    worst = max((r for r in rows if not r.get("calibration")), key=lambda r: abs(r["relative_error"]), default=None)
    return {"rows": rows, "max_abs_relative_error": abs(worst["relative_error"]) if worst else None, "worst": worst,
            "repeats": repeats, "by_setting": by_setting}


def load_settings(results_dir: Path) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``{setting: (simulator inputs, its results files)}`` for every setting with inputs, tool latency first;
    FileNotFoundError without any, ValueError naming a file that is not JSON."""
    names = setting_order(p.stem for p in (results_dir / "sim").glob("*.json"))
    if not names:
        raise FileNotFoundError(f"{results_dir / 'sim'}: no simulator inputs; run .venv/bin/python -m bench.sim.collect")
    return {n: (read_json(results_dir / "sim" / f"{n}.json"),
                [r for part in read_setting(n, results_dir / "async_vs_sync") for r in part]) for n in names}
