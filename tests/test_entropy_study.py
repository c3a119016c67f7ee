"""The entropy studies (`examples/entropy_study/`, research code outside the package).

- The paired statistics: the one-sided sign-flip p-value (`cegppo_trl.research.stats.sign_flip_p`, "greater")
  against hand-counted sign patterns, verdicts from given numbers.
- The second study's scalars and verdicts computed from synthetic curves whose answers are known by construction.
- The second study's testbed: the answer counts against brute force, uniform sampling, the reward, pass@k, and the
  probe's private RNG.
- `--quick`-style runs of both studies on the small model: outputs exist, every curve has the right keys and
  lengths, the switch and the controller act, the first study's results.md verdicts match the curves they come from,
  and worker processes reproduce in-process runs (marked slow: each trains a model).
- The third study: the guard transform's value and gradient through the library loss (cut-off and r-decay), the
  design's arms and seeds, claims (a)-(d) from synthetic runs with known answers, the Monte Carlo sign-flip p-value
  past 20 pairs, the wrapped stability figure.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `examples` is a folder beside the package, importable from the repository root
    sys.path.insert(0, str(ROOT))

from examples.entropy_study import addition, digits, stats, testbed

pytest.importorskip("matplotlib")

QUIET = {"log": lambda *args: None}


@pytest.fixture(autouse=True)
def one_torch_thread():
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)  # the studies set 1 thread


# ----------------------------------------------------------------------------------------------------------------
# Paired statistics
# ----------------------------------------------------------------------------------------------------------------
def test_paired_verdict_held_direction_only_failed_and_dropped_pairs():
    base = [0.5, 0.6, 0.4, 0.55, 0.45]
    lower = [x - 0.1 for x in base]
    r = stats.paired_verdict(lower, base, "<")
    assert r["verdict"] == "held" and r["p"] == 1 / 32 and r["seeds_held"] == 5
    assert r["mean_diff"] == pytest.approx(-0.1) and r["std_diff"] == pytest.approx(0.0, abs=1e-12)
    # Four seeds lower by 0.1, one higher by 0.05: right direction, p = 2/32 > 0.05.
    mixed = [x - 0.1 for x in base[:4]] + [base[4] + 0.05]
    r = stats.paired_verdict(mixed, base, "<")
    assert r["verdict"] == "direction only" and r["p"] == 2 / 32 and r["seeds_held"] == 4
    assert stats.paired_verdict(mixed, base, ">")["verdict"] == "failed"
    # A NaN (e.g. a run that never reached the matched reward) drops that pair only.
    r = stats.paired_verdict([math.nan] + lower[1:], base, "<")
    assert r["n"] == 4 and r["dropped"] == 1 and r["p"] == 1 / 16 and r["verdict"] == "direction only"
    assert stats.paired_verdict([math.nan], [1.0], "<")["verdict"] == "no data"
    with pytest.raises(ValueError, match="relation"):
        stats.paired_verdict([1.0], [2.0], "<=")


# ----------------------------------------------------------------------------------------------------------------
# Second study: scalars and verdicts from curves with known answers
# ----------------------------------------------------------------------------------------------------------------
SPG = 8


def fake_run(arm: str, seed: int, batch_entropy: list[float], batch_reward: list[float], validity=(0.2, 0.6),
             distinct=(6.0, 8.0)) -> dict:  # fmt: skip
    """A run whose per-step entropy is constant within each rollout batch; reward logged on each batch's first step."""
    n = len(batch_entropy) * SPG
    return {
        "arm": arm, "seed": seed, "learning_rate": 3e-4, "steps_per_generation": SPG, "steps": list(range(1, n + 1)),
        "entropy": [h for h in batch_entropy for _ in range(SPG)],
        "reward": [x for r in batch_reward for x in [r] + [math.nan] * (SPG - 1)],
        "left_frac": [0.02] * n, "right_frac": [0.01] * n, "left_logratio": [-0.3] * (n - 1) + [-2.5],
        "lowp_clipped_frac": [math.nan, 0.1, 0.3] * (n // 3) + [0.2] * (n % 3),
        "probe": {"step": [0, n], "validity": list(validity), "pass@8": [0.7, 0.9],
                  "distinct_correct": list(distinct)},
    }  # fmt: skip


def test_run_metrics_from_known_curves():
    h = [0.42, 0.38, 0.33, 0.29, 0.25, 0.22, 0.20, 0.19, 0.18, 0.17]  # 10 rollout batches
    r = [0.1, 0.2, 0.3, 0.45, 0.5, 0.6, 0.6, 0.7, 0.7, 0.7]
    m = digits.run_metrics(fake_run("grpo", 0, h, r, validity=(0.2, 0.05)))
    assert m["entropy_start"] == pytest.approx(0.42)
    assert m["entropy_final"] == pytest.approx(0.17)  # last 10% of 10 batches = the last batch
    assert m["entropy_abs_change"] == pytest.approx(0.25)
    assert m["entropy_at_matched_reward"] == pytest.approx(0.25)  # first batch with reward >= 0.5: the fifth
    assert m["in_band"] == pytest.approx(2 / 10)  # 0.38 and 0.33 lie in [0.30, 0.40]; 0.42 is above
    assert m["band_distance_final"] == pytest.approx(0.30 - 0.17)
    switch_batch = math.ceil(digits.SWITCH_AT * 10)  # 6: the batch before the switch is the sixth (0.22)
    assert m["entropy_abs_change_after_switch"] == pytest.approx(abs(0.17 - h[switch_batch - 1]))
    assert m["left_logratio_min"] == -2.5 and m["left_frac"] == pytest.approx(0.02)
    assert m["collapsed"] == 1.0  # validity 0.2 -> 0.05 is below half
    assert m["lowp_clipped_frac"] == pytest.approx((0.1 + 0.3) * 26 / 54 + 0.2 * 2 / 54)  # NaN steps ignored
    old = fake_run("grpo", 0, h, r)
    del old["lowp_clipped_frac"]  # curves recorded before the metric existed
    assert math.isnan(digits.run_metrics(old)["lowp_clipped_frac"])
    assert math.isnan(digits.run_metrics(fake_run("grpo", 0, h, [0.1] * 10))["entropy_at_matched_reward"])


def test_claim_verdicts_are_computed_from_the_curves():
    runs = []
    for seed in range(5):
        start = 0.42 + 0.01 * seed
        grpo = [start - 0.03 * i for i in range(10)]  # falls to start - 0.27
        cegppo = [start - 0.01 * i for i in range(10)]  # falls to start - 0.09
        # Controller: in band except for the first batch on every seed; GRPO leaves the band after 4 batches.
        runs += [fake_run("grpo", seed, grpo, [0.5] * 10, distinct=(6.0, 4.0 + 0.1 * seed)),
                 fake_run("cegppo_0.5_1", seed, cegppo, [0.5] * 10, distinct=(6.0, 9.0)),
                 fake_run("controller", seed, [0.42] + [0.35] * 9, [0.5] * 10)]  # fmt: skip
    table = digits.summarize(runs)
    assert table["grpo"]["entropy_final"] == pytest.approx([0.42 + 0.01 * s - 0.27 for s in range(5)])
    rows = {r["text"]: r for r in digits.check_claims(table)}
    assert {r["claim"] for r in rows.values()} == {"a", "c", "f", "g"}  # only claims whose arms all ran
    falls = rows["grpo entropy_final < grpo entropy_start"]
    assert falls["verdict"] == "held" and falls["p"] == 1 / 32 and falls["mean_diff"] == pytest.approx(-0.27)
    below = rows["grpo entropy_final < cegppo_0.5_1 entropy_final"]
    assert below["verdict"] == "held" and below["mean_diff"] == pytest.approx(-0.18)
    band = rows["controller in_band > grpo in_band"]
    # GRPO's batches in [0.30, 0.40]: entropies start - 0.03 i; controller 9/10 on every seed.
    grpo_in = [sum(0.30 <= 0.42 + 0.01 * s - 0.03 * i <= 0.40 for i in range(10)) / 10 for s in range(5)]
    assert band["mean_diff"] == pytest.approx(0.9 - statistics.fmean(grpo_in)) and band["verdict"] == "held"
    assert rows["cegppo_0.5_1 distinct_correct_final > grpo distinct_correct_final"]["verdict"] == "held"
    # pass@8 is equal in every arm: a zero difference is not the claimed direction.
    assert rows["cegppo_0.5_1 pass8_final > grpo pass8_final"]["verdict"] == "failed"
    stability = {r["text"]: r for r in digits.check_stability(table)}
    assert stability["cegppo_0.5_1 left_logratio_min < grpo left_logratio_min"]["verdict"] == "failed"  # equal


def _at(run: dict, lr: float, spg: int) -> dict:
    return {**run, "learning_rate": lr, "steps_per_generation": spg}


def test_stability_map_cells_are_mean_final_validity_and_collapsed_seeds():
    h, r = [0.4] * 10, [0.3] * 10
    runs = [_at(fake_run("grpo", s, h, r, validity=(0.2, v)), 3e-4, 8) for s, v in [(1, 0.6), (2, 0.05)]]
    runs += [_at(fake_run("cegppo_0.5_1", s, h, r, validity=(0.2, v)), 1e-3, 8) for s, v in [(1, 0.0), (2, 0.3)]]
    text = digits.stability_map(runs)
    grpo, ce = text.split("**CE-GPPO (0.5, 1)**")
    assert "| 0.0003 | 0.33 (1/2) |" in grpo and "| 0.001 | not run |" in grpo  # (0.6 + 0.05) / 2; 0.05 < 0.1
    assert "| 0.001 | 0.15 (1/2) |" in ce and "| 0.0003 | not run |" in ce


def test_guard_check_counts_warnings_against_collapses():
    h, r = [0.4] * 10, [0.3] * 10
    late = fake_run("cegppo_1_1", 1, h, r, validity=(0.2, 0.05))  # log r -0.3 ... then -2.5 at step 80: too late
    late["probe"] = {**late["probe"], "step": [0, 40, 80], "validity": [0.2, 0.05, 0.05]}
    early = fake_run("cegppo_1_1", 2, h, r, validity=(0.2, 0.05))
    early["left_logratio"] = [-0.3] * 10 + [-2.0] * 70  # crosses at step 11, before the probe at 40 that shows it
    early["probe"] = {**early["probe"], "step": [0, 40, 80], "validity": [0.2, 0.05, 0.05]}
    stable = fake_run("grpo", 3, h, r, validity=(0.2, 0.6))
    stable["left_logratio"] = [-0.3] * 80
    silent = fake_run("grpo", 4, h, r, validity=(0.2, 0.05))
    silent["left_logratio"] = [-1.4] * 80
    false_alarm = fake_run("grpo", 5, h, r, validity=(0.2, 0.6))
    assert digits.guard_check([late, early, stable, silent, false_alarm]) == {
        "warned_collapsed": 2, "warned_stable": 1, "silent_collapsed": 1, "silent_stable": 1, "in_time": 1}  # fmt: skip


def test_left_cutoff_drops_only_the_gradient_of_negative_tokens_pushed_below_it():
    from examples.entropy_study.runner import delta_low_logps

    old = torch.zeros(2, 3)
    # Row 0, A < 0: r = 0.1 (below 0.25: cut), r = 0.5 (left-clipped but above the cut-off), r = 1.
    # Row 1, A > 0: r = 0.1 is not cut, whatever the ratio: the guard only bounds the push on A < 0 tokens.
    logps = torch.log(torch.tensor([[0.1, 0.5, 1.0], [0.1, 0.5, 1.0]])).requires_grad_()
    out = delta_low_logps(logps, old, torch.tensor([-1.0, 1.0]), 0.25, "cutoff")
    torch.testing.assert_close(out, logps.detach())  # values unchanged
    (grad,) = torch.autograd.grad(out.sum(), logps)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]]))
    assert set(digits.GUARD_ARMS) <= set(digits.arm_overrides()) and not set(digits.GUARD_ARMS) & set(digits.ARMS)
    h, r = [0.4] * 10, [0.3] * 10
    runs = [fake_run(arm, seed, h, r, validity=(0.2, v)) for seed in range(1, 6)
            for arm, v in (("grpo", 0.6), ("cegppo_1_1", 0.01 * seed), ("cegppo_1_1_cut", 0.4))]  # fmt: skip
    rows = {row["text"]: row for row in digits.check_stability(digits.summarize(runs))}
    guard = rows["cegppo_1_1_cut validity_final > cegppo_1_1 validity_final"]
    assert guard["verdict"] == "held" and guard["seeds_held"] == 5
    assert rows["cegppo_1_1_cut validity_final < grpo validity_final"]["verdict"] == "held"
    assert all(digits.arm_overrides()[a][1]["study_delta_low"] == digits.LEFT_CUTOFF for a in digits.GUARD_ARMS)


def _curves_dir(root: Path, name: str, runs: list[dict], steps: int = 80, warmup_seconds: float = 70.0) -> Path:
    folder = root / name
    folder.mkdir()
    meta = {"mode": name, "steps": steps, "command": f"cmd {name}", "wall_seconds": 60.0, "workers": 2,
            "warmup": {"steps": 400, "probe_validity": 0.22, "seconds": warmup_seconds, "cached": False}}  # fmt: skip
    (folder / "curves.json").write_text(json.dumps({"meta": meta, "runs": runs}))
    return folder


def test_merge_pairs_runs_from_several_folders_and_refuses_what_cannot_be_paired(tmp_path):
    h, r = [0.4] * 10, [0.3] * 10
    grid = _curves_dir(tmp_path, "grid", [_at(fake_run("grpo", 1, h, r), 1e-3, 8)])
    sweep = _curves_dir(
        tmp_path, "sweep", [fake_run("grpo", 1, h, r), fake_run("cegppo_1_1", 2, h, r)], warmup_seconds=3.0
    )  # a cached warm-up: its wall time does not matter
    data = digits.merge_curves([grid, sweep])
    assert data["meta"]["mode"] == "grid" and data["meta"]["wall_seconds"] == 120.0
    assert data["meta"]["sources"] == ["cmd grid", "cmd sweep"] and data["meta"]["seeds"] == [1, 2]
    assert [(c["arm"], c["seed"], c["learning_rate"]) for c in data["runs"]] == [
        ("grpo", 1, 3e-4), ("cegppo_1_1", 2, 3e-4), ("grpo", 1, 1e-3)]  # fmt: skip
    assert [c["arm"] for c in digits.merge_curves([grid, sweep], arms=["cegppo_1_1"])["runs"]] == ["cegppo_1_1"]
    other = _curves_dir(tmp_path, "other", [fake_run("dapo", 1, h, r)], steps=160)
    with pytest.raises(SystemExit, match="'steps' differs"):
        digits.merge_curves([grid, other])
    again = _curves_dir(tmp_path, "again", [fake_run("grpo", 1, h, r)])
    with pytest.raises(SystemExit, match="repeat runs"):
        digits.merge_curves([sweep, again])


@pytest.mark.slow  # writes every figure (2-4 s)
def test_merge_command_writes_the_results_and_figures(tmp_path):
    h, r = [0.4] * 10, [0.3] * 10
    grid = _curves_dir(tmp_path, "grid", [_at(fake_run("grpo", 1, h, r), 1e-3, 8)])
    sweep = _curves_dir(tmp_path, "sweep", [fake_run("grpo", 1, h, r), fake_run("cegppo_1_1", 2, h, r)])
    out = tmp_path / "merged"
    digits.main(["--merge", str(grid), str(sweep), "--output-dir", str(out)], **QUIET)
    assert "(h) stability map" in (out / "results.md").read_text()
    assert (out / "stability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_claim_names_known_arms_and_metrics():
    metrics = set(digits.run_metrics(fake_run("grpo", 0, [0.4] * 10, [0.5] * 10)))
    for _, _, comparisons in digits.CLAIMS:
        for a, ma, relation, b, mb in comparisons:
            assert a in digits.ARMS and b in digits.ARMS and ma in metrics and mb in metrics and relation in "<>"
    assert {cid for cid, _, _ in digits.CLAIMS} == set("abcdefg")
    assert all(metric in metrics for metric, _, _ in digits.GRID_CLAIMS)


# ----------------------------------------------------------------------------------------------------------------
# Second study: the testbed
# ----------------------------------------------------------------------------------------------------------------
def test_answer_counts_match_brute_force_and_sampling_is_uniform():
    for s in (6, 18, 30):
        brute = sum(sum(d) == s for d in itertools.product(range(10), repeat=4))
        assert testbed._count(4, s) == brute
    rng = random.Random(0)
    draws = [testbed.sample_valid(6, rng) for _ in range(4200)]  # 84 answers, ~50 draws each
    assert all(testbed.is_valid(t, 6) for t in draws) and len(set(draws)) == 84
    counts = [draws.count(t) for t in set(draws)]
    assert max(counts) < 90 and min(counts) > 20  # uniform: 50 expected each (sd ~7)


def test_trace_validity_and_reward():
    assert testbed.format_trace([5, 4, 7, 2]) == "5:5, 4:9, 7:16, 2:18"
    assert testbed.is_valid(" 5:5, 4:9, 7:16, 2:18 ", 18)
    assert not testbed.is_valid("5:5, 4:9, 7:16, 2:18", 17)  # wrong sum
    assert not testbed.is_valid("5:5, 4:9, 7:15, 3:18", 18)  # wrong running total
    assert not testbed.is_valid("5:5, 4:9, 9:18", 18)  # three digits
    assert not testbed.is_valid("5:5, 4:9, 7:16, 2:18, 0:18", 18)
    assert not testbed.is_valid("5:5,4:9,7:16,2:18", 18)  # format
    assert testbed.digit_reward(
        ["3:3, 0:3, 0:3, 3:6", "3:3, 0:3, 0:3, 2:5"], target_sum=[6, 6], num_digits=[4, 4]
    ) == [
        1.0,
        0.0,
    ]
    assert len(testbed.prompt_text(18)) + 23 <= 64  # prompt + completion fit the model's positions


def test_pass_at_k():
    assert testbed.pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert testbed.pass_at_k(32, 0, 8) == 0.0 and testbed.pass_at_k(32, 25, 8) == 1.0
    assert testbed.pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    with pytest.raises(ValueError, match="pass@8"):
        testbed.pass_at_k(4, 1, 8)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    model, tokenizer, _ = testbed.build_testbed_model(testbed.TestbedSettings(**testbed.SMALL_TESTBED),
                                                         cache_dir=cache, log=None)  # fmt: skip
    return model, tokenizer, cache


@pytest.mark.slow  # trains a model (> 3 s)
@pytest.mark.campaign
def test_probe_uses_a_private_rng(small_model):
    model, tokenizer, _ = small_model
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = testbed.probe(model, tokenizer, (6, 18), samples=8, seed=7)
    assert torch.equal(torch.get_rng_state(), state)  # training's random stream is untouched
    assert testbed.probe(model, tokenizer, (6, 18), samples=8, seed=7) == first  # same seed, same samples
    assert set(first) == {"validity", "pass@8", "distinct_correct", "distinct"}
    assert 1 <= first["distinct"] <= 8 and 0 <= first["distinct_correct"] <= first["distinct"]


# ----------------------------------------------------------------------------------------------------------------
# Second study: a short run through the command line
# ----------------------------------------------------------------------------------------------------------------
QUICK_STEPS = 16  # --quick: two rollout batches, so the switch (58.5% -> step 10) and a controller update happen


@pytest.mark.slow  # trains a model (> 3 s)
@pytest.mark.campaign
def test_digits_quick_run_writes_curves_with_the_right_keys_and_shapes(small_model, tmp_path):
    _, _, cache = small_model
    out = tmp_path / "digits"
    data = digits.main(["--quick", "--cache-dir", str(cache), "--output-dir", str(out)], **QUIET)
    for name in digits.OUTPUT_FILES:
        assert (out / name).stat().st_size > 0, name
    written = json.loads((out / "curves.json").read_text())
    assert written["meta"]["steps"] == QUICK_STEPS and written["meta"]["mode"] == "quick"
    assert written["meta"]["seeds"] == [0] and written["meta"]["workers"] == 1
    by = {r["arm"]: r for r in data["runs"]}
    assert set(by) == {"grpo", "switch", "controller"}
    for run in data["runs"]:
        assert run["steps"] == list(range(1, QUICK_STEPS + 1))
        for key in ("entropy", "beta1", "beta2", "left_frac", "right_frac", "left_logratio", "neg_logratio_min"):
            assert len(run[key]) == QUICK_STEPS and all(math.isfinite(v) for v in run[key]), (run["arm"], key)
        assert all(v <= 0 for v in run["left_logratio"] + run["neg_logratio_min"])  # log r of pushed-down tokens
        assert run["left_logratio"][0] == 0.0  # the first step of a batch is on-policy: r = 1, nothing clipped
        assert run["lowp_clipped_frac"][0] == 0.0  # likewise among the low-probability tokens
        assert all(0.0 <= v <= 1.0 for v in run["lowp_clipped_frac"] if not math.isnan(v))
        assert run["probe"]["step"] == [0, 8, 16]
        for key in ("validity", "pass@8", "distinct_correct", "distinct"):
            assert len(run["probe"][key]) == 3
        assert sum(math.isfinite(v) for v in run["reward"]) == QUICK_STEPS // 8  # once per rollout batch
    switch = math.ceil(digits.SWITCH_AT * QUICK_STEPS)
    assert by["switch"]["beta1"] == [0.0] * switch + [0.5] * (QUICK_STEPS - switch)
    assert by["grpo"]["beta1"] == by["grpo"]["beta2"] == [0.0] * QUICK_STEPS
    # The controller starts at its nominal (0.5, 1) and can only move after its first window of 8 steps.
    assert by["controller"]["beta1"][:8] == [0.5] * 8 and by["controller"]["beta2"][:8] == [1.0] * 8
    table = digits.summarize(data["runs"])
    assert table["grpo"]["validity_start"] == [by["grpo"]["probe"]["validity"][0]]
    text = (out / "results.md").read_text()
    for row in digits.check_stability(table):  # each verdict in the file is the one computed from the curves
        assert f"| {row['text']} |" in text and f"| {row['verdict']} |" in text


# ----------------------------------------------------------------------------------------------------------------
# First study (addition): --quick on the small model
# ----------------------------------------------------------------------------------------------------------------
STEPS = 16
SEEDS = (0, 1)
SMOKE_ARMS = ("grpo", "cegppo_0_1", "switch")


def _quick(tmp_path, *extra):
    out = tmp_path / "study"
    argv = ["--quick", "--small-model", "--cache-dir", str(tmp_path / "cache"), "--output-dir", str(out),
            "--steps", str(STEPS), "--seeds", ",".join(map(str, SEEDS)), *extra]  # fmt: skip
    return out, addition.main(argv, **QUIET)


@pytest.fixture(scope="module")
def quick_study(tmp_path_factory):
    return _quick(tmp_path_factory.mktemp("quick"), "--arms", ",".join(SMOKE_ARMS), "--workers", "1")


@pytest.mark.slow  # trains a model (> 3 s)
@pytest.mark.campaign
def test_first_study_quick_json_has_one_finite_curve_per_arm_and_seed(quick_study):
    out, returned = quick_study
    for name in addition.OUTPUT_FILES:
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "curves.json").read_text())
    assert data["meta"]["steps"] == STEPS and data["meta"]["seeds"] == list(SEEDS)
    runs = data["runs"]
    assert sorted((r["arm"], r["seed"]) for r in runs) == sorted((a, s) for a in SMOKE_ARMS for s in SEEDS)
    for run in runs:
        assert run["steps"] == list(range(1, STEPS + 1))
        for key in ("entropy", "beta1", "beta2", "left_frac", "right_frac", "grad_share"):
            assert len(run[key]) == STEPS and all(math.isfinite(v) for v in run[key]), (run["arm"], key)
        assert run["heldout"]["steps"][0] == 0 and run["heldout"]["steps"][-1] == STEPS
    for ours, written in zip(returned["runs"], runs, strict=True):  # the JSON holds them to 5 decimals
        assert written["entropy"] == pytest.approx(ours["entropy"], abs=1e-5)
    training = data["meta"]["training"]
    assert training["gradient_accumulation_steps"] % training["steps_per_generation"] != 0  # off-policy


@pytest.mark.slow  # trains a model (> 3 s)
def test_first_study_results_md_verdicts_match_the_curves(quick_study):
    out, _ = quick_study
    data = json.loads((out / "curves.json").read_text())
    text = (out / "results.md").read_text()
    # Recompute "switch accuracy_after > cegppo_0_1 accuracy_after" from the raw held-out curves, seed by seed.
    acc = {(r["arm"], r["seed"]): r["heldout"]["values"][-1] for r in data["runs"]}
    held = sum(acc[("switch", s)] > acc[("cegppo_0_1", s)] for s in SEEDS)
    mean_held = statistics.fmean(acc[("switch", s)] for s in SEEDS) > statistics.fmean(
        acc[("cegppo_0_1", s)] for s in SEEDS
    )
    verdict = "held" if mean_held and held == len(SEEDS) else "mean only" if mean_held else "**failed**"
    row = next(line for line in text.splitlines() if "switch accuracy_after > cegppo_0_1 accuracy_after" in line)
    assert row.endswith(f"| {held}/{len(SEEDS)} | {verdict} |")


@pytest.mark.slow  # trains a model (> 3 s)
def test_first_study_switch_changes_beta1_and_matches_the_0_1_arm_before(quick_study):
    _, data = quick_study
    by = {(r["arm"], r["seed"]): r for r in data["runs"]}
    switch = math.ceil(addition.SWITCH_AT * STEPS)
    for seed in SEEDS:
        run, constant = by[("switch", seed)], by[("cegppo_0_1", seed)]
        assert run["beta1"] == [0.0] * switch + [0.5] * (STEPS - switch)
        assert run["entropy"][:switch] == constant["entropy"][:switch]  # same seed, data and betas up to it


@pytest.mark.slow  # trains a model (> 3 s)
@pytest.mark.campaign
def test_first_study_worker_processes_reproduce_the_in_process_runs(quick_study, tmp_path):
    _, in_process = quick_study
    _, parallel = _quick(tmp_path, "--arms", "grpo", "--workers", "2")
    expected = [r for r in in_process["runs"] if r["arm"] == "grpo"]
    for ours, theirs in zip(parallel["runs"], expected, strict=True):
        for key in ("entropy", "left_frac", "right_frac", "heldout"):
            assert ours[key] == theirs[key], key


@pytest.mark.slow  # trains a model (> 3 s)
def test_first_study_replot_rewrites_the_outputs_from_the_json(quick_study, tmp_path):
    out, _ = quick_study
    copy = tmp_path / "replot"
    copy.mkdir()
    (copy / "curves.json").write_text((out / "curves.json").read_text())  # a copy: other tests share `out`
    addition.main(["--replot", "--output-dir", str(copy)], **QUIET)
    assert (copy / "results.md").read_text() == (out / "results.md").read_text()
    assert (copy / "entropy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_arm_is_refused():
    with pytest.raises(SystemExit, match="Unknown arm"):
        addition.main(["--arms", "grpo,ppo"], **QUIET)
    with pytest.raises(SystemExit, match="Unknown arm"):
        digits.main(["--arms", "grpo,ppo"], **QUIET)


# ----------------------------------------------------------------------------------------------------------------
# Third study: the guard as an input transform, the design and the claims
# ----------------------------------------------------------------------------------------------------------------
def test_delta_low_transform_gives_the_guarded_gradient_through_the_library_loss():
    """Hand-derived, through `cegppo_objective` with β1 = 0.5, ε = 0.2, A = -1: a left-clipped token (r < 0.8)
    has value and gradient weight -β1(1-ε)A = 0.4. The cut-off 0.25 drops the gradient of r = 0.1 only; the r-decay
    below 0.8 scales it by r / 0.8 (so β1·r·|A| = 0.05 at r = 0.1, 0.25 at r = 0.5); values never change."""
    from cegppo_trl.loss import cegppo_objective
    from examples.entropy_study.runner import delta_low_logps

    old = torch.zeros(2, 3)
    logps = torch.log(torch.tensor([[0.1, 0.5, 1.0], [0.1, 0.5, 1.0]])).requires_grad_()
    adv = torch.tensor([-1.0, 1.0])  # row 1 has A > 0: never guarded, whatever its ratio
    kw = {"epsilon_low": 0.2, "epsilon_high": 0.2, "beta1": 0.5, "beta2": 1.0}
    plain = cegppo_objective(logps, old, adv, **kw)
    (g_plain,) = torch.autograd.grad(plain.sum(), logps)
    torch.testing.assert_close(g_plain[0], torch.tensor([0.4, 0.4, 1.0]))  # r = 1 is inside the clip: -r·A = 1
    expected = {("cutoff", 0.25): [0.0, 0.4, 1.0], ("cutoff", 0.5): [0.0, 0.4, 1.0], ("decay", 0.8): [0.05, 0.25, 1.0],
                ("decay", 0.4): [0.1, 0.4, 1.0]}  # fmt: skip
    for (mode, delta_low), row0 in expected.items():
        loss = cegppo_objective(delta_low_logps(logps, old, adv, delta_low, mode), old, adv, **kw)
        torch.testing.assert_close(loss, plain.detach())  # values unchanged
        (grad,) = torch.autograd.grad(loss.sum(), logps)
        torch.testing.assert_close(grad[0], torch.tensor(row0), msg=f"{mode} {delta_low}")
        torch.testing.assert_close(grad[1], g_plain[1])  # A > 0 untouched
    with pytest.raises(ValueError, match="delta_low_mode must be one of"):
        delta_low_logps(logps, old, adv, 0.5, "soft")


def test_confirm_design_arms_are_known_new_seeds_and_map_to_the_library_fields():
    from examples.entropy_study import confirm

    assert set(confirm.SEEDS).isdisjoint(range(6))  # seeds 0-5 ran the pilot, the grid and the guard's tuning
    assert set(confirm.DIGITS_SETTINGS) == {(lr, spg) for lr in (1e-4, 3e-4) for spg in (4, 8)}
    overrides = digits.arm_overrides()
    for spec in confirm.STAGES.values():
        assert set(spec["arms"]) <= set(digits.KNOWN_ARMS)
    for arm, (b1, mode, delta_low) in digits.CONFIRM_GUARDS.items():
        fields = overrides[arm][1]
        assert (fields["gppo_beta1"], fields["study_delta_low_mode"], fields["study_delta_low"]) == (
            b1,
            mode,
            delta_low,
        )
        assert delta_low <= 1 - fields["epsilon"] and digits.guard_base(arm) == f"cegppo_{b1:g}_1"
        assert {k: v for k, v in fields.items() if not k.startswith("study_")} == overrides[digits.guard_base(arm)][1]
    assert digits.guard_base("cegppo_0.5_1_cut") == "cegppo_0.5_1" and digits.guard_base("cegppo_0.5_1") is None
    with pytest.raises(SystemExit, match="--digits-dir"):
        confirm.stage_arms("addition")
    with pytest.raises(SystemExit, match=r"--arms \['grpo'\] are not in stage beta0.75's arms"):
        confirm.main(["--stage", "beta0.75", "--arms", "grpo", "--output-dir", "unused"], **QUIET)


def _claim_runs(setting, arms_validity: dict[str, list[float]], entropy: dict[str, float] | None = None) -> list[dict]:
    """One fake run per (arm, seed): start validity 0.2, the given final validity; constant entropy per arm."""
    r = [0.6] * 10
    runs = []
    for arm, finals in arms_validity.items():
        for seed, v in enumerate(finals, 6):
            run = _at(fake_run(arm, seed, [(entropy or {}).get(arm, 0.4)] * 10, r, validity=(0.2, v)), *setting)
            run["left_logratio"] = [-0.3] * 80
            runs.append(run)
    return runs


def test_confirm_claims_a_b_c_from_known_runs():
    from examples.entropy_study import confirm

    grpo = [0.60, 0.62, 0.58, 0.61, 0.59]
    runs = _claim_runs((3e-4, 8), {
        "grpo": grpo,
        "cegppo_0_1": grpo,
        "cegppo_0.5_1": [0.05] * 5,  # collapsed: not "already stable", so no (b) row for its guards
        "cegppo_0.5_1_cut0.25": [v - 0.02 for v in grpo],  # lower on 5/5 seeds (p = 1/32) -> not within noise
        "cegppo_0.5_1_decay0.8": [v + (0.01 if i % 2 else -0.01) for i, v in enumerate(grpo)],  # noise
    }, entropy={"cegppo_0_1": 0.40, "cegppo_0.5_1_cut0.25": 0.35, "cegppo_0.5_1_decay0.8": 0.41})  # fmt: skip
    runs += _claim_runs((1e-4, 4), {"grpo": grpo, "cegppo_1_1": grpo, "cegppo_1_1_cut0.25": [v + 0.1 for v in grpo]})
    rows = {(r["claim"], r["setting"], r["text"]): r for r in confirm.claim_rows(runs)}

    def a(arm, s=(0.0003, 8)):
        return rows[("a", s, f"{arm} validity_final ≈ grpo (not lower)")]

    assert not a("cegppo_0.5_1_cut0.25")["held"] and a("cegppo_0.5_1_cut0.25")["p"] == 1 / 32
    assert a("cegppo_0.5_1_decay0.8")["held"]
    assert not rows[("a0", (3e-4, 8), "cegppo_0.5_1 validity_final ≈ grpo (not lower)")]["held"]
    assert not any(r[0] == "b" and r[1] == (3e-4, 8) for r in rows)
    # (1, 1) is stable at (1e-4, 4): its guard is compared with it; +0.1 on every seed is a measurable change.
    b = rows[("b", (1e-4, 4), "cegppo_1_1_cut0.25 validity_final ≈ cegppo_1_1")]
    assert not b["held"] and b["mean_diff"] == pytest.approx(0.1)
    assert rows[("b", (1e-4, 4), "cegppo_1_1_cut0.25 entropy_final ≈ cegppo_1_1")]["held"]  # same entropy
    c = {arm: rows[("c", (3e-4, 8), f"{arm} entropy_at_matched_reward < cegppo_0_1")]
         for arm in ("cegppo_0.5_1_cut0.25", "cegppo_0.5_1_decay0.8")}  # fmt: skip
    assert c["cegppo_0.5_1_cut0.25"]["held"] and not c["cegppo_0.5_1_decay0.8"]["held"]
    # The addition stage's candidate: (a) ties 1-1 (the cut-off's row at (1e-4, 4)), (b) 1-0 for the cut-off.
    assert confirm.addition_candidate(list(rows.values())) == ("cutoff", 0.25)
    assert confirm.addition_candidate([r for r in rows.values() if r["setting"] == (3e-4, 8)]) == ("decay", 0.8)
    # A stage cut off mid-seed: the seed some arms lack is left out at that setting, so every test stays paired.
    cut = runs + _claim_runs((3e-4, 8), {"grpo": [0.6] * 6})[5:]  # GRPO seed 11 only
    kept, dropped = confirm.complete_seeds(cut)
    assert kept == runs and [(c["arm"], c["seed"]) for c in dropped] == [("grpo", 11)]
    text = confirm.confirm_markdown(cut)
    assert "| (a) cutoff 0.25 | failed: 1/2 rows held |" in text and "| (a) decay 0.8 | held: 1/1 rows held |" in text


def test_confirm_warning_leads_count_hits_misses_false_alarms_and_silent_runs_as_warned_at_the_end():
    from examples.entropy_study import confirm

    h, r = [0.4] * 10, [0.3] * 10
    probe = {"step": [0, 20, 40, 60, 80], "validity": [0.2, 0.2, 0.05, 0.02, 0.01], "pass@8": [0.0] * 5,
             "distinct_correct": [0.0] * 5}  # fmt: skip
    early = {**fake_run("cegppo_1_1", 6, h, r), "probe": probe}
    early["lib_left_log_ratio"] = [math.nan] * 10 + [-1.6] * 70  # first below -1.5 at step 11; collapse seen at 40
    silent = {**fake_run("cegppo_1_1", 7, h, r), "probe": probe, "lib_left_log_ratio": [-1.0] * 80}
    false_alarm = {**fake_run("grpo", 6, h, r), "lib_left_log_ratio": [-2.0] * 80}  # validity 0.2 -> 0.6
    quiet = {**fake_run("grpo", 7, h, r), "lib_left_log_ratio": [math.nan] * 80}
    leads = confirm.warning_leads([early, silent, false_alarm, quiet])
    assert [(x["warned_at"], x.get("lead")) for x in leads] == [(11, 29), (None, 40 - 80), (1, None), (None, None)]
    w = confirm.warning_summary(leads)
    assert (w["collapsed"], w["hits"], w["misses"], w["in_time"], w["false_alarms"], w["stable"]) == (2, 1, 1, 1, 1, 2)
    assert w["mean_lead"] == pytest.approx((29 - 40) / 2) and not w["held"]
    assert confirm.warning_summary(confirm.warning_leads([early]))["held"] is False  # one run: p = 1/2


@pytest.mark.slow
def test_stability_plot_wraps_many_arms_into_rows(tmp_path):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import numpy as np

    arms = ["grpo", "cegppo_0_1", *list(digits.CONFIRM_GUARDS)[:1]]  # 3 arms, 2 per row: one empty slot
    runs = [_at(fake_run(arm, 6, [0.4] * 10, [0.3] * 10), *s) for arm in arms for s in ((1e-4, 4), (3e-4, 8))]
    digits.write_stability_plot(runs, tmp_path, plt, np, per_row=2)
    assert (tmp_path / "stability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("mode, delta_low", [("cutoff", 0.25), ("cutoff", 0.5), ("decay", 0.8)])
def test_the_studys_guard_transform_trains_what_the_librarys_delta_low_trains(mode, delta_low):
    # The third study ran the guard as an input transform (`runner.delta_low_logps`); its conclusions are about the
    # library's `delta_low` only if the two give the same loss and gradient.
    from helpers.reference import random_inputs

    from cegppo_trl.loss import cegppo_objective
    from examples.entropy_study.runner import delta_low_logps

    logp, old, adv = random_inputs(spread=3.0, dtype=torch.float32, seed=3)
    kw = dict(epsilon_low=0.2, epsilon_high=0.2, beta1=0.5, beta2=1.0, delta=10.0)
    grads = []
    for transformed in (True, False):
        x = logp.clone().requires_grad_(True)
        if transformed:
            loss = cegppo_objective(delta_low_logps(x, old, adv, delta_low, mode), old, adv, **kw)
        else:
            loss = cegppo_objective(x, old, adv, **kw, delta_low=delta_low, delta_low_mode=mode)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        grads.append((loss.detach(), grad))
    guarded = (adv < 0) & (torch.exp(logp - old) < delta_low)
    assert guarded.sum() > 20  # the guard acts on many tokens here
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-6, atol=1e-7)
