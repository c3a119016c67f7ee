"""The CE-GPPO per-token loss by its definition, for every test that checks a value or a gradient against the formula.

The definition is `cegppo_trl.loss.cegppo_objective` (the table of docs/algorithm.md as `torch.where` selections,
differentiated by autograd); tests/test_loss.py pins it to hand-derived values in every region. Here: TRL's clipped
surrogate (the value the trainer logs), the region masks and the positional form the trainer tests use.
"""

from __future__ import annotations

import torch

from cegppo_trl.loss import cegppo_objective as reference_loss

__all__ = ["random_inputs", "reference_loss", "reference_per_token_loss", "reference_regions", "trl_clip_loss"]


def trl_clip_loss(logp, old_logp, advantages, *, epsilon_low=0.2, epsilon_high=0.2, delta=None):
    """TRL 1.16's clipped surrogate per token (`GRPOTrainer._compute_loss`, token level): the value the trainer logs."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def reference_regions(logp, old_logp, advantages, *, epsilon_low, epsilon_high):
    """``(left, right)``: NA&LP tokens below ``1 - epsilon_low`` and PA&LP tokens above ``1 + epsilon_high``."""
    advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    return (advantages < 0) & (ratio < 1 - epsilon_low), (advantages > 0) & (ratio > 1 + epsilon_high)


def reference_per_token_loss(logp, old, advantages, beta1, beta2, eps_low=0.2, eps_high=0.2, delta=None, **guard):
    """`reference_loss` and its two clipped regions ``(loss, left, right)``, positional as the trainer tests use it;
    `guard`: ``delta_low`` / ``delta_low_mode``."""
    eps = dict(epsilon_low=eps_low, epsilon_high=eps_high)
    loss = reference_loss(logp, old, advantages, **eps, beta1=beta1, beta2=beta2, delta=delta, **guard)
    return (loss, *reference_regions(logp, old, advantages, **eps))


def random_inputs(batch=16, length=32, dtype=torch.float64, seed=0, spread=0.6):
    """Log-ratios uniform in [-spread, spread] (every region populated), (B, 1) advantages with one zero."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g, dtype=torch.float64) * 4
    logp = old + (torch.rand(batch, length, generator=g, dtype=torch.float64) * 2 - 1) * spread
    advantages = torch.randn(batch, 1, generator=g, dtype=torch.float64)
    advantages[0] = 0.0
    return logp.to(dtype), old.to(dtype), advantages.to(dtype)
