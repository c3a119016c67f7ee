"""The CE-GPPO per-token objective (Su et al., ACL 2026, arXiv:2509.20712, Eq. 8): pure functions, tensors in and out.

Per token, with ``r = exp(logp - old_logp)`` and advantage ``A``, the loss (minimised; docs/algorithm.md §1)::

    region                  value                      gradient w.r.t. logp
    A < 0, r < 1 - eps_l    -beta1 * (1 - eps_l) * A   the same (left clip, NA&LP)
    A > 0, r > 1 + eps_h    -beta2 * (1 + eps_h) * A   the same (right clip, PA&LP)
    A < 0, r > delta        -delta * A                 0 (dual clip)
    A < 0, r < delta_low    -beta1 * (1 - eps_l) * A   0 ("cutoff"), or the left clip's times r / delta_low ("decay")
    everywhere else         -r * A                     -r * A

`cegppo_objective` is that definition, the reference the tests hold the trainer to. The trainer does not evaluate it:
it hands TRL's clipped surrogate ``-min(r * A, clip(r) * A)`` the advantage ``A * (1 + w * (log r - sg(log r)))``
(`preserved_advantages`, ``w`` from `preserved_weight`), whose value is ``A``; where ``min`` picks the constant
``clip(r)`` the gradient is ``-bound * w * A``, elsewhere ``w = 0``. Neither form divides by ``r`` as the paper's
``beta * bound * A * r / sg(r)`` does (``inf / inf = NaN`` once ``r`` overflows).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import NamedTuple

import torch

LEFT_GUARD_MODES = ("cutoff", "decay")


def is_finite_number(x: object) -> bool:
    """A real, finite number that is not a bool (YAML's `yes` must not read as 1)."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def _as_rows(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).to(like.dtype)  # [B, 1] or [B, T]


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
    """The CE-GPPO per-token loss by its definition (the module docstring), before masking and aggregation, computed
    in at least fp32 and not guarded against an overflowing ``r``.

    Args:
        logp: log-probabilities under the current policy, ``(B, T)`` (``(B, 1)`` for a sequence-level ratio).
        old_logp: log-probabilities under the sampling policy, broadcastable to `logp` (a constant, as in PPO).
        advantages: ``(B,)``, ``(B, 1)`` or ``(B, T)``.
        epsilon_low, epsilon_high, beta1, beta2: the clip range ``[1 - epsilon_low, 1 + epsilon_high]`` and the
            gradient scales of its left-clipped (A < 0) and right-clipped (A > 0) tokens.
        delta, delta_low, delta_low_mode: the dual clip ``c`` (TRL's `delta`) and the left guard; None: off.
    """
    check_left_guard(delta_low, delta_low_mode, epsilon_low)
    dtype = torch.promote_types(logp.dtype, torch.float32)  # a bf16 r is 1 +- 0.004
    log_r = logp.to(dtype) - old_logp.to(dtype)
    A, r = _as_rows(advantages, log_r), torch.exp(log_r)
    left = (A < 0) & (r < 1 - epsilon_low)
    keep = torch.ones_like(r)  # share of the left-clipped gradient kept
    if delta_low is not None:
        guarded = 0.0 if delta_low_mode == "cutoff" else r.detach() / delta_low
        keep = torch.where(left & (r < delta_low), guarded, keep)

    def preserved(bound, keep=1.0):  # value -bound * A (log r - sg(log r) is 0), gradient -bound * keep * A
        return -A * bound + -A * ((bound * keep) * (log_r - log_r.detach()))

    loss = -r * A
    loss = torch.where(left, preserved(beta1 * (1 - epsilon_low), keep), loss)
    loss = torch.where((A > 0) & (r > 1 + epsilon_high), preserved(beta2 * (1 + epsilon_high)), loss)
    if delta is not None:
        loss = torch.where((A < 0) & (r > delta), (-delta * A).expand_as(loss), loss)
    return loss


def check_left_guard(delta_low: float | None, delta_low_mode: str, epsilon_low: float) -> None:
    """Raise `ValueError` unless `delta_low_mode` is known and `delta_low` is None or in ``(0, 1 - epsilon_low]``."""
    if delta_low_mode not in LEFT_GUARD_MODES:
        raise ValueError(f"`delta_low_mode` must be one of {list(LEFT_GUARD_MODES)}, got {delta_low_mode!r}.")
    if delta_low is not None and not (is_finite_number(delta_low) and 0 < delta_low <= 1 - epsilon_low):
        raise ValueError(
            f"`delta_low` (the left guard) must be in (0, 1 - epsilon] = (0, {1 - epsilon_low:g}], got {delta_low!r}: "
            "it acts on left-clipped tokens, whose ratio is below 1 - epsilon. E.g. 0.25; None disables it."
        )


class CEGPPORegions(NamedTuple):
    """Boolean masks of the module docstring's regions, of the broadcast shape of the ratio and the advantages."""

    left: torch.Tensor  # A < 0, r < 1 - eps_l (NA&LP): gradient scaled by beta1
    right: torch.Tensor  # A > 0, r > 1 + eps_h (PA&LP): gradient scaled by beta2
    dual: torch.Tensor  # A < 0, r > delta: no gradient (all False without delta)
    guard: torch.Tensor  # A < 0, r < delta_low, inside `left` (all False without delta_low)


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
    """`CEGPPORegions` of ``r = exp(log_ratio)`` (shapes and settings as in `cegppo_objective`), compared in
    `log_ratio`'s dtype as TRL compares its ratio."""
    ratio, adv = torch.exp(log_ratio), _as_rows(advantages, log_ratio)
    negative = adv < 0

    def bound(rows: torch.Tensor, value: float, otherwise: float) -> torch.Tensor:
        # One bound per row (+-inf for the other sign of A), in the ratio's dtype: one comparison per token.
        return torch.where(rows, adv.new_tensor(value), adv.new_tensor(otherwise))

    left = ratio < bound(negative, 1 - epsilon_low, -math.inf)
    right = ratio > bound(adv > 0, 1 + epsilon_high, math.inf)
    off = torch.zeros_like(left)
    dual = off if delta is None else ratio > bound(negative, delta, math.inf)
    guard = off if delta_low is None else ratio < bound(negative, delta_low, -math.inf)
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
    """Per token, the share ``w`` of the clipped gradient CE-GPPO keeps: `beta1` on left-clipped tokens (under the left
    guard 0, or ``beta1 * r / delta_low`` with ``"decay"``), `beta2` on right-clipped ones, 0 elsewhere; TRL's
    ``clip(r)`` multiplies the bound in. Arguments as in `cegppo_objective`; `regions` of the same inputs if at hand."""
    regions = regions or cegppo_regions(
        log_ratio, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high, delta_low=delta_low
    )
    zero, left_weight = log_ratio.new_zeros(()), log_ratio.new_tensor(beta1)
    if delta_low is not None:
        guarded = zero if delta_low_mode == "cutoff" else left_weight * torch.exp(log_ratio) / delta_low
        left_weight = torch.where(regions.guard, guarded, left_weight)
    return torch.where(regions.left, left_weight, torch.where(regions.right, log_ratio.new_tensor(beta2), zero))


def preserved_advantages(advantages: torch.Tensor, log_ratio: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``A * (1 + w * (log r - sg(log r)))`` in `advantages`' dtype: `advantages` in value, gradient ``A * w`` w.r.t.
    `log_ratio` (with its graph; `weight` from `preserved_weight`)."""
    A = _as_rows(advantages, advantages)
    return A * (1 + weight.to(A.dtype) * (log_ratio - log_ratio.detach()).to(A.dtype))


def sft_loss(per_token_logps: torch.Tensor, mask: torch.Tensor, normaliser: torch.Tensor | float) -> torch.Tensor:
    """The authors' SFT term of one micro-batch: the NLL of the `mask`ed ``(B, T)`` tokens over `normaliser`, the
    correct completions' tokens in its share of the accumulation window, so that the window's sum is their token mean
    (Klear-Reasoner's "RL with SFT loss") however the rollout batch is split."""
    return -(per_token_logps * mask).sum() / torch.as_tensor(normaliser).clamp(min=1.0)
