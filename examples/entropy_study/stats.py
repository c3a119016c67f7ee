"""Paired statistics for the entropy studies: per-run scalars, an exact sign-flip test, and claim verdicts.

No scipy (not a dependency): the one test needed, the exact one-sided paired sign-flip (permutation) test on the
mean difference, enumerates all 2^n sign patterns, which is instant for the 3-10 seeds a CPU study runs; past
`MAX_EXACT` pairs (the third study's test over runs) it draws `SAMPLES` random sign patterns with a fixed seed.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence

__all__ = ["ALPHA", "paired_verdict", "sign_flip_p"]

ALPHA = 0.05  # one-sided significance level, fixed before the sweep
MAX_EXACT = 20  # 2^20 sign patterns; beyond, a Monte Carlo estimate
SAMPLES = 100_000


def sign_flip_p(differences: Sequence[float]) -> float:
    """Exact one-sided p-value of "mean difference > 0" under the paired sign-flip null.

    Under the null each paired difference is as likely to have either sign, so the p-value is the share of the 2^n
    sign patterns whose mean is at least the observed mean. With n pairs the smallest attainable p is 2^-n: n >= 5
    seeds are needed to reach 0.05.

    Past `MAX_EXACT` pairs the share is estimated from `SAMPLES` random sign patterns (seeded, so the same data give
    the same p), counting the observed pattern once: (hits + 1) / (SAMPLES + 1).

    Args:
        differences: one paired difference per seed, oriented so that the claim predicts a positive mean.

    Returns:
        The p-value in (0, 1]; 1.0 for no pairs.
    """
    d = [float(x) for x in differences]
    if not d:
        return 1.0
    observed = sum(d)
    tolerance = 1e-12 * max(1.0, sum(abs(x) for x in d))
    if len(d) > MAX_EXACT:
        rng = random.Random(0)
        hits = sum(sum(x if rng.random() < 0.5 else -x for x in d) >= observed - tolerance for _ in range(SAMPLES))
        return (hits + 1) / (SAMPLES + 1)
    hits = sum(
        sum(s * x for s, x in zip(signs, d)) >= observed - tolerance
        for signs in itertools.product((1, -1), repeat=len(d))
    )
    return hits / 2 ** len(d)


def paired_verdict(left: Sequence[float], right: Sequence[float], relation: str) -> dict:
    """Compare two arms seed by seed: does `left <relation> right` hold?

    Pairs where either value is NaN (e.g. a run that never reached the matched reward) are dropped and counted.

    Args:
        left: per-seed values of the left arm / metric.
        right: per-seed values of the right arm / metric, same seed order.
        relation: `"<"` or `">"`.

    Returns:
        `{"n", "dropped", "mean_left", "mean_right", "mean_diff", "std_diff", "seeds_held", "p", "verdict"}` where
        `mean_diff` is left minus right and `verdict` is `"held"` (p <= ALPHA), `"direction only"` (the mean
        difference has the claimed sign but p > ALPHA), `"failed"` (it does not) or `"no data"`.
    """
    if relation not in ("<", ">"):
        raise ValueError(f"relation must be '<' or '>', got {relation!r}.")
    if len(left) != len(right):
        raise ValueError(f"left and right need one value per seed each, got {len(left)} and {len(right)}.")
    pairs = [(a, b) for a, b in zip(left, right) if not (math.isnan(a) or math.isnan(b))]
    sign = 1.0 if relation == ">" else -1.0
    diffs = [a - b for a, b in pairs]
    out = {"n": len(pairs), "dropped": len(left) - len(pairs)}
    if not pairs:
        return {**out, "mean_left": math.nan, "mean_right": math.nan, "mean_diff": math.nan, "std_diff": math.nan,
                "seeds_held": 0, "p": 1.0, "verdict": "no data"}  # fmt: skip
    mean_diff = statistics.fmean(diffs)
    p = sign_flip_p([sign * d for d in diffs])
    if sign * mean_diff <= 0:
        verdict = "failed"
    else:
        verdict = "held" if p <= ALPHA else "direction only"
    return {
        **out,
        "mean_left": statistics.fmean(a for a, _ in pairs),
        "mean_right": statistics.fmean(b for _, b in pairs),
        "mean_diff": mean_diff,
        "std_diff": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
        "seeds_held": sum(sign * d > 0 for d in diffs),
        "p": p,
        "verdict": verdict,
    }
