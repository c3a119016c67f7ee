"""Entropy study: do the CE-GPPO paper's entropy claims hold on the quickstart's tiny model and addition task?

GRPO (ε 0.2/0.2), DAPO clip-higher (0.2/0.28), CE-GPPO at (β1, β2) ∈ {(0, 1), (0.5, 1), (0.75, 1), (1, 0.5), (1, 1)}
and the paper's (0, 1) → (0.5, 1) switch at 58.5% of training, 5 seeds each, 8 optimizer steps per rollout batch,
same model, data and budget for every arm. Results and the claims check: docs/entropy-study.md.

    python examples/entropy_study.py --output-dir docs/images/entropy_study   # the default sweep, ~18 min on 2 cores
    python examples/entropy_study.py --quick                                   # ~2 min smoke run
    python examples/entropy_study.py --help

The logic lives in `cegppo_trl/study.py` (importable, so its worker processes can be spawned).
"""

from cegppo_trl.study import main

if __name__ == "__main__":
    main()
