"""``bench.learning_race``: equal resources, the steady window, the stability reader and every study's ``--quick`` run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.async_vs_sync import MethodRun, StepRecord
from bench.learning_race import (
    METHODS,
    STABILITY_METRICS,
    STUDY_CONFIGS,
    STUDY_VARIANTS,
    equal_resources,
    load_variant,
    main,
    read_metrics,
    spread,
    stability_result,
    steady_rates,
)


def test_every_race_method_has_the_same_slots_batch_versions_generators_and_warm_start() -> None:
    """32 episodes in flight (sync G=4: 8 x 4, G=8: 4 x 8, SAO and async GRPO: 32 slots), 32 rollouts per version,
    one engine, the same versions and lr; only the shape of the batch and the correction differ."""
    res = {m: equal_resources(load_variant("race", m, 20)) for m in METHODS}
    for key in ("episodes_in_flight", "batch_rollouts", "generators", "policy_versions", "engine", "lr"):
        assert len({r[key] for r in res.values()}) == 1, key
    assert res["sao"]["episodes_in_flight"] == 32 == res["grpo_sync_g4"]["batch_rollouts"]
    assert [(res[m]["prompts_per_version"], res[m]["group_size"]) for m in METHODS] == [(32, 1), (8, 4), (4, 8), (4, 8)]
    assert [res[m]["asynchronous"] for m in METHODS] == [True, False, False, True]
    assert {load_variant("race", m, 20).warm_start.steps for m in METHODS} == {400}


def test_the_longtail_race_gives_every_method_the_same_slots_batch_versions_lr_and_warm_start() -> None:
    """``longtail`` (issue 29): ``synthetic_longtail`` with tool latency, 32 episodes in flight for every method (the
    synchronous batches' 8 x 4 and 4 x 8), 32 rollouts per version, one engine, lr 1e-4, the same warm start (SFT lr
    1e-3 on references of at most 4 calls); the stability study runs SAO and asynchronous GRPO + DIS alike."""
    res = {m: equal_resources(load_variant("longtail", m, 20)) for m in METHODS}
    for key in ("episodes_in_flight", "batch_rollouts", "generators", "policy_versions", "engine", "lr"):
        assert len({r[key] for r in res.values()}) == 1, key
    assert res["sao"]["episodes_in_flight"] == 32 and res["sao"]["lr"] == 1e-4
    assert [(res[m]["prompts_per_version"], res[m]["group_size"]) for m in METHODS] == [(32, 1), (8, 4), (4, 8), (4, 8)]
    configs = [load_variant(s, v, 20) for s in ("longtail", "longtail_baseline", "longtail_correction",
                                                "longtail_stability") for v in STUDY_VARIANTS[s]]
    assert {c.data.env for c in configs} == {"synthetic_longtail"}
    assert {(c.warm_start.steps, c.warm_start.optim.lr, c.warm_start.max_reference_turns) for c in configs} == {(300, 1e-3, 5)}
    assert {c.data.env_args["tool_latency_median_s"] for c in configs} == {1.0}
    assert list(STUDY_VARIANTS["longtail_stability"]) == ["sao", "grpo_async_g8"]
    assert equal_resources(load_variant("longtail_gain", "sao", 64)) == equal_resources(load_variant("longtail", "sao", 64))
    assert equal_resources(load_variant("longtail_stability", "sao", 300))["policy_versions"] == 300


def test_longtail_gains_count_in_standard_errors_of_the_difference() -> None:
    """0.44 -> 0.60 on 200 samples each: se = sqrt(.44 .56 / 200 + .6 .4 / 200) = 0.0493, gain 3.24 se; mean ± SE over
    seeds uses the seeds' standard deviation / sqrt(n)."""
    from bench.learning_race import gain_in_se, mean_se, sampling_se

    assert sampling_se(0.5, 100) == pytest.approx(0.05)
    assert gain_in_se(0.44, 0.60, 200) == pytest.approx(0.16 / (0.2464 / 200 + 0.24 / 200) ** 0.5)
    assert gain_in_se(1.0, 1.0, 200) is None
    assert mean_se([0.5, 0.7, 0.6]) == "0.600 ± 0.058" and mean_se([0.5, None]) == "0.500" and mean_se([]) == "-"


def test_a_longtail_section_tables_accuracy_and_trained_share_by_calls_and_the_critic_by_left(tmp_path: Path) -> None:
    """A long-tail result: the accuracy and trained-share columns by required calls per variant, the seeds 3 SE above
    the warm start (0.44 -> 0.60 on 200 samples: 3.24 SE, counted; 0.50: 1.2 SE, not), the critic's explained variance
    by ``left`` for SAO only, and the per-version plot."""
    from bench.learning_race import LONGTAIL_SERIES, plot_study, plot_versions, render_training

    race = race_result([0, 1], [0, 1])
    share = {b: {"trained_share": 0.25, "task_share": 0.3} for b in ("1-2", "3-4", "5-8", "9-16")}
    series = {k: [[1, 0.5], [2, 0.4]] for k in [*LONGTAIL_SERIES, "broken_share"]}

    def runs(finals: list[float], critic: bool) -> list[dict]:
        return [{**race["variants"]["sao"]["runs"][0], "seed": i, "final_accuracy": f,
                 "final": {"accuracy_by_calls": {"1-2": [90, 0.9], "3-4": [50, 0.6], "5-8": [40, 0.2], "9-16": [20, 0.0]}},
                 "longtail": {"trained_by_calls": share, "first_broken_version": 7 if (i, critic) == (1, False) else None,
                              "series": series,
                              "value_by_left": {"all": {"n": 40, "explained_variance": 0.3},
                                                "first": {"n": 20, "explained_variance": 0.1},
                                                "0": {"n": 20, "explained_variance": 0.5}} if critic else {},
                              "value_reference": {"all": {"n": 40, "explained_variance": 0.4},
                                                  "0": {"n": 20, "explained_variance": 0.0}} if critic else {}}}
                for i, f in enumerate(finals)]

    result = {**race, "study": "longtail", "env": "synthetic_longtail", "start_accuracy": 0.44,
              "eval": {"tasks": 100, "samples_per_task": 2},
              "start_accuracy_by_calls": {"1-2": [90, 0.65], "3-4": [50, 0.57], "5-8": [40, 0.18], "9-16": [20, 0.0]},
              "variants": {"sao": {**race["variants"]["sao"], "runs": runs([0.60, 0.62], True)},
                           "grpo_sync_g8": {**race["variants"]["grpo_sync_g8"], "runs": runs([0.60, 0.50], False)}}}
    text = render_training(result)
    lines = text.splitlines()
    assert "| warm start | - | - | 0.650 | 0.570 | 0.180 | 0.000 | 0.30 | 0.30 | 0.30 | 0.30 |" in lines
    assert "| sao | 2/2 | none, none | 0.900 | 0.600 | 0.200 | 0.000 | 0.25 | 0.25 | 0.25 | 0.25 |" in lines
    assert "| grpo_sync_g8 | 1/2 | none, 7 | 0.900 |" in text
    assert "| sao | 2 | 0.30 | 0.10 | 0.50 | - | - | - | - | - | 80 |" in lines and "| grpo_sync_g8 | 0.30" not in text
    assert "| sao: left count + version | 2 | 0.40 | - | 0.00 | - | - | - | - | - | 80 |" in lines
    assert "0.610 ± 0.010" in next(line for line in lines if line.startswith("| sao | 2 |"))
    assert plot_versions(result, tmp_path).stat().st_size > 0
    assert "![longtail per version](results/learning_race_longtail_versions.png)" in text
    assert [p.name for p in plot_study(result, tmp_path)] == ["learning_race_longtail_seconds.png",
                                                             "learning_race_longtail_rollouts.png"]


def test_each_ablation_changes_only_its_own_setting() -> None:
    """Within a study the variants' resources differ only in the studied setting (grid: tau and lr)."""
    own = {"correction": {"correction"}, "baseline": {"advantage"}, "grid": {"max_staleness", "lr"},
           "longtail_correction": {"correction"}, "longtail_baseline": {"advantage"}}
    for study, keys in own.items():
        res = [equal_resources(load_variant(study, v, 20)) for v in STUDY_VARIANTS[study]]
        changed = {k for k in res[0] if len({json.dumps(r[k]) for r in res}) > 1}
        assert changed == keys, study
    assert equal_resources(load_variant("correction", "tis", 20))["episodes_in_flight"] == 96


def step(t: float, version: int, rollouts: float = 32.0, tokens: float = 100.0, **metrics: float) -> StepRecord:
    """A learner iteration that made ``version``."""
    return StepRecord(t, version, True, rollouts, tokens, tokens, 0.1, 0.5, dict(metrics))


def test_the_steady_window_starts_at_the_skip_version_and_counts_the_updates_after_it() -> None:
    """Versions 1..5 at 10, 20, 30, 40, 50 s; skip 2: window 20 -> 50 s = 30 s holding versions 3, 4, 5: 3 x 32 / 30
    = 3.2 rollouts/s, 3 x 100 / 30 = 10 tokens/s; GRPO kept 16 of each: 1.6 kept/s. One update in the window: None."""
    run = MethodRun("grpo_sync_g8", steps=[step(10.0 * v, v, **{"grpo/rollouts_kept": 16.0}) for v in range(1, 6)])
    rates = steady_rates(run, 2)
    assert rates["window_s"] == pytest.approx(30.0) and rates["window_versions"] == [2, 5]
    assert rates["rollouts_per_s"] == pytest.approx(3.2) and rates["trained_action_tokens_per_s"] == pytest.approx(10.0)
    assert rates["kept_rollouts_per_s"] == pytest.approx(1.6)
    assert steady_rates(run, 5)["rollouts_per_s"] is None


def test_spread_gives_the_median_and_range_and_says_how_many_seeds_reached() -> None:
    """Times 30, 10, 20: median 20 (10-30); one of three None: 2/3 reached; all None: not reached."""
    assert spread([30.0, 10.0, 20.0], 0) == "20 (10-30)"
    assert spread([30.0, None, 10.0], 0) == "20 (10-30), 2/3 reached"
    assert spread([None, None], 0) == "not reached (0/2)"


def test_the_stability_reader_skips_warm_start_lines_and_tables_by_window(tmp_path: Path) -> None:
    """SFT lines (no reward) are skipped; versions 1..15 of 20 planned, windows of 10: 1-10 holds 10 versions with
    mean reward (0.1 + ... + 1.0) / 10 = 0.55, 11-20 holds 5, not finished; a bad line names file and line."""
    lines = [{"step": s, "warm_start/loss": 1.0} for s in range(1, 4)]
    lines += [{"step": v, "reward/mean": v / 10, "policy/entropy": 1.0} for v in range(1, 16)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert sorted(read_metrics(tmp_path)) == list(range(1, 16))
    result = stability_result(tmp_path, 20, windows=2)
    assert [w["count"] for w in result["windows"]] == [10, 5] and not result["finished"]
    assert result["windows"][0]["reward/mean"] == pytest.approx(0.55)
    assert result["windows"][0]["mask/frac_total"] is None and result["covered_versions"] == [1, 15]
    assert result["run_name"] == tmp_path.name and str(tmp_path) not in json.dumps(result["windows"])
    (tmp_path / "summary.md").write_text("| metric | value |\n|---|---|\n| held-out accuracy after SAO | 0.255 |\n"
                                         f"| reward curve | {tmp_path}/reward_curve.png |\n| masked | 0.000 / 0.008 |\n")
    summary = stability_result(tmp_path, 20, windows=2)["summary"]
    assert summary == {"held-out accuracy after SAO": "0.255", "masked": "0.000 / 0.008"}
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\nnot json\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: not JSON"):
        read_metrics(tmp_path)


def test_help_describes_the_benchmark_in_whole_sentences(capsys) -> None:
    """A new user's ``--help`` ended its description mid-sentence ("... at equal resources, and the paper's")."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bench.learning_race ")
    description = " ".join(out.split("\n\n")[1].split())
    assert description.startswith("The learning race (issue 22): ") and description.endswith("docs section.")
    assert "the paper's ablations in miniature" in description


@pytest.mark.parametrize(("argv", "message"), [
    (["race", "--seeds", "1,1"], "--seeds distinct"),
    (["longtail_gain", "--versions", "0"], "--versions: must be >= 1, got 0"),
    (["race", "--eval-every", "0"], "--eval-every: must be >= 1, got 0"),
    (["race", "--target", "1.5"], "--target: an accuracy in (0, 1], got 1.5"),
    (["grid", "--from-run", "x"], "--from-run: only for the stability study, not 'grid'"),
    (["race", "sao.stepz=3"], "sao.stepz: unknown field"),
    (["longtail", "--variants", "sao,grpo"], "--variants: distinct variants of 'longtail' (sao, grpo_sync_g4,"),
    (["longtail", "--reread", "nope"], "--reread: no results of 'longtail' to refresh in"),
    (["stability", "--variants", "sao"], "--variants: distinct variants of 'stability' (none)"),
])
def test_bad_arguments_fail_in_one_line_before_the_warm_start(tmp_path, capsys, argv, message):
    """Exit 2 with one error line, nothing written."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"output_dir={tmp_path / 'w'}", "--no-docs", "--out-dir", str(tmp_path / "r")])
    assert exc.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


def test_reread_names_a_run_directory_that_does_not_exist(tmp_path, capsys):
    """A new user's ``--reread`` of a path that is not there: exit 2 naming it, the results file untouched."""
    results = tmp_path / "longtail.json"
    results.write_text(json.dumps({"study": "longtail", "variants": {}}))
    with pytest.raises(SystemExit) as exc:
        main(["longtail", "--no-docs", "--out-dir", str(tmp_path), "--reread", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--reread: {tmp_path / 'nope'}: no such run directory")
    assert json.loads(results.read_text()) == {"study": "longtail", "variants": {}}


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the ``--quick`` runs."""
    return tmp_path_factory.mktemp("learning_race_quick")


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # each run starts a generator process (SAO, async GRPO) and an embedded server
def test_quick_race_trains_every_method_and_writes_its_json_and_plots(quick_dir: Path) -> None:
    """``race --quick``: every method once (seed 0), 2 versions, snapshots at versions 1 and 2 graded with the warm
    start; the plots exist; docs untouched.

    The one training smoke of the studies: the race holds every method's code path (SAO, synchronous GRPO G = 4 and
    G = 8, asynchronous GRPO + DIS). The ablations run SAO with other settings through the same ``train_study``:
    their settings are checked by ``test_each_ablation_changes_only_its_own_setting``, their plot and section by
    ``test_an_ablation_section_and_plot_show_reward_staleness_and_masking_per_variant``, and their learner paths
    (no critic: running mean, batch whitening; TIS and no correction) by ``tests/unit/learner/test_loop.py``'s
    ``test_sao_loop_without_a_critic_trains_each_version_with_its_baseline_and_correction``."""
    assert main(["race", "--quick", "--out-dir", str(quick_dir)]) == 0
    result = json.loads((quick_dir / "race.json").read_text())
    assert result["quick"] and result["seeds"] == [0] and result["versions"] == 2
    assert list(result["variants"]) == list(STUDY_VARIANTS["race"]) == list(METHODS)
    for variant in result["variants"].values():
        (run,) = variant["runs"]
        assert [c[0] for c in run["accuracy_curve"]] == [0, 1, 2] and run["policy_versions"] == 2
        assert all(0.0 <= c[3] <= 1.0 for c in run["accuracy_curve"])
        assert [v for v, _ in run["train_reward_by_version"]] == [1, 2] == [v for v, _ in run["version_times_s"]]
        assert run["first_version_s"] == pytest.approx(run["version_times_s"][0][1], abs=0.01)
        assert run["accuracy_curve"][1][1] == pytest.approx(run["first_version_s"], abs=0.01)
    names = ["learning_race_race_seconds.png", "learning_race_race_rollouts.png"]
    assert [Path(p).name for p in result["plots"]] == names
    assert all((quick_dir / "plots" / n).stat().st_size > 0 for n in names)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # the SAO run starts a generator process and an embedded server
def test_quick_longtail_race_grades_by_required_calls_and_reads_each_ledger(quick_dir: Path) -> None:
    """``longtail --quick --variants sao,grpo_sync_g4`` (issue 29): SAO (asynchronous, critic) and synchronous GRPO on
    ``synthetic_longtail``: the warm start's and each run's last snapshot's accuracy by required-calls bucket (samples
    add up to the 4 held-out tasks), the trained share by bucket from each ledger (shares add up to 1), the critic's
    value against the return by ``left`` for SAO only, a per-version series per run, and the per-version plot."""
    out = quick_dir / "longtail"
    assert main(["longtail", "--quick", "--variants", "sao,grpo_sync_g4", "--out-dir", str(out)]) == 0
    result = json.loads((out / "longtail.json").read_text())
    assert result["env"] == "synthetic_longtail" and list(result["variants"]) == ["sao", "grpo_sync_g4"]
    assert sum(n for n, _ in result["start_accuracy_by_calls"].values()) == 4
    for variant, d in result["variants"].items():
        (run,) = d["runs"]
        assert run["final"]["policy_version"] == 2 and sum(n for n, _ in run["final"]["accuracy_by_calls"].values()) == 4
        shares = [b["trained_share"] for b in run["longtail"]["trained_by_calls"].values()]
        assert sum(shares) == pytest.approx(1.0)
        assert [v for v, _ in run["longtail"]["series"]["reward"]][-1] == 2
        assert bool(run["longtail"]["value_by_left"]) == (variant == "sao")
        # the reference's buckets are the critic's (empty for GRPO; a quick run may have too few turns for both halves)
        assert set(run["longtail"]["value_reference"]) <= set(run["longtail"]["value_by_left"])
    assert [Path(p).name for p in result["plots"]][-1] == "learning_race_longtail_versions.png"
    # --reread: the critic's tables again from the SAO run's ledger, its path kept out of the results
    sao = result["variants"]["sao"]["runs"][0]["longtail"]
    run_dir = out / "runs" / "longtail_sao_s0"
    assert main(["longtail", "--out-dir", str(out), "--no-docs", "--reread", str(run_dir)]) == 0
    again = json.loads((out / "longtail.json").read_text())
    assert again["variants"]["sao"]["runs"][0]["longtail"]["value_by_left"] == sao["value_by_left"]
    assert again["reread"].endswith("--reread <dir of run longtail_sao_s0>") and str(run_dir) not in again["reread"]
    with pytest.raises(SystemExit) as exc:  # no such seed in the results: refused, the file unchanged
        main(["longtail", "--out-dir", str(out), "--no-docs", "--reread", str(out / "runs" / "longtail_sao_s7")])
    assert exc.value.code == 2 and json.loads((out / "longtail.json").read_text()) == again


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # each run starts a generator process and an embedded server
@pytest.mark.parametrize(("study", "variant", "setting"), [("longtail_baseline", "running_mean", "sao.advantage"),
                                                           ("longtail_correction", "none", "sao.loss.correction"),
                                                           ("longtail_stability", "grpo_async_g8", None)])
def test_quick_longtail_ablations_run_their_variant_without_the_defaults(quick_dir: Path, study: str, variant: str,
                                                                          setting: str | None) -> None:
    """``longtail_baseline --quick --variants running_mean``, ``longtail_correction --quick --variants none`` and
    ``longtail_stability --quick --variants grpo_async_g8`` (issue 29): each study runs its variant that no other quick
    run covers end to end on ``synthetic_longtail`` (an ablation's own setting in the variant's overrides, accuracy by
    required-calls bucket, the trained share by bucket) and writes its JSON and the per-version plot; a variant without
    a critic has no value-by-``left`` table. ``longtail_gain``'s one variant is the ``longtail`` quick run's SAO
    (``test_the_gain_study_is_the_longtail_races_sao_run_for_longer``)."""
    out = quick_dir / study
    assert main([study, "--quick", "--variants", variant, "--out-dir", str(out)]) == 0
    result = json.loads((out / f"{study}.json").read_text())
    assert result["env"] == "synthetic_longtail" and list(result["variants"]) == [variant]
    d = result["variants"][variant]
    assert setting is None or any(o.startswith(f"{setting}={variant}") for o in d["overrides"])
    (run,) = d["runs"]
    assert run["final"]["policy_version"] == 2 and sum(n for n, _ in run["final"]["accuracy_by_calls"].values()) == 4
    assert sum(b["trained_share"] for b in run["longtail"]["trained_by_calls"].values()) == pytest.approx(1.0)
    assert bool(run["longtail"]["value_by_left"]) == (variant not in ("running_mean", "grpo_async_g8"))
    assert [Path(p).name for p in result["plots"]][-1] == f"learning_race_{study}_versions.png"


def test_the_gain_study_is_the_longtail_races_sao_run_for_longer() -> None:
    """``longtail_gain`` runs the ``longtail`` race's SAO variant (the same method file, folder and overrides) for more
    versions, so the ``longtail`` quick run keeps it working; ``longtail_stability`` adds no variant of its own."""
    assert STUDY_VARIANTS["longtail_gain"] == {"sao": STUDY_VARIANTS["longtail"]["sao"]}
    assert set(STUDY_VARIANTS["longtail_stability"].items()) <= set(STUDY_VARIANTS["longtail"].items())
    assert STUDY_CONFIGS["longtail_gain"] == STUDY_CONFIGS["longtail_stability"] == STUDY_CONFIGS["longtail"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # each SAO run starts a generator process and an embedded server: ~2 min at load 20
def test_quick_stability_runs_two_versions_and_reads_them_back(quick_dir: Path) -> None:
    """The stability config for 2 versions, then the reader: 2 versions logged of 2, one window per version, the plot."""
    assert main(["stability", "--quick", "--out-dir", str(quick_dir)]) == 0
    result = json.loads((quick_dir / "stability.json").read_text())
    assert result["covered_versions"] == [1, 2] and result["finished"] and result["run_name"] == "stability-sao"
    assert [w["count"] for w in result["windows"]] == [1, 1]
    assert set(result["series"]) == set(STABILITY_METRICS)
    assert (quick_dir / "plots" / "learning_race_stability.png").stat().st_size > 0


def race_result(seeds: list[int], planned: list[int]) -> dict:
    """A race results file: SAO reaching 0.6 at 100 s (seed 0) and 300 s (seed 1); G=8 never; version 1 at 40 s."""
    def run(seed: int, t_target: float | None, final: float) -> dict:
        curve = [[0, 0.0, 0, 0.5], [4, t_target or 200.0, 128, final]]
        return {"seed": seed, "when": "2026-12-02T08:00:00Z", "wall_s": 400.0, "load_avg_start_end": [10.0, 12.0],
                "policy_versions": 4, "accuracy_curve": curve, "final_accuracy": final, "time_to_target_s": t_target,
                "time_to_target_after_first_version_s": None if t_target is None else t_target - 40.0,
                "first_version_s": 40.0, "rollouts_to_target": None if t_target is None else 128,
                "trained_action_tokens_per_s": 100.0, "rollouts_per_s": 2.0, "kept_rollouts_per_s": 2.0,
                "trained_tool_wait_s_mean": 1.2, "population_first_call_latency_s_mean": 1.6,
                "train_reward_by_version": [[v, 0.5] for v in range(1, 5)], "staleness_token_lag_mean": 1.0,
                "staleness_mean": 1.0, "masked_fraction_mean": 0.0}
    res = {m: equal_resources(load_variant("race", m, 4)) for m in ("sao", "grpo_sync_g8")}
    return {"study": "race", "question": "q", "machine": {"when": "x", "load_avg": [1, 1, 1]}, "when": "x",
            "seeds": seeds, "seeds_planned": planned, "versions": 4, "eval_every": 4, "eval": {"tasks": 100,
            "samples_per_task": 1}, "env": "synthetic_tool", "env_args": {"tool_latency_median_s": 1.0},
            "start_accuracy": 0.5, "target_accuracy": 0.6, "steady_from_version": 1, "command": "c",
            "variants": {"sao": {"resources": res["sao"], "runs": [run(s, 100.0 + 200 * s, 0.7) for s in seeds]},
                         "grpo_sync_g8": {"resources": res["grpo_sync_g8"], "runs": [run(s, None, 0.55) for s in seeds]}}}


def test_the_race_section_states_equal_resources_spreads_and_missing_seeds(tmp_path: Path) -> None:
    """Two of three seeds done: the section says so; SAO's time to target is the median 200 (100-300), G=8's is not
    reached (0/2); both rows show 32 episodes in flight; the plots are drawn per method."""
    from bench.learning_race import plot_study, render_training

    result = race_result([0, 1], [0, 1, 2])
    text = render_training(result)
    assert "**2 of the 3 planned seeds 0, 1, 2 done**" in text
    assert "| sao | 32 | 32 | 32 x 1 | 1 | 2 |" in text and "| grpo_sync_g8 | 32 | 32 | 4 x 8 | 1 | - |" in text
    sao_row = next(line for line in text.splitlines() if line.startswith("| sao | 2 |"))
    assert "200 (100-300)" in sao_row and "160 (60-260)" in sao_row
    assert "not reached (0/2)" in next(line for line in text.splitlines() if line.startswith("| grpo_sync_g8 | 2 |"))
    paths = plot_study(result, tmp_path)
    assert [p.name for p in paths] == ["learning_race_race_seconds.png", "learning_race_race_rollouts.png"]
    assert "planned" not in render_training(race_result([0, 1, 2], [0, 1, 2])).split("versions per run")[0]


def test_the_tail_race_keeps_the_race_resources_with_a_heavier_tool_latency_tail(tmp_path: Path) -> None:
    """``tail``: the race's slots, batch, versions and lr for SAO, synchronous and asynchronous GRPO G = 8; only the
    tool-latency tail differs (sigma 1.5, cap 20 s); its section and plots carry its own names."""
    from bench.learning_race import TAIL_METHODS, plot_study, render_training

    assert list(STUDY_VARIANTS["tail"]) == list(TAIL_METHODS) == ["sao", "grpo_sync_g8", "grpo_async_g8"]
    for m in TAIL_METHODS:
        race, tail = load_variant("race", m, 12), load_variant("tail", m, 12)
        assert equal_resources(race) == equal_resources(tail)
        changed = {k for k in race.data.env_args if race.data.env_args[k] != tail.data.env_args[k]}
        assert changed == {"tool_latency_sigma", "tool_latency_max_s"}
        assert (tail.data.env_args["tool_latency_sigma"], tail.data.env_args["tool_latency_max_s"]) == (1.5, 20)
    result = {**race_result([0], [0]), "study": "tail"}
    assert "![accuracy vs seconds](results/learning_race_tail_seconds.png)" in render_training(result)
    assert [p.name for p in plot_study(result, tmp_path)] == ["learning_race_tail_seconds.png",
                                                             "learning_race_tail_rollouts.png"]


def test_an_ablation_section_and_plot_show_reward_staleness_and_masking_per_variant(tmp_path: Path) -> None:
    """An ablation (``baseline``: gae / running_mean / batch_norm; one seed, 4 versions): one plot of held-out accuracy
    and training reward against version; the section's row per variant gives the last quarter's training reward
    (version 4's 0.5), the token lag, staleness and masked fraction, and the resources name the advantage."""
    from bench.learning_race import plot_study, render_training

    race = race_result([0], [0])
    run = race["variants"]["sao"]["runs"][0]
    variants = {v: {"resources": equal_resources(load_variant("baseline", v, 4)), "runs": [run]}
                for v in STUDY_VARIANTS["baseline"]}
    result = {**race, "study": "baseline", "variants": variants}
    text = render_training(result)
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ") and " | 1 | " in line}
    assert list(rows) == ["gae", "running_mean", "batch_norm"]
    assert all("| 0.700 | 0.500 | 1.00 | 1.00 | 0.000 | 400 |" in row for row in rows.values())
    assert "| running_mean | 32 | 32 | 32 x 1 | 1 | 2 |" in text and "running_mean | dis |" in text
    assert "![baseline](results/learning_race_baseline.png)" in text and "s to target (median" not in text
    assert [p.name for p in plot_study(result, tmp_path)] == ["learning_race_baseline.png"]
    assert (tmp_path / "learning_race_baseline.png").stat().st_size > 0


def test_results_of_disjoint_seeds_merge_into_one_study_and_mismatches_are_named(tmp_path: Path, capsys) -> None:
    """Seeds 0-1 and 2 run apart merge into seeds 0, 1, 2 with each variant's runs in seed order and both commands;
    parts that differ in a setting or share a seed are refused in one line; ``--merge`` renders the merged file."""
    from bench.learning_race import merge_results

    a, b = race_result([0, 1], [0, 1]), race_result([2], [2])
    a["command"], b["command"] = "first", "second"
    merged = merge_results([b, a])
    assert merged["seeds"] == [0, 1, 2] == merged["seeds_planned"] and merged["commands"] == ["second", "first"]
    assert [r["seed"] for r in merged["variants"]["sao"]["runs"]] == [0, 1, 2]
    with pytest.raises(ValueError, match="merge: part 2 differs from part 1 in 'versions': 8 != 4"):
        merge_results([a, {**b, "versions": 8}])
    with pytest.raises(ValueError, match=r"merge: a run is in two parts \(variant, seed\): \[\('grpo_sync_g8', 0\), "
                                         r"\('sao', 0\)\]"):
        merge_results([a, race_result([0], [0])])
    only_g8 = {**race_result([5], [5]), "variants": {"grpo_sync_g8": race_result([5], [5])["variants"]["grpo_sync_g8"]}}
    only_sao = {**race_result([5], [5]), "variants": {"sao": race_result([5], [5])["variants"]["sao"]}}
    both = merge_results([only_g8, only_sao])
    assert list(both["variants"]) == ["sao", "grpo_sync_g8"] and both["seeds"] == [5]
    parts = []
    for i, part in enumerate((a, b)):
        parts.append(tmp_path / f"part{i}.json")
        parts[-1].write_text(json.dumps(part))
    out = tmp_path / "out"
    assert main(["race", "--merge", *map(str, parts), "--out-dir", str(out), "--no-docs"]) == 0
    assert json.loads((out / "race.json").read_text())["seeds"] == [0, 1, 2]
    with pytest.raises(SystemExit):
        main(["tail", "--merge", str(parts[0]), "--out-dir", str(out), "--no-docs"])
    assert "--merge: the files hold study 'race', not 'tail'" in capsys.readouterr().err
