"""Per-turn advantage, value and return in the ledger (issue 29's evidence): ``token_metrics.turn_diagnostics``."""

import torch

from posttrain.learner.token_metrics import turn_diagnostics
from posttrain.parallel.world import World


def test_turns_are_the_runs_of_action_tokens_and_take_their_mean_advantage_and_first_value():
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([[9.0, 1.0, 3.0, 9.0, 9.0, -2.0, 9.0], [9.0, 9.0, 0.5, 0.5, 0.5, 9.0, 9.0]])
    values = torch.arange(14, dtype=torch.float32).reshape(2, 7) / 10
    returns = values + 1.0
    # Local rows in reverse batch order: each lands at its batch index.
    out = turn_diagnostics(mask, [1, 0], 2, adv, values, returns, World())
    assert out[1] == {"turn_advantage": [2.0, -2.0], "turn_value": [0.1, 0.5], "turn_return": [1.1, 1.5]}
    assert out[0] == {"turn_advantage": [0.5], "turn_value": [0.9], "turn_return": [1.9]}


def test_without_a_critic_only_the_advantage_is_kept_and_a_row_without_action_has_no_turn():
    mask = torch.tensor([[0, 0, 0], [1, 0, 1]], dtype=torch.bool)
    adv = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.25, 0.0, -0.5, 7.0]])  # a wider tensor is cut to the mask
    out = turn_diagnostics(mask, [0, 1], 2, adv, None, None, World())
    assert out == [{"turn_advantage": []}, {"turn_advantage": [0.25, -0.5]}]
