"""Claim verdicts for the entropy studies: per-seed pairs of two arms, a one-sided sign-flip test, a verdict.

The test is `cegppo_trl.research.stats.sign_flip_p(..., "greater", samples=SAMPLES)` on the differences oriented so
that the claim predicts a positive mean: exact for the 3-10 seeds a CPU study runs, past its `MAX_EXACT` pairs (the
third study's test over runs) estimated from `SAMPLES` random sign patterns with a fixed seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from cegppo_trl.research.stats import sign_flip_p

ALPHA = 0.05  # one-sided significance level, fixed before the sweep
SAMPLES = 100_000  # random sign patterns past `MAX_EXACT` pairs


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
    p = sign_flip_p([sign * d for d in diffs], "greater", samples=SAMPLES)
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
