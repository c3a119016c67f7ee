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

import torch


def _broadcast_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # (B,) -> (B, 1); (B, 1) and (B, T) pass through and broadcast against (B, T).
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages


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
    advantages = _broadcast_advantages(advantages, log_ratio)
    ratio = torch.exp(log_ratio.to(torch.promote_types(log_ratio.dtype, torch.float32)))  # [B, T], as in the loss
    left = (advantages < 0) & (ratio < 1 - epsilon_low)
    right = (advantages > 0) & (ratio > 1 + epsilon_high)
    if delta is None:
        dual = torch.zeros_like(left)
    else:
        dual = (advantages < 0) & (ratio > delta)
    return left, right, dual


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
    # Regions are selected by arithmetic on 0/1 float masks (x * 1 + 0 * c, 0 * x + c), in place, not with
    # `torch.where`: on CPU, `where`, `masked_fill` and bool-valued comparisons run 5-30x slower per element than
    # vectorised arithmetic, and each fresh (B, T) buffer costs page faults (benchmarks/bench_loss.py). Every select
    # is exact, so the result is the table's `torch.where` expression bit for bit (tests/test_loss.py, float64).

    # The ratio in fp32 even for bf16 log-probs (bf16 has 8 mantissa bits: r would round to 1 +- 0.004).
    dtype = torch.promote_types(per_token_logps.dtype, torch.float32)
    adv = _broadcast_advantages(advantages, per_token_logps).to(dtype)  # [B, 1] or [B, T]
    shape = torch.broadcast_shapes(per_token_logps.shape, adv.shape)
    if torch.promote_types(old_per_token_logps.dtype, dtype) != dtype:
        old_per_token_logps = old_per_token_logps.to(dtype)
    ratio = torch.empty(shape, dtype=dtype, device=per_token_logps.device)  # [B, T]
    if torch.broadcast_shapes(per_token_logps.shape, old_per_token_logps.shape) == shape:
        ratio.copy_(per_token_logps).sub_(old_per_token_logps).exp_()  # inf once the log-ratio passes ~88.7 (fp32)
    else:  # a (B, 1) sequence ratio against (B, T) advantages: one exp per sequence
        ratio.copy_(torch.exp(per_token_logps.to(dtype) - old_per_token_logps))

    # Constants per advantage sign, shaped like the advantages ([B, 1]: negligible). Flipping the sign of r for
    # A < 0 turns both clip tests into one `>`: A > 0 clips r > 1 + eps_high, A < 0 clips -r > -(1 - eps_low).
    # A == 0 goes with A > 0: its value and gradient are 0 in every region, provided r is finite there.
    neg = torch.lt(adv, 0, out=torch.empty_like(adv))  # [B, 1], 1.0 where A < 0
    nonneg = 1 - neg
    sign = nonneg - neg
    threshold = _by_sign(neg, nonneg, -(1 - epsilon_low), 1 + epsilon_high)
    neg_adv = -adv
    bound_loss = _by_sign(neg, nonneg, beta1 * (1 - epsilon_low), beta2 * (1 + epsilon_high)).mul_(neg_adv)
    # Where r is capped: at delta for A < 0 (the dual clip's value is -delta * A), at the largest finite float for
    # A >= 0 (only r = inf changes, and it is right-clipped or has A == 0, so it is multiplied by 0 below). Without
    # a dual clip A < 0 keeps r = inf (cap big / 0 = inf): -r * A = inf is the true value.
    big = torch.finfo(dtype).max
    cap = big / nonneg if delta is None else _by_sign(neg, nonneg, delta, big)

    signed = ratio * sign  # [B, T]
    clipped = torch.gt(signed, threshold, out=torch.empty_like(signed))  # [B, T], 1.0 on left/right-clipped tokens
    torch.minimum(ratio, cap, out=ratio)
    unclipped_neg_adv = torch.addcmul(neg_adv, clipped, adv)  # [B, T], -A off the clip, 0 on it
    value = ratio.mul_(unclipped_neg_adv).addcmul_(clipped, bound_loss)  # [B, T], -r * A or -beta * bound * A
    if delta is None:
        return value, value
    # Dual clip: tokens with A < 0 and r > delta (signed < -delta) keep the constant value and get no gradient.
    keep = signed.ge_(-delta)  # [B, T], 0.0 on dual-clipped tokens
    return value, keep.mul_(value)


def _by_sign(neg: torch.Tensor, nonneg: torch.Tensor, if_negative: float, otherwise: float) -> torch.Tensor:
    # `if_negative` where A < 0, else `otherwise`; one of the two products is exactly 0, so the sum is exact.
    return torch.mul(nonneg, otherwise).add_(neg, alpha=if_negative)


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
