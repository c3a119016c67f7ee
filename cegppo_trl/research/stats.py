"""Paired statistics over branch points or seeds, in pure Python (scipy is not a dependency): the sign-flip p-value,
a Student-t interval and Holm's correction. The β-response probe gives one paired difference per branch point, the
entropy studies (examples/entropy_study) one per seed.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

MAX_EXACT = 20  # 2^20 sign vectors (~1 s in pure Python); past it only a Monte Carlo estimate (`samples`)
ALTERNATIVES = ("greater", "less", "two-sided")


def sign_flip_p(differences: Sequence[float], alternative: str = "two-sided", *, samples: int | None = None) -> float:
    """P-value of the paired sign-flip (permutation) test on the sum of `differences`.

    Under the null each difference is symmetric about 0, so each of the 2^K sign vectors s is equally likely; the
    p-value is the share whose statistic is at least as extreme as the observed one: "greater": sum(s·d) >= sum(d);
    "less": <=; "two-sided": |sum(s·d)| >= |sum(d)|; ties count (1e-12 relative tolerance). K = 3 positive differences
    give 1/8 one-sided and 2/8 two-sided; the smallest attainable p is 2^-K one-sided.

    Args:
        differences: the K paired differences, oriented so that "greater" is the claim's direction.
        alternative: "greater", "less" or "two-sided".
        samples: past `MAX_EXACT` differences, estimate from this many random sign vectors (seeded with 0, the
            observed one counted once: (hits + 1) / (samples + 1)); None refuses.

    Returns:
        The p-value in (0, 1]; 1.0 for no differences.

    Raises:
        ValueError: an unknown `alternative`, a NaN difference, or more than `MAX_EXACT` without `samples`.
    """
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}.")
    d = [float(x) for x in differences]
    if any(math.isnan(x) for x in d):
        raise ValueError("sign_flip_p: a difference is NaN.")
    if len(d) > MAX_EXACT and samples is None:
        raise ValueError(
            f"sign_flip_p enumerates all 2^K sign vectors; K = {len(d)} > {MAX_EXACT} is too many "
            "(pass `samples` for a seeded Monte Carlo estimate)."
        )
    if not d:
        return 1.0
    observed = sum(d)
    tolerance = 1e-12 * max(1.0, sum(abs(x) for x in d))

    def extreme(total: float) -> bool:
        if alternative == "greater":
            return total >= observed - tolerance
        if alternative == "less":
            return total <= observed + tolerance
        return abs(total) >= abs(observed) - tolerance

    if len(d) > MAX_EXACT:
        rng = random.Random(0)
        hits = sum(extreme(sum(x if rng.random() < 0.5 else -x for x in d)) for _ in range(samples))
        return (hits + 1) / (samples + 1)
    hits = sum(
        extreme(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1.0, -1.0), repeat=len(d))
    )
    return hits / 2 ** len(d)


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom: Simpson's rule (2000 panels) on the density after the
    substitution u = atan(x / √df), which makes the integrand smooth and bounded (about 1e-9 for |x| < 50)."""
    if df < 1:
        raise ValueError(f"t_cdf needs df >= 1, got {df}.")
    # With t = √df·tan(u): density(t) dt = c · cos(u)^(df-1) du, c = Γ((df+1)/2) / (√π Γ(df/2)).
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)
    upper = math.atan(abs(x) / math.sqrt(df))
    n = 2000
    h = upper / n
    total = 1.0 + math.cos(upper) ** (df - 1)
    for i in range(1, n):
        total += (4 if i % 2 else 2) * math.cos(i * h) ** (df - 1)
    half = c * total * h / 3
    return 0.5 + half if x >= 0 else 0.5 - half


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom, by bisection on `t_cdf` (0.5 < p < 1)."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1, got {p}.")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def t_interval(differences: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean of K >= 2 `differences` and its two-sided Student-t interval of `confidence`."""
    d = [float(x) for x in differences]
    if len(d) < 2:
        raise ValueError(f"t_interval needs at least 2 differences, got {len(d)}.")
    mean = statistics.fmean(d)
    half = t_quantile(0.5 + confidence / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return mean, mean - half, mean + half


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the j-th is max over i <= j of
    min(1, (m - i + 1) · p_(i)); rejecting every claim whose adjusted p <= α controls the family-wise error at α."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted
