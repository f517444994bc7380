import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from posttrain.config import DPOLossConfig, OptimConfig
from posttrain.config.techniques import DPOTechniqueConfig
from posttrain.learner.dpo import (
    PairTokens,
    collate_pairs,
    dpo_step,
    preference_metrics,
    reference_logprobs,
    sequence_logprobs,
    tokenize_pair,
    train_dpo,
)
from posttrain.models.hf import load_policy, load_tokenizer
from posttrain.records import PreferencePair


class UniformLM(nn.Module):
    """Zero logits over a vocabulary of 4: every token has probability 1/4."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, input_ids, attention_mask=None, use_cache=False):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, 4))


def _pair(prompt, chosen, rejected):
    return PairTokens(prompt + chosen, [False] * len(prompt) + [True] * len(chosen),
                      prompt + rejected, [False] * len(prompt) + [True] * len(rejected))


@pytest.fixture(scope="module")
def model(tiny_model):
    return load_policy(tiny_model.path)


@pytest.fixture(scope="module")
def pairs():
    torch.manual_seed(0)
    out = []
    for n in (3, 5, 4, 6):
        prompt = torch.randint(5, 300, (4,)).tolist()
        out.append(_pair(prompt, torch.randint(5, 300, (n,)).tolist(), torch.randint(5, 300, (n + 1,)).tolist()))
    return out


def test_sequence_logprob_sums_only_response_tokens():
    """Uniform model over V = 4: each token has log(1/4) = -1.3863; a response of 3 tokens after a
    2-token prompt sums 3 * -1.3863 = -4.1589, the other row (1 token) -1.3863."""
    pairs = [_pair([1, 2], [3, 0, 1], [2])]
    ids, attn, mask = collate_pairs(pairs, pad_token_id=0)
    assert ids.shape == (2, 5) and mask.tolist()[1] == [False, False, True, False, False]
    seq = sequence_logprobs(UniformLM(), ids, attn, mask)
    assert seq.tolist() == pytest.approx([-3 * math.log(4), -math.log(4)], abs=1e-6)


def test_loss_is_log_2_while_the_policy_equals_the_reference(model, pairs):
    """Policy = reference: every margin is 0, so loss = -log sigmoid(0) = log 2 = 0.6931 per pair,
    accuracy 0 (a margin must be > 0) and the chosen/rejected rewards are 0."""
    config = DPOTechniqueConfig(micro_batch_size=2)
    ref = reference_logprobs(model, pairs, pad_token_id=0, micro_batch_size=3)
    acc = dpo_step(copy.deepcopy(model), pairs, ref, config, pad_token_id=0)
    metrics = acc.metrics("loss/dpo")
    assert metrics["loss/dpo"] == pytest.approx(math.log(2), abs=1e-5)
    assert metrics["dpo/accuracy"] == 0.0
    assert metrics["dpo/margin"] == pytest.approx(0.0, abs=1e-5)
    assert acc.num_tokens == 4


def test_two_micro_batches_give_the_same_gradients_as_one_batch(model, pairs):
    """Four pairs: micro-batches of 4 or of 2 both divide each summed loss by the step's 4 pairs."""
    ref = reference_logprobs(model, pairs, pad_token_id=0, micro_batch_size=4) - 0.3  # margins away from 0
    grads = []
    for micro in (4, 2):
        m = copy.deepcopy(model)
        dpo_step(m, pairs, ref, DPOTechniqueConfig(micro_batch_size=micro), pad_token_id=0)
        grads.append([p.grad.clone() for p in m.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_the_gradient_raises_chosen_and_lowers_rejected(model, pairs):
    """One SGD step (lr 0.5) on the DPO loss moves the chosen log-probability up relative to the
    rejected one: the mean margin beta * [(c - c_ref) - (r - r_ref)] becomes > 0."""
    m = copy.deepcopy(model)
    ref = reference_logprobs(m, pairs, pad_token_id=0, micro_batch_size=4)
    config = DPOTechniqueConfig(micro_batch_size=4, loss=DPOLossConfig(beta=0.1))
    dpo_step(m, pairs, ref, config, pad_token_id=0)
    with torch.no_grad():
        for p in m.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
    after = preference_metrics(m, pairs, ref, config, pad_token_id=0)
    assert after["dpo/margin"] > 0
    assert after["dpo/accuracy"] > 0.5


def test_training_raises_preference_accuracy(model, pairs):
    """Twelve AdamW steps (lr 1e-3) over 4 pairs: training preference accuracy goes from 0 (policy =
    reference) to at least 3 of 4 pairs; the per-batch reference gives the same first-step loss."""
    config = DPOTechniqueConfig(steps=12, batch_size=4, micro_batch_size=2, optim=OptimConfig(lr=1e-3))
    ref = reference_logprobs(model, pairs, pad_token_id=0, micro_batch_size=4)
    seen = []
    train_dpo(copy.deepcopy(model), pairs, ref, config, pad_token_id=0,
              on_step=lambda step, metrics: seen.append(metrics))
    assert seen[0]["dpo/accuracy"] == 0.0
    assert seen[-1]["dpo/accuracy"] >= 0.75
    assert {"loss/dpo", "policy/grad_norm", "policy/lr", "dpo/pairs"} <= set(seen[-1])
    first = []
    one_step = config.model_copy(update={"steps": 1})
    train_dpo(copy.deepcopy(model), pairs, ref.new_zeros((0, 2)), one_step, pad_token_id=0,
              reference=copy.deepcopy(model), on_step=lambda step, metrics: first.append(metrics))
    assert first[0]["loss/dpo"] == pytest.approx(seen[0]["loss/dpo"], abs=1e-6)


def test_tokenize_pair_trains_on_the_response_and_its_end_of_turn(tiny_model):
    """The chosen response ' #### 4' plus <|im_end|> are the masked tokens, nothing of the prompt."""
    tok = load_tokenizer(tiny_model.path)
    pair = PreferencePair(pair_id="p", prompt="What is 2 + 2?", chosen="#### 4", rejected="#### 5")
    tokens = tokenize_pair(tok, pair, 128)
    response = [t for t, m in zip(tokens.chosen_ids, tokens.chosen_mask, strict=True) if m]
    assert response == tok.encode("#### 4", add_special_tokens=False) + [tiny_model.im_end_id]
    assert tokens.chosen_ids[: tokens.chosen_mask.index(True)] == tokens.rejected_ids[: tokens.rejected_mask.index(True)]


def test_tokenize_pair_names_the_response_that_does_not_fit(tiny_model):
    tok = load_tokenizer(tiny_model.path)
    pair = PreferencePair(pair_id="p", prompt="a long prompt " * 20, chosen="#### 4", rejected="#### 5")
    with pytest.raises(ValueError, match=r"^chosen: no response token within max_seq_len=8"):
        tokenize_pair(tok, pair, 8)


def test_reference_must_match_the_pairs(model, pairs):
    with pytest.raises(ValueError, match=r"ref: expected shape \(4, 2\)"):
        dpo_step(model, pairs, torch.zeros(3, 2), DPOTechniqueConfig(), pad_token_id=0)
