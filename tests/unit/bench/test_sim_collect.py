"""``bench.sim.collect``: the engine probe and the engine fed by real episodes, on the tiny model; CPU accounting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench.sim.collect import PROBE_BATCHES, busy_cpu_seconds, engine_probe, measure_engine_modes, other_cpu


def test_busy_cpu_seconds_reads_user_nice_system_irq_softirq(tmp_path: Path) -> None:
    """cpu user nice system idle iowait irq softirq steal: busy = 100 + 1 + 50 + 2 + 3 ticks (idle, iowait, steal out)."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 1 50 9000 70 2 3 40 0 0\ncpu0 50 0 25 4500 35 1 1 20 0 0\n")
    assert busy_cpu_seconds(stat) == pytest.approx(156 / os.sysconf("SC_CLK_TCK"))
    assert busy_cpu_seconds(tmp_path / "absent") is None
    stat.write_text("intr 1 2 3\n")
    with pytest.raises(ValueError, match="not the aggregate 'cpu' line"):
        busy_cpu_seconds(stat)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads /proc/stat (Linux)")
def test_other_cpu_counts_a_busy_child_process() -> None:
    """A child spins for 1 s of CPU while this process waits for it: at least a quarter of a core is counted
    (two cores, whatever else runs beside the test)."""
    import subprocess
    import sys

    with other_cpu() as other:
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"],
                       check=True)
    assert len(other) == 1 and other[0] >= 0.25


def test_engine_probe_times_each_fixed_batch_on_the_real_engine(tiny_model) -> None:  # noqa: ANN001 (fixture)
    """The probe runs the hf engine on the tiny model: one median per PROBE_BATCHES shape, seconds their sum,
    and what other processes used beside it (a number on Linux)."""
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
    assert len(out["engine_probe"]) == 2 and out["feed_s"] == 0.2
