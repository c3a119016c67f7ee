"""Tests for the CE-GPPO per-token objective (`cegppo_trl.loss`): the definition, and the advantages the trainer hands
TRL's clipped surrogate (`preserved_weight`, `preserved_advantages`).

In the torchtune style: log-probs are chosen so that the ratio is exactly ``e``, ``1/e``, ``e^0.1``..., the expected
value of each region is derived in a comment, and the gradient w.r.t. the current log-probs is taken with
`torch.autograd.grad`. Unless a test says otherwise: ``epsilon_low = epsilon_high = 0.2`` (clip range [0.8, 1.2]),
``beta1 = 0.5``, ``beta2 = 0.75`` (different from each other and from 1, so a swapped or dropped beta shows).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.reference import random_inputs
from torch.testing import assert_close

from cegppo_trl.loss import cegppo_objective, cegppo_regions, preserved_advantages, preserved_weight, sft_loss

EPS_LOW, EPS_HIGH, BETA1, BETA2 = 0.2, 0.2, 0.5, 0.75
LOSS_KWARGS = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, beta1=BETA1, beta2=BETA2)


def loss_and_grad(logp, old_logp, advantages, grad_out=None, **kwargs):
    """Per-token loss and its gradient w.r.t. `logp` (of `loss.sum()` unless `grad_out` is given)."""
    logp = logp.detach().clone().requires_grad_()
    loss = cegppo_objective(logp, old_logp, advantages, **{**LOSS_KWARGS, **kwargs})
    (grad,) = torch.autograd.grad(loss, logp, torch.ones_like(loss) if grad_out is None else grad_out)
    return loss.detach(), grad


def ppo_clip_loss(logp, old_logp, advantages, *, epsilon_low, epsilon_high, delta=None):
    """TRL 1.16's clipped surrogate (`GRPOTrainer._compute_loss`, token-level), the baseline CE-GPPO generalises."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


# ---------------------------------------------------------------------------------------------------------------------
# One region at a time, with hand-derived values
# ---------------------------------------------------------------------------------------------------------------------
def test_left_clip_negative_advantage_keeps_beta1_scaled_bound_as_value_and_gradient():
    # ratio = exp(-1) = 1/e ~ 0.368 < 0.8 and A = -2 < 0: NA&LP, left clip.
    # value = -beta1 * (1 - eps_low) * A = -0.5 * 0.8 * (-2) = 0.8; gradient the same (PPO would give 0).
    loss, grad = loss_and_grad(torch.tensor([[-1.0]]), torch.tensor([[0.0]]), torch.tensor([-2.0]))
    assert_close(loss, torch.tensor([[0.8]]))
    assert_close(grad, torch.tensor([[0.8]]))


def test_right_clip_positive_advantage_keeps_beta2_scaled_bound_as_value_and_gradient():
    # ratio = exp(1) = e ~ 2.718 > 1.2 and A = 2 > 0: PA&LP, right clip.
    # value = -beta2 * (1 + eps_high) * A = -0.75 * 1.2 * 2 = -1.8; gradient the same (PPO would give 0).
    loss, grad = loss_and_grad(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([2.0]))
    assert_close(loss, torch.tensor([[-1.8]]))
    assert_close(grad, torch.tensor([[-1.8]]))


def test_inside_clip_range_is_the_plain_surrogate():
    # ratio = exp(0.1) ~ 1.105 in [0.8, 1.2]: value = -ratio * A; d/dlogp(-exp(logp - old) * A) = -ratio * A.
    # A = 2 -> -2 e^0.1 ~ -2.2103; A = -2 -> +2 e^0.1.
    loss, grad = loss_and_grad(torch.tensor([[0.1], [0.1]]), torch.zeros(2, 1), torch.tensor([2.0, -2.0]))
    expected = torch.tensor([[-2 * math.exp(0.1)], [2 * math.exp(0.1)]])
    assert_close(loss, expected)
    assert_close(grad, expected)


def test_positive_advantage_below_range_is_not_clipped():
    # ratio = 1/e < 0.8 but A = 1 > 0: PPO's min picks ratio * A, so this is the plain surrogate, no beta.
    # value = gradient = -e^-1 * 1 ~ -0.3679.
    loss, grad = loss_and_grad(torch.tensor([[-1.0]]), torch.tensor([[0.0]]), torch.tensor([1.0]))
    assert_close(loss, torch.tensor([[-math.exp(-1)]]))
    assert_close(grad, torch.tensor([[-math.exp(-1)]]))


def test_negative_advantage_above_range_is_not_clipped():
    # ratio = e > 1.2 but A = -1 < 0 (and no dual clip): plain surrogate, value = gradient = -e * (-1) = e.
    loss, grad = loss_and_grad(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([-1.0]))
    assert_close(loss, torch.tensor([[math.e]]))
    assert_close(grad, torch.tensor([[math.e]]))


def test_dual_clip_gives_constant_value_and_no_gradient_to_negative_advantages_above_delta():
    # ratio = e^3 ~ 20.1 > delta = 10 and A = -1: dual clip, value = -delta * A = 10, gradient 0.
    # ratio = e ~ 2.7 < delta with A = -1: untouched, value = gradient = e.
    # ratio = e^3 with A = +1: right clip, the dual clip never touches positive advantages: -0.75 * 1.2 = -0.9.
    logp = torch.tensor([[3.0, 1.0], [3.0, 3.0]])
    loss, grad = loss_and_grad(logp, torch.zeros(2, 2), torch.tensor([-1.0, 1.0]), delta=10.0)
    assert_close(loss, torch.tensor([[10.0, math.e], [-0.9, -0.9]]))
    assert_close(grad, torch.tensor([[0.0, math.e], [-0.9, -0.9]]))


def test_delta_below_ratio_caps_negative_advantage_tokens_above_the_clip_range():
    # ratio = e ~ 2.72, A = -1: without delta the value is e (gradient e); with delta = 2 < e it is -2 * (-1) = 2
    # and the gradient is 0. Left-clipped tokens (ratio 1/e) are the same with and without delta: 0.5 * 0.8 = 0.4.
    logp, old, adv = torch.tensor([[1.0, -1.0]]), torch.zeros(1, 2), torch.tensor([-1.0])
    loss_none, grad_none = loss_and_grad(logp, old, adv)
    loss_two, grad_two = loss_and_grad(logp, old, adv, delta=2.0)
    assert_close(loss_none, torch.tensor([[math.e, 0.4]]))
    assert_close(grad_none, torch.tensor([[math.e, 0.4]]))
    assert_close(loss_two, torch.tensor([[2.0, 0.4]]))
    assert_close(grad_two, torch.tensor([[0.0, 0.4]]))


def test_all_regions_in_one_batch():
    # Rows: A = -1, +1, 0. Columns: log-ratio -1 (1/e), 0.1 (inside), 1 (e), 3 (e^3 > delta = 10).
    logp = torch.tensor([[-1.0, 0.1, 1.0, 3.0]]).expand(3, 4)
    adv = torch.tensor([-1.0, 1.0, 0.0])
    loss, grad = loss_and_grad(logp, torch.zeros(3, 4), adv, delta=10.0)
    e01, e = math.exp(0.1), math.e
    # A = -1: left clip 0.5 * 0.8 = 0.4 | inside e^0.1 | above range, plain e | dual clip: value 10, gradient 0.
    # A = +1: plain -1/e | inside -e^0.1 | right clip -0.75 * 1.2 = -0.9 | right clip -0.9.
    # A =  0: zeros.
    expected_loss = torch.tensor([[0.4, e01, e, 10.0], [-1 / e, -e01, -0.9, -0.9], [0.0, 0.0, 0.0, 0.0]])
    expected_grad = torch.tensor([[0.4, e01, e, 0.0], [-1 / e, -e01, -0.9, -0.9], [0.0, 0.0, 0.0, 0.0]])
    assert_close(loss, expected_loss)
    assert_close(grad, expected_grad)
    left, right, dual, _ = cegppo_regions(logp - 0.0, adv, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, delta=10.0)
    assert left.tolist() == [[True, False, False, False], [False] * 4, [False] * 4]
    assert right.tolist() == [[False] * 4, [False, False, True, True], [False] * 4]
    assert dual.tolist() == [[False, False, False, True], [False] * 4, [False] * 4]


def test_asymmetric_clip_range_uses_epsilon_high_on_the_right_and_epsilon_low_on_the_left():
    # DAPO-style clip-higher: eps_low = 0.2, eps_high = 0.28, so the range is [0.8, 1.28].
    # A = +1, r = e^0.2 ~ 1.221: above 1.2 but inside 1.28, plain surrogate -e^0.2.
    # A = +1, r = e^0.3 ~ 1.350 > 1.28: right clip, -0.75 * 1.28 = -0.96.
    # A = -1, r = e^-0.25 ~ 0.779 < 0.8: left clip, 0.5 * 0.8 = 0.4 (with eps_low = 0.28 it would be inside).
    logp = torch.tensor([[0.2], [0.3], [-0.25]])
    loss, grad = loss_and_grad(logp, torch.zeros(3, 1), torch.tensor([1.0, 1.0, -1.0]), epsilon_high=0.28)
    expected = torch.tensor([[-math.exp(0.2)], [-0.96], [0.4]])
    assert_close(loss, expected)
    assert_close(grad, expected)


def test_ratio_exactly_on_a_bound_is_not_clipped():
    # The inequalities are strict. Choose eps_low, eps_high and delta so that 1 - eps_low, 1 + eps_high and delta
    # are exactly the fp32 ratios exp(-0.5), exp(0.25), exp(2.5): those tokens stay on the plain surrogate -r * A.
    log_ratio = torch.tensor([[-0.5], [0.25], [2.5]])
    r = torch.exp(log_ratio)  # fp32, what the loss computes
    bounds = dict(epsilon_low=1 - r[0, 0].item(), epsilon_high=r[1, 0].item() - 1, delta=r[2, 0].item())
    adv = torch.tensor([-1.0, 1.0, -1.0])
    loss, grad = loss_and_grad(log_ratio, torch.zeros(3, 1), adv, **bounds)
    assert_close(loss, r * 1.0 * torch.tensor([[1.0], [-1.0], [1.0]]), rtol=0, atol=0)
    assert_close(grad, loss, rtol=0, atol=0)
    left, right, dual, _ = cegppo_regions(log_ratio, adv, **bounds)
    assert not (left.any() or right.any() or dual.any())


def test_regions_without_delta_has_empty_dual_mask():
    left, right, dual, _ = cegppo_regions(
        torch.tensor([[-1.0, 3.0]]), torch.tensor([-1.0]), epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH
    )
    assert left.tolist() == [[True, False]] and not right.any() and not dual.any()


# ---------------------------------------------------------------------------------------------------------------------
# Special cases: PPO (beta = 0) and GPPO (beta = 1)
# ---------------------------------------------------------------------------------------------------------------------
def trl_loss_and_grad(logp, old, adv, grad_out=None, **kwargs):
    """The trainer's loss per token: TRL's clipped surrogate on `preserved_advantages`, and its gradient."""
    kwargs = {**LOSS_KWARGS, **kwargs}
    leaf = logp.detach().clone().requires_grad_()
    log_ratio = leaf - old
    weight = preserved_weight(log_ratio.detach(), adv, **{k: v for k, v in kwargs.items() if k != "delta"})
    adv_hat = preserved_advantages(adv, log_ratio, weight)
    loss = ppo_clip_loss(leaf, old, adv_hat, epsilon_low=kwargs["epsilon_low"], epsilon_high=kwargs["epsilon_high"],
                         delta=kwargs.get("delta"))  # fmt: skip
    rows = adv.unsqueeze(-1) if adv.dim() == 1 else adv
    ppo = ppo_clip_loss(leaf.detach(), old, rows, epsilon_low=kwargs["epsilon_low"], epsilon_high=kwargs["epsilon_high"],
                        delta=kwargs.get("delta"))  # fmt: skip
    (grad,) = torch.autograd.grad(loss, leaf, torch.ones_like(loss) if grad_out is None else grad_out)
    return loss.detach(), ppo, grad, adv_hat.detach()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("delta", [None, 3.0])
@pytest.mark.parametrize("guard", [{}, dict(delta_low=0.5), dict(delta_low=0.5, delta_low_mode="decay")])
def test_trls_surrogate_on_the_preserved_advantages_has_the_definitions_gradient_and_trls_value(delta, dtype, guard):
    # Every region populated (log-ratios in [-1.5, 1.5], advantages of both signs and 0), under an incoming gradient
    # that is not 1 (TRL's masks and aggregation weights): A_hat is A in value, so TRL's loss is TRL's, and the
    # clipped tokens get beta * bound * A of gradient.
    logp, old, adv = random_inputs(batch=32, length=48, dtype=dtype, spread=1.5)
    grad_out = torch.rand(logp.shape, generator=torch.Generator().manual_seed(2), dtype=dtype) / 7
    loss, ppo, grad, adv_hat = trl_loss_and_grad(logp, old, adv, grad_out=grad_out, delta=delta, **guard)
    assert torch.equal(adv_hat, adv.expand_as(adv_hat)) and torch.equal(loss, ppo)  # bit for bit: A and TRL's loss
    leaf = logp.clone().requires_grad_()
    definition = cegppo_objective(leaf, old, adv, **LOSS_KWARGS, delta=delta, **guard)
    (grad_definition,) = torch.autograd.grad(definition, leaf, grad_out)
    left, right, _, _ = cegppo_regions(logp - old, adv, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH)
    assert left.any() and right.any()
    tolerance = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-14, atol=1e-16)
    assert_close(grad, grad_definition, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_at_zero_betas_the_advantages_are_trls_in_value_and_gradient(dtype):
    # beta1 = beta2 = 0: the weight is 0 everywhere, so A_hat has no gradient and TRL's loss is all there is.
    logp, old, adv = random_inputs(dtype=dtype, spread=1.5)
    weight = preserved_weight(logp - old, adv, **{**LOSS_KWARGS, "beta1": 0.0, "beta2": 0.0})
    assert torch.equal(weight, torch.zeros_like(weight))
    leaf = logp.clone().requires_grad_()
    adv_hat = preserved_advantages(adv, leaf - old, weight)
    (grad,) = torch.autograd.grad(adv_hat.sum(), leaf)
    assert torch.equal(adv_hat.detach(), adv.expand_as(adv_hat)) and torch.equal(grad.abs(), torch.zeros_like(grad))


def test_the_weight_is_beta_on_each_side_and_zero_elsewhere_and_trls_bound_multiplies_it():
    # log r = -1 (r = 1/e < 0.8) with A = -1: beta1 = 0.5. log r = 1 (r = e > 1.2) with A = 1: beta2 = 0.75.
    # Inside, and the unclipped sides (A > 0 below the range, A < 0 above it): 0. Through TRL's surrogate the
    # gradient w.r.t. log p is -clip(r) * w * A: 0.8 * 0.5 = 0.4 on the left, -1.2 * 0.75 = -0.9 on the right;
    # elsewhere TRL's -r * A: e^0.1 = 1.105171 and e = 2.718282 for A = -1, -1/e = -0.367879 and -e^0.1 for A = 1.
    log_ratio = torch.tensor([[-1.0, 0.1, 1.0], [-1.0, 0.1, 1.0]])
    adv = torch.tensor([-1.0, 1.0])
    weight = preserved_weight(log_ratio, adv, **LOSS_KWARGS)
    assert_close(weight, torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.0, 0.75]]))
    old = torch.zeros(2, 3)
    loss, _, grad, _ = trl_loss_and_grad(log_ratio, old, adv)
    assert_close(grad, torch.tensor([[0.4, 1.105171, 2.718282], [-0.367879, -1.105171, -0.9]]))
    # The guard: r = 1/e < delta_low = 0.5 cuts the left token off ("cutoff") or scales it by r / delta_low ("decay")
    assert_close(preserved_weight(log_ratio, adv, **LOSS_KWARGS, delta_low=0.5)[0, 0], torch.tensor(0.0))
    decay = preserved_weight(log_ratio, adv, **LOSS_KWARGS, delta_low=0.5, delta_low_mode="decay")[0, 0]
    assert_close(decay, torch.tensor(0.5 * math.exp(-1) / 0.5))


def test_sft_loss_is_the_masked_nll_over_the_normaliser_and_clamps_an_empty_one():
    # NLL of the masked tokens: -(-1 - 2 - 0.5) = 3.5; over 7 tokens: 0.5, gradient -1/7 on each masked token.
    logps = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -3.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = sft_loss(logps, mask, torch.tensor(7.0))
    assert_close(loss, torch.tensor(0.5))
    (grad,) = torch.autograd.grad(loss, logps)
    assert_close(grad, -mask / 7)
    assert_close(sft_loss(logps.detach(), torch.zeros(2, 3), 0.0), torch.tensor(0.0))  # no correct token: 0, not NaN


@pytest.mark.parametrize("delta", [None, 3.0])
def test_unit_betas_are_gppo_whose_value_equals_ppo(delta):
    # beta1 = beta2 = 1 (Klear-Reasoner's GPPO): the forward value is PPO's, and every token's gradient equals its
    # value (clipped ones included) except dual-clipped ones, whose gradient is 0.
    logp, old, adv = random_inputs(spread=1.5)
    loss, grad = loss_and_grad(logp, old, adv, beta1=1.0, beta2=1.0, delta=delta)
    ppo = ppo_clip_loss(logp, old, adv, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, delta=delta)
    assert_close(loss, ppo)
    _, _, dual, _ = cegppo_regions(logp - old, adv, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, delta=delta)
    assert_close(grad, torch.where(dual, 0.0, loss))


# ---------------------------------------------------------------------------------------------------------------------
# Numerics: overflow, exactness, dtypes
# ---------------------------------------------------------------------------------------------------------------------
def test_the_advantages_stay_finite_at_extreme_log_ratios_where_the_authors_form_gives_nan():
    # Log-ratios of +-200 (exp overflows fp32 to inf, underflows to 0) and A = 0: A_hat never evaluates r * A and
    # never divides by r. A = -1, -200: left clip, d A_hat / d log r = A * beta1 = -0.5; A = +1, +200: right clip,
    # A * beta2 = 0.75; A = -1, +200 and A = +1, -200: no preserved gradient; A_hat = A everywhere.
    log_ratio = torch.tensor([[200.0, -200.0], [200.0, -200.0], [200.0, -200.0]], requires_grad=True)
    adv = torch.tensor([-1.0, 1.0, 0.0])
    weight = preserved_weight(log_ratio.detach(), adv, **LOSS_KWARGS)
    adv_hat = preserved_advantages(adv, log_ratio, weight)
    (grad,) = torch.autograd.grad(adv_hat.sum(), log_ratio)
    assert torch.equal(adv_hat.detach(), adv[:, None].expand(3, 2))
    assert_close(grad, torch.tensor([[0.0, -0.5], [0.75, 0.0], [0.0, 0.0]]))

    # The paper's `beta * bound * A / sg(r) * r` on the same clipped tokens: inf / inf and 0 / 0 are NaN.
    logp_authors = torch.tensor([200.0, -200.0], requires_grad=True)
    ratio = torch.exp(logp_authors)
    bound_a = torch.tensor([-BETA2 * (1 + EPS_HIGH) * 1.0, -BETA1 * (1 - EPS_LOW) * -1.0])
    authors = bound_a / ratio.detach() * ratio
    (authors_grad,) = torch.autograd.grad(authors.sum(), logp_authors)
    assert torch.isnan(authors).all() and torch.isnan(authors_grad).all()


def test_nan_log_probs_propagate_instead_of_being_hidden():
    # A NaN log-prob is a bug upstream: the loss and the gradient must show it, whatever the clip settings.
    logp = torch.tensor([[math.nan, 0.0]])
    for delta in (None, 10.0):
        loss, grad = loss_and_grad(logp, torch.zeros(1, 2), torch.tensor([-1.0]), delta=delta)
        assert torch.isnan(loss[0, 0]) and torch.isnan(grad[0, 0])
        assert_close(loss[0, 1], torch.tensor(1.0))


def test_left_clip_bound_above_delta_is_not_capped_by_the_dual_clip():
    # beta1 = 20: the left-clip constant 20 * 0.8 = 16 exceeds delta = 10. The dual clip only concerns r > delta,
    # so a left-clipped token (r = 1/e, A = -1) keeps value = gradient = 16.
    logp, old, adv = torch.tensor([[-1.0]]), torch.zeros(1, 1), torch.tensor([-1.0])
    loss, grad = loss_and_grad(logp, old, adv, beta1=20.0, delta=10.0)
    assert_close(loss, torch.tensor([[16.0]]))
    assert_close(grad, torch.tensor([[16.0]]))


def test_gradcheck_where_the_surrogate_is_smooth():
    # Away from the clip boundaries and outside the clipped regions the objective is the differentiable -r * A, so
    # its gradient must match finite differences (clipped tokens are exempt by design: constant value, kept gradient).
    logp = torch.tensor([[0.1, -0.1, -1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[0.7, -1.3, 0.9, -0.4]], dtype=torch.float64)  # inside, inside, A>0 low, A<0 high
    assert torch.autograd.gradcheck(lambda x: cegppo_objective(x, old, adv, **LOSS_KWARGS), (logp,))


def test_bf16_log_probs_give_fp32_loss_from_fp32_ratio_and_bf16_gradient():
    # -2.0 and -2.03125 are exact in bf16; the log-ratio 0.03125 gives r = e^0.03125 = 1.031743 in fp32, whereas a
    # bf16 exp would round it to 1.03125. With A = 1: value = gradient = -1.031743 (fp32), gradient returned in bf16.
    logp = torch.tensor([[-2.0]], dtype=torch.bfloat16)
    old = torch.tensor([[-2.03125]], dtype=torch.bfloat16)
    loss, grad = loss_and_grad(logp, old, torch.tensor([1.0]))
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert_close(loss, torch.tensor([[-math.exp(0.03125)]]), rtol=1e-6, atol=0)
    assert_close(grad, torch.tensor([[-math.exp(0.03125)]], dtype=torch.bfloat16))


def test_bf16_matches_fp32_on_the_same_values():
    logp, old, adv = random_inputs(dtype=torch.bfloat16, spread=1.5)
    loss_bf16, grad_bf16 = loss_and_grad(logp, old, adv.float(), delta=2.5)
    loss_fp32, grad_fp32 = loss_and_grad(logp.float(), old.float(), adv.float(), delta=2.5)
    assert_close(loss_bf16, loss_fp32, rtol=0, atol=0)
    assert_close(grad_bf16, grad_fp32.to(torch.bfloat16), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------------------------------
def test_advantage_shapes_b_b1_bt_give_the_same_result():
    logp, old, adv = random_inputs(batch=6, length=5, spread=1.5)
    results = [loss_and_grad(logp, old, a, delta=2.5) for a in (adv.squeeze(1), adv, adv.expand(6, 5).clone())]
    for loss, grad in results[1:]:
        assert_close(loss, results[0][0], rtol=0, atol=0)
        assert_close(grad, results[0][1], rtol=0, atol=0)
    assert results[0][0].shape == (6, 5)


def test_sequence_level_log_ratio_with_token_advantages_sums_the_gradient_per_sequence():
    # A (B, 1) log-ratio (GSPO-style sequence ratio) against (B, T) advantages: the loss is (B, T) and the gradient
    # of the (B, 1) input is the per-token gradient summed over T.
    g = torch.Generator().manual_seed(0)
    seq_logp = torch.tensor([[-1.0], [0.1], [1.0], [3.0]], dtype=torch.float64)  # 1/e, inside, e, e^3
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    adv[0, 0] = 0.0
    zeros = torch.zeros(4, 6, dtype=torch.float64)
    loss, grad = loss_and_grad(seq_logp, zeros[:, :1], adv, delta=10.0)
    token_loss, token_grad = loss_and_grad(seq_logp.expand(4, 6), zeros, adv, delta=10.0)
    assert loss.shape == (4, 6) and grad.shape == (4, 1)
    assert_close(loss, token_loss)
    assert_close(grad, token_grad.sum(-1, keepdim=True))


# ---------------------------------------------------------------------------------------------------------------------
# torch.compile: no graph break (hence no `.item()`, no data-dependent shape, no host sync)
# ---------------------------------------------------------------------------------------------------------------------
def _compile_or_skip(fn):
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile unavailable")
    torch._dynamo.reset()
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


@pytest.mark.parametrize("delta", [None, 2.5])
@pytest.mark.slow
def test_compiles_in_one_graph_and_matches_eager(delta):
    # fullgraph=True: TRL's surrogate on the preserved advantages traces into one graph (no graph break); AOT autograd runs
    # the backward of the compiled graph. (Host synchronisation is checked separately below: torch 2.13 captures
    # `.item()` and boolean indexing without a graph break.)
    def masked_mean_loss(logp, old, adv, mask):
        log_ratio = logp - old
        weight = preserved_weight(log_ratio.detach(), adv, **LOSS_KWARGS)
        adv_hat = preserved_advantages(adv, log_ratio, weight)
        loss = ppo_clip_loss(logp, old, adv_hat, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, delta=delta)
        return (loss * mask).sum() / mask.sum()

    compiled = _compile_or_skip(masked_mean_loss)
    logp, old, adv = random_inputs(batch=4, length=8, dtype=torch.float32, spread=1.5)
    mask = (torch.arange(8) < torch.tensor([[8], [5], [3], [8]])).float()
    results = []
    for fn in (compiled, masked_mean_loss):
        x = logp.clone().requires_grad_()
        loss = fn(x, old, adv, mask)
        results.append((loss.detach(), torch.autograd.grad(loss, x)[0]))
    assert_close(results[0][0], results[1][0])
    assert_close(results[0][1], results[1][1])
    assert (results[0][1] != 0).any()


def _host_syncing_ops(fn, *args) -> set[str]:
    """ATen ops in the forward + backward trace of `fn` whose output needs the data on the host: a value read
    (`.item()`, `_local_scalar_dense`) or a data-dependent shape (`nonzero`, boolean-mask indexing)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fwd_bwd(logp, old, adv):
        loss = fn(logp, old, adv)
        return loss, torch.autograd.grad(loss.sum(), logp)[0]

    graph = make_fx(fwd_bwd, tracing_mode="fake")(*args).graph
    sync_tags = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}
    return {
        str(node.target)
        for node in graph.nodes
        if node.op == "call_function" and sync_tags & set(getattr(node.target, "tags", ()))
    }


@pytest.mark.slow
def test_forward_and_backward_need_no_host_sync():
    # On a GPU a value read or a data-dependent shape stalls the stream every step. The traced forward + backward
    # must contain none; the authors' boolean-mask assignment shows what the check catches.
    logp, old, adv = random_inputs(batch=4, length=8, dtype=torch.float32, spread=1.5)
    logp.requires_grad_()

    def cegppo(logp, old, adv):
        log_ratio = logp - old  # the trainer's advantages, handed to TRL's surrogate
        weight = preserved_weight(log_ratio.detach(), adv, **LOSS_KWARGS, delta_low=0.5)
        return preserved_advantages(adv, log_ratio, weight)

    def authors(logp, old, adv):
        ratio = torch.exp(logp - old)
        loss = -ratio * adv
        left = (adv < 0) & (ratio < 1 - EPS_LOW)
        loss[left] = (-BETA1 * (1 - EPS_LOW) * adv / ratio.detach() * ratio)[left]
        return loss

    assert _host_syncing_ops(cegppo, logp, old, adv) == set()
    assert "aten.index.Tensor" in _host_syncing_ops(authors, logp, old, adv)
