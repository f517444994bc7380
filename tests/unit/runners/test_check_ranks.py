"""``check_ranks``: under torchrun, a batch with fewer rows than ranks is refused in one line naming the field."""

import pytest

from posttrain.config import ConfigError, RunConfig
from posttrain.parallel.world import World
from posttrain.runners.common import check_ranks

TWO = World(rank=0, size=2)


def _config(technique, **sections):
    return RunConfig.model_validate({"technique": technique, **sections})


@pytest.mark.parametrize(("technique", "sections", "ranks", "message"), [
    ("sft", {"sft": {"batch_size": 1, "micro_batch_size": 1}}, 2, "sft.batch_size: a batch of 1 cannot feed 2"),
    ("cpt", {"sft": {"batch_size": 1, "micro_batch_size": 1}}, 2, "sft.batch_size: a batch of 1 cannot feed 2"),
    ("dpo", {"dpo": {"batch_size": 1, "micro_batch_size": 1}}, 2, "dpo.batch_size: a batch of 1 cannot feed 2"),
    ("grpo", {"grpo": {"prompts_per_step": 1, "group_size": 2}}, 4,
     "grpo.prompts_per_step x grpo.group_size: a batch of 2 cannot feed 4"),
])
def test_a_batch_smaller_than_the_ranks_names_its_field(technique, sections, ranks, message):
    with pytest.raises(ConfigError, match=rf"^{message} learner ranks"):
        check_ranks(_config(technique, **sections), World(rank=0, size=ranks))


def test_a_batch_with_a_row_per_rank_passes_and_one_rank_never_checks():
    check_ranks(_config("sft", sft={"batch_size": 2, "micro_batch_size": 1}), TWO)
    check_ranks(_config("sft", sft={"batch_size": 1, "micro_batch_size": 1}), World())


def test_sao_under_torchrun_points_to_learner_local_ranks():
    with pytest.raises(ConfigError, match=r"^technique: sao starts its own learner ranks: run `posttrain run CONFIG "
                                          r"learner.local_ranks=2` without torchrun"):
        check_ranks(_config("sao"), TWO)
