"""SFT negative log-likelihood: hand-computed value, gradient, empty mask."""

import pytest
import torch

from posttrain.losses import sft_loss


def test_sft_loss_sums_negative_logprobs_over_the_mask():
    """logprobs [-0.5, -1.0, -2.0], mask [F, T, T]: loss 1.0 + 2.0 = 3.0, 2 tokens, nll 1.5; grad [0, -1, -1]."""
    logprobs = torch.tensor([[-0.5, -1.0, -2.0]], requires_grad=True)
    out = sft_loss(logprobs, torch.tensor([[False, True, True]]))
    assert out.loss_sum.item() == pytest.approx(3.0)
    assert out.num_tokens == 2
    assert out.metrics["sft/nll"] == pytest.approx(1.5)
    out.loss_sum.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -1.0, -1.0]]))


def test_sft_all_masked_gives_finite_zero_and_backward_works():
    logprobs = torch.tensor([[float("-inf"), -1.0]], requires_grad=True)
    out = sft_loss(logprobs, torch.tensor([[False, False]]))
    assert out.loss_sum.item() == 0.0 and out.num_tokens == 0 and out.metrics["sft/nll"] == 0.0
    out.loss_sum.backward()
    assert torch.equal(logprobs.grad, torch.zeros(1, 2))


def test_sft_loss_rejects_a_non_bool_mask():
    with pytest.raises(ValueError, match="loss_mask: expected dtype torch.bool"):
        sft_loss(torch.zeros(1, 2), torch.ones(1, 2))
