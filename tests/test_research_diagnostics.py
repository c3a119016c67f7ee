"""`predictor_sums` / `predictor_metrics` (research layer): what `log_predictor` logs, against hand-derived values.

Unless a test says otherwise: epsilon 0.2 both sides (clip range [0.8, 1.2]), beta1 = 0.5, beta2 = 0.75, delta = 2.5.
"""

from __future__ import annotations

import math

import torch

from cegppo_trl.loss import cegppo_regions, preserved_weight
from cegppo_trl.research.diagnostics import predictor_metrics, predictor_sums, side_bound

BOUNDS = dict(epsilon_low=0.2, epsilon_high=0.2)


def sums(log_ratio, advantages, mask, *, beta1=0.5, beta2=0.75, delta=2.5, logps=None, entropies=None):
    """`predictor_sums` as the trainer calls it (regions, preserved weight times its side's bound), as floats."""
    regions = cegppo_regions(log_ratio, advantages, **BOUNDS, delta=delta)
    weight = preserved_weight(log_ratio, advantages, **BOUNDS, beta1=beta1, beta2=beta2, regions=regions)
    coefficient = weight * side_bound(log_ratio, regions, **BOUNDS)
    shape = mask.shape
    logps = torch.full(shape, -1.0) if logps is None else logps
    entropies = torch.ones(shape) if entropies is None else entropies
    out = predictor_sums(log_ratio, advantages, mask, regions, coefficient, logps, entropies)
    assert all(x.dim() == 0 for x in out.values())
    return {k: v.item() for k, v in out.items()}


def test_token_level_gradient_weights_match_hand_derivation():
    # Row 0, A = -1: log-ratios -1 (r = 1/e < 0.8: left clip), 0 (r = 1: inside), 1 (r = e > delta 2.5: dual clip).
    # Row 1, A = +2: log-ratios 1 (r = e > 1.2: right clip), -1 (r = 1/e, but A > 0: not clipped), 5 (padding).
    log_ratio = torch.tensor([[-1.0, 0.0, 1.0], [1.0, -1.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    got = sums(log_ratio, torch.tensor([-1.0, 2.0]), mask)
    e = math.e
    # |d loss / d logp|: left 0.5 * 0.8 * 1 = 0.4; inside r|A| = 1; dual 0; right 0.75 * 1.2 * 2 = 1.8;
    # unclipped A > 0 below the range: r|A| = 2/e. Preserved = 0.4 + 1.8. The padding token counts nowhere.
    assert got["tokens"] == 5.0 and got["left_tokens"] == 1.0 and got["right_tokens"] == 1.0
    assert math.isclose(got["ratio"], 1 / e + 1 + e + e + 1 / e, rel_tol=1e-6)
    assert math.isclose(got["preserved_grad_weight"], 2.2, rel_tol=1e-6)
    assert math.isclose(got["grad_weight"], 0.4 + 1 + 0 + 1.8 + 2 / e, rel_tol=1e-6)
    metrics = predictor_metrics(got)
    assert math.isclose(metrics["cegppo/preserved/grad_share"], 2.2 / (3.2 + 2 / e), rel_tol=1e-6)
    assert math.isclose(metrics["cegppo/ratio/mean"], got["ratio"] / 5, rel_tol=1e-6)


def test_sequence_level_ratio_counts_each_sequence_with_tokens_once():
    # GSPO: one (B, 1) log-ratio per sequence. Row 0: r = 1/e, A = -1 -> left clip, weight 0.4 for each of its two
    # tokens. Row 1: r = e, A = 1 -> right clip, but it has no tokens, so it counts nowhere.
    got = sums(
        torch.tensor([[-1.0], [1.0]]), torch.tensor([[-1.0], [1.0]]), torch.tensor([[1.0, 1.0, 0.0], [0.0] * 3])
    )
    assert got["tokens"] == 1.0 and got["left_tokens"] == 2.0 and got["right_tokens"] == 0.0
    assert math.isclose(got["ratio"], 1 / math.e, rel_tol=1e-6)
    assert math.isclose(got["preserved_grad_weight"], 0.8, rel_tol=1e-6)
    assert math.isclose(got["grad_weight"], 0.8, rel_tol=1e-6)


def test_without_delta_no_token_is_dual_clipped_and_without_tokens_nothing_is_logged():
    got = sums(torch.tensor([[5.0]]), torch.tensor([-1.0]), torch.ones(1, 1), delta=None)  # r = e^5, A < 0: r|A|
    assert got["preserved_grad_weight"] == 0.0 and math.isclose(got["grad_weight"], math.exp(5.0), rel_tol=1e-6)
    assert predictor_metrics(sums(torch.tensor([[5.0]]), torch.tensor([-1.0]), torch.zeros(1, 1))) == {}


def test_entropy_predictor_counts_the_tokens_whose_push_raises_entropy_and_sums_the_leading_term():
    # H = 1 nat at every position. Row 0, A = +1: a right-clipped token (log r = 1) with p = 0.1, log p = -2.30 < -H:
    # pushed up, it raises entropy; g = beta2 * 1.2 * A = 0.9, leading term -g p (log p + H) = -0.9 * 0.1 * (-1.303)
    # = +0.1173. Its neighbour inside the range carries no preserved gradient. Row 1, A = -1: a left-clipped token
    # (log r = -1) with p = 0.8, log p = -0.223 > -H: pushed down (g = -0.4), it raises entropy too:
    # 0.4 * 0.8 * 0.777 = +0.2486; a left-clipped token with p = 0.05 (log p < -H) pushed down lowers it:
    # 0.4 * 0.05 * (-3.0 + 1) = -0.0399.
    log_ratio = torch.tensor([[1.0, 0.0], [-1.0, -1.0]])
    advantages = torch.tensor([1.0, -1.0])
    logps = torch.tensor([[0.1, 0.5], [0.8, 0.05]]).log()
    got = sums(log_ratio, advantages, torch.ones(2, 2), delta=None, logps=logps)
    assert (got["right_tokens"], got["right_raise"], got["left_tokens"], got["left_raise"]) == (1, 1, 2, 1)

    def term(g, p):
        return -g * p * (math.log(p) + 1.0)

    expected = term(0.9, 0.1) + term(-0.4, 0.8) + term(-0.4, 0.05)
    assert math.isclose(got["entropy_change"], expected, rel_tol=1e-5)
    metrics = predictor_metrics(got)
    assert metrics["cegppo/predictor/right_raise_frac"] == 1.0 and metrics["cegppo/predictor/left_raise_frac"] == 0.5
    assert math.isclose(metrics["cegppo/predictor/entropy_change"], expected, rel_tol=1e-5)
    # At beta = 0 nothing is preserved: no entropy change is predicted, whatever the shares.
    zero = sums(log_ratio, advantages, torch.ones(2, 2), beta1=0.0, beta2=0.0, delta=None, logps=logps)
    assert zero["entropy_change"] == 0.0
