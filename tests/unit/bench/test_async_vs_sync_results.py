"""``bench.async_vs_sync.merge_results``: one result per setting, the tool-latency one on top."""

from __future__ import annotations

import pytest
from bench.async_vs_sync import merge_results, setting_result


def result(setting: str | None, ratio: float) -> dict:
    r = {"throughput_ratio_sao_over_grpo_sync": ratio, "busy_fraction": {"sao": 0.5}}
    if setting is not None:
        r["setting"] = setting
    return r


def test_a_tool_latency_run_goes_on_top_and_keeps_an_old_compute_bound_file_marked_as_such() -> None:
    """Old file (no setting, ratio 0.42) + tool-latency run (2.0) -> top 2.0, compute_bound 0.42 with a note."""
    merged = merge_results(result(None, 0.42), result("tool_latency", 2.0))
    assert merged["throughput_ratio_sao_over_grpo_sync"] == 2.0
    assert merged["compute_bound"]["throughput_ratio_sao_over_grpo_sync"] == 0.42
    assert merged["compute_bound"]["setting"] == "compute_bound"
    assert "before the runtime fixes" in merged["compute_bound"]["runtime_note"]


def test_a_compute_bound_run_replaces_only_the_compute_bound_part() -> None:
    """Top tool-latency 2.0 with compute_bound 0.42; a new compute-bound run 0.8 -> top 2.0, compute_bound 0.8."""
    top = {**result("tool_latency", 2.0), "compute_bound": result("compute_bound", 0.42)}
    merged = merge_results(top, result("compute_bound", 0.8))
    assert merged["throughput_ratio_sao_over_grpo_sync"] == 2.0
    assert merged["compute_bound"]["throughput_ratio_sao_over_grpo_sync"] == 0.8
    assert "runtime_note" not in merged["compute_bound"]
    again = merge_results(merged, result("tool_latency", 3.0))
    assert (again["throughput_ratio_sao_over_grpo_sync"], again["compute_bound"]["throughput_ratio_sao_over_grpo_sync"]) == (3.0, 0.8)


def test_without_a_previous_file_the_run_is_the_top_level() -> None:
    assert merge_results(None, result("compute_bound", 0.8)) == result("compute_bound", 0.8)
    assert "compute_bound" not in merge_results(None, result("tool_latency", 2.0))


def test_setting_result_finds_each_setting_or_says_which_is_missing() -> None:
    """--engine-modes-only writes into the setting its arguments name, never over the other one."""
    top = {**result("tool_latency", 2.0), "compute_bound": result("compute_bound", 0.42)}
    assert setting_result(top, "tool_latency") is top
    assert setting_result(top, "compute_bound") is top["compute_bound"]
    alone = result("compute_bound", 0.8)
    assert setting_result(alone, "compute_bound") is alone
    with pytest.raises(FileNotFoundError, match="no tool_latency result"):
        setting_result(alone, "tool_latency")
    with pytest.raises(FileNotFoundError, match="no compute_bound result"):
        setting_result(result("tool_latency", 2.0), "compute_bound")


@pytest.mark.parametrize(("methods", "message"), [
    (["nonsense"], "unknown method 'nonsense'"),
    (["grpo_sync_g5"], "must be a multiple of the group size of grpo_sync_g5"),
])
def test_bad_methods_fail_before_the_warm_start(tmp_path, capsys, methods, message):
    """Checked right after parsing (the SFT warm start takes minutes): exit 2, one error line, nothing written."""
    from bench.async_vs_sync import main

    with pytest.raises(SystemExit) as exc:
        main(["--methods", *methods, "--steps", "1", "--no-docs", "--work-dir", str(tmp_path / "w")])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w" / "tasks").exists()


@pytest.mark.parametrize(("stored", "message"), [
    ({"setting": "tool_latency"}, "no compute_bound result; run that setting first"),
    (None, "no results; run the benchmark first"),
    ({"setting": "tool_latency", "compute_bound": {"setting": "compute_bound", "task_calls": {"train": {}}}},
     "pass the run's --calls-median"),
])
def test_only_modes_say_in_one_line_what_to_run_first(tmp_path, capsys, monkeypatch, stored, message):
    """--engine-modes-only in a fresh checkout: exit 2, one line on stderr, no traceback, no work directory made.

    Task files are generated again from the arguments when missing, but only if they reproduce the stored
    result's distribution of required calls (here they cannot): else nothing is written."""
    import bench.common
    from bench.async_vs_sync import main

    monkeypatch.setattr(bench.common, "read_result", lambda name: stored)
    work = tmp_path / "w"
    code = main(["--engine-modes-only", "--tool-latency-median-s", "0", "--no-docs", "--work-dir", str(work)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not work.exists()


def summary(busy: float, tokens: float, rollouts: float, step_s: float, **extra) -> dict:
    """One method's run as ``summarise`` writes it (the fields the repeat logic reads)."""
    return {"busy_fraction": busy, "trained_action_tokens_per_s": tokens, "rollouts_per_s": rollouts,
            "learner_step_s_mean": step_s, "time_to_target_s": None, **extra}


def test_repeats_make_the_headline_the_mean_and_keep_the_range() -> None:
    """SAO run twice (busy 0.86 and 0.96, 400 and 440 tokens/s), sync G=8 once (50): headline busy 0.91,
    throughput 420, ratio 420 / 50 = 8.4 (the means, not the first run's 8.0); the table cell shows the range."""
    from bench.async_vs_sync import add_repeats, cell, headline

    result = {"methods": {"sao": summary(0.86, 400.0, 8.0, 3.0, time_to_target_s=116.0),
                          "grpo_sync_g8": summary(0.06, 50.0, 1.3, 0.8)}}
    result.update(headline(result["methods"]))
    assert result["throughput_ratio_sao_over_grpo_sync"] == pytest.approx(8.0)
    add_repeats(result, {"sao": [summary(0.96, 440.0, 9.0, 2.0, seed=1)]}, first_seed=0)
    sao = result["methods"]["sao"]
    assert sao["over_runs"]["runs"] == 2 and sao["over_runs"]["seeds"] == [0, 1]
    assert sao["over_runs"]["busy_fraction"]["values"] == [0.86, 0.96]
    assert result["busy_fraction"]["sao"] == pytest.approx(0.91)
    assert result["trained_action_tokens_per_s"]["sao"] == pytest.approx(420.0)
    assert result["throughput_ratio_sao_over_grpo_sync"] == pytest.approx(8.4)
    assert result["time_to_target_s"]["sao"] == 116.0  # the first run's: repeats are not evaluated
    assert "over_runs" not in result["methods"]["grpo_sync_g8"]
    assert cell(sao, "busy_fraction", 2) == "0.91 (0.86-0.96)"
    assert cell(result["methods"]["grpo_sync_g8"], "busy_fraction", 2) == "0.06"
    add_repeats(result, {"sao": [summary(0.90, 420.0, 8.5, 2.5, seed=2)]}, first_seed=0)  # a later --repeats-only
    assert result["methods"]["sao"]["over_runs"]["runs"] == 3
    assert result["busy_fraction"]["sao"] == pytest.approx((0.86 + 0.96 + 0.90) / 3)


def test_a_repeat_changes_only_the_run_seed() -> None:
    """Repeat 2 of SAO: run seed --seed + 2, its own run directory, the same tool latencies (seeded by --seed)."""
    import argparse
    from pathlib import Path

    from bench.async_vs_sync import method_config, repeat_config

    args = argparse.Namespace(seed=5, train_tasks=10, eval_tasks=4, sft_steps=1, max_episode_tokens=256, engine="hf",
                              generators=1, episodes_in_flight=8, max_new_tokens=8, max_calls=4, eval_samples=1,
                              tool_latency_median_s=3.0, tool_latency_sigma=1.0, tool_latency_max_s=30.0, lr=1e-4,
                              batch_rollouts=8, steps=2, micro_batch_size=4, max_staleness=4, critic_warmup=1)
    first, again = method_config(args, Path("w"), "sao"), repeat_config(args, Path("w"), "sao", 2)
    assert (again["seed"], again["run_name"]) == (7, "sao_r2")
    assert again["data"]["env_args"] == first["data"]["env_args"] and first["data"]["env_args"]["tool_latency_seed"] == 5
    assert {k: v for k, v in again.items() if k not in ("seed", "run_name")} == \
        {k: v for k, v in first.items() if k not in ("seed", "run_name")}
    with pytest.raises(ValueError, match="repeat index: must be >= 1"):
        repeat_config(args, Path("w"), "sao", 0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeats", "0"], "--repeats: must be >= 1 runs per method, got 0"),
    (["--repeats", "2", "--methods", "sao", "--repeat-methods", "grpo_sync_g4"], "grpo_sync_g4 is not in --methods"),
])
def test_bad_repeat_arguments_fail_at_parsing(tmp_path, capsys, argv, message):
    from bench.async_vs_sync import main

    with pytest.raises(SystemExit) as exc:
        main([*argv, "--no-docs", "--work-dir", str(tmp_path / "w")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--steps", "20"], "--steps: the stored tool_latency result used 12, got 20; repeats must share the setting"),
    (["--steps", "12", "--repeat-methods", "grpo_async_g4"], "grpo_async_g4 has no first run in the stored tool_latency"),
])
def test_repeats_only_refuses_another_setting_in_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, message):
    """--repeats-only adds runs to a stored setting only with that setting's arguments and methods: exit 2, one line."""
    import argparse

    import bench.common
    from bench.async_vs_sync import main
    from bench.common import settings_of

    stored_args = argparse.Namespace(steps=12, seed=0, tool_latency_median_s=3.0, keep_stale_episodes=False)
    stored = {"setting": "tool_latency", "settings": settings_of(stored_args), "methods": {"sao": summary(0.9, 1, 1, 1)}}
    monkeypatch.setattr(bench.common, "read_result", lambda name: stored)
    work = tmp_path / "w"
    code = main(["--repeats-only", "--repeats", "3", "--no-docs", "--work-dir", str(work), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0]
    assert not work.exists()


def test_rerunning_some_methods_keeps_the_others_of_the_same_setting() -> None:
    """A tool-latency file with sao (busy 0.86, 400 tokens/s) and sync G=8 (50); re-running only sao (0.95, 450)
    with the same arguments keeps G=8 (ratio 450 / 50 = 9) and says when G=8 ran; other arguments replace all."""
    import argparse

    from bench.common import settings_of

    same = settings_of(argparse.Namespace(steps=12, seed=0))
    g8 = summary(0.06, 50.0, 1.3, 0.8, when="2026-11-30T14:38:38Z")
    stored = {"setting": "tool_latency", "settings": same, "machine": {"when": "2026-11-30T14:38:38Z"},
              "methods": {"sao": summary(0.86, 400.0, 8.0, 3.0), "grpo_sync_g8": g8},
              "compute_bound": {"setting": "compute_bound", "methods": {}}}
    rerun = {"setting": "tool_latency", "settings": same, "methods": {"sao": summary(0.95, 450.0, 9.0, 3.0)}}
    merged = merge_results(stored, rerun)
    assert list(merged["methods"]) == ["sao", "grpo_sync_g8"]
    assert merged["methods"]["grpo_sync_g8"] is g8 and merged["busy_fraction"]["sao"] == 0.95
    assert merged["throughput_ratio_sao_over_grpo_sync"] == pytest.approx(9.0)
    assert merged["carried_methods"] == {"grpo_sync_g8": "2026-11-30T14:38:38Z"}
    assert merged["compute_bound"] == stored["compute_bound"]
    other = {**rerun, "settings": settings_of(argparse.Namespace(steps=20, seed=0))}
    assert list(merge_results(stored, other)["methods"]) == ["sao"]


def test_synchronous_grpo_is_carried_across_a_change_of_tau_slots_or_stale_handling_only() -> None:
    """Synchronous GRPO uses no admission, staleness or slots: a rerun of sao and async G=8 at tau 8 / 512 slots
    keeps the stored sync G=8, not the stored async G=4; another --steps keeps neither."""
    import argparse

    from bench.common import settings_of

    def settings(tau: int, slots: int, steps: int = 12) -> dict:
        return settings_of(argparse.Namespace(steps=steps, seed=0, max_staleness=tau, episodes_in_flight=slots,
                                              keep_stale_episodes=False))

    g8 = summary(0.03, 43.0, 1.1, 0.4, when="2026-12-01T11:20:03Z")
    stored = {"setting": "tool_latency", "settings": settings(4, 256), "machine": {"when": "2026-12-01T11:20:03Z"},
              "methods": {"sao": summary(0.71, 494.0, 10.0, 1.6), "grpo_sync_g8": g8,
                          "grpo_async_g4": summary(0.3, 200.0, 8.0, 0.4)}}
    rerun = {"setting": "tool_latency", "settings": settings(8, 512),
             "methods": {"sao": summary(0.96, 780.0, 17.0, 1.7), "grpo_async_g8": summary(0.4, 300.0, 9.0, 0.4)}}
    merged = merge_results(stored, rerun)
    assert list(merged["methods"]) == ["sao", "grpo_sync_g8", "grpo_async_g8"]
    assert merged["methods"]["grpo_sync_g8"] is g8 and merged["carried_methods"] == {"grpo_sync_g8": g8["when"]}
    assert merged["throughput_ratio_sao_over_grpo_sync"] == pytest.approx(780.0 / 43.0)
    assert list(merge_results(stored, {**rerun, "settings": settings(8, 512, steps=20)})["methods"]) == [
        "sao", "grpo_async_g8"]


def test_engine_probe_times_each_fixed_batch_on_the_real_engine(tiny_model) -> None:  # noqa: ANN001 (fixture)
    """The probe runs the hf engine on the tiny model: one median per PROBE_BATCHES shape, seconds their sum,
    and what other processes used beside it (a number on Linux)."""
    from pathlib import Path

    from bench.async_vs_sync import PROBE_BATCHES, engine_probe

    probe = engine_probe(tiny_model.path, new_tokens=2)
    assert [b[:2] for b in probe["batches"]] == [list(shape) for shape in PROBE_BATCHES]
    assert all(b[2] > 0 for b in probe["batches"])
    assert probe["seconds"] == pytest.approx(sum(b[2] for b in probe["batches"]))
    if Path("/proc/stat").exists():
        assert probe["background_cores"] is not None and probe["background_cores"] >= 0


def test_engine_modes_record_every_episode_and_each_batchs_sampled_tokens(tiny_model) -> None:  # noqa: ANN001
    """The engine alone on the tiny model, 4 slots, groups of 2, a short window per feeding: each feeding keeps
    one ``[prompt, actions, observations]`` per finished rollout (one observation count per turn, a group's two
    members consecutive and of one prompt), and each batch's sampled tokens lie between its longest row and
    rows x steps."""
    from types import SimpleNamespace

    from bench.async_vs_sync import measure_engine_modes

    from posttrain.envs.synthetic.longtail import SyntheticLongTailEnv

    env = SyntheticLongTailEnv(calls_median=2.0, calls_sigma=0.5, max_calls=4)
    tasks = env.tasks("train", 16, seed=0)
    generator = SimpleNamespace(max_turns=3, max_new_tokens=4, max_episode_tokens=384, episode_timeout_s=60.0)
    base = SimpleNamespace(config=SimpleNamespace(generator=generator), tasks=lambda split: tasks,
                           environment=lambda: env)
    out = measure_engine_modes(base, tiny_model.path, seconds=0.2, slots=4, seed=0, group_size=2)
    for mode in ("lockstep", "continuous", "groups"):
        episodes, batches = out[mode]["episodes"], out[mode]["batches"]
        assert len(episodes) == out[mode]["rollouts"] > 0
        assert all(1 <= len(actions) == len(observations) <= 3 for _, actions, observations in episodes)
        assert all(rows * steps >= sampled >= steps for rows, _, _, steps, _, sampled in batches)
        assert sum(b[5] for b in batches) == sum(sum(actions) for _, actions, _ in episodes)
    pairs = out["groups"]["episodes"]
    assert all(pairs[i][0] == pairs[i + 1][0] for i in range(0, len(pairs), 2))


@pytest.mark.parametrize(("point", "message"), [
    ("6", "expected TAU:SLOTS or TAU:SLOTS:keep (e.g. 6:384), got '6'"),
    ("six:384", "expected TAU:SLOTS"),
    ("4:256:drop", "expected TAU:SLOTS or TAU:SLOTS:keep"),
    ("4:x", "expected TAU:SLOTS"),
    ("6:0", "SLOTS must be >= 1 episodes, got '6:0'"),
])
def test_a_malformed_capacity_point_fails_at_parsing(tmp_path, capsys, point, message):
    """--capacity-sweep points are checked before the stored result or the warm start is read: exit 2, nothing made."""
    from bench.async_vs_sync import main

    with pytest.raises(SystemExit) as exc:
        main(["--capacity-sweep", "4:256", point, "--no-docs", "--work-dir", str(tmp_path / "w")])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_a_capacity_sweep_changes_only_tau_and_the_slots(tmp_path, capsys, monkeypatch):
    """Against a stored tool-latency setting (12 steps, tau 4, 256 slots): another tau and slot count are the
    sweep's own; another --steps is refused in one line before any work."""
    import argparse

    import bench.common
    from bench.async_vs_sync import capacity_point, check_sweep_args, main, sweep_args
    from bench.common import settings_of

    stored_args = argparse.Namespace(steps=12, seed=0, tool_latency_median_s=3.0, max_staleness=4, episodes_in_flight=256)
    stored = {"setting": "tool_latency", "settings": settings_of(stored_args), "methods": {}}
    check_sweep_args(stored, sweep_args(stored_args, 6, 384))  # no error: only the swept keys differ
    check_sweep_args(stored, sweep_args(stored_args, 4, 256, keep=True))  # keeping stale episodes is swept too
    assert capacity_point("4:256:keep") == (4, 256, True) and capacity_point("6:384") == (6, 384, False)
    assert (sweep_args(stored_args, 6, 384).max_staleness, sweep_args(stored_args, 6, 384).episodes_in_flight) == (6, 384)
    monkeypatch.setattr(bench.common, "read_result", lambda name: stored)
    work = tmp_path / "w"
    code = main(["--capacity-sweep", "6:384", "--steps", "20", "--no-docs", "--work-dir", str(work)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--steps: the stored tool_latency result used 12, got 20; a capacity sweep changes only tau" in err[0]
    assert not work.exists()


def test_the_capacity_sweep_table_has_one_row_per_point_with_the_runs_range() -> None:
    """Two points: tau 4 / 256 slots run twice (busy 0.80 and 0.86, 150 and 50 stale of 850 and 950 trained) with
    stale episodes kept (a point stored before the option), and tau 6 / 384 once with 30 cancelled in flight:
    capacity (tau + 1) x B, busy mean and range, stale share per run averaged, cancelled per run."""
    from bench.async_vs_sync import over_runs, render_sweep

    def run(busy: float, stale: float, trained: float, seed: int, rewards: dict, aborted: float = 0.0) -> dict:
        return {**summary(busy, 400.0, 9.0, 3.0, seed=seed), "stale_dropped": stale, "heldout_reward": rewards,
                "stale_aborted": aborted, "counters": {"rollouts_trained": trained, "generator_max_in_flight": 256.0}}

    def point(tau: int, slots: int, runs: list, **keep: bool) -> dict:
        return {"max_staleness": tau, "episodes_in_flight": slots, "admission_capacity": (tau + 1) * 64, "runs": runs,
                "over_runs": over_runs({**runs[0], "repeat_runs": runs[1:]}, 0), **keep}

    sweep = {"command": ".venv/bin/python -m bench.async_vs_sync --capacity-sweep 4:256 6:384", "repeats": 2,
             "machine": {"cpu_count": 2, "when": "2026-12-01T10:00:00Z"},
             "points": [point(4, 256, [run(0.80, 150, 850, 0, {"12": 0.14}), run(0.86, 50, 950, 1, {})]),
                        point(6, 384, [run(0.97, 0, 900, 0, {"12": 0.16}, aborted=30)], keep_stale_episodes=False)]}
    assert render_sweep({"methods": {}}) == []
    lines = "\n".join(render_sweep({"capacity_sweep": sweep})).splitlines()
    rows = [line for line in lines if line.startswith("| 4 ") or line.startswith("| 6 ")]
    assert len(rows) == 2
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells[0][:5] == ["4", "256", "320", "finish (learner drops)", "0.83 (0.80-0.86)"]
    assert cells[0][7:9] == ["0.10", "0"]  # (150 / 1000 + 50 / 1000) / 2 stale share; none cancelled
    assert cells[1][:5] == ["6", "384", "448", "cancelled in flight", "0.97"]
    assert cells[1][7:9] == ["0.00", "30"]
    assert rows[1].rstrip(" |").endswith("0.16")


def test_a_runs_episodes_come_from_its_ledger_in_replay_order_with_the_tasks_tool_waits(tmp_path):
    """A ledger of two iterations (the second with a stale drop) on real synthetic_longtail tasks with 3 s median
    tool latency: SAO replays every rollout by start time, drops included; asynchronous GRPO whole groups by their
    first start; synchronous GRPO in ledger order. A turn's wait is the task's call latency; an episode whose
    reported tool_wait_s differs (two calls in one turn) is counted."""
    import types

    from bench.async_vs_sync import run_episodes

    from posttrain.envs.synthetic.longtail import SyntheticLongTailEnv
    from posttrain.learner.ledger import append_ledger, ledger_line
    from posttrain.records import Rollout

    env = SyntheticLongTailEnv(tool_latency_median_s=3.0, tool_latency_sigma=1.0, tool_latency_max_s=30.0)
    tasks = env.tasks("train", 3, seed=0)
    mask = [False, True, True, False, True]  # prompt 1, two turns (2 and 1 tokens), observation 1

    def rollout(name: str, task: int, start: float, group: str, calls: int = 1, wait: float | None = None) -> Rollout:
        reported = env.call_latency_s(tasks[task], 0) if wait is None else wait
        return Rollout(rollout_id=name, task_id=tasks[task].task_id, env_name="synthetic_longtail",
                       token_ids=[1] * 5, behaviour_logprobs=[0.0] * 5, action_mask=mask, reward=1.0,
                       policy_version=0, turn_policy_versions=[0, 0], num_turns=2, group_id=group,
                       started_at=start, finished_at=start + 9, metrics={"tool_calls": calls, "tool_wait_s": reported})

    run_dir = tmp_path / "run"
    ledger = run_dir / "learner_ledger.jsonl"
    append_ledger(ledger, ledger_line(1, 1, [rollout("b1", 1, 5.0, "B"), rollout("b2", 1, 6.0, "B")]))
    append_ledger(ledger, ledger_line(2, 2, [rollout("a1", 0, 3.0, "A"), rollout("a2", 0, 1.0, "A", calls=2, wait=9.0)],
                                      dropped=[(rollout("c1", 2, 2.0, "C"), "stale")]))
    ctx = types.SimpleNamespace(run_dir=run_dir, environment=lambda: env, tasks=lambda split: tasks)

    sao, mismatched = run_episodes(ctx, "sao")
    assert [e[0] for e in sao] == [0, 1, 2, 3, 4] and mismatched == 1
    assert sao[0][1:] == [1, [2, 1], [1, 0], 1.0, [round(env.call_latency_s(tasks[0], 0), 2)]]  # a2, started at 1 s
    assert [e[5] for e in sao[1:3]] == [[round(env.call_latency_s(tasks[2], 0), 2)],  # c1 (dropped), at 2 s
                                        [round(env.call_latency_s(tasks[0], 0), 2)]]  # a1, at 3 s
    grouped, _ = run_episodes(ctx, "grpo_async_g2")
    assert [(e[0], e[5]) for e in grouped][:2] == [(0, sao[0][5]), (0, sao[2][5])]  # group A first: a2 started at 1 s
    assert {e[0] for e in grouped} == {0, 1, 2}
    synced, _ = run_episodes(ctx, "grpo_sync_g2")
    assert [e[5] for e in synced][:2] == [[round(env.call_latency_s(tasks[1], 0), 2)]] * 2  # group B: the first batch
    ctx.tasks = lambda split: tasks[:1]
    with pytest.raises(ValueError, match="which the run's train task file does not have"):
        run_episodes(ctx, "sao")


def test_a_new_run_of_the_setting_keeps_its_capacity_sweep_only_with_the_same_other_arguments() -> None:
    """The sweep ran SAO at other tau / slots on the setting's other arguments: a new run of all methods with those
    arguments keeps it (it names its own hour); a run with another --steps drops it."""
    import argparse

    from bench.common import settings_of

    def settings(steps: int) -> dict:
        return settings_of(argparse.Namespace(steps=steps, seed=0, max_staleness=4, episodes_in_flight=256))

    sweep = {"points": [], "command": "sweep", "repeats": 2, "machine": {}}
    stored = {"setting": "tool_latency", "settings": settings(12), "methods": {"sao": summary(0.7, 1, 1, 1)},
              "capacity_sweep": sweep}
    rerun = {"setting": "tool_latency", "settings": settings(12), "methods": {"sao": summary(0.8, 1, 1, 1)}}
    assert merge_results(stored, rerun)["capacity_sweep"] is sweep
    assert "capacity_sweep" not in merge_results(stored, {**rerun, "settings": settings(20)})


def test_only_synchronous_runs_keep_their_episodes_in_the_results() -> None:
    """Every run counts what its ledger recorded; only synchronous GRPO stores the episodes the simulator replays
    (an asynchronous run's record lacks the episodes in flight when it stopped)."""
    from bench.async_vs_sync import MethodRun, StepRecord, summarise

    episodes = [[0, 8, [20], [0], 1.0, []], [0, 8, [20], [0], 0.0, []]]
    steps = [StepRecord(1.0, 1, True, 2.0, 40.0, 40.0, 0.5, 0.5), StepRecord(2.0, 2, True, 2.0, 40.0, 40.0, 0.5, 0.5)]
    for method, stored in (("grpo_sync_g2", True), ("grpo_async_g2", False), ("sao", False),
                           ("sao tau=6 slots=384", False)):
        out = summarise(MethodRun(method, wall_s=3.0, steps=steps, episodes=episodes), {}, 1.0)
        assert out["episodes_recorded"] == 2
        assert ("episodes" in out) is stored and (not stored or out["episodes"] == episodes)
