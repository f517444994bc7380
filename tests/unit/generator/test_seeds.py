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


def test_a_restarted_generator_continues_its_episode_numbering_from_the_reserved_position() -> None:
    """Issue 23, item 18: a restart replayed the first life's seeds. Two lives of generator 2 on one
    reserve counter (Redis HINCRBY in a generator; a dict here), blocks of 4: life 1 uses counters
    0-5 (reserving 0-7), life 2 starts at 8; their seeds are disjoint, and ``start`` tells them apart."""
    positions = {2: 0}

    def reserve(n: int) -> int:
        positions[2] += n
        return positions[2]

    first = EpisodeSeeds(0, 2, reserve=reserve, block=4)
    life1 = [first.next() for _ in range(6)]
    second = EpisodeSeeds(0, 2, reserve=reserve, block=4)
    life2 = [second.next() for _ in range(6)]
    assert (first.start, second.start) == (0, 8)
    assert life1 == [episode_seed(0, 2, c) for c in range(6)]
    assert life2 == [episode_seed(0, 2, c) for c in range(8, 14)]
    assert not set(life1) & set(life2)
    assert positions[2] == 16


def test_a_reserve_that_returns_less_than_it_reserved_is_refused() -> None:
    with pytest.raises(ValueError, match="reserve"):
        EpisodeSeeds(0, 0, reserve=lambda n: n - 1, block=4)
    with pytest.raises(ValueError, match="block"):
        EpisodeSeeds(0, 0, reserve=lambda n: n, block=0)


def test_engines_sample_with_distinct_32_bit_seeds_for_distinct_episodes() -> None:
    """CPU generators keep only the low 32 bits of a seed; episode seeds are multiples of 2**20.

    Unfolded, generator 0's episodes 0 and 4 had the same low 32 bits (4 * 1024 * 2**20 = 2**32),
    so every 4th episode sampled the same tokens (measured: a restarted generator's 8 rollouts
    held only 4 distinct token sequences, all equal to first-life ones). The folded seeds of 8
    generators x 300 episodes x 4 group members are all distinct, and torch samples them apart.
    """
    import torch

    from posttrain.generator.seeds import episode_seed as seed_of
    from posttrain.inference.base import GenerationRequest
    from posttrain.inference.hf import fold_seed, request_seed

    assert seed_of(0, 0, 0) % 2**32 == seed_of(0, 0, 4) % 2**32  # the trap
    folded = {fold_seed(seed_of(7, i, c) + 1000 * k) for i in range(8) for c in range(300) for k in range(4)}
    assert len(folded) == 8 * 300 * 4 and max(folded) < 2**32
    request = GenerationRequest(prompt_token_ids=[1], max_new_tokens=1, seed=seed_of(0, 0, 4))
    assert request_seed(0, 0, request) == fold_seed(seed_of(0, 0, 4)) != fold_seed(seed_of(0, 0, 0))
    draws = {int(torch.multinomial(torch.ones(400), 1, generator=torch.Generator().manual_seed(fold_seed(
        seed_of(0, 0, c)))).item()) for c in (0, 4, 8, 12)}
    assert len(draws) > 1
