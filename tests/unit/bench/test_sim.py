"""The cluster simulator's logic: engine timing, admission, GRPO waiting and waste, the steady window."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from bench.sim.calibrate import (
    BATCH_COST_TERMS,
    FEEDING_OF,
    batch_cost_features,
    calibrate_engine_speed,
    engine_mode_batches,
    engine_probe_ratio,
    feeding_episodes,
    fit_batch_costs,
    fit_engine_speed,
    measured_config,
    measured_relative_se_over,
    phase_identifies_engine_speed,
    probe_core_seconds,
    run_replay,
    run_twin,
    validate_setting,
)
from bench.sim.model import (
    Cluster,
    ClusterConfig,
    Engine,
    EngineModel,
    EventLoop,
    LearnerModel,
    Request,
    RolloutShape,
    Workload,
    method_kind,
    reward_posteriors,
    simulate,
    simulate_feeding,
    steady_window,
)


def finish_times(model: EngineModel, requests: list[tuple[int, int]], reload_s: float = 0.0) -> list[float]:
    """Submit ``(prompt, new)`` requests at t=0 (after a reload of ``reload_s``); return each one's finish time."""
    loop = EventLoop()
    engine = Engine(loop, model)
    done: list[float] = [0.0] * len(requests)
    engine.reload(reload_s)
    for i, (prompt, new) in enumerate(requests):
        engine.submit(Request(prompt, new, lambda i=i: done.__setitem__(i, loop.now)))
    loop.run(lambda: False, 10_000)
    return done


def one_turn(tokens: int, reward: float = 1.0, prompt: int = 1) -> RolloutShape:
    return RolloutShape(prompt_tokens=prompt, action_tokens=(tokens,), observation_tokens=(0,), reward=reward)


def test_a_static_batch_pays_sampling_only_for_the_tokens_its_rows_sample() -> None:
    """Rows of 10 and 2 tokens: 10 steps of 0.1 s for both, and 12 sampled tokens at 0.05 s: 1.6 s (rows x steps
    would be 20 tokens, 2.0 s)."""
    model = EngineModel(max_batch=8, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0, sample_s_per_token=0.05)
    assert finish_times(model, [(1, 10), (1, 2)]) == pytest.approx([1.6, 1.6])


def test_static_batch_runs_until_its_longest_request_and_pays_prefill_on_the_padded_width() -> None:
    """Rows 2, width 100, 10 steps: 0.001*2*100 + 10*(0.1 + 0.01*2) = 0.2 + 1.2 = 1.4 s for both requests."""
    model = EngineModel(batching="static", max_batch=8, step_s=0.1, step_s_per_row=0.01, prefill_s_per_token=0.001)
    assert finish_times(model, [(100, 10), (50, 2)]) == pytest.approx([1.4, 1.4])


def test_static_engine_queues_requests_beyond_max_batch_for_the_next_batch() -> None:
    """max_batch 1: 5 steps of 0.2 s each, one after the other -> 1.0 s and 2.0 s."""
    model = EngineModel(batching="static", max_batch=1, step_s=0.2, step_s_per_row=0.0, prefill_s_per_token=0.0)
    assert finish_times(model, [(1, 5), (1, 5)]) == pytest.approx([1.0, 2.0])


def test_continuous_engine_releases_short_requests_early_and_speeds_up_the_rest() -> None:
    """Steps 0.12 s at 2 rows, 0.11 s at 1: the 2-token request ends at 0.24 s; the other needs 8 more -> 1.12 s."""
    model = EngineModel(batching="continuous", max_batch=8, step_s=0.1, step_s_per_row=0.01, prefill_s_per_token=0.0)
    assert finish_times(model, [(1, 10), (1, 2)]) == pytest.approx([1.12, 0.24])


def test_continuous_engine_pauses_for_a_reload_and_for_prefill() -> None:
    """0.5 s reload + 0.1 s prefill (100 tokens x 1 ms) + 10 steps x 0.1 s = 1.6 s."""
    model = EngineModel(batching="continuous", max_batch=8, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.001)
    assert finish_times(model, [(100, 10)], reload_s=0.5) == pytest.approx([1.6])


def test_synchronous_grpo_alternates_generation_and_training() -> None:
    """B 4 (G 2), one 10-token turn each, static batch of 4: 10 * (0.1 + 0.01*4) = 1.4 s generating, then
    1.0 s training + 0.5 s publishing: updates at 2.9, 5.8, 8.7 s; busy 3 * 1.4 / 8.7 = 0.483; after the
    first update 8 rollouts in 5.8 s. Every reward is 1, so every group is uniform and trains no token."""
    work = Workload(((one_turn(10, 1.0), one_turn(10, 1.0)),))
    cfg = ClusterConfig(method="grpo_sync", batch_rollouts=4, group_size=2, steps=3, publish_s=0.5,
                        engine=EngineModel(max_batch=4, step_s=0.1, step_s_per_row=0.01, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=1.0, s_per_token=0.0))
    result = simulate(cfg, work)
    assert result.wall_s == pytest.approx(8.7)
    assert result.busy_fraction == pytest.approx(4.2 / 8.7)
    assert result.rollouts_per_s == pytest.approx(8 / 5.8)
    assert result.trained_action_tokens_per_s == 0.0  # every group has rewards 1, 1: uniform, no gradient


def test_sao_trains_every_token_of_the_same_workload() -> None:
    """SAO counts all 4 x 10 action tokens of each batch; with a 0-second learner it is generation-bound."""
    work = Workload(((one_turn(10, 1.0),),))
    cfg = ClusterConfig(method="sao", batch_rollouts=4, episodes_in_flight=4, steps=5,
                        engine=EngineModel(max_batch=4, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=0.0, s_per_token=0.0))
    result = simulate(cfg, work)
    assert result.trained_action_tokens_per_s == pytest.approx(40 / 1.0)  # one 1.0 s batch of 4 per update
    assert result.busy_fraction == pytest.approx(1.0)


def test_admission_bounds_started_rollouts_and_idles_generators_behind_a_slow_learner() -> None:
    """tau 0, B 2: at most (v + 1) * 2 rollouts started; a 10 s learner leaves the 1 s generator mostly idle."""
    work = Workload(((one_turn(10),),))
    cfg = ClusterConfig(method="sao", batch_rollouts=2, episodes_in_flight=8, max_staleness=0, steps=4,
                        engine=EngineModel(max_batch=8, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=10.0, s_per_token=0.0))
    result = simulate(cfg, work)
    assert result.busy_fraction < 0.2
    assert result.stale_dropped == 0
    assert result.learner_busy_fraction > 0.9


def test_a_warmup_longer_than_the_staleness_window_gives_its_slots_back() -> None:
    """tau 0, B 2, 3 critic-only iterations: 6 rollouts consumed at version 0 against a capacity of 2. Refunded
    (as the SAO learner does), all 4 versions are made; without the refund admission would stop at version 0."""
    work = Workload(((one_turn(10),),))
    cfg = ClusterConfig(method="sao", batch_rollouts=2, episodes_in_flight=8, max_staleness=0, steps=4,
                        engine=EngineModel(max_batch=8, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=1.0, s_per_token=0.0, warmup_iterations=3))
    result = simulate(cfg, work)
    assert result.updates == 4 and result.stale_dropped == 0


def test_long_tail_makes_synchronous_grpo_slower_than_sao_when_the_learner_is_cheap() -> None:
    """Tasks of 1 turn and of 12 turns: sync GRPO waits for the 12-turn group every step, SAO does not."""
    short, long = one_turn(5), RolloutShape(1, (5,) * 12, (3,) * 12, 1.0)
    work = Workload(((short, RolloutShape(1, (5,), (0,), 0.0)), (long, RolloutShape(1, (5,) * 12, (3,) * 12, 0.0))))
    engine = EngineModel(batching="continuous", max_batch=16, step_s=0.01, step_s_per_row=0.0, prefill_s_per_token=0.0)
    learner = LearnerModel(step_s_fixed=0.05, s_per_token=0.0)
    sao = simulate(ClusterConfig(method="sao", batch_rollouts=8, episodes_in_flight=16, steps=10, engine=engine,
                                 learner=learner), work)
    grpo = simulate(ClusterConfig(method="grpo_sync", batch_rollouts=8, group_size=2, steps=10, engine=engine,
                                  learner=learner), work)
    assert sao.rollouts_per_s > 1.5 * grpo.rollouts_per_s
    assert sao.busy_fraction > grpo.busy_fraction


def test_cancelling_stale_units_in_flight_frees_their_slots() -> None:
    """tau 1, B 2, 8 slots: half the tasks are 1 turn, half 4 turns with 5 s tool calls. A 4-turn episode outlives
    two versions, so with ``abort_stale=False`` it runs on and the learner drops it; with the default it is
    cancelled at the version that makes it stale (``stale_aborted``), fewer finish stale, and its slot and ticket
    go to new episodes: more rollouts per second."""
    long = RolloutShape(1, (5,) * 4, (3, 3, 3, 0), 1.0, tool_waits_s=(5.0, 5.0, 5.0))
    work = Workload(((one_turn(5),), (long,)))
    cfg = ClusterConfig(method="sao", batch_rollouts=2, episodes_in_flight=8, max_staleness=1, steps=12,
                        engine=EngineModel(max_batch=8, step_s=0.01, step_s_per_row=0.0, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=0.1, s_per_token=0.0))
    kept = simulate(replace(cfg, abort_stale=False), work)
    cancelled = simulate(cfg, work)
    assert kept.stale_aborted == 0 and kept.stale_dropped > 0
    assert cancelled.stale_aborted > 0 and cancelled.stale_dropped < kept.stale_dropped
    assert cancelled.rollouts_per_s > kept.rollouts_per_s


def test_a_request_cancelled_while_queued_is_skipped_by_a_static_engine() -> None:
    """Two requests queued at once, one cancelled: the batch runs the live one alone and only it completes."""
    loop = EventLoop()
    engine = Engine(loop, EngineModel(max_batch=4, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0))
    done: list[str] = []
    engine.submit(Request(1, 10, lambda: done.append("live")))
    engine.submit(Request(1, 10, lambda: done.append("cancelled"), live=lambda: False))
    loop.run(lambda: False, 100)
    assert done == ["live"]


def test_an_asynchronous_run_that_reports_its_engine_seconds_is_simulated_at_that_speed() -> None:
    """SAO with 2 s tool calls between 3 turns and 16 slots: a run whose generator spent twice the simulated engine
    seconds per rollout (``generator_busy_s`` / ``generator_rollouts`` in its counters) is simulated with an engine
    that matches it within 5%, although a slower engine also batches more rows per step."""
    shape = RolloutShape(8, (20, 20, 20), (4, 4, 0), 1.0, tool_waits_s=(2.0, 2.0))
    work = Workload(((shape,),))
    base = ClusterConfig(method="sao", batch_rollouts=4, episodes_in_flight=16, max_staleness=2, steps=8,
                         engine=EngineModel(max_batch=16, step_s=0.01, step_s_per_row=0.002, prefill_s_per_token=1e-4),
                         learner=LearnerModel(step_s_fixed=0.2, s_per_token=0.0))
    alone = simulate(base, work).generating_s_per_rollout
    target = 2.0 * alone
    cfg, source = calibrate_engine_speed(base, {"counters": {"generator_busy_s": 100.0 * target,
                                                             "generator_rollouts": 100.0}}, work, repeats=1)
    assert source == "generator_busy_s" and cfg.engine_scale_idle > 1.0
    assert simulate(cfg, work).generating_s_per_rollout == pytest.approx(target, rel=0.05)
    unchanged, source = calibrate_engine_speed(base, {"counters": {}}, work, repeats=1)
    assert unchanged == base and source == "load average"


def test_steady_window_leaves_out_the_first_update() -> None:
    """Updates (t, rollouts, tokens) at 2, 5, 8 s: window 6 s, rollouts 4 + 4, tokens 30 + 50."""
    assert steady_window([(2.0, 4.0, 10.0), (5.0, 4.0, 30.0), (8.0, 4.0, 50.0)]) == (6.0, 80.0, 8.0)
    assert steady_window([(2.0, 4.0, 10.0)]) == (0.0, 0.0, 0.0)


def test_workload_from_trace_scales_lengths_and_rejects_empty_input() -> None:
    """Scale 2: prompt 10 -> 20, turns (3, 4) -> (6, 8), observations (5, 0) -> (10, 0)."""
    trace = [{"rollouts": [{"prompt_tokens": 10, "action_tokens": [3, 4], "observation_tokens": [5, 0], "reward": 1.0}]}]
    shape = Workload.from_trace(trace, token_scale=2.0).tasks[0][0]
    assert (shape.prompt_tokens, shape.action_tokens, shape.observation_tokens) == (20, (6, 8), (10, 0))
    assert shape.total_tokens == 44
    with pytest.raises(ValueError, match="trace"):
        Workload.from_trace([])
    with pytest.raises(ValueError, match="action_tokens"):
        Workload.from_trace([{"rollouts": [{"prompt_tokens": 1, "action_tokens": [], "observation_tokens": [], "reward": 0}]}])


def test_cluster_config_rejects_a_batch_that_is_not_whole_groups() -> None:
    with pytest.raises(ValueError, match="group_size"):
        ClusterConfig(method="grpo_sync", batch_rollouts=10, group_size=4)
    with pytest.raises(ValueError, match="sao"):
        ClusterConfig(method="sao", group_size=2, batch_rollouts=4)


COSTS = {"step_s": 0.01, "step_s_per_row": 0.001, "prefill_s_per_token": 1e-5}
"""Engine costs at a whole core's speed (what ``fit_batch_costs`` returns)."""


def inputs_on(cores: int = 2) -> dict:
    """A setting's simulator inputs: publish and reload seconds, no engine_modes probe."""
    return {"machine": {"cpu_count": cores, "when": "2026-12-01T10:00:00Z"}, "weight_sync": {"publish_s": 0.1, "reload_s": 0.05},
            "engine_modes": {}, "settings": {"episodes_in_flight": 32}}


def result_of(method: str, *runs: dict, **settings: object) -> dict:
    """A results file of ``method`` on 2 cores with ``runs``."""
    return {"method": method, "machine": {"cpu_count": 2},
            "settings": {"generators": 1, "episodes_in_flight": 32, "batch_rollouts": 32, "max_staleness": 2,
                         "critic_warmup": 1, "seed": 0, "keep_stale_episodes": False, "tool_latency_median_s": 0.0,
                         "tool_latency_sigma": 1.0, "tool_latency_max_s": 30.0, **settings}, "runs": list(runs)}


def run_at(loads: list[float], step_s: float = 3.0, **extra: object) -> dict:
    """One measured run: 12 versions, mean learner step ``step_s``, 1-minute load at its start and end."""
    return {"policy_versions": 12, "learner_step_s_mean": step_s, "load_avg_start_end": loads, **extra}


def test_measured_config_builds_the_twin_of_each_measured_method() -> None:
    """2 cores, costs at a whole core. SAO ran at load 3.5 with 2 busy threads of ours (generator 1, learner 1;
    background 1.5): generator share 2/(1.5 + 1) = 0.8 with the learner idle, 2/(1.5 + 2) = 4/7 with it busy ->
    engine times x1.25 and x1.75. Sync GRPO at load 3 (background 2, its generator's 1 thread): share 2/3 -> x1.5
    in both states (it never trains while generating)."""
    inputs = inputs_on()
    sao = measured_config(inputs, result_of("sao"), run_at([3.5, 3.5]), COSTS)
    assert (sao.method, sao.group_size, sao.learner.warmup_iterations, sao.learner.step_s_fixed) == ("sao", 1, 1, 3.0)
    assert (sao.engine_scale_idle, sao.engine_scale_learner_busy) == pytest.approx((1.25, 1.75))
    assert (sao.publish_s, sao.reload_s, sao.engine.step_s) == (0.1, 0.05, 0.01)
    g4 = measured_config(inputs, result_of("grpo_sync_g4"), run_at([3.0, 3.0], 1.0), COSTS)
    assert (g4.method, g4.group_size, g4.generators, g4.learner.warmup_iterations) == ("grpo_sync", 4, 1, 0)
    assert (g4.engine_scale_idle, g4.engine_scale_learner_busy) == pytest.approx((1.5, 1.5))
    assert measured_config(inputs, result_of("grpo_async_g8"), run_at([1.0, 1.0]), COSTS).method == "grpo_async"


def probe(seconds: float, background_cores: float = 0.0) -> dict:
    """One ``engine_probe`` measurement."""
    return {"seconds": seconds, "background_cores": background_cores}


def test_a_probe_is_scaled_to_a_whole_core_by_what_ran_beside_it() -> None:
    """2 cores: beside 2 busy cores of other work the probe had 2/3 of a core, so 1.5 s is 1.0 s on its own core;
    beside 0.5 cores it had a whole one. The mean over the probes is taken; no probe gives None."""
    assert probe_core_seconds([probe(1.5, 2.0)], cores=2) == pytest.approx(1.0)
    assert probe_core_seconds([probe(1.2, 0.5), probe(1.0, 2.0)], cores=2) == pytest.approx((1.2 + 2 / 3) / 2)
    assert probe_core_seconds([], cores=2) is None
    assert probe_core_seconds(None, cores=2) is None


def test_a_run_in_a_slower_hour_is_simulated_with_a_slower_engine() -> None:
    """engine_modes probed 1.0 and 1.2 s (mean 1.1); SAO's first run probed 1.32 s twice -> its engine runs x1.2
    slower than in engine_modes; a run without a probe keeps the engine_modes speed."""
    first, again = run_at([3.0, 3.0], engine_probe=[probe(1.32), probe(1.32)]), run_at([3.0, 3.0])
    measured, result = inputs_on(), result_of("sao", first, again)
    measured["engine_modes"] = {"engine_probe": [probe(1.0), probe(1.2)]}
    assert engine_probe_ratio(measured, first) == pytest.approx(1.2)
    assert engine_probe_ratio(measured, again) is None
    work = Workload(((one_turn(10),),))
    probed, speed_from = run_twin(measured, result, first, COSTS, 0.5, work, repeats=1)
    unprobed, unprobed_from = run_twin(measured, result, again, COSTS, 0.5, work, repeats=1)
    plain = measured_config(measured, result, again, COSTS)
    assert probed.engine_scale_idle == pytest.approx(0.5 * 1.2 * plain.engine_scale_idle)
    assert probed.engine_scale_learner_busy == pytest.approx(0.5 * 1.2 * plain.engine_scale_learner_busy)
    assert unprobed.engine_scale_idle == pytest.approx(0.5 * plain.engine_scale_idle)
    assert (speed_from, unprobed_from) == ("engine_modes x engine probe x load average", "engine_modes x load average")
    del measured["engine_modes"]["engine_probe"]
    assert engine_probe_ratio(measured, first) is None


def test_a_repeated_run_is_simulated_with_its_own_learner_time_and_load() -> None:
    """SAO's first run: learner 3.0 s at load 3.5 (engine x1.25 / x1.75, as above); its repeat: learner 2.0 s at
    load 3 (background 1: share 2/2 = 1 idle, 2/3 with the learner busy -> x1 / x1.5)."""
    result = result_of("sao", run_at([3.5, 3.5]), run_at([3.0, 3.0], 2.0))
    first = measured_config(inputs_on(), result, result["runs"][0], COSTS)
    again = measured_config(inputs_on(), result, result["runs"][1], COSTS)
    assert (first.learner.step_s_fixed, again.learner.step_s_fixed) == (3.0, 2.0)
    assert (again.engine_scale_idle, again.engine_scale_learner_busy) == pytest.approx((1.0, 1.5))


def test_measured_se_over_runs_uses_their_spread_from_three_runs() -> None:
    """Three runs 0.8 / 0.9 / 1.0: stdev 0.1 / sqrt(3) / mean 0.9. One or two runs: the first run's per-update
    spread (tokens per update 90 / 110 / 90 / 110 after the first: SE 5.77 / 100) over sqrt(runs)."""
    three = [{"busy_fraction": x} for x in (0.8, 0.9, 1.0)]
    assert measured_relative_se_over(three, "busy_fraction") == pytest.approx(0.1 / 3 ** 0.5 / 0.9)
    one = {"trained_action_tokens_per_s": 100.0, "trained_action_tokens_per_update": [0, 90, 110, 90, 110]}
    se_one = measured_relative_se_over([one], "trained_action_tokens_per_s")
    assert se_one == pytest.approx((20 / 3 ** 0.5) / 2 / 100)
    assert measured_relative_se_over([one, dict(one)], "trained_action_tokens_per_s") == pytest.approx(se_one / 2 ** 0.5)
    assert measured_relative_se_over([{"busy_fraction": 0.9}], "busy_fraction") is None


def test_engine_times_follow_the_learner_state_scale() -> None:
    """Learner busy for the whole generation (10 s step): engine times x3 -> a 1.0 s batch takes 3.0 s."""
    work = Workload(((one_turn(10),),))
    base = ClusterConfig(method="sao", batch_rollouts=2, episodes_in_flight=2, steps=2, max_staleness=0,
                         engine=EngineModel(max_batch=2, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0),
                         learner=LearnerModel(step_s_fixed=0.0, s_per_token=0.0))
    assert simulate(base, work).wall_s == pytest.approx(2.0)
    assert simulate(replace(base, engine_scale_idle=3.0), work).wall_s == pytest.approx(6.0)


def test_tool_latency_is_paid_between_turns_not_after_the_last() -> None:
    """One episode of 3 turns of 10 tokens (1.0 s each) with a fixed 2 s tool call after turns 1 and 2
    (sigma 0): 3 + 2 * 2 = 7 s until the first update, then the next episode, 7 s later."""
    work = Workload(((RolloutShape(1, (10, 10, 10), (0, 0, 0), 1.0),),))
    cfg = ClusterConfig(method="sao", batch_rollouts=1, episodes_in_flight=1, steps=2, max_staleness=0,
                        engine=EngineModel(max_batch=1, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=0.0, s_per_token=0.0),
                        tool_latency_median_s=2.0, tool_latency_sigma=0.0)
    result = simulate(cfg, work)
    assert result.wall_s == pytest.approx(14.0)
    assert result.busy_fraction == pytest.approx(6.0 / 14.0)


def test_reward_posteriors_shrink_each_task_towards_the_pooled_rate() -> None:
    """Tasks with 0/4, 4/4, 2/4, 2/4 successes: m = 0.5, var(k/n) = 0.125, var_p = (0.125 - 0.0625) / 0.75
    = 0.0833, kappa = 0.25 / 0.0833 - 1 = 2: task 0 gets Beta(0 + 1, 4 + 1), task 1 Beta(5, 1)."""
    def task(k: int) -> tuple[RolloutShape, ...]:
        return tuple(one_turn(5, 1.0 if i < k else 0.0) for i in range(4))

    beta = Workload.from_trace([{"rollouts": [{"prompt_tokens": 1, "action_tokens": [5], "observation_tokens": [0],
                                               "reward": s.reward} for s in task(k)]} for k in (0, 4, 2, 2)]).reward_beta
    assert beta[0] == pytest.approx((1.0, 5.0)) and beta[1] == pytest.approx((5.0, 1.0))
    assert reward_posteriors([(one_turn(5, 0.5),), (one_turn(5, 1.0),)]) == ()  # non-binary rewards: none


def test_engine_alone_rate_is_inversely_proportional_to_the_speed_factor() -> None:
    """Lockstep feeding of 2 one-turn 10-token episodes, 0.1 s steps: 1 s per wave -> 2 rollouts/s; x2 slower -> 1."""
    model = EngineModel(max_batch=2, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0)
    assert simulate_feeding(model, 1.0, [one_turn(10)], "lockstep", 2, 10.0) == pytest.approx(2.0, rel=0.11)
    assert simulate_feeding(model, 2.0, [one_turn(10)], "lockstep", 2, 10.0) == pytest.approx(1.0, rel=0.11)


def test_a_learner_slows_the_engine_only_when_it_leaves_the_generator_less_than_a_core() -> None:
    """2 cores, calibrated at load 1 (share 1). SAO at load 1.5 (1 -> 2): our 2 busy threads (engine, learner)
    fit the 2 cores, x1 in both states. At load 2.5 (2 -> 3) 0.5 of it is other work: the engine alone gets
    min(1, 2 / 1.5) = 1 (x1); beside the training learner, 2 / 2.5 = 0.8 (x1.25)."""
    idle = measured_config(inputs_on(), result_of("sao"), run_at([1.0, 2.0]), COSTS)
    assert (idle.engine_scale_idle, idle.engine_scale_learner_busy) == pytest.approx((1.0, 1.0))
    shared = measured_config(inputs_on(), result_of("sao"), run_at([2.0, 3.0]), COSTS)
    assert (shared.engine_scale_idle, shared.engine_scale_learner_busy) == pytest.approx((1.0, 1.25))


def test_continuous_feeding_counts_the_episodes_that_drain_after_the_window() -> None:
    """1 slot, 1 s episodes, a 2.5 s window: episodes start at 0, 1 and 2 s; the last ends at 3 s -> 3 / 3 = 1.0
    rollouts/s (stopping the clock at 2.5 s gave 2 / 2.5 = 0.8)."""
    model = EngineModel(max_batch=1, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0)
    assert simulate_feeding(model, 1.0, [one_turn(10)], "continuous", 1, 2.5) == pytest.approx(1.0)


def test_batch_costs_fitted_on_timed_batches_recover_the_costs_that_produced_them() -> None:
    """Batches timed with known costs (the squared-context and sampled-token terms too) over rows 1-128, widths
    60-700, and rows that stop sampling after all, half or a quarter of the batch's steps."""
    truth = {"prefill_s_per_token": 2e-5, "step_s": 1.5e-3, "step_s_per_row": 2e-5, "step_s_per_row_token": 1.2e-7,
             "step_s_per_kv_sq": 2e-11, "sample_s_per_token": 6e-5}
    batches = []
    for rows in (1, 4, 16, 64, 128):
        for width in (60, 200, 450, 700):
            for steps in (4, 15, 20):
                for live in (1.0, 0.5, 0.25):
                    sampled = max(1, round(rows * steps * live))
                    features = batch_cost_features(rows, width, steps, sampled)
                    seconds = sum(truth[k] * f for k, f in zip(BATCH_COST_TERMS, features, strict=True))
                    batches.append([rows, width, rows * width, steps, seconds, sampled])
    fitted = fit_batch_costs(batches)
    assert fitted == pytest.approx(truth, rel=1e-6)
    model = EngineModel(**fitted)
    timed, sampled = next(b[4:] for b in batches if b[:2] == [64, 700] and b[3] == 15)
    predicted = 15 * model.step_time(64, 707) + fitted["prefill_s_per_token"] * 64 * 700 + 6e-5 * sampled
    assert predicted == pytest.approx(timed)
    with pytest.raises(ValueError, match="need at least 6"):
        fit_batch_costs(batches[:5])
    with pytest.raises(ValueError, match="positive seconds"):
        fit_batch_costs([*batches[:6], [1, 60, 60, 4, 0.0, 4]])


def test_batches_without_a_sampled_token_count_fit_no_sampling_cost() -> None:
    """Five-field batches (recorded before the count): sampling is folded into the per-row step cost, so the
    sampled-token coefficient stays 0 (the simulator would otherwise charge it on fewer tokens than it was fitted
    on); one such batch among counted ones turns the term off for all."""
    batches = [[r, w, r * w, s, 1e-3 * s + 1e-4 * s * r + 2e-5 * r * w] for r in (1, 8, 32) for w in (50, 300)
               for s in (5, 20)]
    fitted = fit_batch_costs(batches)
    assert fitted["sample_s_per_token"] == 0.0
    assert fitted["step_s_per_row"] == pytest.approx(1e-4, rel=1e-6)
    counted = [[*b, b[0] * b[3] // 2] for b in batches]
    assert fit_batch_costs([*counted[1:], batches[0]])["sample_s_per_token"] == 0.0


def test_recorded_batches_are_scaled_to_a_whole_core_and_every_setting_is_pooled() -> None:
    """Setting A timed at load 1 (share 1), setting B at load 3 (our 1 thread + 2 others: share 2/3, so its
    0.3 s batch is 0.2 s of a whole core). Fitted on both settings' batches, the costs are those of a whole core."""
    def setting(load: float, seconds: float) -> dict:
        batches = [[r, w, r * w, 10, seconds * (0.1 + 0.01 * r) / 0.11] for r in (1, 2, 4, 8) for w in (10, 20)]
        return {"machine": {"cpu_count": 2}, "engine_modes": {"load_avg_start": load, "load_avg_end": load,
                                                               "lockstep": {"batches": batches}}}
    a, b = setting(1.0, 0.2), setting(3.0, 0.3)
    assert engine_mode_batches(b)[0][4] == pytest.approx(0.2)
    costs = fit_batch_costs(engine_mode_batches(a) + engine_mode_batches(b))
    assert costs["step_s"] == pytest.approx(0.2 * 0.1 / 0.11 / 10, rel=1e-6)


def test_group_members_are_distinct_traced_rollouts_when_the_task_has_enough() -> None:
    """A task traced 4 times (1-4 action tokens): a group of 4 is the 4 traced rollouts, each once (a subset of
    i.i.d. samples is i.i.d.; drawing with replacement repeats shapes, which then finish in lockstep). A group
    of 8 must repeat some."""
    work = Workload((tuple(one_turn(n) for n in (1, 2, 3, 4)),))
    for g, distinct in ((4, {1, 2, 3, 4}), (8, None)):
        cluster = Cluster(ClusterConfig(method="grpo_sync", batch_rollouts=g, group_size=g,
                                        engine=EngineModel(max_batch=8)), work)
        got: list[list[int]] = []
        for _ in range(5):
            cluster._group(0, lambda shapes, _v, got=got: got.append(sorted(s.action_tokens[0] for s in shapes)))
        cluster.loop.run(lambda: False, 10_000)
        assert len(got) == 5 and all(len(x) == g for x in got)
        if distinct is not None:
            assert all(set(x) == distinct for x in got)


def test_generation_phase_made_of_tool_waits_does_not_identify_the_engine_speed() -> None:
    """Phases 24, 48, 72 s: stdev 24, standard error 24 / sqrt(3) = 13.9 s; an engine share of 50 - 49 = 1 s is
    below 2 x 13.9, so no fit. Phases 1.0, 1.2, 1.4 s (SE 0.2 / sqrt(3) = 0.115) with a 1.2 s share (no tool
    wait): fit."""
    assert not phase_identifies_engine_speed([24.0, 48.0, 72.0], engine_free_s=49.0, at_current_s=50.0)
    assert phase_identifies_engine_speed([1.0, 1.2, 1.4], engine_free_s=0.0, at_current_s=1.2)


def test_sync_engine_speed_is_fitted_on_engine_bound_phases_and_kept_when_tool_waits_dominate() -> None:
    """B 4 (G 2), one 10-token turn per episode, static batch of 4: phase 10 * (0.1 + 0.01 * 4) = 1.4 s at x1.
    Measured 2.8 s each step (no spread): the fitted factor is 2.8 / 1.4 = 2 (bisection in log space).
    With two turns and a 5 s tool call between them (sigma 0) the phase is 5 s + 2 x 1.4 s = 7.8 s; measured
    phases 10, 30, 50 s (SE 11.5 s) say nothing about a 2.8 s engine share: the speed stays at x1."""
    cfg = ClusterConfig(method="grpo_sync", batch_rollouts=4, group_size=2, steps=3,
                        engine=EngineModel(max_batch=4, step_s=0.1, step_s_per_row=0.01, prefill_s_per_token=0.0),
                        learner=LearnerModel(step_s_fixed=1.0, s_per_token=0.0))
    fitted, source = calibrate_engine_speed(cfg, {"generator_batch_s": [2.8, 2.8, 2.8]},
                                            Workload(((one_turn(10, 1.0), one_turn(10, 0.0)),)), repeats=1)
    assert source == "generator_batch_s"
    assert fitted.engine_scale_idle == pytest.approx(2.0, rel=1e-3)
    two_turns = RolloutShape(1, (10, 10), (0, 0), 1.0)
    slow_tools = replace(cfg, tool_latency_median_s=5.0, tool_latency_sigma=0.0)
    kept, source = calibrate_engine_speed(slow_tools, {"generator_batch_s": [10.0, 30.0, 50.0]},
                                          Workload(((two_turns, two_turns),)), repeats=1)
    assert source == "load average (generator_batch_s is tool waits)"
    assert kept == slow_tools


def test_every_task_instance_draws_its_own_tool_latencies() -> None:
    """One trace task, two turns of 10 tokens, steps of 0.1 s at any batch size (1.0 s per turn batch), tool
    latency median 1 s, sigma 1. SAO, two episodes started together: their first turns share a batch, then
    each waits its own draw (two task instances), so the second turns run alone: 3 batches, 3.0 s for 2
    rollouts = 1.5 s each (tau 0: no third episode starts). A GRPO group of 2 is one task instance: both wait
    alike, 2 batches, 1.0 s each."""
    shape = RolloutShape(1, (10, 10), (0, 0), 1.0)
    work = Workload(((shape,),))
    engine = EngineModel(max_batch=2, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0)
    common = dict(batch_rollouts=2, episodes_in_flight=2, steps=1, max_staleness=0, engine=engine,
                  tool_latency_median_s=1.0, tool_latency_sigma=1.0,
                  learner=LearnerModel(step_s_fixed=0.0, s_per_token=0.0))
    sao = simulate(ClusterConfig(method="sao", **common), work)
    grpo = simulate(ClusterConfig(method="grpo_sync", group_size=2, **common), work)
    assert sao.generating_s_per_rollout == pytest.approx(1.5)
    assert grpo.generating_s_per_rollout == pytest.approx(1.0)


def test_a_group_feed_starts_the_next_group_when_its_longest_member_ends() -> None:
    """One task, members of 10 and 2 tokens, G = 2, one group slot, 0.1 s steps: each group is one 2-row batch of
    10 steps (1.0 s), started at 0, 1 and 2 s inside a 2.5 s window -> 6 rollouts by 3.0 s = 2.0/s. Fed
    continuously, the 2-token member's slot would not wait for the 10-token one."""
    model = EngineModel(max_batch=2, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0)
    episodes = [one_turn(10), one_turn(2)]
    assert simulate_feeding(model, 1.0, episodes, "groups", 2, 2.5, group_size=2) == pytest.approx(2.0)


def test_a_feeding_replays_the_recorded_episodes_in_order_and_from_the_start_again() -> None:
    """One continuous slot in a 1.0 s window cycles the one recorded 2-token episode (0.2 s at 0.1 s a step): 5 by
    1.0 s (a 10-token one: 1 by 1.0 s). Groups of 2 replay consecutive pairs: (10, 2) takes 1.0 s, (2, 2) 0.2 s; in
    a 1.1 s window 4 rollouts by 1.2 s."""
    model = EngineModel(max_batch=2, step_s=0.1, step_s_per_row=0.0, prefill_s_per_token=0.0)
    assert simulate_feeding(model, 1.0, [one_turn(10)], "continuous", 1, 1.0) == pytest.approx(1.0)
    assert simulate_feeding(model, 1.0, [one_turn(2)], "continuous", 1, 1.0) == pytest.approx(5.0)
    pairs = [one_turn(10), one_turn(2), one_turn(2), one_turn(2)]
    assert simulate_feeding(model, 1.0, pairs, "groups", 2, 1.1, group_size=2) == pytest.approx(4 / 1.2)


def test_recorded_feeding_episodes_are_read_and_malformed_ones_name_the_entry() -> None:
    """``[prompt, actions, observations]`` per episode becomes a RolloutShape; a feeding without them, or an episode
    whose observation counts do not match its turns, is a ValueError naming the mode (and the index)."""
    em = {"groups": {"episodes": [[78, [15, 4], [23, 0]]]}, "lockstep": {"rollouts_per_s": 1.0}}
    assert feeding_episodes(em, "groups") == [RolloutShape(78, (15, 4), (23, 0), 0.0)]
    with pytest.raises(ValueError, match=r"engine_modes.lockstep.episodes: none recorded"):
        feeding_episodes(em, "lockstep")
    em["continuous"] = {"episodes": [[78, [15, 4], [23, 0]], [78, [15, 4], [23]]]}
    with pytest.raises(ValueError, match=r"engine_modes.continuous.episodes\[1\]"):
        feeding_episodes(em, "continuous")


def test_each_method_runs_at_the_speed_of_the_feeding_its_generator_produces() -> None:
    """Lockstep measured 1.5x slower than the engine model at factor 1, groups 3x slower: the fitted factors are
    about 1.5 and 3 (the feeding window makes the rate not exactly inverse), and synchronous GRPO, SAO and
    asynchronous GRPO read lockstep, continuous and groups."""
    episodes = [one_turn(10), one_turn(6)]
    inputs = {**inputs_on(), "settings": {"episodes_in_flight": 32},
              "engine_modes": {"feed_s": 5.0, "group_size": 2, "load_avg_start": 1.0, "load_avg_end": 1.0}}
    costs = {"step_s": 0.01, "step_s_per_row": 0.001, "prefill_s_per_token": 1e-5}
    engine = EngineModel(max_batch=32, **costs)
    recorded = [[s.prompt_tokens, list(s.action_tokens), list(s.observation_tokens)] for s in episodes]
    for mode, slower in (("lockstep", 1.5), ("groups", 3.0)):
        rate = simulate_feeding(engine, 1.0, episodes, mode, 32, 5.0, group_size=2)
        inputs["engine_modes"][mode] = {"rollouts_per_s": rate / slower, "episodes": recorded}
    assert fit_engine_speed(inputs, costs, ("lockstep",)) == pytest.approx(1.5, rel=0.1)
    assert fit_engine_speed(inputs, costs, ("groups",)) == pytest.approx(3.0, rel=0.1)
    kinds = {m: FEEDING_OF[method_kind(m)] for m in ("grpo_sync_g4", "sao", "grpo_async_g8")}
    assert kinds == {"grpo_sync_g4": "lockstep", "sao": "continuous", "grpo_async_g8": "groups"}


def test_missing_inputs_or_a_malformed_file_is_one_line_and_exit_2(tmp_path, capsys) -> None:  # noqa: ANN001
    """No simulator inputs under ``--results-dir``, or an inputs file that is not JSON: exit 2 and one line naming
    what to run or the file, no traceback, nothing written."""
    from bench.sim.project import main

    out = tmp_path / "simulate.json"
    assert main(["--results-dir", str(tmp_path), "--out", str(out), "--no-docs"]) == 2
    assert "run .venv/bin/python -m bench.sim.collect" in capsys.readouterr().err
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "tool_latency.json").write_text("{not json")
    assert main(["--results-dir", str(tmp_path), "--out", str(out), "--no-docs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tool_latency.json" in err[0] and not out.exists()


def test_a_malformed_recorded_episode_is_one_line_naming_setting_and_entry_and_exit_2(tmp_path, capsys) -> None:  # noqa: ANN001
    """Inputs whose engine_modes episode has two fields, or more observations than turns: exit 2, one line with the
    setting and the entry, and nothing written."""
    from bench.sim.project import main

    batches = [[r, w, r * w, 5, 0.01 * r + 1e-4 * r * w, r * 5] for r in (1, 2, 4) for w in (10, 20)]
    inputs = {**inputs_on(), "settings": {"episodes_in_flight": 4, "tool_latency_median_s": 0.0, "tool_latency_sigma": 1.0,
                                          "tool_latency_max_s": 30.0},
              "learner_cost": {"ratio_sao_over_grpo": 2.0},
              "trace": [{"rollouts": [{"prompt_tokens": 5, "action_tokens": [3], "observation_tokens": [0], "reward": 1.0}]}]}
    (tmp_path / "sim").mkdir()
    out = tmp_path / "simulate.json"
    for bad, needle in (([78, [15, 4]], "expected [prompt_tokens"), ([78, [15, 4], [23, 0, 7]], "2 turns and 3")):
        inputs["engine_modes"] = {"feed_s": 1.0, "group_size": 2, "load_avg_start": 1.0, "load_avg_end": 1.0,
                                  **{m: {"rollouts_per_s": 1.0, "batches": batches, "episodes": [[78, [15, 4], [23, 0]], bad]}
                                     for m in ("lockstep", "continuous", "groups")}}
        (tmp_path / "sim" / "tool_latency.json").write_text(json.dumps(inputs))
        assert main(["--results-dir", str(tmp_path), "--out", str(out), "--no-docs"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "tool_latency: engine_modes.lockstep.episodes[1]" in err[0] and needle in err[0]
        assert not out.exists()


def test_capacity_sweep_points_are_simulated_with_their_own_tau_and_slots() -> None:
    """SAO with 1 s tool calls between 3 turns, B = 8. The sweep's point tau = 0 / 4 slots lets at most
    (0 + 1) x 8 rollouts start per version and 4 run at once; tau = 4 / 40 slots, 40 at once. Each point gets its
    own rows, compared with the mean of its runs, and the larger capacity keeps the engine busier."""
    shape = {"prompt_tokens": 8, "action_tokens": [20, 20, 20], "observation_tokens": [4, 4, 0], "reward": 1.0}
    recorded = [[8, [20, 20, 20], [4, 4, 0]]]
    inputs = {**inputs_on(), "trace": [{"rollouts": [shape, shape]}], "settings": {"episodes_in_flight": 8},
              "engine_modes": {"feed_s": 2.0, "group_size": 2, "load_avg_start": 1.0, "load_avg_end": 1.0,
                               **{m: {"rollouts_per_s": 2.0, "episodes": recorded} for m in ("lockstep", "continuous", "groups")}}}

    def run(busy: float) -> dict:
        return run_at([1.0, 1.0], 0.5, policy_versions=4, busy_fraction=busy, trained_action_tokens_per_s=100.0,
                      rollouts_per_s=2.0)

    latency = {"episodes_in_flight": 8, "batch_rollouts": 8, "tool_latency_median_s": 1.0, "tool_latency_sigma": 0.0}
    results = [result_of("sao", run(0.5), **latency),
               {**result_of("sao", run(0.2), run(0.4), **{**latency, "max_staleness": 0, "episodes_in_flight": 4}), "sweep": True},
               {**result_of("sao", run(0.9), **{**latency, "max_staleness": 4, "episodes_in_flight": 40}), "sweep": True},
               {**result_of("sao", run(0.2), **{**latency, "max_staleness": 0, "episodes_in_flight": 4,
                                                "keep_stale_episodes": True}), "sweep": True}]
    rows = validate_setting(inputs, results, COSTS, repeats=1)["rows"]
    busy = {r["method"]: r for r in rows if r["quantity"] == "busy_fraction" and not r.get("calibration")}
    assert set(busy) == {"sao", "sao tau=0 slots=4", "sao tau=4 slots=40", "sao tau=0 slots=4 keep"}
    assert busy["sao tau=0 slots=4"]["measured"] == pytest.approx(0.3) and busy["sao tau=0 slots=4"]["runs"] == 2
    assert busy["sao tau=4 slots=40"]["predicted"] > busy["sao"]["predicted"] > busy["sao tau=0 slots=4"]["predicted"]


def test_a_runs_recorded_episodes_are_read_as_units_in_order() -> None:
    """Episodes [unit, prompt, actions, observations, reward, waits]: consecutive equal units form a group."""
    run = {"episodes": [[0, 8, [20, 5], [4, 0], 1.0, [2.5]], [0, 8, [20], [0], 0.0, []], [1, 9, [7], [0], 1.0, []]]}
    first, second = run_replay(run, "grpo_sync_g2.runs[0]")
    assert [s.action_tokens for s in first] == [(20, 5), (20,)] and first[0].tool_waits_s == (2.5,)
    assert (first[0].reward, first[1].reward, second[0].prompt_tokens) == (1.0, 0.0, 9)
    assert run_replay({}, "sao.runs[0]") == ()
    with pytest.raises(ValueError, match=r"sao.runs\[1\].episodes\[0\]: expected \[unit, prompt_tokens"):
        run_replay({"episodes": [[8, [20], [0], 1.0]]}, "sao.runs[1]")
    with pytest.raises(ValueError, match=r"episodes\[0\]: needs >= 1 turn.*2 turns, 2 observations and 0 waits"):
        run_replay({"episodes": [[0, 8, [20, 5], [4, 0], 1.0, []]]}, "sao.runs[0]")


def test_replayed_units_come_first_with_their_own_tool_waits_then_draws_from_the_trace() -> None:
    """SAO, 1 slot, an instantaneous engine-free cost model and a learner that never blocks: the first episode is
    the replayed two-turn one, which waits its recorded 7 s between turns (the config's latency draw would be
    about 1 s); the next ones are drawn from the trace (one turn, no wait)."""
    replayed = RolloutShape(1, (1, 1), (0, 0), 1.0, (7.0,))
    work = replace(Workload(((one_turn(1),),)), replay=((replayed,),))
    cfg = ClusterConfig(method="sao", generators=1, episodes_in_flight=1, batch_rollouts=1, group_size=1, steps=3,
                        max_staleness=10, engine=EngineModel(max_batch=1, step_s=0.001, step_s_per_row=0.0,
                                                             prefill_s_per_token=0.0),
                        learner=LearnerModel(gpus=1, step_s_fixed=0.001, s_per_token=0.0, warmup_iterations=0),
                        publish_s=0.0, reload_s=0.0, tool_latency_median_s=1.0, tool_latency_sigma=0.0)
    cluster = Cluster(cfg, work)
    result = cluster.run()
    assert cluster._replayed == 1
    assert result.updates == 3
    assert cluster.updates[0][0] == pytest.approx(7.0, abs=0.05)  # the replayed episode's 7 s wait
    assert cluster.updates[2][0] - cluster.updates[1][0] < 0.05  # drawn one-turn episodes: no tool wait
