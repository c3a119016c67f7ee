"""The entropy studies' per-token instruments: which way a preserved push moves entropy, the `gppo_beta_rule="entropy"`
weights, and the diagnostics of one micro-batch (the predictor, the share of the gradient PPO's clip would drop).

Research only: `ResearchCEGPPOTrainer` computes them when asked (`gppo_beta_rule`, `log_predictor`); the core trainer
never does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..loss import CEGPPORegions, _as_rows, cegppo_regions, preserved_weight


def push_up_raises_entropy(logps: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
    """Per token, whether raising its log-probability raises its position's entropy, to first order in one logit:
    ``log p < -H`` (the entropy moves by about ``-g * p * (log p + H)`` for a push ``g``). Pushing it down does the
    opposite. The predictor, `beta_rule="entropy"` and the token-class study all use this one definition."""
    return logps < -entropies


def entropy_rule_weight(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    regions: CEGPPORegions,
    logps: torch.Tensor,
    entropies: torch.Tensor,
    *,
    beta1: float,
    beta2: float,
    **bounds,
) -> torch.Tensor:
    """`loss.preserved_weight` with each beta assigned by what the token's push does to its position's entropy to
    first order instead of by its clip side: a right-clipped token (pushed up) raises entropy iff ``log p < -H``, a
    left-clipped one (pushed down) iff ``log p > -H``; those get `beta2`, the others `beta1`. So `beta2` raises entropy
    and `beta1` lowers it whatever the model's clipped tokens are. Not the paper's rule.

    Args:
        log_ratio, advantages, regions: as in `loss.preserved_weight` (token-level ratios only).
        logps, entropies: ``(B, T)`` of the current policy.
        beta1, beta2: the step's betas.
        **bounds: `epsilon_low`, `epsilon_high`, `delta_low`, `delta_low_mode`.
    """
    if logps.shape != regions.left.shape:
        raise ValueError("`gppo_beta_rule='entropy'` needs per-token `logps` and `entropies` of the ratio's shape.")
    up_raises = push_up_raises_entropy(logps, entropies)
    b1, b2 = log_ratio.new_tensor(beta1), log_ratio.new_tensor(beta2)
    left = preserved_weight(log_ratio, advantages, **bounds, beta1=1.0, beta2=0.0, regions=regions)  # guard in it
    right = torch.where(regions.right, torch.where(up_raises, b2, b1), log_ratio.new_zeros(()))
    return torch.where(regions.left, left * torch.where(up_raises, b1, b2), right)


def preserved_coefficient(log_ratio, advantages, regions, *, epsilon_low, epsilon_high, beta1, beta2, delta_low=None,
                          delta_low_mode="cutoff", **_) -> torch.Tensor:  # fmt: skip
    """``|d loss / d logp| / |A|`` on preserved tokens: `loss.preserved_weight` times its side's bound."""
    weight = preserved_weight(log_ratio, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high, beta1=beta1,
                              beta2=beta2, delta_low=delta_low, delta_low_mode=delta_low_mode, regions=regions)  # fmt: skip
    return weight * side_bound(log_ratio, regions, epsilon_low, epsilon_high)


def side_bound(log_ratio, regions, epsilon_low: float, epsilon_high: float) -> torch.Tensor:
    """The clip bound of each token's side: ``1 - eps_l`` where left-clipped, ``1 + eps_h`` elsewhere."""
    return torch.where(regions.left, log_ratio.new_tensor(1 - epsilon_low), log_ratio.new_tensor(1 + epsilon_high))


class CEGPPODiagnostics(NamedTuple):
    """Local statistics of one micro-batch (one process), each a 0-d tensor, grouped by how they combine across
    processes: add the `sums`, take the minimum of the `minima` and the maximum of the `maxima`.

    Attributes:
        sums: over the (masked) completion tokens: ``tokens``; tokens in each region, ``left``, ``right``, ``dual``,
            ``guard``; ``ratio``, the sum of ``r``; ``grad_weight`` and ``preserved_grad_weight``, the sum of
            ``|d loss / d logp|`` over all tokens and over preserved (left/right-clipped) ones; ``left_log_ratio``,
            the sum of ``log r`` over left-clipped tokens; with `entropies`: ``entropy`` and ``entropy_tokens`` (the
            token-weighted entropy), and the predictor's ``right_raise``, ``left_raise`` (preserved tokens whose push
            raises entropy) and ``entropy_change`` (their first-order entropy change per unit learning rate).
        minima: ``ratio``, the smallest ``r``; ``left_share``, the smallest share of left-clipped tokens in a
            sequence. ``inf`` without tokens.
        maxima: ``ratio``, the largest ``r``; ``right_share``, the largest share of right-clipped tokens in a
            sequence. ``-inf`` without tokens.
    """

    sums: dict[str, torch.Tensor]
    minima: dict[str, torch.Tensor]
    maxima: dict[str, torch.Tensor]


@torch.no_grad()
def cegppo_diagnostics(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None = None,
    delta_low: float | None = None,
    delta_low_mode: str = "cutoff",
    weights: torch.Tensor | None = None,
    logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    regions: CEGPPORegions | None = None,
    coefficient: torch.Tensor | None = None,
) -> CEGPPODiagnostics:
    """What the CE-GPPO loss did to one micro-batch: regions, ratio, the gradient weight it preserved, and which way
    the preserved gradient pushes entropy.

    The gradient weight ``|d loss / d logp|`` of a token is ``|A|`` times PPO's (``r`` where the clip keeps the
    token, 0 where it drops it) plus `preserved_coefficient`, times the token's coefficient in the loss (`weights`):
    its share on preserved tokens is the share of the model's policy gradient that PPO's clip would have thrown away.

    The entropy predictor (first order, one logit at a time): pushing a token's log-probability up by ``g`` moves the
    position's entropy by about ``-g * p * (log p + H)``, so a right-clipped token (pushed up) raises entropy iff
    ``log p < -H`` and a left-clipped one (pushed down) iff ``log p > -H``. ``entropy_change`` sums that leading term
    over preserved tokens with ``g`` their preserved gradient (``A * coefficient * weight``), per unit learning rate in
    logit space; it leaves out the rest of the softmax (the ``sum_b p_b^2 (log p_b + H)`` term), which needs the whole
    vocabulary.

    Args:
        log_ratio: ``logp - old_logp``, ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio (then a sequence counts
            once in the region sums, if it has any token in `mask`).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` completion tokens that enter the loss (0 for padding and for dropped groups).
        epsilon_low, epsilon_high, beta1, beta2, delta, delta_low, delta_low_mode: as in `cegppo_objective`.
        weights: non-negative ``d loss / d per_token_loss`` of each token, broadcastable to ``(B, T)``
            (TRL's aggregation weights times its masks, where known). None: 1 (the trainer's default).
        logps, entropies: ``(B, T)`` current log-probabilities and entropies (TRL's, under the sampling
            temperature), for the entropy sums and the predictor; None leaves those sums out.
        regions, coefficient: `cegppo_regions` and `preserved_coefficient` of the same inputs, if at hand.

    Returns:
        `CEGPPODiagnostics`.
    """
    log_ratio = log_ratio.float() if log_ratio.dtype in (torch.bfloat16, torch.float16) else log_ratio
    dtype = log_ratio.dtype
    mask = mask.to(dtype)
    settings = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta_low=delta_low)
    if regions is None:
        regions = cegppo_regions(log_ratio, advantages, **settings, delta=delta)
    if coefficient is None:
        coefficient = preserved_coefficient(log_ratio, advantages, regions, **settings, beta1=beta1, beta2=beta2,
                                            delta_low_mode=delta_low_mode)  # fmt: skip
    left, right, dual, guard = (x.to(dtype) for x in regions)
    coefficient = coefficient.to(dtype)
    ratio, adv = torch.exp(log_ratio), _as_rows(advantages, log_ratio)
    dropped = torch.clamp(left + right + dual, max=1.0)  # no PPO gradient there
    grad_weight = adv.abs() * (ratio * (1 - dropped) + coefficient)  # [B, T] or [B, 1]
    preserved = adv.abs() * coefficient
    token_weight = mask if weights is None else weights * mask  # [B, T]: d loss / d per_token_loss
    if left.shape[-1] == 1 and mask.shape[-1] != 1:  # sequence-level ratio: one entry per sequence with tokens
        count = (mask.sum(-1, keepdim=True) > 0).to(dtype)  # [B, 1]
        total_weight = token_weight.sum(-1, keepdim=True)  # [B, 1]: the sequence's total
        # log r is the mean of the tokens' log-ratios: each token gets 1 / |o_i| of the sequence's gradient
        token_share = total_weight / mask.sum(-1, keepdim=True).clamp(min=1.0) * mask  # [B, T]
    else:
        count, total_weight, token_share = mask, token_weight, token_weight
    shape = torch.broadcast_shapes(ratio.shape, adv.shape, count.shape)
    # The sums in two stacks, one reduction each: entries counted once each, and gradient weights.
    counted = {
        "tokens": torch.ones_like(ratio),
        "left": left,
        "right": right,
        "dual": dual,
        "guard": guard,
        "ratio": ratio,
        "left_log_ratio": left * log_ratio,
    }
    stacked = torch.stack([x.expand(shape) for x in counted.values()])  # [K, B, T] or [K, B, 1]
    sums = dict(zip(counted, (stacked * count).sum(dim=(1, 2)).unbind()))
    weighted = torch.stack([(grad_weight * total_weight).expand(shape), (preserved * total_weight).expand(shape)])
    sums.update(zip(("grad_weight", "preserved_grad_weight"), weighted.sum(dim=(1, 2)).unbind()))
    if entropies is not None and logps is not None:
        H, logp = entropies.detach().to(dtype), logps.detach().to(dtype)  # [B, T]
        raises = push_up_raises_entropy(logp, H).to(dtype)  # up: raises the entropy; down: lowers it
        right_tokens, left_tokens = right * mask, left * mask
        per_token = {
            "entropy": H * mask,
            "entropy_tokens": mask,
            "right_raise": right_tokens * raises,
            "right_tokens": right_tokens,
            "left_raise": left_tokens * (1 - raises),
            "left_tokens": left_tokens,
            # d logp = +A * coefficient * weight per unit learning rate (gradient descent on the loss)
            "entropy_change": -(adv * coefficient * token_share) * logp.exp() * (logp + H),
        }
        stacked = torch.stack([x.expand_as(mask) for x in per_token.values()])  # [K, B, T]
        sums.update(zip(per_token, stacked.sum(dim=(1, 2)).unbind()))
    tokens_per_sequence = count.sum(-1)  # [B]; 0 / 0 = NaN below for a sequence without tokens, ignored
    left_share = (left * count).sum(-1) / tokens_per_sequence  # [B]
    right_share = (right * count).sum(-1) / tokens_per_sequence  # [B]
    valid = count.bool()
    minima = dict(
        ratio=torch.where(valid, ratio, torch.inf).amin(),
        left_share=torch.where(left_share.isnan(), torch.inf, left_share).amin(),
    )
    maxima = dict(
        ratio=torch.where(valid, ratio, -torch.inf).amax(),
        right_share=torch.where(right_share.isnan(), -torch.inf, right_share).amax(),
    )
    return CEGPPODiagnostics(sums, minima, maxima)


def combine_diagnostics(
    diagnostics: CEGPPODiagnostics, gather: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """`(sums, minima, maxima)` of `cegppo_diagnostics` over all processes, from one `gather` of the named local values
    and one transfer to the host (a device-to-host synchronisation on a GPU).

    Args:
        diagnostics: this process's `cegppo_diagnostics`.
        gather: concatenates a 1-D tensor over the processes (`accelerator.gather`; the identity on one process).
    """
    sums, minima, maxima = diagnostics
    local = torch.stack([*sums.values(), *minima.values(), *(-x for x in maxima.values())])  # [n]
    gathered = gather(local).view(-1, local.numel())  # [processes, n]
    n_sums = len(sums)
    values = torch.cat([gathered[:, :n_sums].sum(0), gathered[:, n_sums:].amin(0)]).tolist()
    combined = dict(zip([*sums, *(f"min/{k}" for k in minima), *(f"max/{k}" for k in maxima)], values))
    return (
        {k: combined[k] for k in sums},
        {k: combined[f"min/{k}"] for k in minima},
        {k: -combined[f"max/{k}"] for k in maxima},
    )


def diagnostics_metrics(
    sums: dict[str, float], minima: dict[str, float], maxima: dict[str, float]
) -> dict[str, float]:
    """The research metrics of one micro-batch from its combined diagnostics (`combine_diagnostics`): the share of
    the gradient on preserved tokens, the mean ratio and the entropy predictor; none when it holds no token. The
    trainer logs the clip fractions (TRL's `clip_ratio/*`), the ratio's extremes and the left drift itself.

    Args:
        sums, minima, maxima: `combine_diagnostics`' values.
    """
    count = sums["tokens"]
    if count == 0:  # nothing to measure
        return {}
    # Share of the gradient weight |d loss / d logp| on preserved tokens: what PPO's clip would have dropped.
    metrics = {"cegppo/preserved/grad_share": sums["preserved_grad_weight"] / max(sums["grad_weight"], 1e-12)}
    metrics["cegppo/ratio/mean"] = sums["ratio"] / count
    if "entropy_change" in sums:  # the entropy predictor (`cegppo_diagnostics`); a share only where it has tokens
        for side in ("right", "left"):
            if sums[f"{side}_tokens"] > 0:
                metrics[f"cegppo/predictor/{side}_raise_frac"] = sums[f"{side}_raise"] / sums[f"{side}_tokens"]
        metrics["cegppo/predictor/entropy_change"] = sums["entropy_change"]
    return metrics
