"""`cegppo_diagnostics` (research layer): the per-region statistics `log_predictor` logs, checked against hand-derived values.

Unless a test says otherwise: epsilon 0.2 both sides (clip range [0.8, 1.2]), beta1 = 0.5, beta2 = 0.75, delta = 2.5.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from cegppo_trl.research.diagnostics import cegppo_diagnostics, combine_diagnostics, diagnostics_metrics

KWARGS = dict(epsilon_low=0.2, epsilon_high=0.2, beta1=0.5, beta2=0.75, delta=2.5)


def named(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    assert all(x.dim() == 0 for x in sums.values())
    return {name: x.item() for name, x in sums.items()}


def test_token_level_sums_per_sequence_shares_and_extremes_match_hand_derivation():
    # Row 0, A = -1: log-ratios -1 (r = 1/e < 0.8: left clip), 0 (r = 1: inside), 1 (r = e > delta 2.5: dual clip).
    # Row 1, A = +2: log-ratios 1 (r = e > 1.2: right clip), -1 (r = 1/e, but A > 0: not clipped), 5 (padding).
    log_ratio = torch.tensor([[-1.0, 0.0, 1.0], [1.0, -1.0, 5.0]])
    advantages = torch.tensor([-1.0, 2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    diag = cegppo_diagnostics(log_ratio, advantages, mask, **KWARGS)
    e = math.e
    # |d loss / d logp|: left 0.5 * 0.8 * 1 = 0.4; inside r|A| = 1; dual 0; right 0.75 * 1.2 * 2 = 1.8;
    # unclipped A > 0 below the range: r|A| = 2/e. Preserved = 0.4 + 1.8.
    expected = dict(
        left=1.0,
        right=1.0,
        dual=1.0,
        ratio=1 / e + 1 + e + e + 1 / e,
        preserved_grad_weight=2.2,
        grad_weight=0.4 + 1 + 0 + 1.8 + 2 / e,
        left_log_ratio=-1.0,  # the one left-clipped token's log r
        tokens=5.0,
        guard=0.0,  # no delta_low
    )
    got = named(diag.sums)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert math.isclose(got[key], value, rel_tol=1e-6), (key, got[key], value)
    # Per-sequence shares of left / right tokens: row 0 1/3 / 0, row 1 0 / 1/2; the smallest left, the largest right.
    assert diag.minima["left_share"].item() == 0.0
    assert_close(diag.maxima["right_share"], torch.tensor(0.5))
    # The padding token's r = e^5 is masked out: max is e, min 1/e.
    assert_close(diag.minima["ratio"], torch.tensor(1 / e))
    assert_close(diag.maxima["ratio"], torch.tensor(e))


def test_masked_out_rows_count_nowhere_and_give_nan_shares():
    # A row whose mask is all zero (a dropped group, or an empty completion) contributes no token to any sum, a NaN
    # per-sequence share (skipped by TRL's nanmin / nanmax) and no ratio extreme.
    log_ratio = torch.tensor([[-1.0, 0.0], [3.0, -3.0]])
    advantages = torch.tensor([-1.0, 1.0])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    diag = cegppo_diagnostics(log_ratio, advantages, mask, **KWARGS)
    got = named(diag.sums)
    assert got["tokens"] == 2.0 and got["left"] == 1.0 and got["right"] == 0.0
    # The empty row is no sequence: the shares are those of row 0 alone (1/2 left, 0 right), not 0 / 0.
    assert diag.minima["left_share"].item() == 0.5 and diag.maxima["right_share"].item() == 0.0
    assert_close(diag.minima["ratio"], torch.tensor(math.exp(-1.0)))
    assert diag.maxima["ratio"].item() == 1.0


def test_sequence_level_ratio_counts_each_sequence_with_tokens_once():
    # GSPO: one (B, 1) log-ratio per sequence. Row 0: r = 1/e, A = -1 -> left clip, kernel weight 0.4; without
    # `weights` the loss is sum(per_token_loss * mask), in which row 0's loss counts once per token: 2 * 0.4.
    # Row 1: r = e, A = 1 -> right clip, but it has no tokens, so it counts nowhere.
    log_ratio = torch.tensor([[-1.0], [1.0]])
    advantages = torch.tensor([[-1.0], [1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    diag = cegppo_diagnostics(log_ratio, advantages, mask, **KWARGS)
    got = named(diag.sums)
    assert got["tokens"] == 1.0 and got["left"] == 1.0 and got["right"] == 0.0
    assert got["left_log_ratio"] == -1.0  # row 0 once; row 1 is right-clipped and has no tokens anyway
    assert math.isclose(got["preserved_grad_weight"], 0.8, rel_tol=1e-6)
    assert math.isclose(got["grad_weight"], 0.8, rel_tol=1e-6)
    assert diag.minima["left_share"].item() == 1.0 and diag.maxima["right_share"].item() == 0.0


def test_without_delta_no_token_is_dual_clipped():
    log_ratio = torch.tensor([[5.0]])  # r = e^5 with A < 0: plain surrogate, weight r|A|
    diag = cegppo_diagnostics(log_ratio, torch.tensor([-1.0]), torch.ones(1, 1), **{**KWARGS, "delta": None})
    got = named(diag.sums)
    assert got["dual"] == 0.0 and got["preserved_grad_weight"] == 0.0
    assert math.isclose(got["grad_weight"], math.exp(5.0), rel_tol=1e-6)


def test_grad_share_weighs_tokens_by_the_factors_the_loss_is_multiplied_by():
    # The trainer multiplies the per-token loss by the off-policy mask, the entropy mask and the vLLM IS ratio
    # before aggregating: the gradient share must be that of the loss the model receives, Σ|∂L/∂logp| over preserved
    # tokens / over all, with L = Σ loss * weights * mask (autograd below). Row 0 (A = -1): left-clipped 1/e, inside,
    # inside; row 1 (A = +1): right-clipped e, inside, padding. The weights silence the inside tokens of row 0 and
    # halve the right-clipped one: unweighted the share would be (0.4 + 0.9) / (0.4 + 2 + 0.9 + 1), weighted it is
    # (0.4 + 0.45) / (0.4 + 0.45 + 1).
    from helpers.reference import reference_loss

    log_ratio = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 3.0]], requires_grad=True)
    advantages = torch.tensor([-1.0, 1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights = torch.tensor([[1.0, 0.0, 0.0], [0.5, 1.0, 1.0]])  # e.g. entropy mask x IS ratio
    kwargs = {**KWARGS, "beta2": 0.75, "delta": None}
    loss = (reference_loss(log_ratio, torch.zeros(()), advantages, **kwargs) * weights * mask).sum()
    (grad,) = torch.autograd.grad(loss, log_ratio)
    preserved = torch.tensor([[True, False, False], [True, False, False]])
    expected = grad.abs()[preserved].sum() / (grad.abs() * mask).sum()
    assert math.isclose(expected.item(), 0.85 / 1.85, rel_tol=1e-6)
    diag = cegppo_diagnostics(log_ratio.detach(), advantages, mask, **kwargs, weights=weights)
    share = diag.sums["preserved_grad_weight"] / diag.sums["grad_weight"]
    assert_close(share, expected)
    unweighted = cegppo_diagnostics(log_ratio.detach(), advantages, mask, **kwargs)
    assert not math.isclose(unweighted.sums["preserved_grad_weight"] / unweighted.sums["grad_weight"], share.item())


def test_combine_diagnostics_adds_the_sums_and_takes_the_extremes_over_processes():
    # Process 0: one left-clipped token (log r = -1, A = -1); process 1: one right-clipped token (log r = 1, A = +1).
    mine = cegppo_diagnostics(torch.tensor([[-1.0]]), torch.tensor([-1.0]), torch.ones(1, 1), **KWARGS)
    other = cegppo_diagnostics(torch.tensor([[1.0]]), torch.tensor([1.0]), torch.ones(1, 1), **KWARGS)
    other_local = torch.stack([*other.sums.values(), *other.minima.values(), *(-x for x in other.maxima.values())])
    sums, minima, maxima = combine_diagnostics(mine, lambda local: torch.cat([other_local, local]))
    assert sums["tokens"] == 2.0 and sums["left"] == 1.0 and sums["right"] == 1.0
    assert minima["ratio"] == pytest.approx(math.exp(-1)) and maxima["ratio"] == pytest.approx(math.e)
    assert minima["left_share"] == 0.0 and maxima["right_share"] == 1.0  # per-sequence shares: 1, 0 and 0, 1


def test_entropy_predictor_counts_the_tokens_whose_push_raises_entropy_and_sums_the_leading_term():
    # H = 1 nat at every position. Row 0, A = +1: a right-clipped token (log r = 1) with p = 0.1, log p = -2.30 < -H:
    # pushed up, it raises entropy; g = beta2 * 1.2 * A = 0.9, leading term -g p (log p + H) = -0.9 * 0.1 * (-1.303)
    # = +0.1173. Its neighbour inside the range carries no preserved gradient. Row 1, A = -1: a left-clipped token
    # (log r = -1) with p = 0.8, log p = -0.223 > -H: pushed down (g = -0.4), it raises entropy too:
    # 0.4 * 0.8 * 0.777 = +0.2486; a left-clipped token with p = 0.05 (log p < -H) pushed down lowers it:
    # -0.4 * ... = 0.4 * 0.05 * (-3.0 + 1) = -0.0399.
    log_ratio = torch.tensor([[1.0, 0.0], [-1.0, -1.0]])
    advantages = torch.tensor([1.0, -1.0])
    logps = torch.tensor([[0.1, 0.5], [0.8, 0.05]]).log()
    entropies = torch.ones(2, 2)
    kwargs = {**KWARGS, "beta2": 0.75, "delta": None}
    diag = cegppo_diagnostics(log_ratio, advantages, torch.ones(2, 2), **kwargs, logps=logps, entropies=entropies)
    sums = named(diag.sums)
    assert (sums["right_tokens"], sums["right_raise"], sums["left_tokens"], sums["left_raise"]) == (1, 1, 2, 1)

    def term(g, p):
        return -g * p * (math.log(p) + 1.0)

    expected = term(0.9, 0.1) + term(-0.4, 0.8) + term(-0.4, 0.05)
    assert math.isclose(sums["entropy_change"], expected, rel_tol=1e-5)
    assert sums["entropy"] == 4.0 and sums["entropy_tokens"] == 4.0
    metrics = diagnostics_metrics(*combine_diagnostics(diag, lambda local: local))
    assert metrics["cegppo/predictor/right_raise_frac"] == 1.0 and metrics["cegppo/predictor/left_raise_frac"] == 0.5
    assert math.isclose(metrics["cegppo/predictor/entropy_change"], expected, rel_tol=1e-5)
    # At beta = 0 nothing is preserved: no entropy change is predicted, whatever the shares.
    zero = cegppo_diagnostics(log_ratio, advantages, torch.ones(2, 2), **{**kwargs, "beta1": 0.0, "beta2": 0.0},
                              logps=logps, entropies=entropies)  # fmt: skip
    assert named(zero.sums)["entropy_change"] == 0.0
