"""Smoke test of the random-reward study script (examples/entropy_study/random_reward.py) on the tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `examples` is a folder beside the package, importable from the repository root
    sys.path.insert(0, str(ROOT))

from examples.entropy_study import random_reward as study  # noqa: E402

pytest.importorskip("matplotlib")

ARMS = ("guarded",)  # one arm keeps it fast; the guarded one also logs the guard's share
ARGS = ["--model", "tiny", "--arms", *ARMS, "--seeds", "0", "--steps", "4", "--prompts", "2", "--generations", "4"]
ARGS += ["--steps-per-batch", "2", "--max-completion-length", "6", "--learning-rate", "1e-2"]


def test_reward_ignores_the_text_and_repeats_per_seed_and_step():
    class State:
        global_step = 4

    reward = study.random_reward(seed=3)
    first = reward(["a"] * 16, trainer_state=State())
    assert first == reward(["something else entirely"] * 16, trainer_state=State())
    assert set(first) == {0.0, 1.0}
    assert first != study.random_reward(seed=4)(["a"] * 16, trainer_state=State())
    State.global_step = 8
    assert first != reward(["a"] * 16, trainer_state=State())


@pytest.mark.slow  # 12-16 s on the shared 2-core box (load average 6-11)
def test_grid_writes_each_runs_series_and_skips_finished_runs(tmp_path):
    out = tmp_path / "rr"
    table = study.main([*ARGS, "--output-dir", str(out)])
    assert set(table["arms"]) == set(ARMS) and table["seeds"] == [0]
    assert table["claims"] == []  # no claim is about the guarded arm alone
    for arm in ARMS:
        record = json.loads(study.run_path(out, arm, 0).read_text())
        assert record["complete"] and [s["step"] for s in record["steps"]] == [1, 2, 3, 4]
        for s in record["steps"]:
            for key in ("entropy", "left_frac", "right_frac", "ratio_min", "ratio_max"):
                assert isinstance(s[key], float), (arm, key)
        # Off-policy: the second step of each rollout batch sees a ratio that moved off 1.
        assert record["steps"][0]["ratio_max"] == pytest.approx(1.0, abs=1e-5)
        assert record["steps"][1]["ratio_max"] > 1.0 + 1e-4
        assert ("guard_frac" in record["steps"][0]) == (arm == "guarded")
        assert table["arms"][arm]["entropy_change"] == [pytest.approx(study.entropy_change(record))]
    assert (out / "entropy_by_arm.png").stat().st_size > 0
    assert len((out / "steps.csv").read_text().splitlines()) == 1 + 4 * len(ARMS)

    before = {a: study.run_path(out, a, 0).stat().st_mtime_ns for a in ARMS}
    study.main([*ARGS, "--output-dir", str(out)])  # finished runs are skipped, not retrained
    assert {a: study.run_path(out, a, 0).stat().st_mtime_ns for a in ARMS} == before

    with pytest.raises(ValueError, match="trained with other settings"):
        study.main([*ARGS[:-2], "--learning-rate", "1e-3", "--output-dir", str(out)])


def _run(arm: str, seed: int, entropies: list[float]) -> dict:
    settings = {"steps_per_batch": 2}
    steps = [{"step": i + 1, "entropy": e, "left_frac": 0.1, "right_frac": 0.0} for i, e in enumerate(entropies)]
    return {"arm": arm, "seed": seed, "settings": settings, "steps": steps, "wall_seconds": 1.0, "complete": True}


def test_summary_pairs_arms_by_seed_and_answers_the_claims():
    # Entropy change = mean of the last rollout batch (2 steps) minus the mean of the first.
    runs = [_run("grpo", s, [2.0, 2.0, 1.8, 1.6, 1.5, 1.5 - 0.1 * s]) for s in (0, 1, 2)]
    runs += [_run("beta2_only", s, [2.0, 2.0, 2.1, 2.2, 2.3, 2.3]) for s in (0, 1, 2)]
    runs += [_run("grpo", 3, [2.0, 2.0, 1.0, 1.0])]  # a seed the other arm lacks: left out
    table = study.summarize(runs)
    assert table["seeds"] == [0, 1, 2] and set(table["arms"]) == {"grpo", "beta2_only"}
    grpo = table["arms"]["grpo"]
    assert grpo["entropy_change"] == pytest.approx([-0.5, -0.55, -0.6])
    assert grpo["entropy_change_range"] == pytest.approx([-0.6, -0.5])
    assert table["arms"]["beta2_only"]["minus_grpo"] == pytest.approx([0.8, 0.85, 0.9])
    table["claims"] = claims = study.check_claims(table)
    assert [(c["claim"], c["seeds_held"], c["verdict"]) for c in claims] == [
        ("a", 3, "direction only"),  # 3 seeds: the exact sign-flip p is at least 1/8
        ("b", 3, "direction only"),
    ]
    assert claims[0]["p"] == pytest.approx(1 / 8)
    assert "| GRPO clip (0, 0) | -0.550 [-0.600, -0.500] | +0.000, +0.000, +0.000 |" in study.markdown(table)
