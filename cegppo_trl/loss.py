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

`cegppo_objective` is that table as ``torch.where`` selections differentiated by autograd: the definition, and the
reference the tests hold the trainer to. The trainer does not evaluate it: its gradient is PPO's clipped surrogate's
(TRL's ``-min(r * A, clip(r) * A)``, computed by TRL) plus `preserved_gradient_term`, which is 0 in value and carries
exactly the gradient the clip throws away, scaled by `preserved_coefficient`. At ``beta1 = beta2 = 0`` the term is 0
with no gradient, so the trainer is TRL's. The paper writes the clipped branches as ``beta * bound * A * r / sg(r)``,
which is ``inf / inf = NaN`` once ``r`` overflows; neither form here divides by ``r``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

LEFT_GUARD_MODES = ("cutoff", "decay")
BETA_RULES = ("paper", "entropy")


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
    """The CE-GPPO per-token loss by its definition (the module table), before masking and aggregation.

    Computes in at least fp32 (bf16 / fp16 inputs are upcast first; the gradient returns in the input's dtype). Pass
    `old_logp` and `advantages` as constants (detached), as in PPO. Not guarded against an overflowing ``r``.

    Args:
        logp: log-probabilities under the current policy, ``(B, T)`` (``(B, 1)`` for a sequence-level ratio).
        old_logp: log-probabilities under the sampling (old) policy, broadcastable to `logp`.
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low, epsilon_high: the clip range ``[1 - epsilon_low, 1 + epsilon_high]``.
        beta1: gradient scale of negative-advantage tokens clipped on the left (NA&LP), ``>= 0``.
        beta2: gradient scale of positive-advantage tokens clipped on the right (PA&LP), ``>= 0``.
        delta: dual-clip constant ``c > 1`` (TRL's `delta`): ``A < 0, r > c`` gives ``-c * A``, no gradient.
        delta_low: left guard, ``0 < delta_low <= 1 - epsilon_low`` (`delta_low_mode`); None: the paper's objective.
        delta_low_mode: ``"cutoff"`` (no gradient below `delta_low`) or ``"decay"`` (the weight decays like ``r``).

    Returns:
        The per-token loss, shape ``broadcast(logp, advantages)``.
    """
    check_left_guard(delta_low, delta_low_mode, epsilon_low)
    dtype = torch.promote_types(logp.dtype, torch.float32)  # a bf16 r is 1 +- 0.004
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


def push_up_raises_entropy(logps: torch.Tensor, entropies: torch.Tensor) -> torch.Tensor:
    """Per token, whether raising its log-probability raises its position's entropy, to first order in one logit:
    ``log p < -H`` (the entropy moves by about ``-g * p * (log p + H)`` for a push ``g``). Pushing it down does the
    opposite. The predictor, `beta_rule="entropy"` and the token-class study all use this one definition."""
    return logps < -entropies


class CEGPPORegions(NamedTuple):
    """Boolean masks of the special regions, each of the broadcast shape of the ratio and the advantages.

    Attributes:
        left: NA&LP, ``A < 0`` and ``r < 1 - eps_l``: gradient scaled by ``beta1``.
        right: PA&LP, ``A > 0`` and ``r > 1 + eps_h``: gradient scaled by ``beta2``.
        dual: ``A < 0`` and ``r > delta``: constant, no gradient (all False without ``delta``).
        guard: ``A < 0`` and ``r < delta_low``, inside `left`: the left guard acts (all False without ``delta_low``).
    """

    left: torch.Tensor
    right: torch.Tensor
    dual: torch.Tensor
    guard: torch.Tensor


def _as_rows(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).to(like.dtype)  # [B, 1] or [B, T]


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
    """`CEGPPORegions` of ``r = exp(log_ratio)``, compared in `log_ratio`'s dtype as TRL compares its ratio.

    Args:
        log_ratio: ``logp - old_logp``, ``(B, T)`` (or ``(B, 1)`` for sequence-level ratios).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low, epsilon_high, delta, delta_low: as in `cegppo_objective`.
    """
    ratio, adv = torch.exp(log_ratio), _as_rows(advantages, log_ratio)
    negative = adv < 0  # [B, 1]

    def bound(rows: torch.Tensor, value: float, otherwise: float) -> torch.Tensor:
        # Each test applies to one sign of A: its bound is one number per row (+-inf for the other sign), in the
        # ratio's dtype as TRL's comparison with a Python float: one comparison per token.
        return torch.where(rows, adv.new_tensor(value), adv.new_tensor(otherwise))  # [B, 1]

    left = ratio < bound(negative, 1 - epsilon_low, -math.inf)
    right = ratio > bound(adv > 0, 1 + epsilon_high, math.inf)
    off = torch.zeros_like(left)
    dual = off if delta is None else ratio > bound(negative, delta, math.inf)
    guard = off if delta_low is None else ratio < bound(negative, delta_low, -math.inf)  # within `left`
    return CEGPPORegions(left, right, dual, guard)


@torch.no_grad()
def preserved_coefficient(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta: float | None = None,
    delta_low: float | None = None,
    delta_low_mode: str = "cutoff",
    regions: CEGPPORegions | None = None,
    beta_rule: str = "paper",
    logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per token, the weight of the gradient CE-GPPO keeps where PPO's clip drops it (a constant, no gradient).

    ``beta1 * (1 - eps_l)`` on left-clipped tokens (times 0 below `delta_low` under ``"cutoff"``, ``r / delta_low``
    under ``"decay"``), ``beta2 * (1 + eps_h)`` on right-clipped ones, 0 elsewhere; shape
    ``broadcast(log_ratio, advantages)``, `log_ratio`'s dtype. `delta` is accepted for the signature's sake: the dual
    region is disjoint from the left one (``delta > 1``). `regions`: `cegppo_regions` of the same inputs, if at hand.

    `beta_rule` ``"entropy"`` assigns each β by what the token's push does to its position's entropy to first order
    instead of by its clip side (the bound stays the side's): a right-clipped token (pushed up) raises entropy iff
    ``log p < -H``, a left-clipped one (pushed down) iff ``log p > -H``; those get ``beta2``, the others ``beta1``. So
    ``beta2`` raises entropy and ``beta1`` lowers it whatever the model's clipped tokens are. Needs `logps` and
    `entropies` (``(B, T)``, the current policy's, token-level ratios).
    """
    if beta_rule not in BETA_RULES:
        raise ValueError(f"`beta_rule` must be one of {list(BETA_RULES)}, got {beta_rule!r}.")
    if regions is None:
        regions = cegppo_regions(
            log_ratio, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta_low=delta_low
        )
    left, right, _, guard = regions
    zero = log_ratio.new_zeros(())
    low, high = 1 - epsilon_low, 1 + epsilon_high
    left_weight, right_weight = log_ratio.new_tensor(beta1 * low), log_ratio.new_tensor(beta2 * high)
    if beta_rule == "entropy":
        if logps is None or entropies is None or logps.shape != left.shape:
            raise ValueError("`beta_rule='entropy'` needs per-token `logps` and `entropies` of the ratio's shape.")
        up_raises = push_up_raises_entropy(logps, entropies)
        left_weight = torch.where(up_raises, left_weight, log_ratio.new_tensor(beta2 * low))
        right_weight = torch.where(up_raises, right_weight, log_ratio.new_tensor(beta1 * high))
    if delta_low is not None:  # the left guard: how far a left-clipped token may be pushed out of the policy
        guarded = zero if delta_low_mode == "cutoff" else left_weight * torch.exp(log_ratio) / delta_low
        left_weight = torch.where(guard, guarded, left_weight)
    coefficient = torch.where(right, right_weight, zero)
    return torch.where(left, left_weight, coefficient)


def preserved_gradient_term(
    log_ratio: torch.Tensor, advantages: torch.Tensor, coefficient: torch.Tensor
) -> torch.Tensor:
    """``-(A * coefficient) * (log r - sg(log r))``: exactly 0 in value, ``-A * coefficient`` in gradient w.r.t. logp.

    Added to PPO's clipped surrogate (whose gradient is 0 where `coefficient` is not), it gives `cegppo_objective`'s
    gradient; the forward value stays PPO's. ``(B, T)``, or ``(B, 1)`` for a sequence-level ratio.

    Args:
        log_ratio: ``logp - old_logp`` with its graph (``(B, 1)``: the masked mean per sequence, as TRL's).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        coefficient: `preserved_coefficient`.
    """
    return -(_as_rows(advantages, log_ratio) * coefficient) * (log_ratio - log_ratio.detach())


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
            (`cegppo_trl.aggregation.trl_weights` times TRL's off-policy mask, entropy mask, vLLM ratio). None: 1.
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
        coefficient = preserved_coefficient(log_ratio, advantages, **settings, beta1=beta1, beta2=beta2,
                                            delta_low_mode=delta_low_mode, regions=regions)  # fmt: skip
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
