"""``bench.async_vs_sync``: method configs, argument checks, run records and the rendered section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.async_vs_sync import (
    cell,
    done_when,
    load_method,
    main,
    ratios,
    render,
    render_rules,
    render_setting,
    setting_of,
    settings_of,
    targets,
)

from posttrain.rollout.lengths import length_metrics


@pytest.mark.parametrize(("argv", "message"), [
    (["nonsense"], "method 'nonsense': no bench/configs/async_vs_sync/nonsense.yaml; known: grpo_async_g8, grpo_sync_g4"),
    (["sao", "sao.steps=0"], "override 'sao.steps=0': sao.steps: Input should be greater than or equal to 1"),
    (["sao", "sao.stepz=3"], "sao.stepz: unknown field"),
    (["sao", "--repeats", "0"], "--repeats and --eval-every: must be >= 1, got 0 and 4"),
    (["sao", "--rules", "token,turn"], "--rules: comma-separated distinct values of token, episode, got 'token,turn'"),
    (["sao", "--rules", "token,token"], "--rules: comma-separated distinct values of token, episode"),
    (["grpo_sync_g4", "--rules", "token"], "--rules: sao.staleness_rule is an SAO setting; method 'grpo_sync_g4' runs grpo"),
])
def test_bad_arguments_fail_in_one_line_before_the_warm_start(tmp_path, capsys, argv, message):
    """Checked right after parsing (the SFT warm start takes minutes): exit 2, one error line, nothing written."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"output_dir={tmp_path / 'w'}", "--no-docs", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and message in err[-1]
    assert not (tmp_path / "w").exists() and not (tmp_path / "r.json").exists()


def test_a_method_is_its_file_on_the_base_then_the_overrides() -> None:
    """Every method validates; an override wins over the method file, which wins over the base; the setting follows
    the tool latency; the sweep's two overrides change only tau and the slots."""
    configs = {m: load_method(m) for m in ("sao", "grpo_sync_g4", "grpo_sync_g8", "grpo_async_g8")}
    assert [c.technique for c in configs.values()] == ["sao", "grpo", "grpo", "grpo"]
    assert configs["grpo_async_g8"].grpo.async_ and not configs["grpo_sync_g8"].grpo.async_
    assert {c.grpo.batch_rollouts for m, c in configs.items() if m != "sao"} == {64} == {configs["sao"].sao.batch_size}
    assert setting_of(configs["sao"]) == "tool_latency"
    point = load_method("sao", ["sao.max_staleness=4", "generator.episodes_in_flight=256"])
    assert setting_of(load_method("sao", ["data.env_args.tool_latency_median_s=0"])) == "compute_bound"
    base, swept = settings_of(configs["sao"], 4, 1), settings_of(point, 4, 1)
    assert {k for k in base if base[k] != swept[k]} == {"max_staleness", "episodes_in_flight"}
    assert (swept["max_staleness"], swept["episodes_in_flight"]) == (4, 256)


def test_every_method_trains_at_one_policy_lr_below_the_one_that_broke_the_answer_turn() -> None:
    """Issue 29: at lr 3e-4 the asynchronous methods' answer turn broke or began to break within 12 versions in 4 of 9
    runs, at 1e-4 in none of 8 (docs/results.md section 8); the methods share the lr so they compare at equal settings."""
    configs = {m: load_method(m) for m in ("sao", "grpo_sync_g4", "grpo_sync_g8", "grpo_async_g8")}
    lrs = {m: (c.sao if c.technique == "sao" else c.grpo).optim.lr for m, c in configs.items()}
    assert set(lrs.values()) == {1e-4}, lrs


def test_the_committed_results_were_run_with_these_configs() -> None:
    """Each committed method file's settings are what its method file and command's overrides give today."""
    import shlex

    from bench.common import RESULTS_DIR

    files = sorted((RESULTS_DIR / "async_vs_sync").glob("**/*.json"))
    assert len(files) >= 8
    for path in files:
        result = json.loads(path.read_text())
        args = shlex.split(result["command"])[3:]
        overrides = [a for a in args if "=" in a and not a.startswith("-")]
        recorded = dict(result["settings"])
        if "staleness_rule" not in recorded:  # written before sao.staleness_rule existed: the episode rule ran
            recorded["staleness_rule"] = "episode"
            overrides += ["sao.staleness_rule=episode"] if result["method"] == "sao" else []
        if recorded["lr"] == 3e-4 and not any(".optim.lr=" in o for o in overrides):
            # written before issue 29 lowered the methods' lr to 1e-4
            overrides += [f"{'sao' if result['method'] == 'sao' else 'grpo'}.optim.lr=3e-4"]
        config = load_method(result["method"], overrides)
        expected = settings_of(config, recorded["eval_every"], len(result.get("runs", [])))
        assert setting_of(config) == result["setting"] == path.relative_to(RESULTS_DIR / "async_vs_sync").parts[0]
        assert {k: v for k, v in expected.items() if k != "repeats"} == \
            {k: v for k, v in recorded.items() if k != "repeats"}, path


def summary(busy: float, tokens: float, rollouts: float, step_s: float, **extra) -> dict:
    """One run as ``summarise`` writes it (the fields the tables read)."""
    return {"busy_fraction": busy, "trained_action_tokens_per_s": tokens, "rollouts_per_s": rollouts,
            "learner_step_s_mean": step_s, "time_to_target_s": None, "wall_s": 10.0, "heldout_reward": {},
            "when": "2026-12-01T10:00:00Z", "stale_dropped": 0.0, "stale_aborted": 0.0,
            "counters": {"rollouts_trained": 100.0, "generator_max_in_flight": 64.0}, **extra}


def method_file(method: str, *runs: dict, **settings: object) -> dict:
    s = {"calls_median": 3.0, "calls_sigma": 0.8, "max_calls": 16, "batch_rollouts": 64, "steps": 12, "lr": 3e-4,
         "engine": "hf", "generators": 1, "episodes_in_flight": 512, "max_staleness": 8, "micro_batch_size": 4,
         "sft_steps": 500, "keep_stale_episodes": False, "eval_tasks": 64, "eval_samples": 2, "eval_every": 4,
         "tool_latency_median_s": 3.0, "tool_latency_sigma": 1.0, "tool_latency_max_s": 30.0, **settings}
    return {"setting": "tool_latency", "method": method, "command": f"bench.async_vs_sync {method}", "settings": s,
            "machine": {"when": runs[-1]["when"], "cpu_count": 2}, "task_calls": {"train": {"mean": 4.1, "p90": 9, "max": 16}},
            "start_reward": 0.17, "target": 0.22, "runs": list(runs)}


def test_repeats_show_the_mean_and_the_range_and_the_ratio_uses_the_means(tmp_path: Path) -> None:
    """SAO run twice (busy 0.86 and 0.96, 400 and 440 tokens/s), sync G=8 once (50), G=4 once (20): busy 0.91,
    ratio 420 / 50 = 8.4 against the faster variant (the means, not the first run's 8.0); one run shows its value."""
    sao = method_file("sao", summary(0.86, 400.0, 8.0, 3.0), summary(0.96, 440.0, 9.0, 2.0, seed=1))
    g8, g4 = method_file("grpo_sync_g8", summary(0.06, 50.0, 1.3, 0.8)), method_file("grpo_sync_g4", summary(0.03, 20.0, 1, 1))
    assert cell(sao, "busy_fraction", 2) == "0.91 (0.86-0.96)" and cell(g8, "busy_fraction", 2) == "0.06"
    assert cell(method_file("sao", summary(None, 1, 1, 1)), "busy_fraction", 2) == "-"
    assert ratios([sao, g4, g8]) == pytest.approx({"grpo_sync_g4": 21.0, "grpo_sync_g8": 8.4})
    assert targets(tmp_path) == {"busy": None, "ratio": None}
    for name, f in (("sao", sao), ("grpo_sync_g8", g8), ("grpo_sync_g4", g4)):
        (tmp_path / "tool_latency").mkdir(exist_ok=True)
        (tmp_path / "tool_latency" / f"{name}.json").write_text(json.dumps(f))
    # The throughput target is judged at equal episodes in flight (``equal/``), which these files are not.
    assert targets(tmp_path) == pytest.approx({"busy": 0.91, "ratio": None})
    text = render_setting("tool_latency", tmp_path)
    assert text.index("| sao |") < text.index("| grpo_sync_g4 |") < text.index("| grpo_sync_g8 |")
    assert "**8.40x** against the faster synchronous variant (grpo_sync_g4: 21.00x, grpo_sync_g8: 8.40x)" in text
    assert "Repeated runs (sao: 2;" in text and render(tmp_path) == text


def test_the_capacity_sweep_table_has_one_row_per_point_with_the_runs_range(tmp_path: Path) -> None:
    """Two points: tau 4 / 256 slots run twice (busy 0.80 and 0.86, 150 and 50 stale of 850 and 950 trained) with
    stale episodes kept, and tau 6 / 384 once with 30 cancelled in flight: capacity (tau + 1) x B, busy mean and
    range, stale share per run averaged, cancelled per run; the points sort by tau and slots."""
    def run(busy: float, stale: float, trained: float, rewards: dict, aborted: float = 0.0) -> dict:
        return summary(busy, 400.0, 9.0, 3.0, stale_dropped=stale, heldout_reward=rewards, stale_aborted=aborted,
                       counters={"rollouts_trained": trained, "generator_max_in_flight": 256.0})

    (tmp_path / "tool_latency" / "sweep").mkdir(parents=True)
    (tmp_path / "tool_latency" / "sao.json").write_text(json.dumps(method_file("sao", summary(0.9, 1, 1, 1))))
    for name, f in (("b", method_file("sao", run(0.97, 0, 900, {"12": 0.16}, aborted=30), max_staleness=6,
                                      episodes_in_flight=384)),
                    ("a", method_file("sao", run(0.80, 150, 850, {"12": 0.14}), run(0.86, 50, 950, {}), max_staleness=4,
                                      episodes_in_flight=256, keep_stale_episodes=True))):
        (tmp_path / "tool_latency" / "sweep" / f"{name}.json").write_text(json.dumps(f))
    rows = [line for line in render_setting("tool_latency", tmp_path).splitlines() if line.startswith(("| 4 ", "| 6 "))]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert cells[0][:5] == ["4", "256", "320", "finish (learner drops)", "0.83 (0.80-0.86)"]
    assert cells[0][6:8] == ["0.10", "0"]  # (150 / 1000 + 50 / 1000) / 2 stale share; none cancelled
    assert cells[1][:5] == ["6", "384", "448", "cancelled in flight", "0.97"]
    assert cells[1][6:] == ["0.00", "30"]


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


def test_the_rules_table_shows_each_rules_buckets_and_the_issue_21_ratios(tmp_path: Path) -> None:
    """Token rule: 0-2 calls 10/10 trained, 9+ 4/5 (share 0.8, ratio 0.8); episode rule: 0-2 9/10, 9+ 1/5 plus 3
    cancelled (1/8 = 0.125 -> ratio 0.139). The ratio compares the longest and shortest buckets that have episodes
    (none with only one). Mean calls: token started (10*1 + 5*10) / 15 = 4, trained (10 + 40) / 14
    = 3.57 -> 0.89."""
    def lengths(short: tuple[int, int], long: tuple[int, int], cancelled: int = 0) -> dict[str, float]:
        return length_metrics({
            "length/trained_calls_0-2": short[0], "length/dropped_calls_0-2": short[1] - short[0],
            "length/trained_calls_9+": long[0], "length/dropped_calls_9+": long[1] - long[0],
            "length/trained_calls_sum": short[0] * 1 + long[0] * 10,
            "length/dropped_calls_sum": (short[1] - short[0]) + (long[1] - long[0]) * 10,
            "generator_stale_aborted_calls_9+": cancelled, "generator_stale_aborted_calls_sum": cancelled * 10})

    token, episode = lengths((10, 10), (4, 5)), lengths((9, 10), (1, 5), cancelled=3)
    assert done_when(token)["share_ratio"] == pytest.approx(0.8)
    assert done_when(token)["calls_ratio"] == pytest.approx((50 / 14) / 4)
    assert done_when(episode)["share_ratio"] == pytest.approx((1 / 8) / 0.9)
    run = summary(0.9, 100.0, 2.0, 1.0, heldout_reward={"12": 0.2}, staleness_violations=0)
    f = {**method_file("sao", run), "when": "2026-12-02T05:00:00Z",
         "rules": {"token": [{**run, "lengths": token}], "episode": [{**run, "lengths": episode}]}}
    text = render_rules([f])
    assert "| tool calls 9+ | 4 / 5 (0.80) | 1 / 8 (0.12) |" in text
    assert "| longest / shortest bucket with episodes, trained share (>= 0.8) | 0.80 (9+ / 0-2 calls) | 0.14 (9+ / 0-2 " \
           "calls) |" in text
    short_only = lengths((10, 10), (0, 0))
    assert done_when(short_only)["share_ratio"] is None and done_when(short_only)["buckets"] is None
    assert "| rollouts trained past tau (ledger check) | 0 | 0 |" in text


def test_the_headline_ratio_is_at_equal_episodes_in_flight_beside_the_equal_batch_one(tmp_path: Path) -> None:
    """SAO with 512 slots and batches of 64 (820 tokens/s, steady versions 13-40, trained tasks needing 3.9 calls)
    against synchronous GRPO G = 8 with 64 prompts x 8 = 512 episodes in flight (600 tokens/s): the target's ratio is
    820 / 600; the equal-batch files (GRPO with 64 in flight, 41 tokens/s) give 20x beside it, named as such."""
    (tmp_path / "tool_latency" / "equal").mkdir(parents=True)
    sao = method_file("sao", summary(0.95, 820.0, 12.0, 2.0, steady_from_version=12, steady_window_s=200.0,
                                     trained_calls={"all": 3.5, "steady": 3.9}), steps=40)
    g8 = method_file("grpo_sync_g8", summary(0.5, 600.0, 7.0, 30.0, steady_from_version=1, steady_window_s=300.0,
                                             trained_calls={"all": 4.1, "steady": 4.1}), steps=6, batch_rollouts=512)
    for name, f in (("sao", sao), ("grpo_sync_g8", g8)):
        (tmp_path / "tool_latency" / "equal" / f"{name}.json").write_text(json.dumps(f))
    for name, f in (("sao", method_file("sao", summary(0.9, 820.0, 12.0, 2.0, steady_window_s=60.0))),
                    ("grpo_sync_g8", method_file("grpo_sync_g8", summary(0.06, 41.0, 0.7, 1.0, steady_window_s=600.0)))):
        (tmp_path / "tool_latency" / f"{name}.json").write_text(json.dumps(f))
    assert targets(tmp_path)["ratio"] == pytest.approx(820.0 / 600.0)
    text = render_setting("tool_latency", tmp_path)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| equal ")]
    assert [r[:5] for r in rows] == [
        ["equal episodes in flight", "sao", "512", "64", "13-40"],
        ["equal episodes in flight", "grpo_sync_g8", "512", "512", "2-6"],
        ["equal batch (SAO 8x in flight)", "sao", "512", "64", "2-12"],
        ["equal batch (SAO 8x in flight)", "grpo_sync_g8", "64", "64", "2-12"]]
    assert rows[0][6] == "3.90" and rows[2][6] == "-"
    assert "at **equal episodes in flight**: **1.37x**" in text and "8x the episodes in flight: **20.00x**" in text


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_the_asynchronous_grpo_method_ends_it_with_one_line_after_a_checkpoint(tmp_path: Path) -> None:
    """Issue 36: SIGTERM at version 10 of 12 checkpointed, then ``bench.async_vs_sync`` printed a traceback ending in
    ``LearnerStopped``. Now the learner's one line ends the command (status 143), as ``posttrain`` ends. The method
    shrunk to a 2-step warm start and groups of 2 on instantaneous tools; SIGTERM once the learner has trained."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from bench.common import REPO

    out = tmp_path / "w"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.async_vs_sync", "grpo_async_g8", f"output_dir={out}", "warm_start.steps=2",
         "data.num_train_tasks=16", "data.num_eval_tasks=4", "data.env_args.tool_latency_median_s=0",
         "data.env_args.max_calls=1", "grpo.prompts_per_step=1", "grpo.group_size=2", "grpo.steps=1000",
         "grpo.checkpoint_every=4", "generator.episodes_in_flight=4", "generator.max_new_tokens=8",
         "generator.max_turns=3", "learner.max_iterations_without_progress=1000", "--no-docs",
         "--out", str(tmp_path / "r.json")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")})
    ledger = out / "grpo_async_g8_r0" / "learner_ledger.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not ledger.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ledger.exists(), proc.poll()  # the learner trained a batch: its own SIGTERM handler is in place
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "Traceback" not in stdout + stderr, stderr[-3000:]
    stopped = [line for line in stderr.splitlines() if "stopped" in line]
    assert stopped == [stderr.strip().splitlines()[-1]], stderr[-3000:]
    assert stopped[0].startswith("bench.async_vs_sync: learner stopped at policy version ")
    assert ": SIGTERM received; stopped after a final checkpoint; run the same command again to resume" in stopped[0]
    assert proc.returncode == 143
    assert list((out / "grpo_async_g8_r0" / "checkpoints").glob("iter-*"))
    assert not (tmp_path / "r.json").exists()
