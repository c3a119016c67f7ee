"""Third entropy study: confirm the left-side guard against the β1 collapse on settings it was not developed on.

The second study (examples/entropy_study/RESULTS.md, "(h) Stability") found that with several optimizer steps per rollout batch
and a high learning rate, CE-GPPO with β1 > 0 pushes left-clipped negative-advantage tokens out of the policy and
loses validity where GRPO trains; a left cut-off (no gradient for A < 0 tokens once r < 0.25) rescued most of
(0.5, 1) at the one point it was tried (lr 3e-4, 8 steps per batch, seeds 1-5). This study tests the guard the
library ships (`CEGPPOConfig.delta_low` / `delta_low_mode`, here the study's input transform
`runner.delta_low_logps`, the same gradient) on held-out settings: new seeds, β1 = 0.75, lr 1e-4 and 4 steps per
batch, a second strength and the soft r-decay, and the first study's addition task.

Everything below (stages, arms, settings, seeds, steps, the claims, their metrics, margins and the paired test) was
committed before any run. Stages, in the order they run (the most decisive first; each writes its curves.json after
every finished run, so a cut-off leaves usable data):

    python -m examples.entropy_study.confirm --stage digits --output-dir DIR1
    python -m examples.entropy_study.confirm --stage beta0.75 --output-dir DIR2
    python -m examples.entropy_study.confirm --stage addition --digits-dir DIR1 --output-dir DIR3
    python -m examples.entropy_study.confirm --stage strengths --output-dir DIR4
    python -m examples.entropy_study.confirm --merge DIR1 DIR2 DIR4 --output-dir OUT      # results + figures

Results and their discussion: examples/entropy_study/RESULTS.md ("Third study: confirming the guard").
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cegppo_trl.research.stats import sign_flip_p

from . import digits
from .digits import guard_base, guard_name, run_metrics, summarize
from .stats import ALPHA, SAMPLES, paired_verdict

__all__ = ["CLAIMS", "STAGES", "claim_rows", "confirm_markdown", "main", "run_addition_arm", "warning_leads"]

# ----------------------------------------------------------------------------------------------------------------
# Design (fixed before any run)
# ----------------------------------------------------------------------------------------------------------------
# Seeds 1-5 ran the grid and the guard's development; 0 the pilot. New seeds, so nothing here was seen before.
SEEDS = (6, 7, 8, 9, 10)
BETA1S = (0.5, 0.75, 1.0)  # β2 = 1 throughout
# (lr, steps per rollout batch), the most decisive first: 3e-4 / 4 (unguarded β1 > 0 lost validity there on the grid)
# and 1e-4 / 4 (it was close to GRPO: claim (b)), then the 8-step points (the guard was developed at 3e-4 / 8).
DIGITS_SETTINGS = ((3e-4, 4), (1e-4, 4), (3e-4, 8), (1e-4, 8))
ADDITION_SETTINGS = ((3e-4, 8), (1e-4, 8))
MAIN_CANDIDATES = digits.GUARD_CANDIDATES[:2]  # the soft r-decay below 0.8 (= β1·r·A) and the cut-off r < 0.25
EXTRA_CANDIDATES = digits.GUARD_CANDIDATES[2:]  # cut-off 0.1 and 0.5: the strengths either side, if time allows


def _guards(candidates, beta1s=BETA1S) -> tuple[str, ...]:
    return tuple(guard_name(b, mode, d) for mode, d in candidates for b in beta1s)


# Sized on a measured run: 160 digits steps take 18 s on a quiet core, 2-3 min when the 2 cores are shared with
# ~15 other processes (as when this study started), so the stages are ordered to fail gracefully. Jobs run
# setting by setting (all seeds of one setting before the next), so the first settings finish with 5 seeds each.
STAGES: dict[str, dict] = {
    # 8 arms x 4 settings x 5 seeds = 160 runs of 160 steps.
    "digits": {"task": "digits", "arms": ("grpo", "cegppo_0_1", "cegppo_0.5_1", "cegppo_1_1",
                                          *_guards(MAIN_CANDIDATES, (0.5, 1.0))),
               "settings": DIGITS_SETTINGS, "steps": 160, "probe_every": 40},
    # β1 = 0.75, unguarded and with both candidates: 60 runs.
    "beta0.75": {"task": "digits", "arms": ("cegppo_0.75_1", *_guards(MAIN_CANDIDATES, (0.75,))),
                 "settings": DIGITS_SETTINGS, "steps": 160, "probe_every": 40},
    # The first study's task, smaller: GRPO, (0.5, 1), (1, 1) and each with the candidate chosen on the digits
    # (`addition_candidate`), 8 steps per batch at both learning rates, 300 steps instead of the first study's 600
    # (a 600-step run takes ~80 s on a quiet core): 5 arms x 2 settings x 5 seeds = 50 runs.
    "addition": {"task": "addition", "arms": ("grpo", "cegppo_0.5_1", "cegppo_1_1"), "guard_beta1s": (0.5, 1.0),
                 "settings": ADDITION_SETTINGS, "steps": 300, "probe_every": 25},
    # The other strengths (cut-off 0.1 and 0.5) on β1 = 0.5 and 1, comparators from the "digits" stage: 80 runs.
    "strengths": {"task": "digits", "arms": _guards(EXTRA_CANDIDATES, (0.5, 1.0)), "settings": DIGITS_SETTINGS,
                  "steps": 160, "probe_every": 40},
    # Added after the results above, so exploratory, not part of the fixed design: the cut-off 0.5 came closest to
    # claim (a) on the digits, so it is checked where it had not run (β1 = 0.75; the addition task).
    "followup-digits": {"task": "digits", "arms": _guards([("cutoff", 0.5)], (0.75,)), "settings": DIGITS_SETTINGS,
                        "steps": 160, "probe_every": 40},
    "followup-addition": {"task": "addition", "arms": _guards([("cutoff", 0.5)], (0.5, 1.0)),
                          "settings": ADDITION_SETTINGS, "steps": 300, "probe_every": 25},
}  # fmt: skip

# "Within noise" / "changes nothing measurable": no one-sided paired sign-flip test at ALPHA finds the difference,
# AND the mean difference is smaller than the margin (with 5 seeds p <= 0.05 needs all 5 seeds on one side, so the
# test alone would call a consistent 4-of-5 shortfall "noise"). Margins: about GRPO's seed-to-seed spread on the grid
# (final validity std 0.03-0.05; final entropy std ~0.01).
MARGINS = {"validity_final": 0.05, "entropy_final": 0.02}
DRIFT_THRESHOLD = digits.GUARD_THRESHOLD  # -1.5: the trainer's warning threshold, fixed by the second study

CLAIMS = {
    "a": "guarded β1 > 0 is within noise of GRPO's final validity at every point where GRPO trains (GRPO's mean "
         "final validity above its start, no GRPO seed collapsed): not lower at p <= 0.05 (one-sided) and mean "
         f"shortfall < {MARGINS['validity_final']}",
    "b": "where unguarded CE-GPPO was already stable (no seed collapsed and it passes (a)'s test against GRPO), the "
         "guard changes nothing measurable: final validity and final entropy against the unguarded arm, neither "
         "one-sided test at p <= 0.05 and |mean difference| < the margin "
         f"({MARGINS['validity_final']} validity, {MARGINS['entropy_final']} nats)",
    "c": "β1's role survives: at matched reward (first rollout batch with mean reward >= 0.5), guarded (0.5, 1) has "
         "lower entropy than (0, 1) (one-sided, p <= 0.05); survives if the direction holds at every setting where "
         "both reach the reward and the test at half of them or more",
    "d": f"the drift warning (a step's mean left-clipped log r < {DRIFT_THRESHOLD}, `cegppo/preserved/"
         "left_log_ratio`) fires before the collapse it warns of: over the collapsed runs (final validity below half "
         "the start), lead = first probe step showing the collapse (validity below half the start) minus the first "
         "warning step, a run that never warned counting as warned at its last step; mean lead > 0 at p <= 0.05 "
         "(sign-flip over runs)",
}  # fmt: skip


def addition_candidate(rows: list[dict]) -> tuple[str, float]:
    """The guard candidate the addition stage runs, chosen from the digits' claim rows by a rule fixed in advance:
    the most (a) rows held, then the most (b) rows held, then the order of `MAIN_CANDIDATES`."""

    def score(candidate):
        arms = set(_guards([candidate]))

        def held(cid):
            return sum(r["held"] for r in rows if r["claim"] == cid and r["arm"] in arms)

        return held("a"), held("b"), -MAIN_CANDIDATES.index(candidate)

    return max(MAIN_CANDIDATES, key=score)


def stage_arms(stage: str, digits_rows: list[dict] | None = None) -> tuple[str, ...]:
    """A stage's arms; the addition stage adds `addition_candidate(digits_rows)` on its `guard_beta1s`."""
    spec = STAGES[stage]
    if "guard_beta1s" not in spec:
        return spec["arms"]
    if digits_rows is None:
        raise SystemExit("The addition stage runs the guard candidate chosen on the digits task: pass --digits-dir "
                         "(a folder with the digits stage's curves.json).")  # fmt: skip
    return spec["arms"] + _guards([addition_candidate(digits_rows)], spec["guard_beta1s"])


# ----------------------------------------------------------------------------------------------------------------
# The addition task through the same runner (guard, drift metrics), held-out accuracy as the probe's "validity"
# ----------------------------------------------------------------------------------------------------------------
def run_addition_arm(arm: str, seed: int, *, steps: int, probe_every: int, learning_rate: float,
                     steps_per_generation: int, small: bool = False, cache_dir: str | None = None) -> dict:  # fmt: skip
    """One run on the first study's task (its cached warmed-up model, `TINY_MODEL_TRAINING`); the probe's
    `validity` is the greedy held-out accuracy (200 prompts), its diversity fields NaN (one right answer)."""
    from dataclasses import asdict

    import torch

    from cegppo_trl.demos.runs import FAST_MODEL_WARMUP, TINY_MODEL_TRAINING, quiet_libraries
    from cegppo_trl.demos.tasks import evaluate_accuracy
    from cegppo_trl.demos.warmup import WarmupSettings

    from .addition import _model
    from .runner import run_once

    quiet_libraries()
    torch.set_num_threads(1)
    model, tokenizer, task, _ = _model(asdict(WarmupSettings(**(FAST_MODEL_WARMUP if small else {}))), cache_dir)
    overrides = {**TINY_MODEL_TRAINING, "steps_per_generation": steps_per_generation, "learning_rate": learning_rate,
                 **digits.arm_overrides()[arm][1]}  # fmt: skip

    def measure(m) -> dict:
        accuracy = evaluate_accuracy(m, tokenizer, task)
        return {"validity": accuracy, "pass@8": math.nan, "distinct_correct": math.nan, "distinct": math.nan}

    curves = run_once(overrides, model=model, tokenizer=tokenizer, task=task, steps=steps, seed=seed,
                      probe_every=probe_every, measure=measure)  # fmt: skip
    return {"arm": arm, "seed": seed, "learning_rate": learning_rate, "steps_per_generation": steps_per_generation,
            **curves}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Claims
# ----------------------------------------------------------------------------------------------------------------
def _within(left: Sequence[float], right: Sequence[float], margin: float, sides: str) -> dict:
    """`left` vs `right` paired: "within" when no one-sided test in `sides` ("<", or "<>" for both) is significant
    and the mean difference is inside the margin on those sides."""
    tests = {rel: paired_verdict(left, right, rel) for rel in sides}
    row = tests[sides[0]]
    d = row["mean_diff"]
    inside = not math.isnan(d) and (d > -margin if sides == "<" else abs(d) < margin)
    return {**row, "p": min(t["p"] for t in tests.values()),
            "held": inside and all(t["verdict"] != "held" for t in tests.values())}  # fmt: skip


def _by_setting(runs: list[dict]) -> dict[tuple[float, int], dict]:
    groups: dict[tuple, list[dict]] = {}
    for c in runs:
        groups.setdefault((c["learning_rate"], c["steps_per_generation"]), []).append(c)
    return {k: summarize(v) for k, v in sorted(groups.items())}


def grpo_trains(table: dict) -> bool:
    g = table.get("grpo")
    return bool(g) and statistics.fmean(g["validity_final"]) > statistics.fmean(g["validity_start"]) \
        and not any(g["collapsed"])  # fmt: skip


def claim_rows(runs: list[dict]) -> list[dict]:
    """Claims (a)-(c) per setting and arm (`paired_verdict` rows plus `claim`, `setting`, `arm`, `text`, `held`);
    unguarded arms against GRPO come along as context rows (`claim` "a0"), not claim rows."""
    rows = []
    guards = [a for a in digits.KNOWN_ARMS if guard_base(a)]
    for setting, table in _by_setting(runs).items():

        def add(cid, arm, text, result, setting=setting):
            rows.append({"claim": cid, "setting": setting, "arm": arm, "text": text, **result})

        if grpo_trains(table):
            for arm in [a for a in table if a.startswith("cegppo_") and a != "cegppo_0_1"]:
                result = _within(table[arm]["validity_final"], table["grpo"]["validity_final"],
                                 MARGINS["validity_final"], "<")  # fmt: skip
                add("a" if guard_base(arm) else "a0", arm, f"{arm} validity_final ≈ grpo (not lower)", result)
        for arm in [a for a in guards if a in table and guard_base(a) in table]:
            base = guard_base(arm)
            stable = (
                not any(table[base]["collapsed"])
                and grpo_trains(table)
                and _within(
                    table[base]["validity_final"], table["grpo"]["validity_final"], MARGINS["validity_final"], "<"
                )["held"]
            )
            if stable:
                for metric in ("validity_final", "entropy_final"):
                    add(
                        "b",
                        arm,
                        f"{arm} {metric} ≈ {base}",
                        _within(table[arm][metric], table[base][metric], MARGINS[metric], "<>"),
                    )
        if "cegppo_0_1" in table:
            for arm in [a for a in guards if a in table and a.startswith("cegppo_0.5_1_")]:
                result = paired_verdict(table[arm]["entropy_at_matched_reward"],
                                        table["cegppo_0_1"]["entropy_at_matched_reward"], "<")  # fmt: skip
                add(
                    "c",
                    arm,
                    f"{arm} entropy_at_matched_reward < cegppo_0_1",
                    {**result, "held": result["verdict"] == "held"},
                )
    return rows


def _drift(c: dict) -> list[float]:
    """Per-step mean left-clipped log r as the trainer logs it (absent on steps without left-clipped tokens: NaN);
    the study's own copy for runs recorded before the library metric existed."""
    return c["lib_left_log_ratio"] if "lib_left_log_ratio" in c else c["left_logratio"]


def warning_leads(runs: list[dict], threshold: float = DRIFT_THRESHOLD) -> list[dict]:
    """Per run: `warned_at` (first step whose drift < threshold, None if never), `collapsed` (final validity below
    half the start) and, for collapsed runs, `collapse_at` (first probe step below half the start) and `lead`
    (`collapse_at` minus `warned_at`, a silent run counted as warned at its last step)."""
    out = []
    for c in runs:
        warned_at = next((s for s, x in zip(c["steps"], _drift(c)) if x < threshold), None)
        p = c["probe"]
        record = {"arm": c["arm"], "seed": c["seed"], "setting": (c["learning_rate"], c["steps_per_generation"]),
                  "warned_at": warned_at, "collapsed": bool(run_metrics(c)["collapsed"])}  # fmt: skip
        if record["collapsed"]:
            record["collapse_at"] = next(s for s, v in zip(p["step"], p["validity"]) if v < 0.5 * p["validity"][0])
            record["lead"] = record["collapse_at"] - (warned_at if warned_at is not None else c["steps"][-1])
        out.append(record)
    return out


def warning_summary(leads: list[dict]) -> dict:
    """Counts (hits, misses, false alarms, silent stable), the leads of the collapsed runs and claim (d)'s test."""
    collapsed = [r for r in leads if r["collapsed"]]
    stable = [r for r in leads if not r["collapsed"]]
    hits = [r for r in collapsed if r["warned_at"] is not None]
    values = [r["lead"] for r in collapsed]
    p = sign_flip_p(values, "greater", samples=SAMPLES)
    mean = statistics.fmean(values) if values else math.nan
    return {
        "runs": len(leads), "collapsed": len(collapsed), "hits": len(hits), "misses": len(collapsed) - len(hits),
        "in_time": sum(r["lead"] > 0 for r in hits), "false_alarms": sum(r["warned_at"] is not None for r in stable),
        "stable": len(stable), "leads": sorted(r["lead"] for r in hits),
        "median_lead": statistics.median(r["lead"] for r in hits) if hits else math.nan, "mean_lead": mean, "p": p,
        "held": bool(values) and mean > 0 and p <= ALPHA,
    }  # fmt: skip


def _claim_verdicts(rows: list[dict], warning: dict) -> dict[str, str]:
    """One line per claim (and per candidate for (a)-(c)), as the docs report it."""
    out = {}
    candidates = {}
    for r in rows:
        if r["claim"] in "abc" and r["claim"] != "a0":
            mode, d = digits.CONFIRM_GUARDS[r["arm"]][1:]
            candidates.setdefault((r["claim"], mode, d), []).append(r)
    for (cid, mode, d), rs in sorted(candidates.items()):
        held = sum(r["held"] for r in rs)
        name = f"{mode} {d:g}"
        if cid == "c":
            direction = all(r["mean_diff"] < 0 for r in rs if r["n"])
            ok = direction and held * 2 >= len(rs)
            out[f"({cid}) {name}"] = (f"{'held' if ok else 'failed'}: direction at "
                                      f"{sum(r['mean_diff'] < 0 for r in rs if r['n'])}/{len(rs)} settings, "
                                      f"p <= {ALPHA} at {held}/{len(rs)}")  # fmt: skip
        else:
            out[f"({cid}) {name}"] = f"{'held' if held == len(rs) else 'failed'}: {held}/{len(rs)} rows held"
    out["(d) warning"] = (f"{'held' if warning['held'] else 'failed'}: mean lead {warning['mean_lead']:.1f} steps, "
                          f"p = {warning['p']:.3g} over {warning['collapsed']} collapsed runs")  # fmt: skip
    return out


def validity_table(runs: list[dict]) -> str:
    """Final validity per arm (rows) and setting (columns): mean, the range over seeds, collapsed seeds."""
    tables = _by_setting(runs)
    arms = [a for a in digits.KNOWN_ARMS if any(a in t for t in tables.values())]
    labels = {a: lab for a, (lab, _) in digits.arm_overrides().items()}
    lines = ["| arm | " + " | ".join(f"lr {lr:g}, {spg} steps" for lr, spg in tables) + " |",
             "|---" * (len(tables) + 1) + "|"]  # fmt: skip
    for arm in arms:
        cells = []
        for t in tables.values():
            if arm not in t:
                cells.append("not run")
                continue
            v, n = t[arm]["validity_final"], len(t[arm]["validity_final"])
            collapsed = int(sum(t[arm]["collapsed"]))
            cells.append(f"{statistics.fmean(v):.2f} ({min(v):.2f}–{max(v):.2f})" + (f", {collapsed}/{n} coll."
                         if collapsed else "") + (f", {n} seeds" if n != len(SEEDS) else ""))  # fmt: skip
        lines.append(f"| {labels[arm]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def confirm_markdown(runs: list[dict]) -> str:
    """The claims section of results.md for the confirm mode: verdicts, claim rows, the warning table (on the
    `complete_seeds` runs)."""
    runs = complete_seeds(runs)[0]
    rows = claim_rows(runs)
    leads = warning_leads(runs)
    unguarded = [r for r in leads if not guard_base(r["arm"])]
    lines = [
        "## Final validity: mean (range over seeds), collapsed seeds",
        "",
        validity_table(runs),
        "## Third study: the claims (fixed before the runs)",
        "",
    ]
    lines += [f"- ({cid}) {text}" for cid, text in CLAIMS.items()]
    lines += ["", "| claim, candidate | verdict |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _claim_verdicts(rows, warning_summary(leads)).items()]
    lines += ["", ("| claim | lr, steps/batch | comparison | mean left vs right | difference (mean ± std) "
              "| seeds with left < right | p (sign-flip, one-sided) | held |"), "|---" * 8 + "|"]  # fmt: skip
    for r in rows:
        lines.append(f"| ({r['claim']}) | {r['setting'][0]:g}, {r['setting'][1]} | {r['text']} | "
                     f"{r['mean_left']:.3f} vs {r['mean_right']:.3f} | {r['mean_diff']:+.3f} ± {r['std_diff']:.3f} | "
                     f"{r['seeds_held']}/{r['n']} | {r['p']:.3f} | {'yes' if r['held'] else '**no**'} |")  # fmt: skip
    lines += ["", "(a0): unguarded arms against GRPO, for context (not claim rows).", "",
              (f"**(d) the drift warning** (a step's mean left-clipped log r < {DRIFT_THRESHOLD}) as a collapse "
              "detector; lead = steps from the first warning to the first probe that showed the collapse:"), "",
              ("| runs | n | collapsed | warned and collapsed | of them before the probe | collapsed, silent | "
              "warned, stable | stable | median lead | mean lead (silent = warned at the end) | p |"),
              "|---" * 11 + "|"]  # fmt: skip
    for name, subset in (("all", leads), ("unguarded (GRPO, (0, 1), β1 > 0)", unguarded),
                         ("guarded", [r for r in leads if guard_base(r["arm"])])):  # fmt: skip
        w = warning_summary(subset)
        lines.append(f"| {name} | {w['runs']} | {w['collapsed']} | {w['hits']} | {w['in_time']} | {w['misses']} | "
                     f"{w['false_alarms']} | {w['stable']} | {w['median_lead']:g} | {w['mean_lead']:.1f} | "
                     f"{w['p']:.3g} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.entropy_study.confirm", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--stage", choices=list(STAGES), help="run one stage of the design")
    mode.add_argument("--merge", nargs="+", metavar="DIR", help="write <output-dir> from several stages' folders "
                      "(same task, steps and warm-up)")  # fmt: skip
    mode.add_argument("--replot", action="store_true", help="rewrite outputs from <output-dir>/curves.json")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--lrs", default=None, help="comma-separated subset of the stage's learning rates")
    p.add_argument("--spgs", default=None, help="comma-separated subset of the stage's steps per rollout batch")
    p.add_argument("--arms", default=None, help="comma-separated subset of the stage's arms (a cut-down run)")
    p.add_argument("--seeds", default=None, help=f"comma-separated seeds (default {','.join(map(str, SEEDS))})")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the stage's)")
    p.add_argument(
        "--digits-dir",
        action="append",
        default=None,
        help="(addition) folder(s) with the digits stage's curves.json, to choose the guard candidate",
    )
    p.add_argument("--workers", type=int, default=2, help="processes, one torch thread each")
    p.add_argument("--small-model", action="store_true", help="the tests' small models (numbers mean nothing)")
    p.add_argument("--cache-dir", default=None, help="model cache (default: the quickstart's)")
    return p


def complete_seeds(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """(kept, dropped): a seed counts at a setting only if every arm that ran there ran it, so every comparison is
    paired (a stage cut off mid-seed leaves some arms one seed short)."""
    arms: dict[tuple, set] = {}
    for c in runs:
        arms.setdefault((c["learning_rate"], c["steps_per_generation"]), set()).add(c["arm"])
    have: dict[tuple, set] = {}
    for c in runs:
        have.setdefault((c["learning_rate"], c["steps_per_generation"], c["seed"]), set()).add(c["arm"])

    def ok(c):
        return (
            have[c["learning_rate"], c["steps_per_generation"], c["seed"]]
            == arms[c["learning_rate"], c["steps_per_generation"]]
        )

    return [c for c in runs if ok(c)], [c for c in runs if not ok(c)]


def _write(runs: list[dict], meta: dict, out: Path) -> str:
    runs, dropped = complete_seeds(runs)
    if dropped:
        meta = {
            **meta,
            "dropped_incomplete_seeds": sorted(
                f"{c['arm']} seed {c['seed']} lr {c['learning_rate']:g} spg {c['steps_per_generation']}"
                for c in dropped
            ),
        }
    return digits.write_outputs(runs, {**meta, "mode": "confirm"}, out)


def main(argv: Sequence[str] | None = None, *, log=print) -> dict:
    """Run a stage or merge stages (see `--help`); returns `{"meta", "runs"}` as written to curves.json."""
    args = _parser().parse_args(argv)
    out = Path(args.output_dir)
    command = "python -m examples.entropy_study.confirm " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.replot:
        data = json.loads((out / "curves.json").read_text())
        _write(data["runs"], data["meta"], out)
        return data
    if args.merge:
        data = digits.merge_curves([Path(d) for d in args.merge])
        data["meta"]["command"] = command
        _write(data["runs"], data["meta"], out)
        return data
    spec = STAGES[args.stage]
    digits_rows = None
    if args.digits_dir:
        digits_rows = claim_rows(digits.merge_curves([Path(d) for d in args.digits_dir])["runs"])
    arms = stage_arms(args.stage, digits_rows)
    if args.arms:
        unknown = sorted(set(args.arms.split(",")) - set(arms))
        if unknown:
            raise SystemExit(f"--arms {unknown} are not in stage {args.stage}'s arms {list(arms)}.")
        arms = tuple(a for a in arms if a in args.arms.split(","))
    lrs = {float(x) for x in args.lrs.split(",")} if args.lrs else {lr for lr, _ in spec["settings"]}
    spgs = {int(x) for x in args.spgs.split(",")} if args.spgs else {spg for _, spg in spec["settings"]}
    settings = [(lr, spg) for lr, spg in spec["settings"] if lr in lrs and spg in spgs]
    if not settings:
        raise SystemExit(f"--lrs / --spgs select none of the stage's settings {spec['settings']}.")
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(SEEDS)
    steps = args.steps or spec["steps"]

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        started = time.time()
        if spec["task"] == "digits":
            fn, (_, _, info) = digits.run_arm, digits._model(args.small_model, args.cache_dir)
            warmup = {k: v for k, v in info.items() if k != "settings"}
        else:
            from dataclasses import asdict

            from cegppo_trl.demos.runs import FAST_MODEL_WARMUP
            from cegppo_trl.demos.warmup import WarmupSettings

            from .addition import _model

            settings_w = asdict(WarmupSettings(**(FAST_MODEL_WARMUP if args.small_model else {})))
            fn, info = run_addition_arm, _model(settings_w, args.cache_dir)[3]
            warmup = {k: v for k, v in info.items() if k in ("steps", "dev_accuracy", "num_parameters")}
        jobs = [{"arm": a, "seed": s, "steps": steps, "probe_every": spec["probe_every"], "learning_rate": lr,
                 "steps_per_generation": spg, "small": args.small_model, "cache_dir": args.cache_dir}
                for lr, spg in settings for s in seeds for a in arms]  # fmt: skip
        log(f"Third entropy study, stage {args.stage} ({spec['task']}): {len(jobs)} runs of {steps} steps, "
            f"{args.workers} worker(s)")  # fmt: skip
        meta = {"task": spec["task"], "stage": args.stage, "steps": steps, "seeds": seeds, "arms": list(arms),
                "settings": settings, "warmup": warmup, "workers": args.workers, "command": command}  # fmt: skip

        def checkpoint(done: list[dict]) -> None:  # the finished runs so far, as a curves.json --merge can read
            out.mkdir(parents=True, exist_ok=True)
            partial = {**meta, "mode": "confirm", "partial": f"{len(done)}/{len(jobs)} runs",
                       "wall_seconds": time.time() - started}  # fmt: skip
            runs = [digits._rounded(c) for c in sorted(done, key=digits._run_order)]
            (out / "curves.json").write_text(json.dumps({"meta": partial, "runs": runs}, separators=(",", ":")))

        runs = digits._run_all(jobs, args.workers, log, fn=fn, on_result=checkpoint)
        meta["wall_seconds"] = time.time() - started
        text = _write(runs, meta, out)
        log("\n" + text)
        return {"meta": {**meta, "mode": "confirm"}, "runs": runs}
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":
    main()
