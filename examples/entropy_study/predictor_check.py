"""What the per-step entropy predictor carries, and where its first-order sign rule is exact.

    python -m examples.entropy_study.predictor_check

1. From the token-class runs' branch records (`results/mechanism/{t1,tlow}-seed{0,1,2}.json`): for the paper's
   (0, 1) arm minus GRPO, how often the predictor's sign matched the measured probe-entropy change D, how often a
   constant "always negative" predictor matches it, and the Spearman rank correlation of predictor and D. Where the
   arm moved nothing (no right-clipped token: predictor and D both 0) the branch point is left out.
2. The one-logit rule says a push up on token k raises its position's entropy iff `log p_k < -H`. Plain SGD on the
   logits moves them along `e_k - p`, whose first-order entropy change adds `sum_j p_j^2 (log p_j + H)`: on random
   softmaxes (logits ~ N(0, sigma^2) over V tokens, k drawn from p) it prints the share of sampled tokens for which
   the two signs differ.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "mechanism"


def _ranks(values: list[float]) -> list[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in order[i : j + 1]:
            ranks[m] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    """Spearman's rho and its two-sided p from Student's t with n - 2 degrees of freedom (as scipy reports it)."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    rho = cov / math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    df = len(x) - 2
    theta = math.atan(abs(rho) * math.sqrt(df / (1 - rho * rho)) / math.sqrt(df))  # t = rho sqrt(df / (1 - rho^2))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0  # Abramowitz & Stegun 26.7.3-4: P(|T| < t) for integer df
    if df % 2:
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    else:
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return rho, 1 - inside


def predictor_against_d(regime: str, results: Path = RESULTS) -> dict:
    """Sign matches and Spearman rho of the (0, 1) arm's summed predictor against its D, over branch points."""
    predicted, measured = [], []
    for path in sorted(results.glob(f"{regime}-seed*.json")):
        for branch in json.loads(path.read_text())["branches"]:
            arm, grpo = branch["arms"]["(0, 1)"], branch["arms"]["(0, 0)"]
            p, d = arm["predicted"] - grpo["predicted"], arm["delta"] - grpo["delta"]
            if p != 0 or d != 0:
                predicted.append(p)
                measured.append(d)
    rho, p_value = spearman(predicted, measured)
    return {
        "branch_points": len(measured),
        "predictor_sign_matches": sum((p < 0) == (d < 0) for p, d in zip(predicted, measured, strict=True)),
        "always_negative_matches": sum(d < 0 for d in measured),
        "spearman_rho": rho,
        "spearman_p": p_value,
    }


def one_logit_sign_differs(vocab: int, sigma: float, n: int, seed: int = 0) -> float:
    """Share of sampled tokens whose one-logit entropy sign differs from the sign of SGD's step along e_k - p."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * sigma
    p = logits.softmax(-1)  # [n, V]
    logp = p.log()
    entropy = -(p * logp).sum(-1, keepdim=True)  # [n, 1]
    k = torch.multinomial(p, 1, generator=gen)  # [n, 1]
    one_logit = -p.gather(1, k) * (logp.gather(1, k) + entropy)  # dH/dz_k
    along_e_k_minus_p = one_logit + (p * p * (logp + entropy)).sum(-1, keepdim=True)
    return ((one_logit > 0) != (along_e_k_minus_p > 0)).double().mean().item()


def main() -> None:
    for regime, temperature in (("t1", 1.0), ("tlow", 0.7)):
        r = predictor_against_d(regime)
        print(
            f"T {temperature}: {r['branch_points']} branch points; predictor's sign = D's at "
            f"{r['predictor_sign_matches']}, 'always negative' at {r['always_negative_matches']}; "
            f"Spearman rho {r['spearman_rho']:.2f}, p {r['spearman_p']:.2g}"
        )
    print("share of sampled tokens whose one-logit sign differs from SGD's (logits ~ N(0, sigma^2)):")
    for vocab, n in ((10, 20000), (100, 20000), (1000, 5000), (49152, 300)):
        shares = [one_logit_sign_differs(vocab, sigma, n) for sigma in (1.0, 2.0, 3.0, 5.0)]
        print(f"  V {vocab:>5}: " + ", ".join(f"sigma {s:g} {x:.0%}" for s, x in zip((1, 2, 3, 5), shares)))


if __name__ == "__main__":
    main()
