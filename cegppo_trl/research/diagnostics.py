"""The entropy studies' per-token instruments: which way a preserved push moves entropy, the `gppo_beta_rule="entropy"`
weights, and the per-micro-batch predictor `log_predictor` logs (`ResearchCEGPPOTrainer`; the core never computes
them).
"""

from __future__ import annotations

import torch

from ..loss import CEGPPORegions, _as_rows, preserved_weight


def push_up_raises_entropy(logps: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
    """Per token, whether raising its log-probability raises its position's entropy, to first order in one logit:
    ``log p < -H`` (a push ``g`` moves the entropy by about ``-g * p * (log p + H)``). Pushing it down does the
    opposite. The predictor, `gppo_beta_rule="entropy"` and the token-class study all use this one definition."""
    return logps < -entropies


def entropy_rule_weight(log_ratio, advantages, regions: CEGPPORegions, logps, entropies, *, beta1: float,
                        beta2: float, **bounds) -> torch.Tensor:  # fmt: skip
    """`loss.preserved_weight` with each beta assigned by what the token's push does to its position's entropy instead
    of by its clip side: tokens whose push raises entropy (`push_up_raises_entropy` for right-clipped ones, its
    negation for left-clipped ones) get `beta2`, the others `beta1`. Not the paper's rule.

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


def side_bound(log_ratio, regions: CEGPPORegions, epsilon_low: float, epsilon_high: float) -> torch.Tensor:
    """The clip bound of each token's side: ``1 - eps_l`` where left-clipped, ``1 + eps_h`` elsewhere."""
    return torch.where(regions.left, log_ratio.new_tensor(1 - epsilon_low), log_ratio.new_tensor(1 + epsilon_high))


@torch.no_grad()
def predictor_sums(log_ratio, advantages, mask, regions: CEGPPORegions, coefficient, logps,
                   entropies) -> dict[str, torch.Tensor]:  # fmt: skip
    """One micro-batch's sums (0-d tensors, added over processes) for `predictor_metrics`.

    A token's gradient weight ``|d loss / d logp|`` is ``|A| r`` where PPO's clip keeps it, 0 where it drops it, plus
    ``|A| * coefficient`` (the preserved part); ``grad_weight`` and ``preserved_grad_weight`` sum them. The predictor
    (first order, one logit at a time): a right-clipped token (pushed up) raises entropy iff ``log p < -H``, a
    left-clipped one (pushed down) iff ``log p > -H``; ``entropy_change`` sums ``-g * p * (log p + H)`` over preserved
    tokens with ``g = A * coefficient`` (per unit learning rate in logit space, without the rest of the softmax).

    Args:
        log_ratio: ``log r``, ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio (then `tokens` and `ratio` count a
            sequence with tokens once).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` loss tokens.
        regions: `loss.cegppo_regions` of the inputs.
        coefficient: ``|d loss / d logp| / |A|`` on preserved tokens (the preserved weight times `side_bound`).
        logps, entropies: ``(B, T)`` of the current policy (TRL's, under the sampling temperature).
    """
    dtype = torch.float32 if log_ratio.dtype in (torch.bfloat16, torch.float16) else log_ratio.dtype
    log_ratio, mask, coefficient = log_ratio.to(dtype), mask.to(dtype), coefficient.to(dtype)
    left, right, dual = (x.to(dtype) for x in regions[:3])
    ratio, adv = log_ratio.exp(), _as_rows(advantages, log_ratio)
    count = mask if log_ratio.shape[-1] == mask.shape[-1] else (mask.sum(-1, keepdim=True) > 0).to(dtype)
    preserved = adv.abs() * coefficient
    kept = adv.abs() * ratio * (1 - torch.clamp(left + right + dual, max=1.0))
    logp, H = logps.to(dtype), entropies.to(dtype)
    raises = push_up_raises_entropy(logp, H).to(dtype)
    right, left = right * mask, left * mask
    return {
        "tokens": count.sum(),
        "ratio": (ratio * count).sum(),
        "grad_weight": ((kept + preserved) * mask).sum(),
        "preserved_grad_weight": (preserved * mask).sum(),
        "right_tokens": right.sum(),
        "right_raise": (right * raises).sum(),
        "left_tokens": left.sum(),
        "left_raise": (left * (1 - raises)).sum(),
        "entropy_change": (-(adv * coefficient * mask) * logp.exp() * (logp + H)).sum(),
    }


def predictor_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The logged metrics of `predictor_sums` (over all processes): the preserved share of the gradient weight (what
    PPO's clip would have dropped), the mean ratio, the predictor's shares and entropy change; none without tokens."""
    if not sums["tokens"]:
        return {}
    metrics = {
        "cegppo/preserved/grad_share": sums["preserved_grad_weight"] / max(sums["grad_weight"], 1e-12),
        "cegppo/ratio/mean": sums["ratio"] / sums["tokens"],
        "cegppo/predictor/entropy_change": sums["entropy_change"],
    }
    for side in ("right", "left"):
        if sums[f"{side}_tokens"] > 0:
            metrics[f"cegppo/predictor/{side}_raise_frac"] = sums[f"{side}_raise"] / sums[f"{side}_tokens"]
    return metrics
