"""The entropy study (`examples/entropy_study.py`, `cegppo_trl.study`): `--quick` end to end for its outputs and
their shape (not its scientific result), the paired claims check, and worker processes reproducing in-process runs.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from cegppo_trl.study import ARMS, CLAIMS, OUTPUT_FILES, SWITCH_AT, check_claims, main

pytest.importorskip("matplotlib")

STEPS = 16  # two rollout batches of 8 optimizer steps: the second batch's steps are off-policy
SEEDS = (0, 1)
SMOKE_ARMS = ("grpo", "cegppo_0_1", "switch")


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)  # the study sets 1 thread, as the quickstart does


def _quick(tmp_path, *extra):
    out = tmp_path / "study"
    argv = ["--quick", "--small-model", "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out),
            "--steps", str(STEPS), "--seeds", ",".join(map(str, SEEDS)), *extra]  # fmt: skip
    return out, main(argv, log=lambda *args: None)


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    """`--quick` in this process on the small model, three arms, two seeds, two rollout batches."""
    return _quick(tmp_path_factory.mktemp("quick"), "--arms", ",".join(SMOKE_ARMS), "--workers", "1")


def test_quick_study_writes_the_plots_table_and_json(quick_study):
    out, _ = quick_study
    for name in OUTPUT_FILES:
        assert (out / name).stat().st_size > 0, name
    for name in ("entropy.png", "accuracy.png", "preserved_tokens.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "results.md").read_text()
    for label in ("GRPO (ε 0.2/0.2)", "CE-GPPO (0, 1)", "CE-GPPO (0, 1) → (0.5, 1) at 58.5%"):
        assert f"| {label} |" in text
    assert "switch accuracy_after > cegppo_0_1 accuracy_after" in text  # the switch claim is checked
    assert not (out / "trainer").exists()  # TRL's output_dir is a temporary folder


def test_quick_study_json_has_one_finite_curve_per_arm_and_seed(quick_study):
    out, returned = quick_study
    data = json.loads((out / "curves.json").read_text())
    assert data["meta"]["steps"] == STEPS and data["meta"]["seeds"] == list(SEEDS)
    runs = data["runs"]
    assert sorted((r["arm"], r["seed"]) for r in runs) == sorted((a, s) for a in SMOKE_ARMS for s in SEEDS)
    for run in runs:
        assert run["steps"] == list(range(1, STEPS + 1))
        for key in ("entropy", "beta1", "beta2", "left_frac", "right_frac", "grad_share"):
            assert len(run[key]) == STEPS and all(math.isfinite(v) for v in run[key]), (run["arm"], key)
        assert run["heldout"]["steps"][0] == 0 and run["heldout"]["steps"][-1] == STEPS
        assert all(0.0 <= v <= 1.0 for v in run["heldout"]["values"])
        assert run["reward"]["values"] and all(math.isfinite(v) for v in run["reward"]["values"])
    for ours, written in zip(returned["runs"], runs, strict=True):  # the JSON holds them to 5 decimals
        assert written["entropy"] == pytest.approx(ours["entropy"], abs=1e-5)
    # Off-policy: TRL computes old log-probs (so the ratio can leave 1) only when the optimizer steps per rollout
    # batch do not divide the accumulation steps (reference sheet §2).
    training = data["meta"]["training"]
    assert training["gradient_accumulation_steps"] % training["steps_per_generation"] != 0


def test_switch_arm_changes_beta1_at_58_5_percent_and_matches_the_0_1_arm_before(quick_study):
    _, data = quick_study
    by = {(r["arm"], r["seed"]): r for r in data["runs"]}
    switch = math.ceil(SWITCH_AT * STEPS)  # global_step >= 9.36 -> logged from the 10th step on
    for seed in SEEDS:
        run, constant = by[("switch", seed)], by[("cegppo_0_1", seed)]
        assert run["beta1"] == [0.0] * switch + [0.5] * (STEPS - switch)
        assert run["beta2"] == [1.0] * STEPS
        # Same seed, same data order, same betas up to the switch: the runs coincide there.
        assert run["entropy"][:switch] == constant["entropy"][:switch]
        assert by[("grpo", seed)]["beta1"] == by[("grpo", seed)]["beta2"] == [0.0] * STEPS


def test_worker_processes_reproduce_the_in_process_runs(quick_study, tmp_path):
    _, in_process = quick_study
    _, parallel = _quick(tmp_path, "--arms", "grpo", "--workers", "2")
    expected = [r for r in in_process["runs"] if r["arm"] == "grpo"]
    for ours, theirs in zip(parallel["runs"], expected, strict=True):
        for key in ("entropy", "left_frac", "right_frac", "heldout"):
            assert ours[key] == theirs[key], key


def test_replot_rewrites_the_outputs_from_the_json(quick_study):
    out, _ = quick_study
    before = (out / "results.md").read_text()
    (out / "results.md").unlink()
    (out / "entropy.png").unlink()
    main(["--replot", "--output-dir", str(out)], log=lambda *args: None)
    assert (out / "results.md").read_text() == before and (out / "entropy.png").exists()


def test_unknown_arm_is_refused():
    with pytest.raises(SystemExit, match="Unknown arm"):
        main(["--arms", "grpo,ppo"], log=lambda *args: None)


def test_claims_are_checked_on_the_mean_and_seed_by_seed():
    def arm(final, start=0.8, accuracy=0.5):
        n = len(final)
        return {"entropy_final": final, "entropy_start": [start] * n, "entropy_abs_change": [abs(f - start) for f in final],
                "accuracy_after": [accuracy] * n}  # fmt: skip

    table = {"grpo": arm([0.3, 0.4, 0.9]), "cegppo_0.5_1": arm([0.6, 0.6, 0.6])}
    claims = check_claims(table)
    assert [c["claim"] for c in claims] == [CLAIMS[0][0]]  # only claims whose arms all ran
    falls, below = claims[0]["comparisons"]
    # GRPO falls on the mean (0.533 < 0.8) but rises on seed 2; it ends below (0.5, 1) on 2 of 3 seeds.
    assert falls["held"] and falls["seeds_held"] == 2 and falls["seeds"] == 3
    assert below["held"] and below["seeds_held"] == 2
    assert below["differences"] == pytest.approx([-0.3, -0.2, 0.3])
    table["grpo"] = arm([0.9, 0.9, 0.9])
    assert not check_claims(table)[0]["held"]


def test_every_claim_names_known_arms_and_metrics():
    metrics = {"entropy_start", "entropy_final", "entropy_abs_change", "entropy_abs_change_after_switch",
               "accuracy_after"}  # fmt: skip
    for _, comparisons in CLAIMS:
        for a, ma, relation, b, mb in comparisons:
            assert a in ARMS and b in ARMS and ma in metrics and mb in metrics and relation in ("<", ">", "<=")
