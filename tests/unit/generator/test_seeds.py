"""Generator identity and episode seeds: two generators of one run never share a sampling seed.

Run: .venv/bin/python -m pytest -q tests/unit/generator/test_seeds.py
"""

from __future__ import annotations

import pytest

from posttrain.cli import build_parser
from posttrain.generator.seeds import (
    EPISODE_SEED_STRIDE,
    MAX_GENERATORS,
    EpisodeSeeds,
    episode_seed,
    generator_identity,
)


def test_hand_worked_seeds_of_run_seed_0() -> None:
    """Episode c of generator i is numbered c * 1024 + i: generator 1, episode 2 -> 2049 * 2**20."""
    assert episode_seed(0, 1, 2) == 2049 * 1048576 == 2148532224
    assert episode_seed(0, 0, 2) == 2048 * 1048576
    seeds = EpisodeSeeds(0, 3)
    assert [seeds.next() for _ in range(3)] == [3 * 2**20, 1027 * 2**20, 2051 * 2**20]


@pytest.mark.parametrize("run_seed", [0, 7, 123456789])
def test_generators_of_one_run_never_share_a_request_seed(run_seed: int) -> None:
    """Every request seed (episode seed + 1000 * group member + turn) of 8 generators x 300 episodes is distinct."""
    per_episode = {(i, c): episode_seed(run_seed, i, c) for i in range(8) for c in range(300)}
    assert len(set(per_episode.values())) == len(per_episode)
    assert all(s % EPISODE_SEED_STRIDE == 0 and 0 <= s < 2**53 for s in per_episode.values())
    # The widest episode: group member 1023, turn 999 stays inside its stride.
    assert 1023 * 1000 + 999 < EPISODE_SEED_STRIDE


def test_runs_with_different_seeds_start_from_different_episode_seeds() -> None:
    assert len({episode_seed(run_seed, 0, 0) for run_seed in range(100)}) == 100


def test_identity_from_the_index_and_its_overrides() -> None:
    assert generator_identity(7, index=3) == (3, "g3", 7003)
    assert generator_identity(7, generator_id="g2") == (2, "g2", 7002)
    assert generator_identity(7, index=1, generator_id="fast", seed=5) == (1, "fast", 5)
    assert generator_identity(0) == (0, "g0", 0)


@pytest.mark.parametrize("index", [-1, MAX_GENERATORS])
def test_an_index_out_of_range_is_refused(index: int) -> None:
    with pytest.raises(ValueError, match="generator index"):
        generator_identity(0, index=index)


def test_the_generator_command_takes_an_index() -> None:
    args = build_parser().parse_args(["generator", "--config", "c.yaml", "--generator-index", "5"])
    assert generator_identity(2, args.generator_index, args.generator_id, args.seed) == (5, "g5", 2005)
