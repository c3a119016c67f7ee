"""The chaos harness, short: kill CE-GPPO off-policy at a random moment, requeue it with `last`, end bit-identical.

A few trials per launch, one of each variant that matters (tests/helpers/chaos.py: three epochs, so kills land in
epochs 2 and 3 too; a callback that writes into every checkpoint; `save_total_limit=1` with `load_best_model_at_end`;
a kill before the first checkpoint, a kill while a checkpoint is written; a resume from a copy outside `output_dir`).
The long campaign: `python -m tests.helpers.chaos --launch single ddp --trials 20`.
"""

from __future__ import annotations

import pytest

# Multi-process or real-model work: a separate step of .ci/run (README, Contributing).
pytestmark = [pytest.mark.slow, pytest.mark.campaign]

VARIANTS = [
    {"save_total_limit": 1, "load_best": True, "kill": "save", "resume": "last"},
    {"save_total_limit": 2, "load_best": True, "kill": "time", "resume": "outside"},
    {"save_total_limit": 1, "load_best": False, "kill": "early", "resume": "last"},
]


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["single", "ddp"])
def test_chaos_trials_of_each_variant_end_with_the_uninterrupted_runs_weights(launch, tmp_path):
    from helpers.chaos import campaign, summary

    results = campaign([launch], len(VARIANTS), tmp_path, seed=2, variants=VARIANTS)
    assert all("error" not in r for r in results[launch]), (summary(results), results)
    assert [r["max_abs_diff"] for r in results[launch]] == [0.0] * len(VARIANTS)
