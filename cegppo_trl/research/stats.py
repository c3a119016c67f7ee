"""Paired statistics over branch points or seeds: a sign-flip p-value, a t confidence interval, Holm's correction.

Pure numbers, no trainer state and no scipy (not a dependency). The β-response probe (`cegppo_trl.research.probe`)
gives one paired difference per branch point (an arm's probe-entropy change minus the reference arm's), the entropy
studies (examples/entropy_study) one per seed; these functions turn K of them into the figures they print:

- `sign_flip_p`: the p-value of the paired sign-flip (permutation) test on the sum of the differences, one- or
  two-sided: exact from all 2^K sign vectors up to `MAX_EXACT` = 20 differences; past that a seeded Monte Carlo
  estimate when asked for (`samples`), else refused. With K differences the smallest attainable exact p-value is
  2^-K one-sided, 2^(1-K) two-sided.
- `t_interval`: the two-sided Student-t interval for the mean difference (mean ± t_{1-α/2, K-1} · sd / √K), with the
  t quantile computed here by bisection on the t distribution function (Simpson's rule on the density).
- `holm`: Holm's step-down adjusted p-values for a family of claims.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

__all__ = ["MAX_EXACT", "holm", "sign_flip_p", "t_cdf", "t_interval", "t_quantile"]

MAX_EXACT = 20  # 2^20 sign vectors (~1 s in pure Python); past it only a Monte Carlo estimate (`samples`)
ALTERNATIVES = ("greater", "less", "two-sided")


def sign_flip_p(differences: Sequence[float], alternative: str = "two-sided", *, samples: int | None = None) -> float:
    """P-value of the paired sign-flip test on the sum (equivalently the mean) of `differences`.

    Under the null each difference is symmetric about 0, so each of the 2^K sign vectors s is equally likely; the
    p-value is the share of them whose statistic is at least as extreme as the observed one:
    "greater": sum(s·d) >= sum(d); "less": sum(s·d) <= sum(d); "two-sided": |sum(s·d)| >= |sum(d)|. Ties count
    (a tolerance of 1e-12 relative absorbs float rounding). Example: K = 3 positive differences give 1/8 one-sided
    ("greater") and 2/8 two-sided.

    Up to `MAX_EXACT` differences every sign vector is enumerated (exact). Past it, with `samples` given, the share
    is estimated from that many random sign vectors (a generator seeded with 0, so the same data give the same
    p-value), counting the observed vector once: (hits + 1) / (samples + 1). Without `samples` that is refused.

    Args:
        differences: the K paired differences, oriented so that "greater" is the claim's direction.
        alternative: "greater", "less" or "two-sided".
        samples: the number of random sign vectors past `MAX_EXACT` differences (None: refuse).

    Returns:
        The p-value in (0, 1]; 1.0 for no differences.

    Raises:
        ValueError: an unknown `alternative`, a NaN difference, or more than `MAX_EXACT` differences without
            `samples`.
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
    """P(T <= x) for Student's t with `df` degrees of freedom (Simpson's rule on the density from 0 to |x|).

    Accurate to about 1e-9 for the quantiles used here (|x| < 50, df >= 1); the density's integral from 0 to x is
    computed with 2000 panels on the substitution u = atan(x / √df), which makes the integrand smooth and bounded.
    """
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
    """The mean of `differences` and its two-sided Student-t confidence interval.

    Args:
        differences: K >= 2 paired differences.
        confidence: the interval's coverage (0.95: t_{0.975, K-1}).

    Returns:
        (mean, low, high).
    """
    d = [float(x) for x in differences]
    if len(d) < 2:
        raise ValueError(f"t_interval needs at least 2 differences, got {len(d)}.")
    mean = statistics.fmean(d)
    half = t_quantile(0.5 + confidence / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
    return mean, mean - half, mean + half


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order.

    Sorted ascending p_(1) <= ... <= p_(m), the adjusted value of the j-th is max over i <= j of
    min(1, (m - i + 1) · p_(i)); rejecting every claim whose adjusted p <= α controls the family-wise error at α.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return adjusted
