"""Issue 29: the long-tail collapse in one command, with per-version evidence of its mechanism.

Trains one method of ``bench.async_vs_sync`` (``bench/configs/async_vs_sync/<method>.yaml`` on ``base.yaml``, dotted
``key=value`` overrides after it) from the shared SFT warm start, evaluates snapshots every ``--eval-every`` versions on
the held-out tasks, then reads the run's learner ledger (``learner_ledger.jsonl``) and the learner's per-iteration
metrics and writes, per policy version (``analyse``):

* the trained rollouts' reward, overall and by required-calls bucket (``CALLS``), and their count per bucket;
* the early-answer rate (answered before ``left 0``), the extra-call rate (made a call past ``left 0``), the
  malformed-action rate, and the finish reasons (``stop``, ``length``: the turn or token limit, ``tool_error``);
* mean tool calls made and required per trained episode;
* ``policy/entropy``, ``policy/grad_norm``, the critic's ``value/explained_variance`` and mean value;
* the shares of action tokens the staleness bound and the DIS band masked;
* the advantage by turn kind (SAO's per-turn ledger diagnostics, ``token_metrics.TURN_KEYS``): a call while ``left > 0``,
  an extra call at ``left 0``, an early answer, an answer at ``left 0``: mean advantage and share positive;
* the critic's value against its return at each turn's first token, by the ``left`` count the turn saw (the first turn,
  which saw none, apart);
* rollouts dropped, by reason and bucket; and, over the run, started against trained by bucket (the generator's length
  counters), so a trained population that differs from the generated one shows.

Run (12 versions; the collapse needs the old lr and breaks in some runs only, docs/results.md section 8):
``.venv/bin/python -m bench.longtail_evidence sao sao.staleness_rule=episode sao.optim.lr=3e-4 --label L``; smoke:
``... sao sao.steps=2 sao.checkpoint_every=2 warm_start.steps=5 data.num_train_tasks=64 generator.episodes_in_flight=16
data.env_args.tool_latency_median_s=0 output_dir=/tmp/lte --eval-every 2 --out /tmp/lte.json --no-docs``.
Writes ``bench/results/longtail_evidence/<label>.json`` (``--label``, default the method); ``--render`` tables every
such file into ``docs/log.md`` (``<!-- bench:longtail_evidence:begin/end -->``).
"""

from __future__ import annotations

import json
import statistics
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import common

RESULTS = common.RESULTS_DIR / "longtail_evidence"
"""``<label>.json`` per run."""
DOCS = common.REPO / "docs" / "log.md"
"""``--render`` rewrites its section (``<!-- bench:longtail_evidence:begin/end -->``); docs/results.md section 8 links it."""
CALLS: tuple[tuple[int, int], ...] = ((1, 2), (3, 4), (5, 8), (9, 16))
"""Required-calls buckets (inclusive) of ``synthetic_longtail`` tasks (1..16 calls)."""
LEFTS: tuple[tuple[int, int], ...] = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 16))
"""Buckets of the ``left`` count a turn saw (required calls not yet made before the turn)."""
STEP_KEYS = ("policy/entropy", "policy/grad_norm", "value/explained_variance", "value/mean", "value/explained_variance_before",
             "mask/frac_stale", "mask/frac_low", "mask/frac_high", "mask/frac_total", "mismatch/k3_kl_unmasked",
             "clip/frac_low", "clip/frac_high", "ppo_ratio/mean", "ppo_ratio/max", "advantage/mean", "advantage/std",
             "staleness/token_lag_mean", "reward/mean")
"""Learner metrics kept per version (those the method reports)."""
FIRST = "first"
"""The bucket of an episode's first turn: it has seen no observation, so no ``left`` count (the prompt does not say how
many calls the task requires); its value can only be the mean over tasks."""
REFERENCE_WINDOW = 8
"""Policy versions per window of ``value_reference``'s group means."""
EV_MIN_EACH_SIDE = 20
"""``value_by_left`` and ``value_reference`` give a bucket's explained variance only when at least this many of its
returns lie above their mean and as many below (None otherwise): where nearly every return is the same (a bucket of
long tasks that hardly any episode solves), ``Var(G)`` is tiny and the ratio is noise."""
REFERENCE_MIN = 3
"""Fewest returns a group of ``value_reference`` needs in the other half (fewer: the other half's mean over the run)."""
TURN_KINDS = ("call_left_gt0", "extra_call", "early_answer", "answer_left0")
"""Kinds of turn ``turn_kinds`` tells apart."""


def label_of(value: int, buckets: Sequence[tuple[int, int]]) -> str:
    """The label (``"3-4"``, ``"0"``) of the bucket holding ``value``; the last bucket takes anything above it."""
    for lo, hi in buckets:
        if lo <= value <= hi:
            return f"{lo}" if lo == hi else f"{lo}-{hi}"
    lo, hi = buckets[-1]
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def labels(buckets: Sequence[tuple[int, int]]) -> list[str]:
    """Every bucket's label, in order."""
    return [label_of(lo, buckets) for lo, _ in buckets]


def seen_label(turn: int, left: int) -> str:
    """The bucket of the ``left`` count turn ``turn`` (0-based) saw: ``FIRST`` for the first turn, which saw none,
    else ``left``'s ``LEFTS`` label."""
    return FIRST if turn == 0 else label_of(left, LEFTS)


def seen_labels() -> list[str]:
    """``FIRST`` and every ``LEFTS`` label, in order: the buckets of ``value_by_left``."""
    return [FIRST, *labels(LEFTS)]


def turn_kinds(rollout: Mapping[str, Any], required: int) -> list[tuple[str, int]] | None:
    """``(kind, left before the turn)`` for each action turn of a ``synthetic_longtail`` ledger rollout, or None.

    A turn is a call while ``left > 0``, an extra call (``left 0``), an early answer (``left > 0``) or an answer at
    ``left 0``, read from the episode's metrics: with one well-formed call per action (the reference episode's form)
    turn ``i < tool_calls`` is the ``i``-th call (``required``: the task's required calls) and a ``stop`` episode's last turn is its answer. None when the turns do
    not add up that way (a malformed action, several calls in one action): such episodes are left out of turn stats.
    """
    m, turns = rollout["metrics"], len(rollout["action_tokens"])
    calls = int(m.get("tool_calls", 0))
    answered = rollout["finish_reason"] == "stop"
    if m.get("malformed_actions", 0) or turns != calls + int(answered) or turns == 0:
        return None
    out = [("call_left_gt0" if i < required else "extra_call", max(0, required - i)) for i in range(calls)]
    if answered:
        out.append(("answer_left0" if calls >= required else "early_answer", max(0, required - calls)))
    return out


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not None; None without any."""
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _share(flags: Iterable[bool]) -> float | None:
    vals = list(flags)
    return sum(vals) / len(vals) if vals else None


def explained_variance(pairs: Sequence[tuple[float, float]]) -> float | None:
    """``1 - Var(G - V) / Var(G)`` over ``(value, return)`` pairs (population variances); None with fewer than two
    pairs or returns that do not vary."""
    if len(pairs) < 2:
        return None
    returns = [g for _, g in pairs]
    var = statistics.pvariance(returns)
    return 1.0 - statistics.pvariance([g - v for v, g in pairs]) / var if var > 0 else None


def version_evidence(rollouts: Sequence[Mapping[str, Any]], dropped: Sequence[Mapping[str, Any]],
                     tasks: Mapping[str, int]) -> dict[str, Any]:
    """The evidence of one ledger line's trained ``rollouts`` and ``dropped`` ones (module docstring).

    ``tasks`` maps each task id to its required calls (an episode cut before its first tool step has no metrics);
    KeyError for a rollout of a task it lacks."""
    def req(r: Mapping[str, Any]) -> int:
        return int(tasks[r["task_id"]])

    by_bucket: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        by_bucket[label_of(req(r), CALLS)].append(float(r["reward"]))
    tokens = [sum(float(r.get(k) or 0.0) for r in rollouts) for k in ("trained_tokens", "stale_masked_tokens",
                                                                        "dis_masked_tokens")]
    total = sum(tokens)
    kinds: dict[str, list[float]] = defaultdict(list)
    value_by_left: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in rollouts:
        turns = turn_kinds(r, req(r))
        adv = r.get("turn_advantage")
        if turns is None or adv is None or len(adv) != len(turns):
            continue
        for t, (kind, left) in enumerate(turns):
            kinds[kind].append(float(adv[t]))
            if "turn_value" in r:
                value_by_left[seen_label(t, left)].append((float(r["turn_value"][t]), float(r["turn_return"][t])))
    finish = Counter(str(r["finish_reason"]) for r in rollouts)
    return {
        "trained": len(rollouts),
        "reward": mean(float(r["reward"]) for r in rollouts),
        "reward_by_calls": {b: mean(by_bucket[b]) for b in labels(CALLS)},
        "trained_by_calls": {b: len(by_bucket[b]) for b in labels(CALLS)},
        "early_answer_rate": _share(bool(r["metrics"].get("early_answer", 0)) for r in rollouts),
        "extra_call_rate": _share(float(r["metrics"].get("extra_calls", 0)) > 0 for r in rollouts),
        "extra_calls_mean": mean(float(r["metrics"].get("extra_calls", 0)) for r in rollouts),
        "malformed_rate": _share(float(r["metrics"].get("malformed_actions", 0)) > 0 for r in rollouts),
        "finish": {k: v / max(len(rollouts), 1) for k, v in sorted(finish.items())},
        "calls_mean": mean(float(r["metrics"].get("tool_calls", 0)) for r in rollouts),
        "required_mean": mean(float(req(r)) for r in rollouts),
        "turns_mean": mean(float(len(r["action_tokens"])) for r in rollouts),
        "stale_masked_share": tokens[1] / total if total else None,
        "dis_masked_share": tokens[2] / total if total else None,
        "advantage_by_turn": {k: {"n": len(kinds[k]), "mean": mean(kinds[k]),
                                  "positive": _share(a > 0 for a in kinds[k])} for k in TURN_KINDS},
        "value_vs_return_by_left": {b: {"n": len(value_by_left[b]), "value": mean(v for v, _ in value_by_left[b]),
                                        "return": mean(g for _, g in value_by_left[b]),
                                        "explained_variance": explained_variance(value_by_left[b])}
                                    for b in seen_labels() if value_by_left[b]},
        "dropped": dict(Counter(str(d.get("reason", "?")) for d in dropped)),
        "dropped_by_calls": dict(Counter(label_of(req(d), CALLS) for d in dropped)),
    }


def analyse(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, int],
            step_metrics: Mapping[int, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """Per ledger line (one learner iteration): its version, ``version_evidence`` and the learner's ``STEP_KEYS``.

    ``lag_oldest_mean``: the mean over the batch of the learner's version minus the rollout's oldest turn's version
    (None for lines without ``learner_version``, synchronous GRPO's: 0 there).

    Args:
        lines: ``read_ledger`` lines (the later line for a repeated iteration stands).
        tasks: Required calls by task id (the run's train tasks).
        step_metrics: The learner's metrics by iteration (1-based), or None.
    """
    by_iteration = {int(line["iteration"]): line for line in lines}
    out = []
    for it in sorted(by_iteration):
        line = by_iteration[it]
        metrics = (step_metrics or {}).get(it, {})
        lv = line.get("learner_version")
        lags = [lv - min(r["turn_policy_versions"] or [r["policy_version"]]) for r in line["rollouts"]] if lv is not None else []
        out.append({"iteration": it, "policy_version": int(line["policy_version"]),
                    "lag_oldest_mean": mean(lags),
                    **version_evidence(line["rollouts"], line.get("dropped", []), tasks),
                    "learner": {k: metrics[k] for k in STEP_KEYS if k in metrics}})
    return out


def population(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, Any]) -> dict[str, Any]:
    """Over the run: rollouts trained and dropped by required-calls bucket, and the train tasks' own mix.

    ``tasks`` maps task id to required calls (the train split); the share of the train tasks per bucket is what a
    uniform draw of tasks starts, so a trained share far from it is the population the learner saw drifting."""
    trained: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for line in lines:
        for r in line["rollouts"]:
            trained[label_of(int(tasks[r["task_id"]]), CALLS)] += 1
        for d in line.get("dropped", []):
            dropped[label_of(int(tasks[d["task_id"]]), CALLS)] += 1
    mix = Counter(label_of(int(k), CALLS) for k in tasks.values())
    n_trained, n_tasks = max(sum(trained.values()), 1), max(sum(mix.values()), 1)
    return {b: {"trained": trained[b], "dropped": dropped[b], "trained_share": trained[b] / n_trained,
                "task_share": mix[b] / n_tasks} for b in labels(CALLS)}


def _value_turns(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, int]) -> list[tuple[str, Any, float, float, int]]:
    """``(bucket, group key, value, return, half)`` of every turn with a value (SAO's ledger) in well-formed episodes
    (``turn_kinds``) of the iterations that trained the policy (the critic-only ones, where no rollout trained a
    token, are its pretraining and left out): the bucket of the ``left`` count it saw (``seen_label``), its ``value_reference`` group (the
    policy version's window and the exact count seen, or ``FIRST``), and the rollout's half of the run (CRC-32 of its
    id, so the split is the same on every machine)."""
    out = []
    for line in lines:
        if not any(float(r.get("trained_tokens") or 0.0) > 0 for r in line["rollouts"]):
            continue  # a critic-only iteration (value pretraining on the warm start's rollouts): no policy update
        window = int(line["policy_version"]) // REFERENCE_WINDOW
        for r in line["rollouts"]:
            turns = turn_kinds(r, int(tasks[r["task_id"]]))
            if turns is None or "turn_value" not in r or len(r["turn_value"]) != len(turns):
                continue
            half = zlib.crc32(str(r["rollout_id"]).encode()) % 2
            for t, (_, left) in enumerate(turns):
                out.append((seen_label(t, left), (window, FIRST if t == 0 else left), float(r["turn_value"][t]),
                            float(r["turn_return"][t]), half))
    return out


def _bucket_ev(pairs: Sequence[tuple[float, float]]) -> float | None:
    """``explained_variance`` of a bucket's pairs, or None with fewer than ``EV_MIN_EACH_SIDE`` returns on either side
    of their mean."""
    if not pairs:
        return None
    centre = statistics.fmean(g for _, g in pairs)
    above = sum(g > centre for _, g in pairs)
    below = sum(g < centre for _, g in pairs)
    return explained_variance(pairs) if min(above, below) >= EV_MIN_EACH_SIDE else None


def value_by_left(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, int]) -> dict[str, Any]:
    """Over the run (SAO): the critic's value before its update against the return, at each turn's first token, by the
    ``left`` count the turn saw (``seen_labels``: the first turn saw none): pairs, mean value, mean return and
    explained variance (``explained_variance``; None where the returns hardly vary, ``EV_MIN_EACH_SIDE``); and the same
    over every turn (``all``). Empty without per-turn values (GRPO)."""
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for bucket, _, value, ret, _ in _value_turns(lines, tasks):
        pairs[bucket].append((value, ret))
        pairs["all"].append((value, ret))
    return {b: {"n": len(pairs[b]), "value": mean(v for v, _ in pairs[b]), "return": mean(g for _, g in pairs[b]),
                "explained_variance": _bucket_ev(pairs[b])} for b in ["all", *seen_labels()] if pairs[b]}


def value_reference(lines: Sequence[Mapping[str, Any]], tasks: Mapping[str, int]) -> dict[str, Any]:
    """What the ``left`` count and the policy's progress alone explain of the return, as ``value_by_left`` measures the
    critic: each turn's return predicted by the mean return, in the other half of the run's rollouts, of the turns that
    saw the same ``left`` count (or were first turns) within the same window of ``REFERENCE_WINDOW`` policy versions
    (cross-fitted, so a turn never predicts itself; a group with fewer than ``REFERENCE_MIN`` returns there falls back
    to the other half's mean). Explained variance overall (``all``) and by bucket (None as in ``value_by_left``), with
    the turns counted.

    A reference for the critic, not a bound on it: the critic sees the whole history, which may tell more. Where this
    is near 0 inside a bucket, the return there is the policy's own sampling, which no value predicts from the count.
    Empty without per-turn values (GRPO)."""
    turns = _value_turns(lines, tasks)
    groups: dict[tuple[Any, int], list[float]] = defaultdict(list)
    halves: dict[int, list[float]] = defaultdict(list)
    for _, key, _, ret, half in turns:
        groups[(key, half)].append(ret)
        halves[half].append(ret)
    pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for bucket, key, _, ret, half in turns:
        other = groups.get((key, 1 - half), [])
        pred = statistics.fmean(other) if len(other) >= REFERENCE_MIN else mean(halves.get(1 - half, []))
        if pred is None:
            continue
        pairs[bucket].append((pred, ret))
        pairs["all"].append((pred, ret))
    return {b: {"n": len(pairs[b]), "explained_variance": _bucket_ev(pairs[b])}
            for b in ["all", *seen_labels()] if pairs[b]}


def fmt(x: Any, digits: int = 2) -> str:
    """A table cell: ``-`` for None, a float to ``digits`` places, anything else as text."""
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A compact markdown table of ``analyse``'s rows (one per iteration)."""
    head = ["version", "n", "reward", *[f"r {b}" for b in labels(CALLS)], "early", "extra", "malformed", "length",
            "calls / req", "entropy", "grad", "EV", "stale", "adv call>0", "adv extra", "adv early", "adv ans0",
            "V/G left 0", "V/G left 1", "dropped"]
    body = []
    for r in rows:
        a, vl, lr = r["advantage_by_turn"], r["value_vs_return_by_left"], r["learner"]
        body.append([r["policy_version"], r["trained"], fmt(r["reward"]),
                     *[fmt(r["reward_by_calls"][b]) for b in labels(CALLS)], fmt(r["early_answer_rate"]),
                     fmt(r["extra_call_rate"]), fmt(r["malformed_rate"]), fmt(r["finish"].get("length", 0.0)),
                     f"{fmt(r['calls_mean'], 1)} / {fmt(r['required_mean'], 1)}", fmt(lr.get("policy/entropy")),
                     fmt(lr.get("policy/grad_norm")), fmt(lr.get("value/explained_variance")),
                     fmt(r["stale_masked_share"]), *[fmt(a[k]["mean"]) for k in TURN_KINDS],
                     *[f"{fmt(vl[b]['value'])}/{fmt(vl[b]['return'])}" if b in vl else "-" for b in ("0", "1")],
                     sum(r["dropped"].values())])
    return common.markdown_table(head, body)


def report_warm_start(base: Any, sft: Path, config: Any, argv: list[str] | None, out: Path | None) -> int:
    """``--warm-start-only``: the warm start's held-out reward (``evaluate_policy``) and, on the same held-out tasks
    and samples, its reward by required-calls bucket; written to ``out`` when given."""
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.eval.heldout import heldout_rollouts, heldout_scores

    samples = heldout_rollouts(base, sft, engine_kind="hf")
    scores = heldout_scores(samples)
    calls = {t.task_id: len(codes_of(t)) for t in base.tasks("eval")}
    by_bucket: dict[str, list[float]] = defaultdict(list)
    for r in samples.rollouts:
        by_bucket[label_of(calls[r.task_id], CALLS)].append(float(r.reward))
    result = {"command": common.command_line("bench.longtail_evidence", argv), "when": common.utc_now(),
              "machine": common.machine_info(), "sft_steps": config.warm_start.steps,
              "max_reference_turns": config.warm_start.max_reference_turns, "heldout_reward": scores["reward_mean"],
              "heldout_by_calls": {b: {"n": len(by_bucket[b]), "reward": mean(by_bucket[b])} for b in labels(CALLS)}}
    print(json.dumps(result))
    if out is not None:
        common.write_result(out, result)
    return 0


BROKEN_SHARE = 0.3
"""A version whose trained episodes made an extra call or a malformed action, or hit the turn or token limit, in at
least this share is broken (``collapse_version``)."""


def sft_lr(command: str) -> str:
    """The warm start's learning rate a ``--warm-start-only`` command set (``warm_start.optim.lr=X``), else the bench's
    base.yaml value, 3e-3."""
    return next((arg.split("=", 1)[1] for arg in command.split() if arg.startswith("warm_start.optim.lr=")), "3e-3")


def broken_share(row: Mapping[str, Any]) -> float:
    """Share of a version's trained episodes that are broken: an extra call, a malformed action or a ``length`` end."""
    return max(row["extra_call_rate"] or 0.0, row["malformed_rate"] or 0.0, row["finish"].get("length", 0.0))


def collapse_version(rows: Sequence[Mapping[str, Any]]) -> int | None:
    """The first policy version whose trained episodes are broken (``BROKEN_SHARE``), or None."""
    return next((int(r["policy_version"]) for r in rows if broken_share(r) >= BROKEN_SHARE), None)


def render(results: Path = RESULTS) -> str:
    """One row per results file (sorted by name): held-out reward, the collapse version, calls and the trained mix at
    the extremes of required calls; then the critic's explained variance by ``left`` and the warm starts. Entropy, the
    lag from a rollout's oldest turn, the whole trained mix and the turn counts stay in each results file."""
    rows = []
    for path in sorted(results.glob("*.json")):
        f = common.read_json(path)
        if "versions" not in f:
            continue
        vs, pop = f["versions"], f["population"]
        broke = collapse_version(vs)
        last = vs[-1]
        extremes = labels(CALLS)[0], labels(CALLS)[-1]
        rows.append([f["label"], f["settings"].get("staleness_rule", "-") if f["method"] == "sao" else "-",
                     f["settings"]["lr"], f"{f['heldout_start']:.3f} -> " + " / ".join(f"{x:.3f}" for x in f["heldout"].values()),
                     "none" if broke is None else broke,
                     f"{fmt(last['calls_mean'], 1)} / {fmt(last['required_mean'], 1)}", f"{broken_share(last):.2f}",
                     " / ".join(f"{pop[b]['trained_share']:.2f}" for b in extremes), f"{f['wall_s']:.0f}"])
    ev_rows = [[f["label"], *[_ev_cell(f["value_by_left"].get(b)) if b != FIRST or FIRST in f["value_by_left"]
                              else "n/a" for b in ["all", *seen_labels()]]]
               for f in (common.read_json(p) for p in sorted(results.glob("*.json"))) if f.get("value_by_left")]
    ev_table = ("\n\nThe critic (SAO runs): explained variance of the return by the value before the critic's update, "
                "at each trained turn's first token, by the `left` count the turn saw (- : under 20 turns; n/a: analysed "
                "before the first turn, which saw no count, had its own column: there it counts under its task's "
                "required calls):\n\n"
                + common.markdown_table(["run", "all turns", "first turn", *[f"left {b}" for b in labels(LEFTS)]], ev_rows)
                ) if ev_rows else ""
    warm = [common.read_json(p) for p in sorted(results.glob("*.json"))]
    warm_rows = [[f["sft_steps"], sft_lr(f["command"]), f["max_reference_turns"] or "all", "left first" if
                  "left_first=true" in f["command"] else "code first", f"{f['heldout_reward']:.3f}",
                  *[fmt(f["heldout_by_calls"][b]["reward"]) for b in labels(CALLS)]]
                 for f in warm if "heldout_by_calls" in f]
    warm_table = ("\n\nWarm starts (`--warm-start-only`; held-out reward, 64 tasks x 2 samples, by required calls):\n\n"
                  + common.markdown_table(["SFT steps", "SFT lr", "max reference turns", "observation", "held-out reward",
                                           *[f"calls {b}" for b in labels(CALLS)]], warm_rows)) if warm_rows else ""
    lo, hi = labels(CALLS)[0], labels(CALLS)[-1]
    return common.markdown_table(
        ["run", "staleness rule", "lr", "held-out: warm start -> versions 4 / 8 / 12", "first broken version",
         "last version: calls / required", "last version: broken share", f"trained share, {lo} / {hi} calls",
         "wall s"], rows) + ev_table + warm_table


def _ev_cell(cell: Mapping[str, Any] | None) -> str:
    ev = None if not cell or cell["n"] < 20 else cell["explained_variance"]
    return "-" if ev is None else f"{ev:.2f}"


def analyse_run_dir(run_dir: Path) -> int:
    """``--run-dir``: print ``table`` and ``population`` of a finished run's ledger (its ``resolved_config.yaml`` gives
    the tasks); FileNotFoundError without a ledger or config."""
    from posttrain.config import load_config
    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger
    from posttrain.runtime import RunContext

    ctx = RunContext(load_config(run_dir / "resolved_config.yaml"))
    tasks = {t.task_id: len(codes_of(t)) for t in ctx.tasks("train")}
    lines = read_ledger(run_dir / LEDGER_NAME)
    print(table(analyse(lines, tasks)))
    print(json.dumps(population(lines, tasks)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (module docstring)."""
    from bench import async_vs_sync as avs

    p = common.parser(__doc__, None)
    p.add_argument("method", nargs="?", default="sao", help=f"a file of bench/configs/async_vs_sync/: {', '.join(avs.METHODS)}")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    p.add_argument("--eval-every", type=int, default=4, help="held-out evaluation every this many versions")
    p.add_argument("--label", default="", help="results file name (default: the method)")
    p.add_argument("--run-dir", type=Path, default=None, help="analyse this finished run's ledger instead of training "
                   "(no learner metrics, no held-out reward); prints the table only")
    p.add_argument("--warm-start-only", action="store_true", help="build the warm start, print its held-out reward "
                   "and accuracy by required-calls bucket, and stop (issue 29 item 2)")
    p.add_argument("--render", action="store_true", help="print the summary table of bench/results/longtail_evidence/ "
                   "and write it into docs/log.md (unless --no-docs)")
    args = p.parse_intermixed_args(argv)
    if args.eval_every < 1:
        p.error(f"--eval-every: must be >= 1, got {args.eval_every}")
    if args.run_dir is not None:
        return analyse_run_dir(args.run_dir)
    if args.render:
        table_md = render()
        print(table_md)
        if not args.no_docs:
            common.update_docs_section("longtail_evidence", table_md, DOCS)
        return 0
    config = avs.load_method(args.method, args.overrides, p)
    import torch

    from posttrain.envs.synthetic.longtail import codes_of
    from posttrain.learner.ledger import LEDGER_NAME, read_ledger
    from posttrain.runtime import RunContext

    torch.set_num_threads(1)
    base, sft = avs.shared_warm_start(config)
    if args.warm_start_only:
        return report_warm_start(base, sft, config, argv, args.out)
    cfg = config.model_copy(update={"run_name": f"evidence_{args.label or args.method}"})
    run = avs.run_method(cfg, args.method, base, sft, Path(config.output_dir) / "snapshots" / cfg.run_name,
                         args.eval_every, episodes=False)
    start, rewards = avs.evaluate_snapshots(base, sft, [run])
    ctx = RunContext(cfg)
    lines = read_ledger(ctx.run_dir / LEDGER_NAME)
    tasks = {t.task_id: len(codes_of(t)) for t in ctx.tasks("train")}
    rows = analyse(lines, tasks, {i + 1: s.metrics for i, s in enumerate(run.steps)})
    result = {"method": args.method, "label": args.label or args.method,
              "command": common.command_line("bench.longtail_evidence", argv), "machine": common.machine_info(),
              "when": common.utc_now(), "settings": avs.settings_of(cfg, args.eval_every, 1), "wall_s": run.wall_s,
              "load_avg_start_end": run.load_avg, "heldout_start": start,
              "heldout": {str(v): x for v, x in sorted(rewards[run.key].items())},
              "counters": run.counters, "population": population(lines, tasks),
              "value_by_left": value_by_left(lines, tasks), "versions": rows}
    path = args.out or RESULTS / f"{result['label']}.json"
    common.write_result(path, result)
    print(table(rows))
    print(json.dumps({"heldout_start": start, "heldout": result["heldout"], "population": result["population"]}))
    print(f"wrote {common.display_path(path)}")
    return 0


if __name__ == "__main__":
    common.run_main("bench.longtail_evidence", main)
