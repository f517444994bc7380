"""SAO DIS policy loss: hand-computed values, band edges, hard masking, gradients, metrics."""

import math

import pytest
import torch

from posttrain.config import ConfigError, SAOLossConfig, load_config
from posttrain.losses import POLICY_LOSSES, PolicyLossInputs, sao_loss
from posttrain.losses.sao import applied_band, dis_band


def _inputs(logprobs, behaviour, advantages, mask, requires_grad=True):
    lp = torch.tensor(logprobs, dtype=torch.float32, requires_grad=requires_grad)
    behav = torch.tensor(behaviour, dtype=torch.float32, requires_grad=True)
    adv = torch.tensor(advantages, dtype=torch.float32)
    return PolicyLossInputs(lp, behav, adv, torch.tensor(mask, dtype=torch.bool))


def _single_token(log_ratio, advantage=1.0, config=None):
    """One action token with logprobs = log_ratio, behaviour = 0; returns (output, grad)."""
    inputs = _inputs([[float(log_ratio)]], [[0.0]], [[advantage]], [[True]])
    out = sao_loss(inputs, config or SAOLossConfig())
    out.loss_sum.backward()
    return out, inputs.logprobs.grad


def test_sao_loss_matches_hand_computed_value_and_metrics():
    """Row: obs token (ignored), then 3 action tokens with eps = (0.3, 5.0), band (0.7, 6.0).

    t=1: logp=-1, behav=-1 -> r=1 kept, A=2:          -(1 * 2 * -1)        = +2
    t=2: logp=ln .5, behav=ln .25 -> r=2 kept, A=-1:  -(2 * -1 * -0.693147) = -1.386294
    t=3: logp=-3, behav=-1 -> r=e^-2=0.135335 dropped (<= 0.7), A=4: 0
    loss_sum = 0.613706, num_tokens = 3 (kept or not).
    mask/frac_low = 1/3, frac_high = 0; ratio/mean = (1 + 2 + 0.135335)/3 = 1.045112; ratio/max = 2
    logprob_abs_diff = (0 + 0.693147 + 2)/3 = 0.897716
    k3(r) = r - 1 - ln r: 0, 0.306853, 1.135335 -> mean 0.480729
    ess = (3.135335)^2 / (3 * (1 + 4 + 0.018316)) = 9.830326 / 15.054947 = 0.652963
    """
    inputs = _inputs(
        [[-5.0, -1.0, math.log(0.5), -3.0]],
        [[0.0, -1.0, math.log(0.25), -1.0]],
        [[100.0, 2.0, -1.0, 4.0]],
        [[False, True, True, True]],
    )
    out = sao_loss(inputs, SAOLossConfig())
    assert out.loss_sum.item() == pytest.approx(0.613706, abs=1e-5)
    assert out.num_tokens == 3
    m = out.metrics
    assert m["mask/frac_low"] == pytest.approx(1 / 3)
    assert m["mask/frac_high"] == 0.0
    assert m["mask/frac_total"] == pytest.approx(1 / 3)
    assert m["ratio/mean"] == pytest.approx(1.045112, abs=1e-5)
    assert m["ratio/max"] == pytest.approx(2.0, abs=1e-6)
    assert m["mismatch/logprob_abs_diff"] == pytest.approx(0.897716, abs=1e-5)
    assert m["mismatch/k3_kl"] == pytest.approx(0.480729, abs=1e-5)
    assert m["ratio/ess"] == pytest.approx(0.652963, abs=1e-5)
    assert all(isinstance(v, float) for v in m.values())


def test_sao_gradient_equals_minus_band_weight_times_advantage():
    """d loss_sum / d logprobs = -f(r) * A: t=1: -(1*2) = -2; t=2: -(2*-1) = +2; t=3 dropped: 0; obs: 0."""
    inputs = _inputs(
        [[-5.0, -1.0, math.log(0.5), -3.0]],
        [[0.0, -1.0, math.log(0.25), -1.0]],
        [[100.0, 2.0, -1.0, 4.0]],
        [[False, True, True, True]],
    )
    sao_loss(inputs, SAOLossConfig()).loss_sum.backward()
    torch.testing.assert_close(inputs.logprobs.grad, torch.tensor([[0.0, -2.0, 2.0, 0.0]]), atol=1e-5, rtol=0)


def test_sao_gradient_reaches_logprobs_never_behaviour_logprobs():
    inputs = _inputs([[-1.0, -2.0]], [[-1.1, -2.2]], [[1.0, -1.0]], [[True, True]])
    sao_loss(inputs, SAOLossConfig()).loss_sum.backward()
    assert inputs.logprobs.grad is not None and bool((inputs.logprobs.grad != 0).all())
    assert inputs.behaviour_logprobs.grad is None


def test_sao_all_masked_gives_finite_zero_and_backward_works():
    """No action token: loss 0, num_tokens 0, every metric 0.0 (not NaN), gradient all zero."""
    inputs = _inputs([[-1.0, float("nan")]], [[-1.0, 3.0]], [[5.0, float("inf")]], [[False, False]])
    out = sao_loss(inputs, SAOLossConfig())
    assert out.loss_sum.item() == 0.0
    assert out.num_tokens == 0
    out.loss_sum.backward()
    assert torch.equal(inputs.logprobs.grad, torch.zeros(1, 2))
    assert out.metrics and all(v == 0.0 for v in out.metrics.values())


@pytest.mark.parametrize(
    ("ratio", "kept"),
    [
        (0.7, False),  # exactly on the low edge: open interval, dropped
        (0.7 - 1e-4, False),
        (0.7 + 1e-4, True),  # just inside
        (6.0, False),  # exactly on the high edge
        (6.0 + 1e-4, False),
        (6.0 - 1e-4, True),
        (1.0, True),
    ],
)
def test_sao_band_edges_are_strict(ratio, kept):
    """Band (0.7, 6.0): a kept token has loss -r*A*logp and gradient -r*A (A = 1); a dropped one 0 and 0."""
    log_ratio = torch.log(torch.tensor(ratio, dtype=torch.float32)).item()
    out, grad = _single_token(log_ratio)
    if kept:
        assert grad.item() == pytest.approx(-ratio, rel=1e-5)
        assert out.metrics["mask/frac_total"] == 0.0
    else:
        assert grad.item() == 0.0
        assert out.loss_sum.item() == 0.0
        assert out.metrics["mask/frac_total"] == 1.0


@pytest.mark.parametrize(("ratio", "kept"), [(0.2, False), (0.2001, True), (4.0, False), (3.9999, True)])
def test_sao_swe_band_edges_are_strict(ratio, kept):
    """Coding-agent band (eps_low, eps_high) = (0.8, 3.0): keep r in (0.2, 4.0), edges dropped."""
    config = SAOLossConfig(mask_eps_low=0.8, mask_eps_high=3.0)
    _, grad = _single_token(math.log(ratio), config=config)
    assert (grad.item() != 0.0) is kept


def test_sao_edge_built_from_python_log_is_dropped():
    """logprobs = math.log(0.7) (double rounded to float32), behaviour = 0: r rounds to 0.7 -> dropped."""
    _, grad = _single_token(math.log(0.7))
    assert grad.item() == 0.0
    _, grad = _single_token(math.log(6.0))
    assert grad.item() == 0.0


def test_dis_is_a_hard_mask_not_a_clamp():
    """r = e^5 = 148.4 > 6 with A = 10: a clamp would keep weight 6 and gradient -60; DIS gives 0 and 0."""
    out, grad = _single_token(5.0, advantage=10.0)
    assert out.loss_sum.item() == 0.0
    assert grad.item() == 0.0
    out, grad = _single_token(-5.0, advantage=-10.0)
    assert out.loss_sum.item() == 0.0 and grad.item() == 0.0


@pytest.mark.parametrize("log_ratio", [math.log(0.5), math.log(7.0)])
@pytest.mark.parametrize("advantage", [3.0, -3.0])
def test_sao_masking_does_not_depend_on_advantage_sign(log_ratio, advantage):
    """Unlike PPO, r = 0.5 or r = 7 is dropped for A > 0 and A < 0 alike."""
    _, grad = _single_token(log_ratio, advantage=advantage)
    assert grad.item() == 0.0


def test_sao_on_policy_gradient_is_the_reinforce_gradient():
    """Identical logprobs: r = 1, nothing masked, gradient = d/dlogp(-sum A*logp) = -A on action tokens."""
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 6) * 4
    advantages = torch.randn(3, 6)
    mask = torch.rand(3, 6) > 0.3
    lp = logprobs.clone().requires_grad_(True)
    out = sao_loss(PolicyLossInputs(lp, logprobs.clone(), advantages, mask), SAOLossConfig())
    out.loss_sum.backward()
    assert out.metrics["mask/frac_total"] == 0.0
    assert out.metrics["ratio/mean"] == pytest.approx(1.0)
    assert out.metrics["ratio/ess"] == pytest.approx(1.0)
    assert out.metrics["mismatch/k3_kl"] == 0.0

    lp_reinforce = logprobs.clone().requires_grad_(True)
    (-(advantages * lp_reinforce)[mask].sum()).backward()
    torch.testing.assert_close(lp.grad, lp_reinforce.grad)


def test_sao_huge_log_ratio_stays_finite():
    """log r = 100 is clamped to 20 before exp: metrics finite; behaviour -inf is dropped, not NaN."""
    inputs = _inputs([[0.0, -1.0]], [[-100.0, float("-inf")]], [[1.0, 1.0]], [[True, True]])
    out = sao_loss(inputs, SAOLossConfig())
    out.loss_sum.backward()
    assert out.loss_sum.item() == 0.0
    assert out.metrics["mask/frac_high"] == 1.0
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert out.metrics["ratio/max"] == pytest.approx(math.exp(20.0), rel=1e-6)


def test_sao_nan_at_action_token_raises_naming_the_field():
    inputs = _inputs([[0.0, float("nan")]], [[0.0, 0.0]], [[1.0, 1.0]], [[True, True]])
    with pytest.raises(ValueError, match=r"logprobs: NaN at action token \(row 0, position 1\)"):
        sao_loss(inputs, SAOLossConfig())


def test_policy_loss_inputs_reject_bad_fields():
    lp = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="action_mask: expected dtype torch.bool"):
        PolicyLossInputs(lp, lp, lp, mask.float())
    with pytest.raises(ValueError, match="behaviour_logprobs: expected shape"):
        PolicyLossInputs(lp, torch.zeros(2, 4), lp, mask)
    with pytest.raises(ValueError, match="logprobs: expected dtype torch.float32"):
        PolicyLossInputs(lp.double(), lp, lp, mask)
    with pytest.raises(ValueError, match="ref_logprobs: expected shape"):
        PolicyLossInputs(lp, lp, lp, mask, ref_logprobs=torch.zeros(3))


def test_policy_losses_dict_maps_technique_to_function():
    assert POLICY_LOSSES["sao"] is sao_loss
    assert set(POLICY_LOSSES) == {"sao", "grpo"}


def test_sao_nan_log_ratio_from_two_minus_infs_raises():
    """logprobs = behaviour = -inf: the log-ratio -inf - (-inf) is NaN; the loss refuses it instead of dropping it."""
    inputs = _inputs([[float("-inf")]], [[float("-inf")]], [[1.0]], [[True]])
    with pytest.raises(ValueError, match="logprobs - behaviour_logprobs: NaN at action token"):
        sao_loss(inputs, SAOLossConfig())


def test_stale_tokens_get_no_gradient_and_are_counted_apart_from_the_dis_band():
    """Row: 4 action tokens, all ratio 1 (in the band), A = (1, 2, 3, 4); tokens 0 and 2 are stale.

    Fresh tokens 1 and 3 train: loss_sum = -(1*2*lp1 + 1*4*lp3) with lp = -1 -> 2 + 4 = 6; gradient
    -A on them (-2, -4), 0 on the stale ones. num_tokens stays 4 (the divisor does not move).
    mask/frac_stale = 2/4, frac_low = frac_high = 0, frac_total = 0.5. A stale token outside the
    band (token 0 again, ratio e^-3) counts as stale only.
    """
    inputs = _inputs([[-1.0] * 4], [[-1.0] * 4], [[1.0, 2.0, 3.0, 4.0]], [[True] * 4])
    inputs.stale_mask = torch.tensor([[True, False, True, False]])
    out = sao_loss(inputs, SAOLossConfig())
    out.loss_sum.backward()
    assert out.loss_sum.item() == pytest.approx(6.0)
    assert inputs.logprobs.grad.tolist() == [[0.0, -2.0, 0.0, -4.0]]
    assert out.num_tokens == 4
    m = out.metrics
    assert (m["mask/frac_stale"], m["mask/frac_low"], m["mask/frac_high"], m["mask/frac_total"]) == (0.5, 0.0, 0.0, 0.5)

    outside = _inputs([[-4.0, -1.0]], [[-1.0, -1.0]], [[1.0, 1.0]], [[True, True]])
    outside.stale_mask = torch.tensor([[True, False]])
    m = sao_loss(outside, SAOLossConfig()).metrics
    assert (m["mask/frac_stale"], m["mask/frac_low"], m["mask/frac_total"]) == (0.5, 0.0, 0.5)


def test_all_stale_gives_finite_zero_and_backward_works():
    inputs = _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]], [[True, True]])
    inputs.stale_mask = torch.ones((1, 2), dtype=torch.bool)
    out = sao_loss(inputs, SAOLossConfig())
    out.loss_sum.backward()
    assert out.loss_sum.item() == 0.0 and inputs.logprobs.grad.abs().sum().item() == 0.0
    assert out.metrics["mask/frac_stale"] == 1.0


def test_stale_mask_must_be_bool_of_the_logprobs_shape():
    with pytest.raises(ValueError, match="stale_mask: expected dtype torch.bool"):
        PolicyLossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool),
                         stale_mask=torch.zeros(1, 2))
    with pytest.raises(ValueError, match="stale_mask: expected shape"):
        PolicyLossInputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool),
                         stale_mask=torch.zeros(1, 3, dtype=torch.bool))


# --- correction modes (sao.loss.correction; issue 22 ablation (a)) ---------------------------------

def _mode_row():
    """4 action tokens, behaviour 0, ratios r = (1, 2, 0.5, 8), A = (2, -1, 3, 1); band (0.7, 6.0)."""
    ratios = [1.0, 2.0, 0.5, 8.0]
    return _inputs([[math.log(r) for r in ratios]], [[0.0] * 4], [[2.0, -1.0, 3.0, 1.0]], [[True] * 4]), ratios


@pytest.mark.parametrize(
    ("correction", "weights"),
    [
        ("dis", [1.0, 2.0, 0.0, 0.0]),  # r inside (0.7, 6.0), 0 outside (0.5 below, 8 above)
        ("tis", [1.0, 2.0, 0.5, 2.0]),  # min(r, 2): 8 truncated to 2, 0.5 kept as 0.5, no band
        ("none", [1.0, 1.0, 1.0, 1.0]),  # f = 1 everywhere, band ignored
    ],
)
def test_gradient_per_correction_is_minus_f_times_advantage(correction, weights):
    """d loss_sum / d logprobs = -f(r) * A with A = (2, -1, 3, 1), by hand per mode."""
    inputs, _ = _mode_row()
    out = sao_loss(inputs, SAOLossConfig(correction=correction))
    out.loss_sum.backward()
    advantages = [2.0, -1.0, 3.0, 1.0]
    expected = [-w * a for w, a in zip(weights, advantages, strict=True)]
    torch.testing.assert_close(inputs.logprobs.grad, torch.tensor([expected]), atol=1e-5, rtol=0)
    # The band diagnostics are the same in every mode: 0.5 below, 8 above.
    assert (out.metrics["mask/frac_low"], out.metrics["mask/frac_high"]) == (0.25, 0.25)
    assert out.metrics["mask/frac_total"] == 0.5
    assert out.metrics["mask/frac_applied"] == (0.5 if correction == "dis" else 0.0)


@pytest.mark.parametrize(("cap", "ratio", "weight"), [(2.0, 3.0, 2.0), (2.0, 1.9, 1.9), (10.0, 8.0, 8.0),
                                                      (10.0, 50.0, 10.0), (1.5, 0.1, 0.1)])
def test_tis_truncates_the_weight_at_the_cap(cap, ratio, weight):
    """tis: f = min(r, tis_cap), gradient -f * A with A = 1; a ratio below the band is not masked."""
    _, grad = _single_token(math.log(ratio), config=SAOLossConfig(correction="tis", tis_cap=cap))
    assert grad.item() == pytest.approx(-weight, rel=1e-5)


def test_none_ignores_the_band_even_far_outside_it():
    """none: r = e^5 (148, far above 6) and e^-5 still train with gradient -A (DIS gives 0)."""
    for log_ratio in (5.0, -5.0):
        out, grad = _single_token(log_ratio, advantage=3.0, config=SAOLossConfig(correction="none"))
        assert grad.item() == pytest.approx(-3.0)
        assert out.metrics["mask/frac_total"] == 1.0 and out.metrics["mask/frac_applied"] == 0.0


@pytest.mark.parametrize("correction", ["dis", "tis", "none"])
def test_stale_tokens_are_masked_in_every_correction_mode(correction):
    """Tokens 0 and 3 stale (ratio 1 and 8): no gradient whatever the mode; fresh tokens train as in the mode."""
    inputs, _ = _mode_row()
    inputs.stale_mask = torch.tensor([[True, False, False, True]])
    out = sao_loss(inputs, SAOLossConfig(correction=correction))
    out.loss_sum.backward()
    grad = inputs.logprobs.grad[0].tolist()
    assert grad[0] == 0.0 and grad[3] == 0.0
    fresh = {"dis": [2.0, 0.0], "tis": [2.0, -1.5], "none": [1.0, -3.0]}[correction]  # -f*A on tokens 1, 2
    assert grad[1:3] == pytest.approx(fresh, abs=1e-5)
    assert out.metrics["mask/frac_stale"] == 0.5
    assert out.metrics["mask/frac_applied"] == (0.75 if correction == "dis" else 0.5)


def test_applied_band_keeps_every_fresh_token_without_dis():
    inputs, _ = _mode_row()
    band = dis_band(inputs.logprobs, inputs.behaviour_logprobs, inputs.action_mask, 0.3, 5.0, 20.0,
                    torch.tensor([[False, False, False, True]]))
    assert applied_band(band, "dis") is band
    tis = applied_band(band, "tis")
    assert tis.keep.tolist() == [[True, True, True, False]]
    assert not tis.below.any() and not tis.above.any() and tis.stale.tolist() == band.stale.tolist()
    with pytest.raises(ValueError, match=r"correction: allowed values are \('dis', 'tis', 'none'\), got 'is'"):
        applied_band(band, "is")


@pytest.mark.parametrize("cap", [1.0, 0.5, 100.5])
def test_config_rejects_tis_cap_out_of_range_naming_the_field(cap):
    with pytest.raises(ConfigError, match=r"sao\.loss\.tis_cap: Input should be"):
        load_config(None, [f"sao.loss.tis_cap={cap}"])


def test_config_rejects_an_unknown_correction_listing_the_allowed_values():
    with pytest.raises(ConfigError, match=r"sao\.loss\.correction: allowed values are 'dis', 'tis' or 'none', got 'is'"):
        load_config(None, ["sao.loss.correction=is"])
    assert load_config(None, ["sao.loss.correction=tis", "sao.loss.tis_cap=3"]).sao.loss.correction == "tis"
