"""token_logprobs / entropy_from_logits: the one-position shift, float32 maths, temperature, errors."""

import math

import pytest
import torch

from posttrain.losses.logprobs import entropy_from_logits, selected_entropies, token_logprobs


def _hand_loop(logits, token_ids, temperature=1.0):
    batch, length, _ = logits.shape
    out = torch.zeros(batch, length)
    for b in range(batch):
        for t in range(1, length):
            log_p = torch.log_softmax(logits[b, t - 1].float() / temperature, dim=-1)
            out[b, t] = log_p[token_ids[b, t]]
    return out


def test_token_logprobs_worked_example():
    """V = 2. logits[0] = [0, 0] predicts token 1 with log 0.5 = -0.693147;
    logits[1] = [ln 3, 0] predicts token 0 with log 0.75 = -0.287682; position 0 gets 0.0.
    logits[2] predicts nothing (no token 3)."""
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, -5.0]]])
    out = token_logprobs(logits, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, -0.693147, -0.287682]]), atol=1e-6, rtol=0)


def test_token_logprobs_shift_matches_a_hand_loop():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11)
    token_ids = torch.randint(0, 11, (3, 7))
    out = token_logprobs(logits, token_ids)
    assert out.dtype == torch.float32 and out.shape == (3, 7)
    torch.testing.assert_close(out, _hand_loop(logits, token_ids))
    torch.testing.assert_close(
        token_logprobs(logits, token_ids, temperature=0.7), _hand_loop(logits, token_ids, 0.7)
    )


def test_token_logprobs_computes_in_float32_for_bf16_logits():
    torch.manual_seed(1)
    logits = (torch.randn(2, 5, 50) * 4).to(torch.bfloat16)
    token_ids = torch.randint(0, 50, (2, 5))
    out = token_logprobs(logits, token_ids)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _hand_loop(logits.float(), token_ids), atol=1e-6, rtol=1e-6)


def test_token_logprobs_gradient_reaches_logits():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    token_logprobs(logits, torch.tensor([[0, 1, 2, 3]])).sum().backward()
    assert logits.grad is not None
    assert torch.equal(logits.grad[0, -1], torch.zeros(5))  # the last position predicts no token
    assert bool((logits.grad[0, :-1] != 0).any())


def test_token_logprobs_rejects_bad_inputs_naming_the_field():
    logits = torch.zeros(1, 3, 4)
    with pytest.raises(ValueError, match=r"token_ids: values must lie in \[0, 4\)"):
        token_logprobs(logits, torch.tensor([[0, 4, 1]]))
    with pytest.raises(ValueError, match="token_ids: expected shape"):
        token_logprobs(logits, torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="logits: expected \\[B, T, V\\]"):
        token_logprobs(torch.zeros(3, 4), torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match="temperature: must be > 0"):
        token_logprobs(logits, torch.tensor([[0, 1, 2]]), temperature=0.0)


def test_entropy_from_logits_uses_the_same_shift():
    """Uniform logits over V = 4 give entropy ln 4 = 1.386294 at t >= 1; position 0 gets 0.
    A near-one-hot row (logit 30 vs 0) gives entropy ~0 at the next position."""
    logits = torch.zeros(1, 3, 4)
    logits[0, 1, 2] = 30.0
    out = entropy_from_logits(logits)
    assert out.dtype == torch.float32
    assert out[0, 0].item() == 0.0
    assert out[0, 1].item() == pytest.approx(math.log(4.0), abs=1e-6)
    assert out[0, 2].item() == pytest.approx(0.0, abs=1e-9)


def test_selected_entropies_match_entropy_from_logits_at_the_masked_tokens_in_any_chunking():
    """Random logits [2, 5, 7], mask on 5 tokens (one at position 0, which has no prediction: 0.0):
    the selected entropies are entropy_from_logits at those tokens, for chunks of 1, 2 and 64."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    mask = torch.tensor([[True, False, True, True, False], [False, True, False, False, True]])
    full = entropy_from_logits(logits)[mask]
    for chunk in (1, 2, 64):
        torch.testing.assert_close(selected_entropies(logits, mask, chunk_tokens=chunk), full)
    assert selected_entropies(logits, mask)[0].item() == 0.0
    warm = selected_entropies(logits, mask, temperature=2.0)
    torch.testing.assert_close(warm, entropy_from_logits(logits, temperature=2.0)[mask])
    assert selected_entropies(logits, torch.zeros(2, 5, dtype=torch.bool)).shape == (0,)
    with pytest.raises(ValueError, match="mask: expected bool"):
        selected_entropies(logits, mask.long())
