"""The CE-GPPO per-token objective, as pure functions (no trainer state).

Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
Reinforcement Learning", ACL 2026 (arXiv:2509.20712), Eq. 8.

Per token, with ratio ``r = exp(logp - old_logp)`` and advantage ``A`` (the loss is minimised):

==============================  ============================  ============================================
region                          forward value                 gradient w.r.t. ``logp``
==============================  ============================  ============================================
``A < 0, r < 1 - eps_l``        ``-beta1 * (1 - eps_l) * A``  ``-beta1 * (1 - eps_l) * A``
``A > 0, r > 1 + eps_h``        ``-beta2 * (1 + eps_h) * A``  ``-beta2 * (1 + eps_h) * A``
``A < 0, r > delta``            ``-delta * A``                ``0`` (dual clip)
``A < 0, r < delta_low``        ``-beta1 * (1 - eps_l) * A``  ``0`` (left guard, ``"cutoff"``) or
                                                              ``-beta1 * (1 - eps_l) * A * r / delta_low``
                                                              (``"decay"``)
everything else                 ``-r * A``                    ``-r * A``
==============================  ============================  ============================================

`cegppo_objective` is that table as ``torch.where`` selections differentiated by autograd: the definition.
`cegppo_per_token_loss` is the fast path used in training, one pass that computes the value and the per-token gradient
weight directly: it saves ``-A`` and one ``(B, T)`` weight for backward and applies them to the incoming gradient in the
order autograd differentiates the definition (and TRL's ``-min(r * A, clip(r) * A)``). tests/test_loss.py checks that the two are
equal bit for bit, for fp64, fp32 and bf16 inputs (both compute in at least fp32), and that at ``beta1 = beta2 = 0``
the gradient is TRL's bit for bit under any incoming gradient (fp32, fp64). The paper writes the clipped branches as
``beta * bound * A * r / sg(r)``, which is ``inf / inf = NaN`` once ``r`` overflows; neither form here divides by ``r``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

LEFT_GUARD_MODES = ("cutoff", "decay")


def cegppo_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None = None,
    delta_low: float | None = None,
    delta_low_mode: str = "cutoff",
) -> torch.Tensor:
    """The CE-GPPO per-token loss by its definition (the module table); same arguments as `cegppo_per_token_loss`.

    Slow (autograd through every branch) and, like the paper's form, not guarded against an overflowing ``r``; train
    with `cegppo_per_token_loss`, which equals it exactly, in value and gradient, for every input dtype: like it, this
    computes in at least fp32 (bf16 / fp16 inputs are upcast first; the gradient returns in the input's dtype).
    """
    dtype = torch.promote_types(logp.dtype, torch.float32)  # as `_ratio_and_advantages`: a bf16 r is 1 +- 0.004
    logp, old_logp = logp.to(dtype), old_logp.to(dtype)
    A = advantages.to(dtype)
    A = A.unsqueeze(-1) if A.dim() == 1 else A  # [B, 1] or [B, T]
    log_r = logp - old_logp  # [B, T]
    r = torch.exp(log_r)
    na_lp = (A < 0) & (r < 1 - epsilon_low)  # left clip: negative advantage, low probability
    pa_lp = (A > 0) & (r > 1 + epsilon_high)  # right clip: positive advantage, low probability
    keep = torch.ones_like(r)  # share of the left-clipped gradient kept
    if delta_low is not None:  # left guard: how far beta1 may push a token out of the policy
        guarded = 0.0 if delta_low_mode == "cutoff" else r.detach() / delta_low
        keep = torch.where(na_lp & (r < delta_low), guarded, keep)

    def preserved(bound, keep=1.0):  # the paper's -bound * A * r / sg(r): value -bound * A, gradient -bound * keep * A
        # log r - sg(log r) is 0 with gradient 1, so the second term adds nothing to the value (and never divides by r)
        return -A * bound + -A * ((bound * keep) * (log_r - log_r.detach()))

    loss = -r * A
    loss = torch.where(na_lp, preserved(beta1 * (1 - epsilon_low), keep), loss)
    loss = torch.where(pa_lp, preserved(beta2 * (1 + epsilon_high)), loss)
    if delta is not None:  # the authors' dual clip: a constant, no gradient
        loss = torch.where((A < 0) & (r > delta), (-delta * A).expand_as(loss), loss)
    return loss


def check_left_guard(delta_low: float | None, delta_low_mode: str, epsilon_low: float) -> None:
    """Raise `ValueError` unless the left guard's settings are valid: ``0 < delta_low <= 1 - epsilon_low``."""
    if delta_low_mode not in LEFT_GUARD_MODES:
        raise ValueError(f"`delta_low_mode` must be one of {list(LEFT_GUARD_MODES)}, got {delta_low_mode!r}.")
    if delta_low is None:
        return
    valid = isinstance(delta_low, (int, float)) and not isinstance(delta_low, bool) and math.isfinite(delta_low)
    if not (valid and 0 < delta_low <= 1 - epsilon_low):
        raise ValueError(
            f"`delta_low` (the left guard) must be in (0, 1 - epsilon] = (0, {1 - epsilon_low:g}], got {delta_low!r}: "
            "it acts on left-clipped tokens, whose ratio is below 1 - epsilon. E.g. 0.25; None disables it."
        )


# ---------------------------------------------------------------------------------------------------------------------
# The fast path: regions by one comparison per token, then the value and the gradient weight in one pass
# ---------------------------------------------------------------------------------------------------------------------
class CEGPPORegions(NamedTuple):
    """Boolean masks of the special regions, each of the broadcast shape of the ratio and the advantages.

    Attributes:
        left: NA&LP, ``A < 0`` and ``r < 1 - eps_l``: gradient scaled by ``beta1``.
        right: PA&LP, ``A > 0`` and ``r > 1 + eps_h``: gradient scaled by ``beta2``.
        dual: ``A < 0`` and ``r > delta``: constant, no gradient. All False without ``delta`` (None inside the
            kernel, which then skips it).
        guard: ``A < 0`` and ``r < delta_low``, inside `left`: the left guard acts. All False without ``delta_low``
            (None inside the kernel).
    """

    left: torch.Tensor
    right: torch.Tensor
    dual: torch.Tensor | None
    guard: torch.Tensor | None


def _ratio_and_advantages(
    per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    # The ratio in fp32 even for bf16 log-probs (bf16 has 8 mantissa bits: r would round to 1 +- 0.004).
    dtype = torch.promote_types(per_token_logps.dtype, torch.float32)
    adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).to(dtype)  # [B, 1] or [B, T]
    if per_token_logps.dtype == dtype:
        log_ratio = per_token_logps - old_per_token_logps.to(dtype)  # [B, T]
    else:  # bf16 / fp16 log-probs: one fp32 copy, subtracted in place
        log_ratio = per_token_logps.to(dtype).sub_(old_per_token_logps)
    return log_ratio.exp_(), adv  # the ratio, inf past a log-ratio of ~88.7 in fp32


def _regions(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None,
    delta_low: float | None,
) -> CEGPPORegions:
    """`CEGPPORegions`, None for a disabled clip. Each test applies to one sign of A, so its bound is one number
    per row of `adv` ([B, 1], -inf / +inf for the other sign), in the ratio's dtype (a float32 0.8 is not a float64
    0.8): one comparison per token."""
    negative = adv < 0  # [B, 1]

    def bound(rows: torch.Tensor, value: float, otherwise: float) -> torch.Tensor:
        return torch.where(rows, adv.new_tensor(value), adv.new_tensor(otherwise))  # [B, 1]

    low = bound(negative, 1 - epsilon_low, -math.inf)
    high = bound(adv > 0, 1 + epsilon_high, math.inf)
    left, right = ratio < low, ratio > high  # [B, T]
    dual = None if delta is None else ratio > bound(negative, delta, math.inf)  # disjoint from left: delta > 1
    guard = None if delta_low is None else ratio < bound(negative, delta_low, -math.inf)  # within left
    return CEGPPORegions(left, right, dual, guard)


def _value_and_grad_factors(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    regions: CEGPPORegions,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None,
    delta_low: float | None,
    delta_low_mode: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The module table, row by row: the loss value, and d(value)/d(logp) per token as ``-A * weight``.

    Returns ``(value, -A, weight)``. The backward multiplies the incoming gradient by ``-A`` first, then by ``weight``
    (``r``, ``beta * bound``, 0, ...): autograd's order for TRL's ``-min(r * A, clip(r) * A)`` (``(g * -A) * r``) and
    for the definition, so that with beta1 = beta2 = 0 the gradient is TRL's bit for bit, whatever gradient the
    aggregation sends in. (One product ``g * (-r * A)`` rounds differently: 1 ulp on about a quarter of the tokens.)
    """
    left, right, dual, guard = regions
    neg_adv = -adv  # [B, 1]
    # Everything else: -r * A, whose gradient w.r.t. logp is again -r * A. For A < 0 the dual clip caps r at delta
    # (the constant -delta * A); for A >= 0 r is capped at the largest finite float, so that A == 0 gives exactly 0
    # where r overflowed (inf * 0 would be NaN). A NaN log-prob stays NaN.
    cap = torch.where(
        adv < 0, adv.new_tensor(math.inf if delta is None else delta), adv.new_tensor(torch.finfo(adv.dtype).max)
    )  # [B, 1]
    # Clipped tokens: value and gradient weight are the constant -beta * bound * A (the paper's
    # beta * bound * A * r / sg(r), evaluated without dividing by r). `left` needs A < 0 and `right` A > 0, so one
    # select of the row's beta * bound serves both.
    bound = torch.where(adv < 0, adv.new_tensor(beta1 * (1 - epsilon_low)), adv.new_tensor(beta2 * (1 + epsilon_high)))
    weight = torch.where(left | right, bound, torch.minimum(ratio, cap))  # [B, T]
    value = neg_adv * weight  # [B, T]
    cut = dual  # the value above and no gradient: the dual clip, and the left guard's cut-off (one select for both)
    if guard is not None and delta_low_mode == "cutoff":
        cut = guard if cut is None else cut | guard
    if cut is not None:
        weight = torch.where(cut, 0.0, weight)
    if guard is not None and delta_low_mode == "decay":  # the left-clipped weight, decaying like r below delta_low
        weight = torch.where(guard, bound * (ratio / delta_low), weight)
    return value, neg_adv, weight


@torch.no_grad()
def cegppo_regions(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    delta_low: float | None = None,
) -> CEGPPORegions:
    """Boolean masks of the special regions of the CE-GPPO objective.

    Args:
        log_ratio: ``logp - old_logp``, shape ``(B, T)`` (or ``(B, 1)`` for sequence-level ratios).
        advantages: shape ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low, epsilon_high, delta, delta_low: as in `cegppo_per_token_loss`.

    Returns:
        `CEGPPORegions` ``(left, right, dual, guard)``.
    """
    ratio, adv = _ratio_and_advantages(log_ratio, log_ratio.new_zeros(()), advantages)
    left, right, dual, guard = _regions(
        ratio, adv, epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta=delta, delta_low=delta_low
    )
    off = torch.zeros_like(left)
    return CEGPPORegions(left, right, off if dual is None else dual, off if guard is None else guard)


class _CEGPPOLoss(torch.autograd.Function):
    """Single pass: forward returns the value and saves d(value)/d(logp) as ``-A`` and one weight per token."""

    @staticmethod
    def forward(ctx, per_token_logps, old_per_token_logps, advantages, settings):
        ratio, adv = _ratio_and_advantages(per_token_logps, old_per_token_logps, advantages)
        regions = _regions(
            ratio,
            adv,
            epsilon_low=settings["epsilon_low"],
            epsilon_high=settings["epsilon_high"],
            delta=settings["delta"],
            delta_low=settings["delta_low"],
        )
        value, neg_adv, weight = _value_and_grad_factors(ratio, adv, regions, **settings)
        ctx.save_for_backward(neg_adv, weight)
        ctx.logp_dtype = per_token_logps.dtype
        ctx.logp_shape = per_token_logps.shape
        return value

    @staticmethod
    @torch.autograd.function.once_differentiable  # the saved factors are constants: no double backward
    def backward(ctx, grad_value):
        neg_adv, weight = ctx.saved_tensors
        grad_logps = (grad_value * neg_adv).mul_(weight)  # in this order: see `_value_and_grad_factors`
        if grad_logps.shape != ctx.logp_shape:  # (B, 1) sequence ratio broadcast against (B, T) advantages
            grad_logps = grad_logps.sum_to_size(ctx.logp_shape)
        # Old log-probs and advantages are constants of the surrogate, as in PPO.
        return grad_logps.to(ctx.logp_dtype), None, None, None


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
    delta_low: float | None = None,
    delta_low_mode: str = "cutoff",
) -> torch.Tensor:
    """Per-token CE-GPPO loss (to be minimised), before masking and aggregation.

    Implements Eq. 8 of CE-GPPO (arXiv:2509.20712) with the authors' dual clip: tokens outside the PPO clip range
    keep a bounded gradient, ``beta1 * (1 - epsilon_low) * A`` for negative-advantage tokens below the range (larger
    ``beta1`` -> entropy falls faster) and ``beta2 * (1 + epsilon_high) * A`` for positive-advantage tokens above it
    (larger ``beta2`` -> entropy falls slower). ``beta1 = beta2 = 0`` gives the PPO-clip gradient, ``beta1 = beta2 =
    1`` the original GPPO (Klear-Reasoner), whose forward value equals PPO's. Equal to `cegppo_objective`, the
    definition, in value and gradient.

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
        delta_low: left guard, ``0 < delta_low <= 1 - epsilon_low``: negative-advantage tokens with ``r <
            delta_low`` keep the left-clipped value but a bounded gradient (`delta_low_mode`). ``None`` (the paper's
            objective) disables it.
        delta_low_mode: ``"cutoff"``: no gradient below ``delta_low``; ``"decay"``: the gradient weight
            ``-beta1 * (1 - epsilon_low) * A * r / delta_low``, continuous at ``delta_low`` (with ``delta_low = 1 -
            epsilon_low``: ``-beta1 * r * A``, the unclipped surrogate's decay).

    Returns:
        The per-token loss, shape ``broadcast(per_token_logps, advantages)``, dtype at least fp32.
    """
    check_left_guard(delta_low, delta_low_mode, epsilon_low)
    settings = dict(
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        beta1=beta1,
        beta2=beta2,
        delta=delta,
        delta_low=delta_low,
        delta_low_mode=delta_low_mode,
    )
    return _CEGPPOLoss.apply(per_token_logps, old_per_token_logps, advantages, settings)


# ---------------------------------------------------------------------------------------------------------------------
# Diagnostics: what the loss did to a micro-batch, by name
# ---------------------------------------------------------------------------------------------------------------------
class CEGPPODiagnostics(NamedTuple):
    """Local statistics of one micro-batch (one process), each a 0-d tensor, grouped by how they combine across
    processes: add the `sums`, take the minimum of the `minima` and the maximum of the `maxima`.

    Attributes:
        sums: over the (masked) completion tokens: ``tokens``; tokens in each region, ``left``, ``right``, ``dual``,
            ``guard``; ``ratio``, the sum of ``r``; ``grad_weight`` and ``preserved_grad_weight``, the sum of
            ``|d loss / d logp|`` over all tokens and over preserved (left/right-clipped) ones; ``left_log_ratio``,
            the sum of ``log r`` over left-clipped tokens (how far β1 has pushed them below the rollout policy).
        minima: ``ratio``, the smallest ``r``; ``left_share``, the smallest share of left-clipped tokens in a
            sequence (TRL's ``clip_ratio/low_min``). ``inf`` without tokens.
        maxima: ``ratio``, the largest ``r``; ``right_share``, the largest share of right-clipped tokens in a
            sequence (TRL's ``clip_ratio/high_max``). ``-inf`` without tokens.
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
) -> CEGPPODiagnostics:
    """What the CE-GPPO loss did to one micro-batch: regions, ratio, and the gradient weight it preserved.

    The gradient weight ``|d loss / d logp|`` is the kernel's own times each token's coefficient in the loss
    (`weights`), so, given the coefficients the loss applies, its share on preserved tokens is exactly the share of
    the surrogate's gradient the model receives that PPO's clip would have thrown away, for every aggregation and
    both ratio levels (tests/test_aggregation.py checks it against autograd). A sequence-level ratio is the masked
    mean of the token log-ratios, so each of a sequence's tokens gets ``1 / |o_i|`` of its gradient: the sequence's
    total is the kernel's weight times the sum of its tokens' coefficients.

    Args:
        log_ratio: ``logp - old_logp``, ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio (then a sequence counts
            once, if it has any token in `mask`).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        mask: ``(B, T)`` completion tokens that enter the loss (0 for padding and for dropped groups).
        epsilon_low, epsilon_high, beta1, beta2, delta, delta_low, delta_low_mode: as in `cegppo_per_token_loss`.
        weights: non-negative ``d loss / d per_token_loss`` of each token, broadcastable to ``(B, T)``: the
            aggregation's weights (`cegppo_trl.aggregation.aggregation_weights`, e.g. ``1 / |o_i|`` per sequence for
            ``grpo``) times the factors the per-token loss is multiplied by (TRL's off-policy mask, entropy mask,
            vLLM importance-sampling ratio). None: 1 per token (the loss ``sum(per_token_loss * mask)``).

    Returns:
        `CEGPPODiagnostics`.
    """
    ratio, adv = _ratio_and_advantages(log_ratio, log_ratio.new_zeros(()), advantages)
    settings = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta=delta, delta_low=delta_low)
    regions = _regions(ratio, adv, **settings)
    _, neg_adv, weight = _value_and_grad_factors(
        ratio, adv, regions, **settings, beta1=beta1, beta2=beta2, delta_low_mode=delta_low_mode
    )
    grad_weight = (neg_adv * weight).abs()  # [B, T] (or [B, 1])
    coefficient = mask if weights is None else weights * mask  # [B, T]: d loss / d per_token_loss
    if regions.left.shape[-1] == 1 and mask.shape[-1] != 1:  # sequence-level ratio: one entry per sequence with tokens
        count = (mask.sum(-1, keepdim=True) > 0).to(ratio.dtype)  # [B, 1]
        grad_weight = grad_weight * coefficient.sum(-1, keepdim=True)  # [B, 1]: the sequence's total
    else:
        count = mask.to(ratio.dtype)  # [B, T]
        grad_weight = grad_weight * coefficient  # [B, T]
    off = torch.zeros_like(regions.left, dtype=ratio.dtype)
    left, right, dual, guard = (off if region is None else region.to(ratio.dtype) for region in regions)
    sums = dict(
        tokens=torch.ones_like(count),
        left=left,
        right=right,
        dual=dual,
        guard=guard,
        ratio=ratio,
        grad_weight=grad_weight,
        preserved_grad_weight=(left + right) * grad_weight,  # the regions are disjoint
        left_log_ratio=left * log_ratio.to(ratio.dtype),
    )
    sums = {name: (x * count).sum() for name, x in sums.items()}
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
