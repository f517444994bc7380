"""Summing loss_sum over micro-batches and dividing by the total token count gives the full-batch gradient."""

import pytest
import torch

from posttrain.config import DPOLossConfig, GRPOLossConfig, SAOLossConfig
from posttrain.losses import PolicyLossInputs, dpo_loss, grpo_loss, sao_loss, sft_loss, value_loss


def _batch(seed=0, rows=6, length=9):
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rows, length, generator=generator) * 3
    behaviour = logprobs + torch.randn(rows, length, generator=generator) * 0.4
    advantages = torch.randn(rows, length, generator=generator)
    mask = torch.rand(rows, length, generator=generator) > 0.35
    ref = logprobs + torch.randn(rows, length, generator=generator) * 0.2
    return logprobs, behaviour, advantages, mask, ref


def _policy_loss(name, lp, behaviour, advantages, mask, ref):
    inputs = PolicyLossInputs(lp, behaviour, advantages, mask, ref_logprobs=ref)
    if name == "sao":
        return sao_loss(inputs, SAOLossConfig())
    if name == "grpo":
        return grpo_loss(inputs, GRPOLossConfig(kl_coef=0.05))
    if name == "grpo_dis":
        return grpo_loss(inputs, GRPOLossConfig(dis_mask=True))
    if name == "sft":
        return sft_loss(lp, mask)
    return value_loss(lp, behaviour, advantages, mask, value_clip=0.2)


@pytest.mark.parametrize("name", ["sao", "grpo", "grpo_dis", "sft", "value"])
def test_micro_batches_give_the_same_gradient_as_one_batch(name):
    """Split rows [0:2] + [2:6]; sum(loss_sum) / sum(num_tokens) must match the one-batch gradient."""
    logprobs, behaviour, advantages, mask, ref = _batch()
    full = logprobs.clone().requires_grad_(True)
    out = _policy_loss(name, full, behaviour, advantages, mask, ref)
    (out.loss_sum / out.num_tokens).backward()

    split = logprobs.clone().requires_grad_(True)
    parts = [slice(0, 2), slice(2, 6)]
    outs = [_policy_loss(name, split[s], behaviour[s], advantages[s], mask[s], ref[s]) for s in parts]
    total_tokens = sum(o.num_tokens for o in outs)
    assert total_tokens == out.num_tokens == int(mask.sum())
    for o in outs:
        (o.loss_sum / total_tokens).backward()
    torch.testing.assert_close(split.grad, full.grad)
    assert full.grad.abs().sum() > 0


def test_dpo_micro_batches_give_the_same_gradient_as_one_batch():
    generator = torch.Generator().manual_seed(3)
    chosen, rejected, ref_c, ref_r = (-torch.rand(6, generator=generator) * 20 for _ in range(4))
    full = chosen.clone().requires_grad_(True)
    out = dpo_loss(full, rejected, ref_c, ref_r, DPOLossConfig())
    (out.loss_sum / out.num_tokens).backward()
    split = chosen.clone().requires_grad_(True)
    for s in (slice(0, 4), slice(4, 6)):
        part = dpo_loss(split[s], rejected[s], ref_c[s], ref_r[s], DPOLossConfig())
        (part.loss_sum / 6).backward()
    torch.testing.assert_close(split.grad, full.grad)
