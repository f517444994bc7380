"""GKD losses: hand-computed JSD(beta) at beta 0, 0.5 and 1, temperature, masking, the sampled reverse KL.

The worked example has a vocabulary of 2. One trained token (position 1, token id 1) is predicted
by the logits at position 0: the teacher's ``[0, 0]`` gives T = (1/2, 1/2), the student's
``[0, ln 3]`` gives S = (1/4, 3/4). Every other logit is NaN, so a loss that read a position it
must not would be NaN.

    KL(T || S) = 1/2 ln(1/2 / 1/4) + 1/2 ln(1/2 / 3/4) = 1/2 ln(4/3)                   = 0.1438410
    KL(S || T) = 1/4 ln(1/4 / 1/2) + 3/4 ln(3/4 / 1/2) = -0.1732868 + 0.3040988         = 0.1308120
    beta 0.5:  M = (3/8, 5/8)
               KL(T || M) = 1/2 ln(4/3) + 1/2 ln(4/5) = 1/2 ln(16/15)                   = 0.0322693
               KL(S || M) = 1/4 ln(2/3) + 3/4 ln(6/5) = -0.1013663 + 0.1367412          = 0.0353749
               JSD = 1/2 (0.0322693 + 0.0353749)                                        = 0.0338221
"""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.config import GKDLossConfig
from posttrain.losses import DistillLossInputs, generalized_jsd_loss, sampled_reverse_kl_loss

NAN = float("nan")
LN3 = math.log(3.0)
FORWARD_KL, REVERSE_KL, JSD_HALF = 0.1438410, 0.1308120, 0.0338221


def _inputs(student_row=(0.0, LN3), teacher_row=(0.0, 0.0), behaviour=None):
    """[1, 3, 2] logits, NaN everywhere but position 0; token 1 at position 1 is the one trained token."""
    student = torch.full((1, 3, 2), NAN)
    student[0, 0] = torch.tensor(student_row)
    teacher = torch.full((1, 3, 2), NAN)
    teacher[0, 0] = torch.tensor(teacher_row)
    student.requires_grad_(True)
    teacher.requires_grad_(True)
    lp = None
    if behaviour is not None:
        lp = torch.tensor([[0.0, behaviour, NAN]], requires_grad=True)
    return DistillLossInputs(student, teacher, torch.tensor([[0, 1, 1]]), torch.tensor([[False, True, False]]), lp)


@pytest.mark.parametrize(("beta", "expected"), [(0.0, FORWARD_KL), (0.5, JSD_HALF), (1.0, REVERSE_KL)])
def test_generalized_jsd_matches_the_hand_computed_values_at_beta_0_half_and_1(beta, expected):
    out = generalized_jsd_loss(_inputs(), GKDLossConfig(beta=beta))
    assert out.loss_sum.item() == pytest.approx(expected, abs=1e-6)
    assert out.num_tokens == 1
    assert out.metrics["gkd/divergence"] == pytest.approx(expected, abs=1e-6)
    assert out.metrics["gkd/forward_kl"] == pytest.approx(FORWARD_KL, abs=1e-6)
    assert out.metrics["gkd/reverse_kl"] == pytest.approx(REVERSE_KL, abs=1e-6)
    assert out.metrics["gkd/teacher_logprob"] == pytest.approx(math.log(0.5), abs=1e-6)
    assert out.metrics["gkd/student_logprob"] == pytest.approx(math.log(0.75), abs=1e-6)
    assert out.metrics["gkd/agreement"] == 0.0  # the student's argmax is token 1, the tied teacher's token 0


def test_interior_beta_shrinks_towards_zero_at_both_ends():
    """JSD(beta) at beta 0.25 / 0.5 / 0.75 (mixtures computed by hand as above): 0.0260482, 0.0338221,
    0.0248700, below both KLs; the ends are the limits JSD/beta -> KL(T||S) and JSD/(1-beta) -> KL(S||T)."""
    values = [generalized_jsd_loss(_inputs(), GKDLossConfig(beta=b)).loss_sum.item() for b in (0.25, 0.5, 0.75)]
    assert values == pytest.approx([0.0260482, JSD_HALF, 0.0248700], abs=1e-6)
    near_zero = generalized_jsd_loss(_inputs(), GKDLossConfig(beta=1e-4)).loss_sum.item() / 1e-4
    near_one = generalized_jsd_loss(_inputs(), GKDLossConfig(beta=1 - 1e-4)).loss_sum.item() / 1e-4
    assert near_zero == pytest.approx(FORWARD_KL, rel=5e-3)  # first-order term: O(beta)
    assert near_one == pytest.approx(REVERSE_KL, rel=5e-3)


def test_gradients_of_forward_and_reverse_kl_match_the_hand_derivation_and_never_reach_the_teacher():
    """d KL(T||S) / d z_S = S - T = (-1/4, 1/4); d KL(S||T) / d z_S,j = S_j (ln S_j - ln T_j - KL(S||T)):
    1/4 (ln 1/2 - 0.1308120) = -0.2059898 and 3/4 (ln 3/2 - 0.1308120) = +0.2059898."""
    for beta, grad in ((0.0, [-0.25, 0.25]), (1.0, [-0.2059898, 0.2059898])):
        inputs = _inputs()
        generalized_jsd_loss(inputs, GKDLossConfig(beta=beta)).loss_sum.backward()
        assert inputs.student_logits.grad[0, 0].tolist() == pytest.approx(grad, abs=1e-6)
        assert inputs.student_logits.grad[0, 1:].abs().sum().item() == 0.0  # unread positions get exactly 0
        assert inputs.teacher_logits.grad is None


def test_temperature_divides_both_models_logits():
    """At temperature 2 the student's [0, ln 9] is [0, ln 3]: the same values as above. With the teacher's
    [0, ln 4] -> T = (1/3, 2/3): KL(T||S) = 1/3 ln(4/3) + 2/3 ln(8/9) = 0.0173720,
    KL(S||T) = 1/4 ln(3/4) + 3/4 ln(9/8) = 0.0164168, and the most likely tokens now agree."""
    hot = GKDLossConfig(beta=0.0, temperature=2.0)
    assert generalized_jsd_loss(_inputs((0.0, math.log(9.0))), hot).loss_sum.item() == pytest.approx(FORWARD_KL, abs=1e-6)
    out = generalized_jsd_loss(_inputs((0.0, math.log(9.0)), (0.0, math.log(4.0))), hot)
    assert out.loss_sum.item() == pytest.approx(0.0173720, abs=1e-6)
    assert out.metrics["gkd/reverse_kl"] == pytest.approx(0.0164168, abs=1e-6)
    assert out.metrics["gkd/agreement"] == 1.0


def test_masked_positions_count_for_nothing_and_each_trained_token_adds_its_divergence():
    """Two rows. Row 0 trains position 1 (the worked example); row 1 trains positions 1 and 2, predicted
    by [0, ln 3] vs [0, 0] again and by equal logits (divergence 0). Positions 0 and 3 of row 1 hold
    other distributions but are masked out: the sum is 2 x KL(T||S) over 3 tokens."""
    student = torch.zeros(2, 4, 2)
    teacher = torch.zeros(2, 4, 2)
    student[:, 0] = torch.tensor([0.0, math.log(3.0)])
    student[1, 1] = torch.tensor([1.0, 2.0])
    teacher[1, 1] = torch.tensor([1.0, 2.0])
    student[1, 2:] = torch.tensor([5.0, -5.0])  # predicts position 3, masked out
    student.requires_grad_(True)
    mask = torch.tensor([[False, True, False, False], [False, True, True, False]])
    ids = torch.ones(2, 4, dtype=torch.long)
    out = generalized_jsd_loss(DistillLossInputs(student, teacher, ids, mask), GKDLossConfig(beta=0.0))
    assert out.num_tokens == 3
    assert out.loss_sum.item() == pytest.approx(2 * FORWARD_KL, abs=1e-6)
    assert out.metrics["gkd/divergence"] == pytest.approx(2 * FORWARD_KL / 3, abs=1e-6)
    out.loss_sum.backward()
    assert student.grad[1, 2:].abs().sum().item() == 0.0


def test_all_masked_gives_a_finite_zero_that_backpropagates():
    inputs = _inputs()
    inputs.loss_mask = torch.zeros(1, 3, dtype=torch.bool)
    for loss in (generalized_jsd_loss, sampled_reverse_kl_loss):
        out = loss(inputs, GKDLossConfig())
        assert out.loss_sum.item() == 0.0 and out.num_tokens == 0
        assert all(v == 0.0 for v in out.metrics.values()), out.metrics
        out.loss_sum.backward()
        assert torch.isfinite(inputs.student_logits.grad).all()


def test_sampled_reverse_kl_is_the_k1_estimate_with_the_policy_gradient_of_the_sampled_token():
    """delta = ln S(1) - ln T(1) = ln(3/4) - ln(1/2) = ln 1.5 = 0.4054651; with the generator's own
    probability (ratio 1) the loss is delta and its gradient delta (onehot(1) - S) = (-0.1013663, 0.1013663)."""
    inputs = _inputs(behaviour=math.log(0.75))
    out = sampled_reverse_kl_loss(inputs, GKDLossConfig(divergence="sampled_reverse_kl"))
    assert out.loss_sum.item() == pytest.approx(0.4054651, abs=1e-6)
    assert out.metrics["gkd/is_weight"] == pytest.approx(1.0) and out.metrics["gkd/is_truncated"] == 0.0
    out.loss_sum.backward()
    assert inputs.student_logits.grad[0, 0].tolist() == pytest.approx([-0.1013663, 0.1013663], abs=1e-6)
    assert inputs.teacher_logits.grad is None and inputs.behaviour_logprobs.grad is None


def test_sampled_reverse_kl_truncates_the_importance_weight_of_a_stale_sample():
    """The generator gave token 1 probability 1/4 (an older student): ratio 3/4 / 1/4 = 3, truncated to
    is_cap 2, so the loss is 2 delta = 0.8109302; without behaviour logprobs the weight is 1."""
    out = sampled_reverse_kl_loss(_inputs(behaviour=math.log(0.25)), GKDLossConfig(is_cap=2.0))
    assert out.loss_sum.item() == pytest.approx(0.8109302, abs=1e-6)
    assert out.metrics["gkd/is_weight"] == pytest.approx(2.0) and out.metrics["gkd/is_truncated"] == 1.0
    assert sampled_reverse_kl_loss(_inputs(), GKDLossConfig()).loss_sum.item() == pytest.approx(0.4054651, abs=1e-6)


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line():
    inputs = _inputs()
    with pytest.raises(ValueError, match=r"^teacher_logits: vocabulary of 3 tokens differs from the student's 2") as err:
        DistillLossInputs(inputs.student_logits, torch.zeros(1, 3, 3), inputs.token_ids, inputs.loss_mask)
    assert "\n" not in str(err.value)


def test_a_non_finite_logit_at_a_trained_position_and_a_trained_first_token_raise():
    inputs = _inputs(teacher_row=(0.0, NAN))
    with pytest.raises(ValueError, match=r"teacher_logits: non-finite value .* \(row 0, position 1\)"):
        generalized_jsd_loss(inputs, GKDLossConfig())
    inputs = _inputs()
    inputs.loss_mask = torch.tensor([[True, False, False]])
    with pytest.raises(ValueError, match="position 0"):
        generalized_jsd_loss(inputs, GKDLossConfig())
