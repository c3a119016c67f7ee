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

ARGS = ["--model", "tiny", "--seeds", "0", "--steps", "4", "--prompts", "2", "--generations", "4"]
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


def test_grid_writes_each_runs_series_and_skips_finished_runs(tmp_path):
    out = tmp_path / "rr"
    table = study.main([*ARGS, "--output-dir", str(out)])
    assert set(table["arms"]) == set(study.ARMS) and table["seeds"] == [0]
    for arm in study.ARMS:
        record = json.loads(study.run_path(out, arm, 0).read_text())
        assert record["complete"] and [s["step"] for s in record["steps"]] == [1, 2, 3, 4]
        for s in record["steps"]:
            for key in ("entropy", "left_frac", "right_frac", "dual_frac", "ratio_min", "ratio_max"):
                assert isinstance(s[key], float), (arm, key)
        # Off-policy: the second step of each rollout batch sees a ratio that moved off 1.
        assert record["steps"][0]["ratio_max"] == pytest.approx(1.0, abs=1e-5)
        assert record["steps"][1]["ratio_max"] > 1.0 + 1e-4
        assert ("guard_frac" in record["steps"][0]) == (arm == "guarded")
        assert table["arms"][arm]["entropy_change"] == [pytest.approx(study.entropy_change(record))]
    # Same seed, same model, same first rollout batch: every arm's first step is identical.
    first = {json.loads(study.run_path(out, a, 0).read_text())["steps"][0]["entropy"] for a in study.ARMS}
    assert len(first) == 1
    assert (out / "entropy_by_arm.png").stat().st_size > 0
    assert len((out / "steps.csv").read_text().splitlines()) == 1 + 4 * len(study.ARMS)

    before = {a: study.run_path(out, a, 0).stat().st_mtime_ns for a in study.ARMS}
    study.main([*ARGS, "--output-dir", str(out)])  # finished runs are skipped, not retrained
    assert {a: study.run_path(out, a, 0).stat().st_mtime_ns for a in study.ARMS} == before

    with pytest.raises(ValueError, match="trained with other settings"):
        study.main([*ARGS[:-2], "--learning-rate", "1e-3", "--output-dir", str(out)])
