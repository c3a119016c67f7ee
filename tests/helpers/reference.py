"""The CE-GPPO per-token loss (Eq. 8 of arXiv:2509.20712 with the authors' dual clip) written independently of the
library, for every test that checks a value or a gradient against the formula.

A plain `torch.where` transcription of the table in docs/algorithm.md, differentiated by autograd. Clipped tokens use
the log-space stop-gradient form ``bound * A * exp(logp - sg(logp))``: value ``bound * A``, gradient ``bound * A``.
"""

from __future__ import annotations

import torch


def reference_regions(logp, old_logp, advantages, *, epsilon_low, epsilon_high):
    """``(left, right)``: NA&LP tokens below ``1 - epsilon_low`` and PA&LP tokens above ``1 + epsilon_high``."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    return (advantages < 0) & (ratio < 1 - epsilon_low), (advantages > 0) & (ratio > 1 + epsilon_high)


def reference_loss(logp, old_logp, advantages, *, epsilon_low, epsilon_high, beta1, beta2, delta=None):
    """Per-token loss, shape ``broadcast(logp, advantages)``; advantages ``(B,)``, ``(B, 1)`` or ``(B, T)``."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unit = torch.exp(log_ratio - log_ratio.detach())  # value 1, gradient 1
    left, right = reference_regions(logp, old_logp, advantages, epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    loss = torch.where(left, -beta1 * (1 - epsilon_low) * advantages * unit, -ratio * advantages)
    loss = torch.where(right, -beta2 * (1 + epsilon_high) * advantages * unit, loss)
    if delta is not None:
        loss = torch.where((advantages < 0) & (ratio > delta), (-delta * advantages).expand_as(loss), loss)
    # No case for A == 0: such a token is in no clipped region (those need A < 0 or A > 0), so the table gives it
    # -r * A, whose value and gradient are 0 for every finite r. (An overflowing r is the kernel's concern, checked
    # by hand in tests/test_loss.py.)
    return loss


def reference_per_token_loss(logp, old, advantages, beta1, beta2, eps_low=0.2, eps_high=0.2, delta=None):
    """`reference_loss` and its two clipped regions ``(loss, left, right)``, positional as the trainer tests use it."""
    eps = dict(epsilon_low=eps_low, epsilon_high=eps_high)
    loss = reference_loss(logp, old, advantages, **eps, beta1=beta1, beta2=beta2, delta=delta)
    return (loss, *reference_regions(logp, old, advantages, **eps))
