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
reference the tests hold the trainer to. The trainer does not evaluate it. It hands TRL's own clipped surrogate
``-min(r * A, clip(r) * A)`` an advantage that carries the gradient the clip throws away (`preserved_advantages`):

    A_hat = A * (1 + w * (log r - sg(log r)))       # value exactly A; w = beta1 left-clipped, beta2 right-clipped

Where TRL's ``min`` picks ``clip(r) * A_hat`` (a clipped token), ``clip(r)`` is the constant bound, so the token's
gradient is ``-bound * w * A``: Eq. 8. Elsewhere ``w = 0`` and the gradient is TRL's. The value is TRL's at every
beta, and TRL's masks and aggregation apply to the preserved gradient as to the rest of its loss. The paper writes
the clipped branches as ``beta * bound * A * r / sg(r)``, which is ``inf / inf = NaN`` once ``r`` overflows; neither
form here divides by ``r``.
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
def preserved_weight(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    beta1: float,
    beta2: float,
    delta_low: float | None = None,
    delta_low_mode: str = "cutoff",
    regions: CEGPPORegions | None = None,
) -> torch.Tensor:
    """Per token, the share ``w`` of the clipped gradient CE-GPPO keeps (a constant, no gradient): `beta1` on
    left-clipped tokens (0 below `delta_low` under ``"cutoff"``, ``beta1 * r / delta_low`` under ``"decay"``), `beta2`
    on right-clipped ones, 0 elsewhere. The bound (``1 - eps_l`` or ``1 + eps_h``) is not in it: TRL's ``clip(r)``
    multiplies it in (`preserved_advantages`).

    Args:
        log_ratio: ``log r``, ``(B, T)`` (``(B, 1)`` for a sequence-level ratio).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low, epsilon_high, beta1, beta2, delta_low, delta_low_mode: as in `cegppo_objective`.
        regions: `cegppo_regions` of the same inputs, if at hand.

    Returns:
        ``broadcast(log_ratio, advantages)``-shaped, in `log_ratio`'s dtype.
    """
    if regions is None:
        regions = cegppo_regions(
            log_ratio, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta_low=delta_low
        )
    left, right, _, guard = regions
    zero = log_ratio.new_zeros(())
    left_weight = log_ratio.new_tensor(beta1)
    if delta_low is not None:  # the left guard: how far a left-clipped token may be pushed out of the policy
        guarded = zero if delta_low_mode == "cutoff" else left_weight * torch.exp(log_ratio) / delta_low
        left_weight = torch.where(guard, guarded, left_weight)
    weight = torch.where(right, log_ratio.new_tensor(beta2), zero)
    return torch.where(left, left_weight, weight)


def preserved_advantages(advantages: torch.Tensor, log_ratio: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``A * (1 + w * (log r - sg(log r)))``: exactly `advantages` in value, with gradient ``A * w`` w.r.t. ``log r``.

    Handed to TRL's ``-min(r * A, clip(r) * A)`` in place of ``A``, it gives `cegppo_objective`'s gradient: on a
    clipped token ``min`` selects ``clip(r) * A_hat``, whose gradient is ``-bound * w * A``; elsewhere ``w = 0``.

    Args:
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``, no gradient.
        log_ratio: ``logp - old_logp`` with its graph, ``(B, T)`` (``(B, 1)``: TRL's per-sequence mean).
        weight: `preserved_weight`.

    Returns:
        ``broadcast(advantages, log_ratio)``-shaped, in `advantages`' dtype.
    """
    A = _as_rows(advantages, advantages)  # [B, 1] or [B, T]
    return A * (1 + weight.to(A.dtype) * (log_ratio - log_ratio.detach()).to(A.dtype))


def sft_loss(per_token_logps: torch.Tensor, mask: torch.Tensor, normaliser: torch.Tensor | float) -> torch.Tensor:
    """The authors' SFT term of one micro-batch: the NLL of the masked completion tokens over `normaliser`, the
    correct completions' tokens of its share of the accumulation window, so the window's sum is their token mean
    (Klear-Reasoner's "RL with SFT loss"), however the rollout batch is split.

    Args:
        per_token_logps: ``(B, T)`` log-probabilities of the completion tokens, with their graph.
        mask: ``(B, T)``: the tokens of the correct completions that enter the loss.
        normaliser: correct-completion tokens per micro-batch share of the window (0-d, or a number).
    """
    return -(per_token_logps * mask).sum() / torch.as_tensor(normaliser).clamp(min=1.0)
