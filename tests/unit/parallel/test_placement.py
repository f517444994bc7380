"""``prepare_model`` with one rank: bf16 autocast with fp32 weights and fp32 logits, activation checkpointing."""

from __future__ import annotations

import torch

from posttrain.config import LearnerConfig
from posttrain.learner.critic import CriticModel
from posttrain.models.hf import load_policy
from posttrain.parallel.placement import output_heads, prepare_model, transformer_blocks
from posttrain.parallel.world import World


def test_bf16_computes_the_blocks_in_bf16_but_keeps_fp32_weights_logits_and_grads(tiny_model) -> None:
    ids = torch.randint(3, tiny_model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    reference = prepare_model(load_policy(tiny_model.path), World(), LearnerConfig(device="cpu"))
    bf16 = prepare_model(load_policy(tiny_model.path), World(),
                         LearnerConfig(device="cpu", precision="bf16", activation_checkpointing=True))
    exact = reference(input_ids=ids).logits
    logits = bf16(input_ids=ids).logits
    assert logits.dtype == torch.float32 and all(p.dtype == torch.float32 for p in bf16.parameters())
    gap = float((logits - exact).detach().abs().max())
    assert 0.0 < gap < 0.1, gap  # computed in bf16 (not bitwise fp32), close to it
    logits.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in bf16.parameters())


def test_blocks_and_heads_are_found_for_the_policy_and_the_critic(tiny_model) -> None:
    policy, critic = load_policy(tiny_model.path), CriticModel.from_policy_path(tiny_model.path)
    assert len(transformer_blocks(policy)) == len(transformer_blocks(critic)) == policy.config.num_hidden_layers
    assert output_heads(policy) == [policy.lm_head] and output_heads(critic) == [critic.value_head]
