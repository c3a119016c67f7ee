"""The CE-GPPO per-token objective, as a pure function (no trainer state).

Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
Reinforcement Learning", ACL 2026 (arXiv:2509.20712), Eq. 8.

Per token, with ratio ``r = exp(logp - old_logp)`` and advantage ``A`` (the loss is minimised):

========================  ============================  ==================================
region                    forward value                 gradient w.r.t. ``logp``
========================  ============================  ==================================
``A < 0, r < 1 - eps_l``  ``-beta1 * (1 - eps_l) * A``  ``-beta1 * (1 - eps_l) * A``
``A > 0, r > 1 + eps_h``  ``-beta2 * (1 + eps_h) * A``  ``-beta2 * (1 + eps_h) * A``
``A < 0, r > delta``      ``-delta * A``                ``0`` (dual clip)
everything else           ``-r * A``                    ``-r * A``
========================  ============================  ==================================

The paper writes the clipped branches as ``beta * bound * A * r / sg(r)``, which is ``inf / inf = NaN`` once ``r``
overflows. Here the forward pass computes the value and the per-token gradient weight directly, so nothing is ever
divided by ``r`` and only one ``(B, T)`` tensor is saved for backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def _broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # (B,) -> (B, 1); (B, 1) and (B, T) pass through and broadcast against (B, T).
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages


def _ratio_and_advantages(
    per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # The ratio in fp32 even for bf16 log-probs (bf16 has 8 mantissa bits: r would round to 1 +- 0.004).
    dtype = torch.promote_types(per_token_logps.dtype, torch.float32)
    adv = _broadcast_advantages(advantages, per_token_logps).to(dtype)  # [B, 1] or [B, T]
    if per_token_logps.dtype == dtype:
        log_ratio = per_token_logps - old_per_token_logps.to(dtype)  # [B, T]
    else:  # bf16 / fp16 log-probs: one fp32 copy, subtracted in place
        log_ratio = per_token_logps.to(dtype).sub_(old_per_token_logps)
    return log_ratio.exp_(), adv  # the ratio, inf past a log-ratio of ~88.7 in fp32


def _regions(
    ratio: torch.Tensor, adv: torch.Tensor, epsilon_low: float, epsilon_high: float, delta: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    # Each clip test applies to one sign of A, so its bound is per row ([B, 1]): one comparison per token.
    inf = torch.inf
    left = ratio < _per_row(adv < 0, 1 - epsilon_low, -inf, adv)  # [B, T] NA&LP: gradient scaled by beta1
    right = ratio > _per_row(adv > 0, 1 + epsilon_high, inf, adv)  # [B, T] PA&LP: gradient scaled by beta2
    # A < 0 above delta: constant, no gradient. Disjoint from `left` because delta > 1.
    dual = None if delta is None else ratio > _per_row(adv < 0, delta, inf, adv)  # [B, T]
    return left, right, dual


def _per_row(condition: torch.Tensor, if_true: float, otherwise: float, like: torch.Tensor) -> torch.Tensor:
    # A bound per advantage entry, in the ratio's dtype (a float32 0.8 is not a float64 0.8).
    return torch.where(condition, like.new_tensor(if_true), like.new_tensor(otherwise))


@torch.no_grad()
def cegppo_regions(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boolean masks of the three special regions of the CE-GPPO objective.

    Args:
        log_ratio: ``logp - old_logp``, shape ``(B, T)`` (or ``(B, 1)`` for sequence-level ratios).
        advantages: shape ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low: lower clip range ``eps_l``.
        epsilon_high: upper clip range ``eps_h``.
        delta: dual-clip constant ``c`` for negative advantages, or ``None``.

    Returns:
        ``(left, right, dual)``: NA&LP tokens below ``1 - eps_l`` (gradient scaled by ``beta1``), PA&LP tokens above
        ``1 + eps_h`` (gradient scaled by ``beta2``), and negative-advantage tokens above ``delta`` (no gradient).
        Each has the broadcast shape of ``log_ratio`` and ``advantages``.
    """
    ratio, adv = _ratio_and_advantages(log_ratio, log_ratio.new_zeros(()), advantages)
    left, right, dual = _regions(ratio, adv, epsilon_low, epsilon_high, delta)
    return left, right, torch.zeros_like(left) if dual is None else dual


def _value_and_grad_weight(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The table of the module docstring, row by row: the loss value and d(value)/d(logp) per token."""
    ratio, adv = _ratio_and_advantages(per_token_logps, old_per_token_logps, advantages)
    regions = _regions(ratio, adv, epsilon_low, epsilon_high, delta)
    return _table(ratio, adv, *regions, epsilon_low, epsilon_high, beta1, beta2, delta)


def _table(ratio, adv, left, right, dual, epsilon_low, epsilon_high, beta1, beta2, delta):
    # Everything else: -r * A, whose gradient w.r.t. logp is again -r * A. r is capped per row: at delta for A < 0
    # (the dual clip's constant -delta * A; infinite without one) and at the largest finite float for A >= 0, so
    # that A == 0 gives exactly 0 where r overflowed (inf * 0 would be NaN). A NaN log-prob stays NaN.
    cap = _per_row(adv < 0, torch.inf if delta is None else delta, torch.finfo(adv.dtype).max, adv)  # [B, 1]
    value = torch.minimum(ratio, cap).mul_(-adv)  # [B, T]
    # Clipped tokens: the constant -beta * bound * A is both the value and the gradient weight (the paper's
    # beta * bound * A * r / sg(r), evaluated without dividing by r).
    # `left` needs A < 0 and `right` A > 0, so one select with the row's constant serves both.
    bound_loss = torch.where(adv < 0, -beta1 * (1 - epsilon_low) * adv, -beta2 * (1 + epsilon_high) * adv)  # [B, 1]
    value = torch.where(left | right, bound_loss, value)  # [B, T]
    if dual is None:
        return value, value
    return value, torch.where(dual, 0.0, value)  # dual clip: the value above, no gradient


# Names of `CEGPPODiagnostics.sums`, in order. Token counts and sums over the (masked) completion tokens.
DIAGNOSTIC_SUMS = (
    "left", "right", "dual", "ratio", "preserved_grad_weight", "grad_weight", "left_log_ratio", "tokens"
)  # fmt: skip


class CEGPPODiagnostics(NamedTuple):
    """Local statistics of one micro-batch (one process): reduce `sums` with a sum, gather the other two.

    Attributes:
        sums: ``(8,)``, see `DIAGNOSTIC_SUMS`: tokens in each region, sum of the ratio, sum of ``|d loss / d logp|``
            over preserved (left/right-clipped) tokens and over all tokens, sum of ``log r`` over left-clipped tokens
            (how far β1 has pushed them below the rollout policy), and the token count.
        per_sequence: ``(B, 2)``, share of each sequence's tokens in the left / right region (NaN for a sequence
            without tokens), for TRL's ``clip_ratio/low_min`` and ``clip_ratio/high_max``.
        extremes: ``(2,)``, ``(min ratio, -max ratio)`` (``inf`` without tokens): gather, then take the minimum.
    """

    sums: torch.Tensor
    per_sequence: torch.Tensor
    extremes: torch.Tensor


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
) -> CEGPPODiagnostics:
    """What the CE-GPPO loss did to one micro-batch: regions, ratio, and the gradient weight it preserved.

    The gradient weight ``|d loss / d logp|`` is the kernel's own (`_value_and_grad_weight`), so its share on
    preserved tokens is exactly what PPO's clip would have thrown away.

    Args:
        log_ratio: ``logp - old_logp``, ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio (then a sequence counts
            once, if it has any token in `mask`).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` completion tokens that enter the loss (0 for padding and for dropped groups).
        epsilon_low, epsilon_high, beta1, beta2, delta: as in `cegppo_per_token_loss`.

    Returns:
        `CEGPPODiagnostics`.
    """
    ratio, adv = _ratio_and_advantages(log_ratio, log_ratio.new_zeros(()), advantages)
    left, right, dual = _regions(ratio, adv, epsilon_low, epsilon_high, delta)
    # The kernel's own gradient weight, from the same ratio and regions.
    _, grad_weight = _table(ratio, adv, left, right, dual, epsilon_low, epsilon_high, beta1, beta2, delta)
    grad_weight = grad_weight.abs()  # [B, T]
    if left.shape[-1] == 1 and mask.shape[-1] != 1:  # sequence-level ratio: one entry per sequence with tokens
        weight = (mask.sum(-1, keepdim=True) > 0).to(ratio.dtype)  # [B, 1]
        grad_weight = (grad_weight * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    else:
        weight = mask.to(ratio.dtype)  # [B, T]
    left, right = left.to(ratio.dtype), right.to(ratio.dtype)
    dual = torch.zeros_like(left) if dual is None else dual.to(ratio.dtype)
    preserved = (left + right) * grad_weight  # the regions are disjoint
    left_log_ratio = left * log_ratio.to(ratio.dtype)
    sums = torch.stack(
        [(x * weight).sum() for x in (left, right, dual, ratio, preserved, grad_weight, left_log_ratio)]
        + [weight.sum()]
    )  # [8]
    tokens_per_sequence = weight.sum(-1)  # [B]
    per_sequence = torch.stack([(left * weight).sum(-1), (right * weight).sum(-1)], dim=1) / tokens_per_sequence[
        :, None
    ]  # [B, 2]; 0 / 0 = NaN for a sequence without tokens
    valid = weight.bool()
    extremes = torch.stack(
        [torch.where(valid, ratio, torch.inf).amin(), -torch.where(valid, ratio, -torch.inf).amax()]
    )  # [2]
    return CEGPPODiagnostics(sums, per_sequence, extremes)


class _CEGPPOLoss(torch.autograd.Function):
    """Single pass: forward returns the value and saves only d(value)/d(logp); backward is one multiply."""

    @staticmethod
    def forward(ctx, per_token_logps, old_per_token_logps, advantages, epsilon_low, epsilon_high, beta1, beta2, delta):
        value, grad_weight = _value_and_grad_weight(
            per_token_logps, old_per_token_logps, advantages, epsilon_low, epsilon_high, beta1, beta2, delta
        )
        ctx.save_for_backward(grad_weight)
        ctx.logp_dtype = per_token_logps.dtype
        ctx.logp_shape = per_token_logps.shape
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable  # the saved weight is a constant: no double backward
    def backward(ctx, grad_value):
        (grad_weight,) = ctx.saved_tensors
        grad_logps = grad_value * grad_weight
        if grad_logps.shape != ctx.logp_shape:  # (B, 1) sequence ratio broadcast against (B, T) advantages
            grad_logps = grad_logps.sum_to_size(ctx.logp_shape)
        # Old log-probs and advantages are constants of the surrogate, as in PPO.
        return grad_logps.to(ctx.logp_dtype), None, None, None, None, None, None, None


def cegppo_per_token_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None = None,
) -> torch.Tensor:
    """Per-token CE-GPPO loss (to be minimised), before masking and aggregation.

    Implements Eq. 8 of CE-GPPO (arXiv:2509.20712) with the authors' dual clip: tokens outside the PPO clip range
    keep a bounded gradient, ``beta1 * (1 - epsilon_low) * A`` for negative-advantage tokens below the range (larger
    ``beta1`` -> entropy falls faster) and ``beta2 * (1 + epsilon_high) * A`` for positive-advantage tokens above it
    (larger ``beta2`` -> entropy falls slower). ``beta1 = beta2 = 0`` gives the PPO-clip gradient, ``beta1 = beta2 =
    1`` the original GPPO (Klear-Reasoner), whose forward value equals PPO's.

    Only ``per_token_logps`` receives a gradient; ``old_per_token_logps`` and ``advantages`` are constants.

    Args:
        per_token_logps: log-probabilities under the current policy, shape ``(B, T)`` (``(B, 1)`` for a
            sequence-level ratio). Any float dtype; the ratio is computed in at least fp32.
        old_per_token_logps: log-probabilities under the sampling (old) policy, same shape (or anything that
            broadcasts to it, e.g. a 0-d zero when ``per_token_logps`` already holds log-ratios).
        advantages: shape ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low: lower clip range (``1 - epsilon_low`` is the left bound), in ``(0, 1)``.
        epsilon_high: upper clip range (``1 + epsilon_high`` is the right bound), ``> 0``.
        beta1: gradient scale of negative-advantage tokens clipped on the left (NA&LP), ``>= 0``.
        beta2: gradient scale of positive-advantage tokens clipped on the right (PA&LP), ``>= 0``.
        delta: dual-clip constant ``c > 1``: negative-advantage tokens with ``r > c`` get the constant ``-c * A``
            and no gradient. ``None`` disables it.

    Returns:
        The per-token loss, shape ``broadcast(per_token_logps, advantages)``, dtype at least fp32.
    """
    return _CEGPPOLoss.apply(
        per_token_logps, old_per_token_logps, advantages, epsilon_low, epsilon_high, beta1, beta2, delta
    )
