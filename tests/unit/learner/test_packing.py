import copy
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from posttrain.config import OptimConfig
from posttrain.config.techniques import SFTTechniqueConfig
from posttrain.learner.packing import (
    collate_packed,
    pack_examples,
    packed_logprobs,
    sft_step,
    train_sft_packed,
)
from posttrain.learner.sft import TokenExample
from posttrain.losses.logprobs import token_logprobs
from posttrain.models.hf import load_policy


def _example(n, first_trained=False, start=10):
    return TokenExample(list(range(start, start + n)), [first_trained] + [True] * (n - 1))


@pytest.fixture(scope="module")
def model(tiny_model):
    torch.manual_seed(0)
    return load_policy(tiny_model.path)


class UniformLM(nn.Module):
    """Zero logits over a vocabulary of 4: every token costs log 4 nats."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(4))

    def forward(self, input_ids, position_ids=None, use_cache=False):
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, 4))


@pytest.mark.parametrize("packing", [True, False])
def test_sft_step_loss_is_the_mean_nll_of_the_trained_tokens(packing):
    """Uniform model over V = 4: each trained token costs log 4 = 1.3863 nats. Examples of 5 and 3 tokens
    train (5 - 1) + (3 - 1) = 6 tokens (first tokens excluded): loss_sum = 6 * 1.3863 = 8.3178, divided by
    the 6 trained tokens = 1.3863, packed or not."""
    rows = pack_examples([TokenExample([1, 2, 3, 0, 1], [True] * 5), TokenExample([2, 2, 3], [True] * 3)], 8,
                         packing=packing)
    acc = sft_step(UniformLM(), rows, pad_token_id=0, micro_batch_size=1)
    assert acc.num_tokens == 6
    assert acc.loss == pytest.approx(math.log(4), abs=1e-6)
    assert acc.metrics("loss/sft")["sft/nll"] == pytest.approx(math.log(4), abs=1e-6)


def test_pack_examples_fills_rows_greedily_in_order():
    """Lengths 7, 5, 9 into rows of 16: 7 + 5 = 12 fits, 12 + 9 = 21 does not -> rows [7, 5] and [9]."""
    rows = pack_examples([_example(7), _example(5), _example(9)], 16)
    assert [r.example_lengths for r in rows] == [[7, 5], [9]]
    assert rows[0].position_ids == list(range(7)) + list(range(5))
    assert rows[0].loss_mask == [False] + [True] * 6 + [False] + [True] * 4


def test_each_example_first_token_is_never_trained():
    """A CPT window marks its first token too, but in a packed row that token would be predicted from
    the previous example, so it is masked: 2 examples of 4 tokens -> 2 * 3 = 6 trained tokens."""
    rows = pack_examples([_example(4, first_trained=True), _example(4, first_trained=True)], 8)
    assert sum(rows[0].loss_mask) == 6


def test_long_examples_are_truncated_and_never_split():
    rows = pack_examples([_example(20), _example(3)], 8)
    assert [r.example_lengths for r in rows] == [[8], [3]]
    assert rows[0].token_ids == list(range(10, 18))


def test_packing_off_gives_one_row_per_example():
    rows = pack_examples([_example(3), _example(3)], 16, packing=False)
    assert [r.example_lengths for r in rows] == [[3], [3]]


def test_pack_examples_rejects_an_empty_example():
    with pytest.raises(ValueError, match=r"examples\[1\].token_ids"):
        pack_examples([_example(3), TokenExample([], [])], 8)


def test_collate_pads_with_untrained_tokens_and_continuing_positions():
    """Rows of 5 and 3 tokens: width 5; the short row's padding continues positions 3, 4 and is untrained."""
    rows = pack_examples([_example(5), _example(3)], 6, packing=True)
    ids, positions, mask = collate_packed(rows, pad_token_id=0)
    assert ids.shape == (2, 5)
    assert ids[1].tolist() == [10, 11, 12, 0, 0]
    assert positions[1].tolist() == [0, 1, 2, 3, 4]
    assert mask[1].tolist() == [False, True, True, False, False]


def test_packed_rows_see_no_token_of_another_example(model):
    """The log-probabilities of each example inside a packed row equal those of the example alone
    (block-diagonal attention, positions restarting at 0), up to float rounding."""
    torch.manual_seed(1)
    examples = [TokenExample(torch.randint(5, 300, (n,)).tolist(), [True] * n) for n in (7, 5, 9)]
    ids, positions, _ = collate_packed(pack_examples(examples, 32), pad_token_id=0)
    with torch.no_grad():
        packed = packed_logprobs(model, ids, positions)[0]
        offset = 0
        for ex in examples:
            alone_ids = torch.tensor([ex.token_ids])
            alone = token_logprobs(model(input_ids=alone_ids, use_cache=False).logits, alone_ids)[0]
            n = len(ex.token_ids)
            torch.testing.assert_close(packed[offset + 1 : offset + n], alone[1:], atol=1e-5, rtol=1e-5)
            offset += n


def _grads(module):
    return [p.grad.detach().clone() for p in module.parameters() if p.grad is not None]


def test_packed_and_unpacked_batches_give_the_same_loss_and_gradients(model):
    """Three examples with untrained first tokens: packed into one row or padded one per row, the
    mean NLL over the same 3 + 4 + 5 = 12 trained tokens and its gradient are the same."""
    torch.manual_seed(2)
    examples = [TokenExample(torch.randint(5, 300, (n + 1,)).tolist(), [False] + [True] * n) for n in (3, 4, 5)]
    results = []
    for packing in (True, False):
        m = copy.deepcopy(model)
        acc = sft_step(m, pack_examples(examples, 64, packing=packing), pad_token_id=0, micro_batch_size=8)
        assert acc.num_tokens == 12
        results.append((acc.loss, _grads(m)))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_two_micro_batches_give_the_same_gradients_as_one_batch(model):
    """Rows with 6 and 2 trained tokens: one micro-batch divides the summed NLL by 8; two micro-batches
    divide each part by the same global 8, so the accumulated gradient is identical."""
    torch.manual_seed(3)
    rows = pack_examples([_example(7, start=20), _example(3, start=40)], 8, packing=False)
    out = []
    for micro in (2, 1):
        m = copy.deepcopy(model)
        acc = sft_step(m, rows, pad_token_id=0, micro_batch_size=micro)
        out.append((acc.loss, _grads(m)))
    assert out[0][0] == pytest.approx(out[1][0], rel=1e-6)
    for a, b in zip(out[0][1], out[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_training_on_packed_rows_lowers_the_loss(model):
    """Eight steps of AdamW (lr 1e-2) on the same two rows: the loss of the last step is below the first."""
    m = copy.deepcopy(model)
    rows = pack_examples([_example(12, start=50), _example(12, start=80)], 16, packing=False)
    config = SFTTechniqueConfig(steps=8, batch_size=2, micro_batch_size=1, max_seq_len=16,
                                optim=OptimConfig(lr=1e-2))
    seen = []
    last = train_sft_packed(m, rows, config, pad_token_id=0, on_step=lambda step, metrics: seen.append(metrics["loss/sft"]))
    assert len(seen) == 8 and seen[-1] < seen[0]
    assert {"loss/sft", "policy/grad_norm", "policy/lr", "sft/tokens"} <= set(last)
    assert last["sft/tokens"] == 22


def test_training_needs_a_trained_token(model):
    rows = pack_examples([TokenExample([5, 6], [False, False])], 8)
    with pytest.raises(ValueError, match="loss_mask all False"):
        train_sft_packed(model, rows, SFTTechniqueConfig(steps=1, batch_size=1, micro_batch_size=1), pad_token_id=0)
